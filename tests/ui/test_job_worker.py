"""The app's job queues computing in a worker process (fireviz.ui.jobs with process=True): the same
numbers as in-process, progress relayed, a fit stopped with its best parameters, a killed worker
failing only its own job."""

from __future__ import annotations

import functools
import os
import signal
import time

import pytest

from fireviz.checkpoints import Checkpoint
from fireviz.eval import EvalCache, EvalSettings, evaluate
from fireviz.ui import jobs

SETTINGS = {"mode": "nonoverlapping", "token_budget": 256, "seed": 0, "device": "cpu"}


def test_an_evaluation_in_the_worker_process_gives_the_in_process_numbers(app_env):
    q = jobs.JobQueue(name="test-process", process=True, threads=1)
    try:
        ckpts = [Checkpoint.resolve(str(app_env / n)) for n in ("alibi", "fire")]
        settings = EvalSettings.make("prose", [16, 32], **SETTINGS)
        reports = []
        job = q.submit(
            jobs.evaluation_description(ckpts, settings),
            functools.partial(jobs._evaluation_work, ckpts, settings, None, 0, " (worker)"),
        )
        while job.status not in jobs.FINISHED:
            reports.append((job.done, job.total))
            time.sleep(0.02)
        assert job.status == jobs.DONE, job.error
        assert q.worker_pid is not None and q.worker_pid != os.getpid()
        assert job.total > 0 and job.done == job.total  # the last progress report arrived
        direct = evaluate(ckpts, settings, cache=EvalCache(enabled=False))
        assert [r["label"] for r in job.result] == ["alibi (worker)", "fire (worker)"]
        for got, want in zip(job.result, direct, strict=True):
            assert [e["bits_per_byte"] for e in got["per_length"]] == [e["bits_per_byte"] for e in want["per_length"]]
        # the worker wrote the cache the app reads: submitting the same job again computes nothing
        assert q.submit(jobs.evaluation_description(ckpts, settings), job.work) is job
    finally:
        q._worker.close()


def _optimising_fit(q, seed: int):
    """A 100,000-step fit submitted to ``q``, returned once it optimises in the child (≤ 120 s)."""
    job = jobs.submit_fit("alibi", {}, 64, 2, 8, 100000, seed=seed, queue_=q)
    deadline = time.time() + 120
    while not job.message.startswith("step ") and time.time() < deadline:
        time.sleep(0.02)
    return job


def test_a_fit_in_the_worker_process_stops_with_its_best_parameters(app_env):
    q = jobs.JobQueue(name="test-process-fit", process=True, threads=1)
    try:
        job = _optimising_fit(q, seed=3)
        assert job.status == jobs.RUNNING and job.total == 100000
        q.cancel(job.key)
        assert q.wait(job.key, 60).status == jobs.CANCELLED
        res = job.snapshot()["result"]
        assert res.stopped and 0 < res.steps_run < 100000 and res.c > 0
    finally:
        q._worker.close()


def test_a_killed_worker_fails_only_its_job(app_env):
    q = jobs.JobQueue(name="test-process-kill", process=True, threads=1)
    try:
        job = _optimising_fit(q, seed=4)
        os.kill(q.worker_pid, signal.SIGKILL)
        assert q.wait(job.key, 30).status == jobs.ERROR
        assert "SIGKILL" in job.error and "Run it again" in job.error
        after = jobs.submit_fit("alibi", {}, 64, 2, 8, 20, seed=5, queue_=q)
        assert q.wait(after.key, 120).status == jobs.DONE and after.result.steps_run == 20
    finally:
        q._worker.close()


def test_a_process_queue_refuses_work_that_cannot_reach_the_worker():
    q = jobs.JobQueue(name="test-process-refuse", process=True)
    try:
        with pytest.raises(TypeError, match="must pickle"):
            q.submit({"job": "lambda"}, lambda p, s: 1)
        assert q.jobs() == [] and q.worker_pid is None  # nothing queued, no process started
    finally:
        q._worker.close()


def test_the_app_queues_compute_in_a_worker_process_unless_told_otherwise(monkeypatch):
    monkeypatch.setattr(jobs, "_QUEUES", {})
    monkeypatch.setenv("FIREVIZ_JOB_WORKER", "process")
    assert jobs.default_queue("evaluate").in_process and jobs.default_queue("fit").in_process
    monkeypatch.setattr(jobs, "_QUEUES", {})
    monkeypatch.setenv("FIREVIZ_JOB_WORKER", "thread")
    assert not jobs.default_queue("evaluate").in_process
    monkeypatch.setattr(jobs, "_QUEUES", {})
    monkeypatch.setenv("FIREVIZ_JOB_WORKER", "threads")
    with pytest.raises(ValueError, match="FIREVIZ_JOB_WORKER"):
        jobs.default_queue("evaluate")
