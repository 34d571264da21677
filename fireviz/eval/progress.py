"""Progress of an evaluation: target tokens done over all checkpoints and lengths, a rate and an
ETA once scoring starts, and the cancellation check between batches."""

from __future__ import annotations

import math
import time
from typing import Callable

from fireviz.core.text import duration  # noqa: F401  (re-exported: fireviz.eval.progress.duration)

#: ``progress(done, total, message)``: target tokens done and in all, and what is happening
ProgressFn = Callable[[int, int, str], None]
#: ``should_stop() -> bool``: True asks the evaluation to stop at its next check
StopFn = Callable[[], bool]


class EvaluationCancelled(RuntimeError):
    """Raised when ``should_stop()`` returned True; lengths finished before stay cached."""


class Progress:
    """Target tokens done over all checkpoints and lengths, with a rate and an ETA from the
    first computed (not cached) batch on; ``check_stop`` raises EvaluationCancelled."""

    def __init__(self, total: int, progress: ProgressFn | None, should_stop: StopFn | None):
        self.total, self.done, self._progress, self._stop = total, 0, progress, should_stop
        self._t0: float | None = None
        self._done0 = 0

    def start_scoring(self) -> None:
        """Start the clock of the rate (the first call only: cached lengths before it do not count)."""
        if self._t0 is None:
            self._t0, self._done0 = time.perf_counter(), self.done

    def report(self, message: str) -> None:
        """``progress(done, total, message)``, if a callback was given."""
        if self._progress is not None:
            self._progress(self.done, self.total, message)

    def eta(self) -> str:
        """``", 1,234 tokens/s, ~3 min 05 s left"`` once scoring has started and moved, else ``""``."""
        if self._t0 is None or self.done <= self._done0:
            return ""
        rate = (self.done - self._done0) / max(time.perf_counter() - self._t0, 1e-9)
        left = (self.total - self.done) / rate if rate > 0 else float("inf")
        return f", {rate:,.0f} tokens/s, ~{duration(left)} left" if math.isfinite(left) else ""

    def check_stop(self) -> None:
        """Raises: EvaluationCancelled when ``should_stop()`` returns True."""
        if self._stop is not None and self._stop():
            raise EvaluationCancelled("evaluation cancelled; finished lengths are cached")
