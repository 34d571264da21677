"""Optional compiled kernels: built on first use (``LazyKernel``); numba calls serialised with
torch's thread count kept.

FIRE's row kernels (:mod:`fireviz.encodings.fire`) are compiled with numba when it is
installed, the biased-attention backward (:mod:`fireviz.attention_kernel`) with the machine's
C++ compiler. They have exact torch fallbacks (tests compare them to 1e-5); ``FIRE_NO_NUMBA=1``
and ``FIREVIZ_NO_CPP_KERNEL=1`` force the fallbacks.
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
    """A compiled kernel built on first call (its build caches the compiled code on disk).

    ``LazyKernel(build)()`` returns what ``build()`` returns, or None — callers then take their
    torch path — while the environment variable ``off_switch`` is set to anything but 0 (read
    at every call), or for good once ``build`` raised one of ``unavailable`` (``on_unavailable``
    is then called with the error, e.g. to warn). ``build`` runs at most once per process, under
    a lock. Defaults: numba kernels (``FIRE_NO_NUMBA``; ImportError when numba is not installed).
    """

    def __init__(
        self,
        build: Callable[[], object],
        off_switch: str = "FIRE_NO_NUMBA",
        unavailable: tuple[type[BaseException], ...] = (ImportError,),
        on_unavailable: Callable[[BaseException], None] | None = None,
    ):
        self._build = build
        self._off_switch = off_switch
        self._unavailable = unavailable
        self._on_unavailable = on_unavailable
        self._kernel = None  # None: not tried yet; False: unavailable
        self._lock = threading.Lock()

    def __call__(self):
        if os.environ.get(self._off_switch, "") not in ("", "0"):
            return None
        if self._kernel is None:
            with self._lock:
                if self._kernel is None:
                    self._kernel = False
                    try:
                        self._kernel = self._build()
                    except self._unavailable as err:
                        if self._on_unavailable is not None:
                            self._on_unavailable(err)
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
