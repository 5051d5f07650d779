"""A seeded whole-pipeline fault simulation (``python -m tests.sim --seed N --steps K``).

:mod:`tests.sim.schedule` derives every input and fault from the seed,
:mod:`tests.sim.run` plays it against real ``relaybox`` processes on PostgreSQL or
SQLite, :mod:`tests.sim.invariants` holds the named checkers, and
:mod:`tests.sim.__main__` replays a seed, shrinks a failing schedule by bisection and
runs for hours. ``docs/simulation.md`` says what is and is not deterministic.
"""
