"""Optional numba kernels: compiled on first use, calls serialised, torch's thread count kept.

FIRE's row kernels (:mod:`fireviz.encodings.fire`) are compiled with numba when it is
installed. They have exact torch fallbacks (tests compare them to 1e-5); ``FIRE_NO_NUMBA=1``
forces the fallbacks.
"""

from __future__ import annotations

import contextlib
import os
import threading
from typing import Callable

import torch

#: numba's fallback threading layer (workqueue) aborts on concurrent parallel launches, so
#: calls into the kernels are serialised (they are short).
KERNEL_LOCK = threading.Lock()


class LazyKernel:
    """A numba kernel built on first call (numba caches the compiled code on disk).

    ``LazyKernel(build)()`` returns what ``build()`` returns, or None when numba is not
    installed (``build`` raises ImportError) or ``FIRE_NO_NUMBA`` is set to anything but 0;
    callers then take their torch path. ``build`` runs at most once per process.
    """

    def __init__(self, build: Callable[[], object]):
        self._build = build
        self._kernel = None  # None: not tried yet; False: unavailable

    def __call__(self):
        if self._kernel is None:
            self._kernel = False
            if os.environ.get("FIRE_NO_NUMBA", "") in ("", "0"):
                try:
                    self._kernel = self._build()
                except ImportError:
                    pass
        return self._kernel or None


@contextlib.contextmanager
def numba_kernel_call():
    """Serialise one numba kernel call (``KERNEL_LOCK``) and run it with torch's thread count.

    numba's OpenMP threading layer shares libgomp with torch, and its first parallel launch
    sets the calling thread's OpenMP thread count to ``NUMBA_NUM_THREADS`` (all CPUs). Without
    the restore below, a process started with ``OMP_NUM_THREADS=1`` silently ran torch on every
    core after its first FIRE bias — two such training processes on two cores ran at a third of
    their speed. torch's count is read before the call and put back after it.
    Raises: ImportError without numba (callers enter it only after ``LazyKernel`` succeeded).
    """
    import numba

    with KERNEL_LOCK:
        threads = torch.get_num_threads()
        numba.set_num_threads(max(1, min(threads, numba.config.NUMBA_NUM_THREADS)))
        try:
            yield
        finally:
            if torch.get_num_threads() != threads:
                torch.set_num_threads(threads)
