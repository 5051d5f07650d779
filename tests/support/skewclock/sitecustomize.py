"""A host whose wall clock is wrong, for the processes tests start: with this folder
on ``PYTHONPATH`` and ``TEST_CLOCK_SKEW`` set (seconds, may be negative), the Python
process reads its wall clock (``time.time``, ``time.time_ns``) that far off from the
start, as libfaketime would make it. The monotonic clock is left alone, as it is when
a host's wall clock is set wrong. relaybox reads the wall clock only through these
(its ``SystemClock`` and ``DatabaseClock``), so the process runs relaybox's real code
on a skewed time source."""

from __future__ import annotations

import os
import time

_skew = float(os.environ.get("TEST_CLOCK_SKEW") or 0)
if _skew:
    _time, _time_ns = time.time, time.time_ns
    _skew_ns = int(_skew * 1_000_000_000)

    def _skewed() -> float:
        return _time() + _skew

    def _skewed_ns() -> int:
        return _time_ns() + _skew_ns

    time.time = _skewed
    time.time_ns = _skewed_ns
