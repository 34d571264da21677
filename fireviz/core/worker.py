"""Run functions in a long-lived child process, so a long computation never starves the caller.

The app's server (Streamlit) runs every page of every tab in one Python process. An evaluation
or a fit computed in a thread of that process shares its cores (PyTorch's intra-op threads take
them all) and its interpreter lock, and every page stalls while it runs (issue #40: Home took
259 s to draw beside an evaluation, 10–20 s idle). :class:`WorkerProcess` runs each piece of work
in one child process instead, started on first use (``spawn``, so no threads or locks are
copied from the server) and reused for the next piece (PyTorch is imported once):

  * the child uses ``threads`` intra-op threads (default: all cores but one, at least one) at a
    lower scheduling priority (``nice``), so the server keeps a core and wins when both want one;
  * ``progress(done, total, message)`` calls in the child reach the caller's ``progress`` within
    ~0.1 s (the latest one only: progress is state, not a log), and the caller's
    ``should_stop()`` is forwarded to the child's within ~0.1 s;
  * the function's return value comes back pickled (as bytes through the pipe: tensors are copied,
    never moved to shared memory); an exception it raises is raised again in the caller (its type
    kept where it pickles, ``remote_traceback`` holding the child's traceback text);
  * a child that dies (killed for memory, a crash in native code) raises :class:`WorkerDied`
    naming its exit code or signal; the next call starts a fresh child. A child whose parent died
    stops its work at the next ``should_stop`` check and exits.

The function must pickle (a module-level function, or ``functools.partial`` of one, with picklable
arguments). The caller's environment variables are applied in the child before each call
(``env``), so a changed ``FIREVIZ_CACHE_DIR`` is honoured without a restart.
"""

from __future__ import annotations

import contextlib
import multiprocessing
import os
import pickle
import signal
import sys
import threading
import time
import traceback
import types
from typing import Any, Callable

#: seconds between forwarded progress reports and cancellation checks
POLL_S = 0.1

Progress = Callable[[int, int, str], None]


class WorkerDied(RuntimeError):
    """The worker process ended while it ran a function (killed, out of memory, a native crash)."""


def worker_threads() -> int:
    """Intra-op threads for a worker: ``FIREVIZ_WORKER_THREADS`` if set (a positive integer), else
    the cores this process may use minus one (one left for the server), at least 1.

    Raises: ValueError for a ``FIREVIZ_WORKER_THREADS`` that is not a positive integer.
    """
    env = os.environ.get("FIREVIZ_WORKER_THREADS", "").strip()
    if env:
        if not env.isdigit() or int(env) < 1:
            raise ValueError(
                f"FIREVIZ_WORKER_THREADS must be a positive integer (got {env!r}); unset it or give e.g. 1"
            )
        return int(env)
    try:
        cores = len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        cores = os.cpu_count() or 1
    return max(1, cores - 1)


_MAIN_SWAP = threading.Lock()


@contextlib.contextmanager
def bare_main():
    """Start a spawned child without re-running this process's ``__main__`` in it.

    ``spawn`` re-imports the parent's ``__main__`` (its file, or its module name) in the child
    before the target runs. Under Streamlit ``__main__`` is whichever page script ran last (its
    script runner installs each page as ``__main__``), so the child would draw that page headless
    before it could take a job — and fail where the page needs a session. The child needs nothing
    from ``__main__``: its target and every job function live in importable modules. So while the
    child starts, ``__main__`` is an empty module (put back only if nobody replaced it meanwhile).
    """
    with _MAIN_SWAP:
        real = sys.modules.get("__main__")
        bare = types.ModuleType("__main__")
        sys.modules["__main__"] = bare
        try:
            yield
        finally:
            if sys.modules.get("__main__") is bare:
                if real is None:
                    del sys.modules["__main__"]
                else:
                    sys.modules["__main__"] = real


def _send(conn, lock: threading.Lock, msg) -> None:
    """One message as pickled bytes: copied through the pipe (never tensors moved to shared memory
    and file descriptors, as ``Connection.send``'s torch-aware pickler would)."""
    data = pickle.dumps(msg)
    with lock:
        conn.send_bytes(data)


def _raised(e: BaseException, text: str) -> tuple:
    """The ``("raised", exception bytes, traceback text)`` message of ``e``: itself where it pickles
    both ways and is an ``Exception``, else a RuntimeError carrying its type and text."""
    if isinstance(e, Exception):
        try:
            payload = pickle.dumps(e)
            pickle.loads(payload)
            return ("raised", payload, text)
        except Exception:
            pass
    try:
        said = f"{type(e).__name__}: {e}"
    except Exception:  # an exception whose str() fails
        said = type(e).__name__
    return ("raised", pickle.dumps(RuntimeError(said)), text)


