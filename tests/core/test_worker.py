"""fireviz.core.worker: functions run in a child process — progress, results, errors, cancel, death."""

from __future__ import annotations

import os
import signal
import time

import pytest

from fireviz.core.worker import WorkerDied, WorkerProcess, worker_threads


def report_and_describe(progress, should_stop):
    """Three progress reports, then what the child sees."""
    import torch

    for k in range(3):
        progress(k + 1, 3, f"step {k + 1}")
        time.sleep(0.15)
    return {"pid": os.getpid(), "threads": torch.get_num_threads(), "env": os.environ.get("FIREVIZ_TEST_MARK")}


def count_until_stopped(progress, should_stop):
    n = 0
    while not should_stop():
        n += 1
        progress(n, 0, "counting")
        time.sleep(0.01)
        if n > 3000:  # 30 s: the stop never arrived
            return -1
    return n


def raise_key_error(progress, should_stop):
    raise KeyError("no such table")


def raise_unpicklable(progress, should_stop):
    class Local(Exception):
        pass

    raise Local("defined inside a function")


def quick_then_slow(progress, should_stop):
    """A report right after another, then a long step: the second must still show at once."""
    progress(1, 3, "loading (fast)")
    progress(2, 3, "computing (slow)")
    time.sleep(1.5)
    progress(3, 3, "done")
    return "ok"


def exit_the_job(progress, should_stop):
    raise SystemExit(3)


def tagged_slow(progress, should_stop):
    time.sleep(1.0)
    return "first job"


def tagged_quick(progress, should_stop):
    return "second job"


def return_tensors(progress, should_stop):
    import torch

    return [torch.full((4,), float(k)) for k in range(300)]


def die(progress, should_stop):
    progress(1, 2, "about to be killed")
    time.sleep(0.3)
    os.kill(os.getpid(), signal.SIGKILL)
    time.sleep(10)


def test_worker_runs_in_a_child_with_bounded_threads_and_relays_progress(monkeypatch):
    monkeypatch.setenv("FIREVIZ_TEST_MARK", "first")
    w = WorkerProcess(name="test-worker", threads=1)
    try:
        seen = []
        out = w.run(report_and_describe, progress=lambda d, t, m: seen.append((d, t, m)))
        assert out["pid"] != os.getpid() and out["threads"] == 1 and out["env"] == "first"
        assert seen[-1] == (3, 3, "step 3")  # the last report always arrives
        assert [d for d, _, _ in seen] == sorted(d for d, _, _ in seen)
        monkeypatch.setenv("FIREVIZ_TEST_MARK", "second")  # the caller's environment at each call
        again = w.run(report_and_describe)
        assert again["pid"] == out["pid"] and again["env"] == "second"  # one child, reused
    finally:
        w.close()
    assert w.pid is None


def test_worker_raises_the_childs_exception_and_lives_on():
    w = WorkerProcess(name="test-worker", threads=1)
    try:
        with pytest.raises(KeyError, match="no such table") as info:
            w.run(raise_key_error)
        assert "raise_key_error" in info.value.remote_traceback
        with pytest.raises(RuntimeError, match="Local: defined inside a function"):
            w.run(raise_unpicklable)
        assert w.run(report_and_describe)["threads"] == 1
        with pytest.raises(TypeError, match="must pickle"):
            w.run(lambda p, s: 1)
    finally:
        w.close()


def test_worker_forwards_a_stop():
    w = WorkerProcess(name="test-worker", threads=1)
    try:
        seen = []  # stop once the child has reported progress
        n = w.run(count_until_stopped, progress=lambda d, t, m: seen.append(d), should_stop=lambda: bool(seen))
        assert n >= seen[0] > 0
        assert w.run(count_until_stopped, should_stop=lambda: True) >= 0  # the stop is cleared per call
    finally:
        w.close()


