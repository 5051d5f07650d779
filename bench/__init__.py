"""relaybox benchmarks: relaybox and its peers in the same run, alternating; ratios
are the result (absolute numbers on a shared 2-core machine are noise).

    python -m bench accept | process | dispatch | growth | all   [--quick]
"""