def die_with_parent() -> None:
    """Linux: the kernel sends this process SIGTERM when its parent dies (``PR_SET_PDEATHSIG``)."""
    try:
        import ctypes

        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGTERM)  # 1 = PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass


def _child_main(conn, cancel, threads: int, nice: int) -> None:
    """The child's loop: receive ``(fn, env)`` bytes, run it, send progress and the outcome; exit on
    EOF. Anything that goes wrong outside the function (its arguments do not rebuild here, an
    environment that cannot be set) is sent back as its error; the child lives on."""
    parent = os.getppid()
    die_with_parent()
    if nice:
        try:
            os.nice(nice)
        except OSError:
            pass
    import torch

    torch.set_num_threads(threads)
    lock = threading.Lock()
    while True:
        try:
            data = conn.recv_bytes()
        except (EOFError, OSError):
            return
        try:
            msg = pickle.loads(data)
            if msg is None:
                return
            fn, env = msg
            if env is not None:
                os.environ.clear()
                os.environ.update(env)
        except Exception as e:  # the job never started: its error, not a dead worker
            _send(conn, lock, _raised(e, traceback.format_exc()))
            continue
        _run_one(conn, lock, cancel, fn, parent)


def _run_one(conn, lock: threading.Lock, cancel, fn, parent: int) -> None:
    state: dict = {"pending": None, "last": 0.0, "running": True}
    state_lock = threading.Lock()

    def flush() -> None:
        with state_lock:
            msg, state["pending"] = state["pending"], None
            if msg is not None:
                state["last"] = time.monotonic()
        if msg is not None:
            _send(conn, lock, ("progress", *msg))

    def progress(done: int, total: int, message: str | None = "") -> None:
        with state_lock:
            state["pending"] = (int(done), int(total), "" if message is None else str(message))
            due = time.monotonic() - state["last"] >= POLL_S
        if due:
            flush()

    def flusher() -> None:  # a report held back sends itself once POLL_S has passed
        while state["running"]:
            time.sleep(POLL_S)
            flush()

    def should_stop() -> bool:
        return cancel.is_set() or os.getppid() != parent

    beat = threading.Thread(target=flusher, name="fireviz-progress", daemon=True)
    beat.start()
    try:
        result = fn(progress, should_stop)
    except BaseException as e:  # sent back: the caller raises it again
        outcome = _raised(e, traceback.format_exc())
    else:
        try:
            pickle.dumps(result)
            outcome = ("result", result)
        except Exception as e:  # a result that does not pickle
            outcome = _raised(TypeError(f"the result does not pickle: {e}"), traceback.format_exc())
    state["running"] = False
    beat.join()
    flush()
    _send(conn, lock, outcome)


