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
  * the function's return value comes back pickled; an exception it raises is raised again in
    the caller (its type kept where it pickles, ``remote_traceback`` holding the child's
    traceback text);
  * a child that dies (killed for memory, a crash in native code) raises :class:`WorkerDied`
    naming its exit code or signal; the next call starts a fresh child. A child whose parent died
    stops its work at the next ``should_stop`` check and exits.

The function must pickle (a module-level function, or ``functools.partial`` of one, with picklable
arguments). The caller's environment variables are applied in the child before each call
(``env``), so a changed ``FIREVIZ_CACHE_DIR`` is honoured without a restart.
"""

from __future__ import annotations

import multiprocessing
import os
import pickle
import signal
import threading
import time
import traceback
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


def _child_main(conn, cancel, threads: int, nice: int) -> None:
    """The child's loop: receive ``(fn, env)``, run it, send progress and the outcome; exit on EOF."""
    parent = os.getppid()
    if nice:
        try:
            os.nice(nice)
        except OSError:
            pass
    import torch

    torch.set_num_threads(threads)
    while True:
        try:
            msg = conn.recv()
        except (EOFError, OSError):
            return
        if msg is None:
            return
        fn, env = msg
        if env is not None:
            os.environ.clear()
            os.environ.update(env)
        _run_one(conn, cancel, fn, parent)


def _run_one(conn, cancel, fn, parent: int) -> None:
    last = [0.0]
    pending: list[tuple | None] = [None]

    def flush() -> None:
        if pending[0] is not None:
            conn.send(("progress", *pending[0]))
            pending[0], last[0] = None, time.monotonic()

    def progress(done: int, total: int, message: str = "") -> None:
        pending[0] = (int(done), int(total), str(message))
        if time.monotonic() - last[0] >= POLL_S:
            flush()

    def should_stop() -> bool:
        return cancel.is_set() or os.getppid() != parent

    try:
        result = fn(progress, should_stop)
    except BaseException as e:  # sent back whole: the caller raises it again
        flush()
        text = traceback.format_exc()
        try:
            payload = pickle.dumps(e)
            pickle.loads(payload)
        except Exception:  # an exception that does not pickle: its text
            payload = pickle.dumps(RuntimeError(f"{type(e).__name__}: {e}"))
        conn.send(("raised", payload, text))
        return
    flush()
    try:
        conn.send(("result", result))
    except Exception as e:  # a result that does not pickle
        conn.send(("raised", pickle.dumps(TypeError(f"the result does not pickle: {e}")), traceback.format_exc()))


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
        return self._proc.pid if self._proc is not None and self._proc.is_alive() else None

    def _start(self) -> None:
        parent_conn, child_conn = self._ctx.Pipe()
        proc = self._ctx.Process(
            target=_child_main, args=(child_conn, self._cancel, self.threads, self.nice), name=self.name, daemon=True
        )
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
        Raises: what ``fn`` raised (``remote_traceback`` attribute: the child's traceback);
          WorkerDied when the child ended first; TypeError when ``fn`` does not pickle.
        """
        env = dict(os.environ) if env is None else dict(env)
        with self._lock:
            if self._proc is None or not self._proc.is_alive():
                self._start()
            self._cancel.clear()
            try:
                self._conn.send((fn, env))
            except (pickle.PicklingError, TypeError, AttributeError) as e:
                raise TypeError(f"work for a worker process must pickle (a module-level function): {e}") from None
            return self._wait(progress, should_stop)

    def _wait(self, progress, should_stop):
        while True:
            if should_stop is not None and not self._cancel.is_set() and should_stop():
                self._cancel.set()
            try:
                msg = self._conn.recv() if self._conn.poll(POLL_S) else None
            except (EOFError, OSError):  # the child closed its end: it has ended
                raise self._died() from None
            if msg is None:
                if not self._proc.is_alive():
                    raise self._died()
                continue
            kind = msg[0]
            if kind == "progress":
                if progress is not None:
                    progress(*msg[1:])
            elif kind == "result":
                return msg[1]
            elif kind == "raised":
                exc = pickle.loads(msg[1])
                exc.remote_traceback = msg[2]
                raise exc

    def _died(self) -> WorkerDied:
        self._proc.join(5)
        code = self._proc.exitcode
        self._proc, self._conn = None, None
        if code is not None and code < 0:
            try:
                how = f"killed by signal {signal.Signals(-code).name}"
            except ValueError:
                how = f"killed by signal {-code}"
            hint = " — most often the system running out of memory" if -code == signal.SIGKILL else ""
        else:
            how, hint = f"exit code {code}", ""
        return WorkerDied(f"the worker process stopped while it ran this job ({how}{hint})")

    def close(self) -> None:
        """Stop the child (after its current function, if any); the next :meth:`run` starts a new one."""
        with self._lock:
            if self._proc is not None:
                try:
                    self._conn.send(None)
                except OSError:
                    pass
                self._proc.join(5)
                if self._proc.is_alive():
                    self._proc.kill()
                self._proc, self._conn = None, None