def test_a_killed_worker_fails_its_call_only():
    w = WorkerProcess(name="test-worker", threads=1)
    try:
        seen = []
        with pytest.raises(WorkerDied, match="SIGKILL.*out of memory"):
            w.run(die, progress=lambda d, t, m: seen.append(m))
        assert seen == ["about to be killed"] and w.pid is None
        assert w.run(report_and_describe)["threads"] == 1  # a fresh child
    finally:
        w.close()


def test_a_held_back_report_is_sent_within_the_poll_interval():
    w = WorkerProcess(name="test-worker", threads=1)
    try:
        seen = []
        w.run(quick_then_slow, progress=lambda d, t, m: seen.append((time.time(), m)))
        slow = [t for t, m in seen if m == "computing (slow)"]
        done = [t for t, m in seen if m == "done"]
        assert slow and done and done[0] - slow[0] > 1.0  # it arrived during the slow step, not with the next report
    finally:
        w.close()


def test_what_ends_a_call_early_here_or_there_never_mixes_two_jobs_results():
    w = WorkerProcess(name="test-worker", threads=1)
    try:
        with pytest.raises(RuntimeError, match="SystemExit: 3"):  # not an Exception: wrapped, the child lives on
            w.run(exit_the_job)
        pid = w.pid

        def stop_badly():
            raise KeyError("the caller's own bug")

        with pytest.raises(KeyError):
            w.run(tagged_slow, should_stop=stop_badly)
        assert w.pid is None or w.pid != pid  # the child still running the first job was discarded
        assert w.run(tagged_quick) == "second job"
        with pytest.raises(ValueError, match="env"):
            w.run(tagged_quick, env={"A=B": "x"})
        got = w.run(return_tensors)  # copied through the pipe: no file descriptor or /dev/shm per tensor
        assert len(got) == 300 and float(got[299][0]) == 299.0 and not got[0].is_shared()
    finally:
        w.close()


def test_close_stops_a_running_job_within_its_timeout():
    import threading

    w = WorkerProcess(name="test-worker", threads=1)
    out = {}

    def call():
        try:
            out["result"] = w.run(count_until_stopped, progress=lambda d, t, m: out.setdefault("started", True))
        except Exception as e:  # noqa: BLE001 - what the call ended with
            out["error"] = e

    t = threading.Thread(target=call)
    t.start()
    deadline = time.time() + 60
    while "started" not in out and time.time() < deadline:
        time.sleep(0.05)
    began = time.time()
    w.close(timeout=2)
    t.join(30)
    assert time.time() - began < 10 and w.pid is None
    assert out.get("result", 0) > 0 or isinstance(out.get("error"), WorkerDied)


def test_worker_threads_setting(monkeypatch):
    monkeypatch.setenv("FIREVIZ_WORKER_THREADS", "3")
    assert worker_threads() == 3
    for bad in ("0", "-1", "two"):
        monkeypatch.setenv("FIREVIZ_WORKER_THREADS", bad)
        with pytest.raises(ValueError, match="FIREVIZ_WORKER_THREADS"):
            worker_threads()
    monkeypatch.delenv("FIREVIZ_WORKER_THREADS")
    assert worker_threads() == max(1, len(os.sched_getaffinity(0)) - 1)


def test_a_main_script_that_cannot_run_headless_is_not_rerun_in_the_child(tmp_path, monkeypatch):
    """Streamlit installs each page script as ``__main__``; spawn would re-run it in the child."""
    import sys
    import types

    script = tmp_path / "page.py"
    script.write_text("raise RuntimeError('this page script ran in the worker')\n")
    page = types.ModuleType("__main__")
    page.__file__ = str(script)
    monkeypatch.setitem(sys.modules, "__main__", page)
    w = WorkerProcess(name="test-worker", threads=1)
    try:
        assert w.run(tagged_quick) == "second job"
    finally:
        w.close()
    assert sys.modules["__main__"] is page  # put back as it was