class WorkerProcess:
    """One child process that runs functions one at a time (see the module docstring).

    Args: ``name`` (the process's name); ``threads`` intra-op threads in the child (default
      ``worker_threads()``); ``nice`` added to the child's scheduling niceness (0 keeps it).
    Thread-safe: calls to :meth:`run` are serialised.
    """

    def __init__(self, name: str = "fireviz-worker", threads: int | None = None, nice: int = 10):
        self.name = name
        self.threads = worker_threads() if threads is None else int(threads)
        self.nice = int(nice)
        self._ctx = multiprocessing.get_context("spawn")
        self._proc: Any = None  # the child (a SpawnProcess) while it runs
        self._conn: Any = None  # our end of its pipe
        self._cancel = self._ctx.Event()
        self._lock = threading.Lock()

    @property
    def pid(self) -> int | None:
        """The child's process id, or None before the first call / after it died."""
        proc = self._proc
        return proc.pid if proc is not None and proc.is_alive() else None

    def _start(self) -> None:
        parent_conn, child_conn = self._ctx.Pipe()
        proc = self._ctx.Process(
            target=_child_main, args=(child_conn, self._cancel, self.threads, self.nice), name=self.name, daemon=True
        )
        with bare_main():
            proc.start()
        child_conn.close()
        self._proc, self._conn = proc, parent_conn

    def run(
        self,
        fn: Callable[[Progress, Callable[[], bool]], Any],
        progress: Progress | None = None,
        should_stop: Callable[[], bool] | None = None,
        env: dict[str, str] | None = None,
    ) -> Any:
        """``fn(progress, should_stop)`` in the child; returns its result.

        Args: ``fn`` picklable; ``progress`` receives the child's reports; ``should_stop`` is polled
          every ``POLL_S`` and, once true, makes the child's ``should_stop()`` true; ``env`` the
          environment variables to run with (default: this process's, ``os.environ``).
        Raises: what ``fn`` raised (an ``Exception``; anything else, e.g. SystemExit, as RuntimeError;
          ``remote_traceback`` attribute: the child's traceback); WorkerDied when the child ended
          first; TypeError when ``fn`` does not pickle; ValueError for an ``env`` that is not
          str → str with no ``=`` or NUL in a name. Whatever ends a call early on this side (an
          exception from ``progress`` or ``should_stop``, KeyboardInterrupt) stops the child with it,
          so no later call can receive this one's messages.
        """
        env = dict(os.environ) if env is None else _checked_env(env)
        try:
            job = pickle.dumps((fn, env))
        except Exception as e:
            raise TypeError(f"work for a worker process must pickle (a module-level function): {e}") from None
        with self._lock:
            if self._proc is None or not self._proc.is_alive():
                self._start()
            self._cancel.clear()
            try:
                try:
                    self._conn.send_bytes(job)
                except OSError:  # the child ended while the job was sent
                    raise self._died() from None
                return self._wait(progress, should_stop)
            except WorkerDied:
                raise
            except BaseException:
                if self._proc is not None and not self._finished_cleanly:
                    self._discard()
                raise
            finally:
                self._finished_cleanly = False

    #: set by ``_wait`` once the child's outcome arrived (it is idle again); else a call that ends
    #: early on this side leaves it running, and it is discarded
    _finished_cleanly = False

    def _wait(self, progress, should_stop):
        while True:
            if should_stop is not None and not self._cancel.is_set() and should_stop():
                self._cancel.set()
            try:
                data = self._conn.recv_bytes() if self._conn.poll(POLL_S) else None
            except (EOFError, OSError):  # the child closed its end: it has ended
                raise self._died() from None
            if data is None:
                if not self._proc.is_alive():
                    raise self._died()
                continue
            msg = pickle.loads(data)
            kind = msg[0]
            if kind == "progress":
                if progress is not None:
                    progress(*msg[1:])
                continue
            self._finished_cleanly = True  # the child is idle again: its next message is the next job's
            if kind == "result":
                return msg[1]
            exc = pickle.loads(msg[1])
            exc.remote_traceback = msg[2]
            raise exc

    def _discard(self) -> None:
        """Kill the child (its job is abandoned); the next :meth:`run` starts a fresh one."""
        proc, self._proc, self._conn = self._proc, None, None
        if proc is not None:
            proc.kill()
            proc.join(5)

    def _died(self) -> WorkerDied:
        proc, self._proc, self._conn = self._proc, None, None
        proc.join(5)
        code = proc.exitcode
        if code is not None and code < 0:
            try:
                how = f"killed by signal {signal.Signals(-code).name}"
            except ValueError:
                how = f"killed by signal {-code}"
            hint = " — most often the system running out of memory" if -code == signal.SIGKILL else ""
        else:
            how, hint = f"exit code {code}", ""
        return WorkerDied(f"the worker process stopped while it ran this job ({how}{hint})")

    def close(self, timeout: float = 5.0) -> None:
        """Stop the child: a running function is asked to stop and given ``timeout`` seconds, then
        the child is killed (its call raises WorkerDied). The next :meth:`run` starts a new one."""
        self._cancel.set()
        if not self._lock.acquire(timeout=timeout):  # a job still running past its stop: kill it
            proc = self._proc
            if proc is not None:
                proc.kill()
            self._lock.acquire()
        try:
            if self._proc is not None:
                try:
                    self._conn.send_bytes(pickle.dumps(None))
                except OSError:
                    pass
                self._proc.join(timeout)
                if self._proc.is_alive():
                    self._proc.kill()
                    self._proc.join(5)
                self._proc, self._conn = None, None
        finally:
            self._lock.release()


def _checked_env(env: dict) -> dict[str, str]:
    """``env`` as a fresh dict. Raises: ValueError unless every name and value is a str, no name is
    empty or holds ``=`` or NUL, and no value holds NUL (what ``os.environ`` refuses)."""
    out = {}
    for k, v in env.items():
        if not (isinstance(k, str) and isinstance(v, str)) or not k or "=" in k or "\0" in k or "\0" in v:
            raise ValueError(f"env must map names to str values, names without '=' or NUL (got {k!r}: {v!r})")
        out[k] = v
    return out
