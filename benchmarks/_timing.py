"""Shared timing helpers for the benchmarks: interleaved repeats, medians, ratios."""

from __future__ import annotations

import statistics
import time
from typing import Callable


def interleaved_medians(fns: dict[str, Callable[[], None]], repeats: int = 7, warmup: int = 2) -> dict[str, float]:
    """Median seconds per call of each function, calling them round-robin.

    Round-robin (a, b, c, a, b, c, …) exposes every contender to the same background load,
    so the *ratios* between them are meaningful on a shared 2-core machine even when
    absolute times drift. Returns {name: median seconds}.
    """
    for _ in range(warmup):
        for fn in fns.values():
            fn()
    times: dict[str, list[float]] = {name: [] for name in fns}
    for _ in range(repeats):
        for name, fn in fns.items():
            t = time.perf_counter()
            fn()
            times[name].append(time.perf_counter() - t)
    return {name: statistics.median(ts) for name, ts in times.items()}
