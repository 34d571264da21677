"""Background jobs: a FIFO queue per kind of work, each job computed once, in a worker process.

Long evaluations must outlive the web page that started them: a page reload or a second
browser tab asks the same process for the job and finds it queued, running or finished.

  * A job is keyed by a hash of its description (``job_key``: the checkpoints' sha256 +
    settings); submitting the same key again returns the existing job,
    so a result is never computed twice. A job that failed or was cancelled is run again
    on resubmission.
  * One worker thread per queue (module singletons, ``default_queue(name)``: "evaluate"
    and "fit") runs that queue's jobs one at a time, in submission order. The app's queues
    compute in a child process (``fireviz.core.worker.WorkerProcess``: all cores but one, lower
    priority), so pages in every tab stay responsive while a job runs and show its progress within
    ~0.1 s; the thread only relays progress and cancellation. ``FIREVIZ_JOB_WORKER=thread`` computes
    in the thread instead (the test suite's fixtures do, so monkeypatched settings reach the work).
    A worker that dies (killed for memory) fails only its job; the next job gets a fresh one.
  * Each job has ``status`` (queued | running | done | error | cancelled), ``progress``
    (done, total, message), ``result``, ``error``; ``cancel`` stops a queued job at once
    and a running one at its next ``should_stop()`` check.
  * Evaluation jobs (``submit_evaluation``) write their results into fireviz.evaluate's
    on-disk cache, so a restarted server finds them there too.

No Streamlit here; pages poll ``Job.snapshot()``.
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
import pickle
import queue
import threading
import time
import traceback
from dataclasses import asdict, dataclass, field
from typing import Any, Callable, Sequence

from fireviz.analysis import DilutionSettings, text_attention
from fireviz.checkpoints import CausalLMCheckpoint, Checkpoint
from fireviz.core.worker import WorkerDied, WorkerProcess
from fireviz.encodings import has_normalizer
from fireviz.eval import (
    EvalCache,
    EvalSettings,
    EvaluationCancelled,
    EvaluationError,
    check_reference,
    checkpoint_list,
    evaluate,
)
from fireviz.fit import fitting as fit

QUEUED, RUNNING, DONE, ERROR, CANCELLED = "queued", "running", "done", "error", "cancelled"
FINISHED = (DONE, ERROR, CANCELLED)

#: ``work(progress, should_stop) -> result``; ``progress(done, total, message)``.
Work = Callable[[Callable[[int, int, str], None], Callable[[], bool]], Any]


class JobCancelled(Exception):
    """Raised inside a job's work to end it early after ``cancel``."""


def job_key(description: Any) -> str:
    """A stable hash (hex, 16 digits) of a JSON-serialisable job description.

    Keys are sorted, so dict order does not matter. Raises TypeError for non-JSON values.
    """
    text = json.dumps(description, sort_keys=True, separators=(",", ":"), default=_no_default)
    return hashlib.sha256(text.encode("utf-8")).hexdigest()[:16]


def _no_default(obj):
    raise TypeError(f"job descriptions must be JSON-serialisable; got {type(obj).__name__}")


@dataclass
class Job:
    """One unit of background work. Read it through :meth:`snapshot` (thread-safe copy).

    Attributes: key, label (for people), description (what was asked), status, done/total
    (progress units of the work, e.g. windows evaluated), message, result, error (text),
    submitted/started/finished (Unix seconds), device.
    """

    key: str
    label: str
    description: Any
    work: Work = field(repr=False)
    status: str = QUEUED
    done: int = 0
    total: int = 0
    message: str = "waiting in the queue"
    result: Any = None
    error: str | None = None
    submitted: float = field(default_factory=time.time)
    started: float | None = None
    finished: float | None = None
    device: str | None = None
    traceback_text: str | None = field(default=None, repr=False)
    _cancel: threading.Event = field(default_factory=threading.Event, repr=False)

    @property
    def cancel_requested(self) -> bool:
        """Whether :meth:`JobQueue.cancel` has asked this job to stop (it may still be running)."""
        return self._cancel.is_set()

    @property
    def fraction(self) -> float:
        """Progress in [0, 1] (0 while the total is unknown)."""
        return min(1.0, self.done / self.total) if self.total else (1.0 if self.status == DONE else 0.0)

    def snapshot(self) -> dict:
        """A plain dict of the job's state: key, label, status, done, total, fraction, message,
        result, error, submitted, started, finished, device, elapsed_s."""
        end = self.finished or time.time()
        return {
            "key": self.key,
            "label": self.label,
            "status": self.status,
            "done": self.done,
            "total": self.total,
            "fraction": self.fraction,
            "message": self.message,
            "result": self.result,
            "error": self.error,
            "submitted": self.submitted,
            "started": self.started,
            "finished": self.finished,
            "device": self.device,
            "elapsed_s": (end - self.started) if self.started else 0.0,
        }


class JobQueue:
    """A FIFO of jobs run one at a time by one daemon worker thread (started lazily).

    Args: ``name``; ``process``: compute each job in a child process
      (``fireviz.core.worker.WorkerProcess``, started on the first job and reused) instead of the
      thread; its work must then pickle (a module-level function or a ``functools.partial`` of one);
      ``threads``: the child's intra-op threads (default ``fireviz.core.worker.worker_threads()``).
    """

    def __init__(self, name: str = "fireviz-jobs", process: bool = False, threads: int | None = None):
        self._name = name
        self._lock = threading.RLock()
        self._jobs: dict[str, Job] = {}
        self._queue: "queue.Queue[str]" = queue.Queue()
        self._thread: threading.Thread | None = None
        self._worker = WorkerProcess(name=name, threads=threads) if process else None

    @property
    def in_process(self) -> bool:
        """Whether jobs are computed in a child process (else in the queue's thread)."""
        return self._worker is not None

    @property
    def worker_pid(self) -> int | None:
        """The worker process's id while it is running, else None (and always None for a thread queue)."""
        return None if self._worker is None else self._worker.pid

    def submit(self, description: Any, work: Work, label: str = "", device: str | None = None) -> Job:
        """Queue ``work`` under ``job_key(description)``, or return the job already under that key.

        A queued, running or finished-successfully job is returned as is (never run twice);
        one that errored or was cancelled is replaced by a fresh run.
        Returns: the :class:`Job`.
        Raises: TypeError for work that does not pickle on a process queue (before queueing).
        """
        key = job_key(description)
        if self._worker is not None:
            try:
                pickle.dumps(work)
            except (pickle.PicklingError, TypeError, AttributeError) as e:
                raise TypeError(
                    f"a job for a worker process must pickle (a module-level function or functools.partial): {e}"
                ) from None
        with self._lock:
            job = self._jobs.get(key)
            if job is not None and job.status not in (ERROR, CANCELLED):
                return job
            job = Job(key=key, label=label or key, description=description, work=work, device=device)
            self._jobs[key] = job
            self._queue.put(key)
            self._ensure_worker()
            return job

    def get(self, key: str) -> Job | None:
        """The job submitted under ``key`` (queued, running or finished), or None if there is none."""
        with self._lock:
            return self._jobs.get(key)

    def find(self, description: Any) -> Job | None:
        """The job for ``description`` (same key as ``submit``), or None."""
        return self.get(job_key(description))

    def jobs(self) -> list[Job]:
        """All jobs this process has seen, oldest first."""
        with self._lock:
            return sorted(self._jobs.values(), key=lambda j: j.submitted)

    def position(self, key: str) -> int:
        """How many queued or running jobs are ahead of ``key`` (0 = it is next or running)."""
        with self._lock:
            job = self._jobs.get(key)
            if job is None or job.status != QUEUED:
                return 0
            return sum(1 for j in self._jobs.values() if j.status in (QUEUED, RUNNING) and j.submitted < job.submitted)

    def cancel(self, key: str) -> bool:
        """Ask the job to stop. A queued job is cancelled at once; a running one at its next
        ``should_stop()`` check. Returns False if there is no such unfinished job."""
        with self._lock:
            job = self._jobs.get(key)
            if job is None or job.status in FINISHED:
                return False
            job._cancel.set()
            if job.status == QUEUED:
                job.status, job.message, job.finished = CANCELLED, "cancelled before it started", time.time()
            return True

    def wait(self, key: str, timeout: float | None = None) -> Job | None:
        """Block until the job finishes or ``timeout`` seconds pass; returns the job."""
        end = None if timeout is None else time.time() + timeout
        while True:
            job = self.get(key)
            if job is None or job.status in FINISHED or (end is not None and time.time() >= end):
                return job
            time.sleep(0.05)

    # -- worker --------------------------------------------------------------------------------
    def _ensure_worker(self) -> None:
        if self._thread is None or not self._thread.is_alive():
            self._thread = threading.Thread(target=self._run_forever, name=self._name, daemon=True)
            self._thread.start()

    def _run_forever(self) -> None:
        while True:
            key = self._queue.get()
            with self._lock:
                job = self._jobs.get(key)
                if job is None or job.status != QUEUED:
                    continue
                job.status, job.started, job.message = RUNNING, time.time(), "starting"
            self._run(job)

    def _run(self, job: Job) -> None:
        def progress(done: int, total: int, message: str = "") -> None:
            job.done, job.total = int(done), int(total)
            if message:
                job.message = str(message)

        def should_stop() -> bool:
            return job.cancel_requested

        try:
            if self._worker is None:
                result = job.work(progress, should_stop)
            else:
                result = self._worker.run(job.work, progress, should_stop)
        except JobCancelled:
            job.status, job.message = CANCELLED, "cancelled"
        except WorkerDied as e:  # only this job is lost; the next one starts a fresh worker
            job.error = (
                f"{e}. What it finished is kept (evaluated lengths are cached). Run it again, with fewer "
                "lengths or checkpoints if memory ran out."
            )
            job.message, job.status, job.traceback_text = "failed", ERROR, None
        except BaseException as e:  # the job failed (even SystemExit in thread mode); the worker lives on
            job.error = f"{type(e).__name__}: {e}"
            job.message = "failed"
            job.status = ERROR
            job.traceback_text = getattr(e, "remote_traceback", None) or traceback.format_exc()
        else:
            job.result = result
            if job.cancel_requested:
                job.status, job.message = CANCELLED, "cancelled (partial result kept)"
            else:
                job.status, job.message = DONE, "finished"
        job.finished = time.time()


_QUEUES: dict[str, JobQueue] = {}
_QUEUES_LOCK = threading.Lock()


def default_queue(name: str = "evaluate") -> JobQueue:
    """The process-wide job queue called ``name`` (created on first use): every page and tab
    shares it. ``"evaluate"`` runs evaluations; ``"fit"`` runs FIRE fits, so a quick fit
    does not wait behind a long evaluation. Each queue has its own worker thread and computes in
    its own worker process, unless ``FIREVIZ_JOB_WORKER=thread`` (read when the queue is created).

    Raises: ValueError for a ``FIREVIZ_JOB_WORKER`` other than ``process`` or ``thread``.
    """
    with _QUEUES_LOCK:
        if name not in _QUEUES:
            mode = os.environ.get("FIREVIZ_JOB_WORKER", "process").strip() or "process"
            if mode not in ("process", "thread"):
                raise ValueError(f"FIREVIZ_JOB_WORKER must be 'process' or 'thread' (got {mode!r}); unset it")
            _QUEUES[name] = JobQueue(name=f"fireviz-{name}", process=mode == "process")
        return _QUEUES[name]


# -- evaluations ---------------------------------------------------------------------------------
def evaluation_description(
    checkpoints: Sequence[Checkpoint],
    settings: EvalSettings,
    cache: EvalCache | None = None,
    reference: int | str = 0,
) -> dict:
    """The description (hence the key) of an evaluation job.

    Args: ``checkpoints`` resolved once (``Checkpoint``: its ``sha256`` makes a retrained
      checkpoint a new job); ``settings`` built once (``EvalSettings.make``); ``cache`` and
      ``reference`` as ``fireviz.eval.evaluate``.
    Returns: ``{"kind": "evaluate", "checkpoints": [{"path", "sha256"}], "settings":
      settings.describe()}`` (+ ``"options"``: the cache and reference where they differ from the
      defaults): JSON-able, and equal for every spelling of one computation — ``device="auto"`` or
      ``"cpu"`` on a CPU machine, ``token_budget="auto"`` or its value, lengths in any order,
      ``batch_tokens`` or not.
    Raises: EvaluationError for a reference that is not an index, name or path.
    """
    reference = check_reference(reference)
    bad = [c for c in checkpoint_list(checkpoints) if not isinstance(c, (Checkpoint, CausalLMCheckpoint))]
    if bad:
        raise EvaluationError(
            f"an evaluation job takes Checkpoint objects (got {bad[0]!r}); resolve it once with Checkpoint.resolve"
        )
    options: dict[str, Any] = {}
    if reference != 0:
        options["reference"] = reference
    if cache is not None and cache != EvalCache():
        options["cache"] = {**asdict(cache), "folder": None if cache.folder is None else str(cache.folder)}
    out = {
        "kind": "evaluate",
        "checkpoints": [{"path": c.path, "sha256": c.sha256} for c in checkpoints],
        "settings": settings.describe(),
    }
    return {**out, "options": options} if options else out


def find_evaluation(
    checkpoints: Sequence[Checkpoint], settings: EvalSettings, cache: EvalCache | None = None, reference: int | str = 0
) -> Job | None:
    """The job ``submit_evaluation`` would return for these arguments, if it exists; never submits.

    Raises: as ``submit_evaluation``.
    """
    return default_queue("evaluate").find(evaluation_description(checkpoints, settings, cache, reference))


def submit_evaluation(
    checkpoints: Sequence[Checkpoint],
    settings: EvalSettings,
    cache: EvalCache | None = None,
    reference: int | str = 0,
    label_suffix: str = "",
    queue_: JobQueue | None = None,
) -> Job:
    """Run ``fireviz.eval.evaluate`` in the background (or return the job already doing it).

    Args: ``checkpoints``, ``settings``, ``cache``, ``reference`` as ``evaluation_description``;
      ``label_suffix`` is appended to each result's ``label`` (= checkpoint name), e.g.
      " + yarn". (What is already cached, without computing: ``fireviz.eval.lookup``, a direct
      call.) One computation is one job, however its settings are spelled.
    Returns: the :class:`Job`; its result is ``evaluate``'s list of results (one per
      checkpoint, each with ``label``, ``per_length`` and ``device``). Evaluate writes each
      finished length into its cache, so after a cancel or a server restart those lengths
      are not computed again.
    Raises: EvaluationError for a bad reference or not a list of Checkpoint objects, before
      anything is queued.
    """
    checkpoints = list(checkpoint_list(checkpoints))
    description = evaluation_description(checkpoints, settings, cache, reference)
    work = functools.partial(_evaluation_work, checkpoints, settings, cache, reference, label_suffix)
    return (queue_ or default_queue("evaluate")).submit(
        description, work, label="evaluation" + label_suffix, device=str(settings.device)
    )


def _evaluation_work(checkpoints, settings, cache, reference, label_suffix, progress, should_stop) -> list:
    """The work of ``submit_evaluation`` (module level, so a worker process can run it)."""
    try:
        results = evaluate(
            checkpoints, settings, cache=cache, reference=reference, progress=progress, should_stop=should_stop
        )
    except EvaluationCancelled:
        raise JobCancelled() from None
    for r in results:
        r["label"] = f"{r['checkpoint']}{label_suffix}"
    return results


# -- attention dilution ---------------------------------------------------------------------------
def dilution_description(
    checkpoints: list[Checkpoint],
    source: str,
    query_positions: list[int],
    near: int,
    rows: int = 8,
    normalizer_cap: int | None = None,
    rope_scaling: str | None = None,
) -> dict:
    """The description (hence the key) of a ``submit_dilution`` job (``rope_scaling``: published
    models measured with it as well); the checkpoints' identities
    (``Checkpoint.sha256``) make a retrained checkpoint a new job; the settings are
    ``DilutionSettings.describe()`` (validated, positions sorted). Raises: ValueError for bad settings."""

    settings = DilutionSettings.make(query_positions, near=near, rows=rows, normalizer_cap=normalizer_cap)
    return {
        "kind": "dilution",
        "checkpoints": [{"path": c.path, "sha256": c.sha256} for c in checkpoints],
        "source": str(source),
        **settings.describe(),
        **({"rope_scaling": rope_scaling} if rope_scaling else {}),
    }


def submit_dilution(
    checkpoints: list[Checkpoint],
    tokens,
    source: str,
    query_positions: list[int],
    near: int,
    rows: int = 8,
    normalizer_cap: int | None = None,
    queue_: JobQueue | None = None,
    rope_scaling: str | None = None,
) -> Job:
    """Measure ``fireviz.analysis.text_attention.attention_dilution`` for each checkpoint in the background
    (the "evaluate" queue), plain and — for FIRE checkpoints when ``normalizer_cap`` is set —
    with the normalizer capped; each result is cached on disk
    (``text_attention.cached_attention_dilution``), so a finished measurement is never repeated.

    Args: ``checkpoints`` resolved once by the page; ``tokens`` LongTensor ``[T]`` of the text; ``source`` a name of
      the text for the job's key (e.g. ``"prose:validation:<doc id>"`` or an upload's content
      hash); ``query_positions`` (tokens); ``near`` keys counted as near.
    Returns: the :class:`Job`; its result is a list of ``DilutionResult.to_dict()``.
    Raises: ValueError for bad settings (before queueing).
    """
    description = dilution_description(checkpoints, source, query_positions, near, rows, normalizer_cap, rope_scaling)
    work = functools.partial(
        _dilution_work, list(checkpoints), tokens, list(query_positions), near, rows, normalizer_cap, rope_scaling
    )
    return (queue_ or default_queue("evaluate")).submit(description, work, label="attention dilution")


def _dilution_work(
    checkpoints, tokens, query_positions, near, rows, normalizer_cap, rope_scaling, progress, should_stop
) -> list:
    """The work of ``submit_dilution`` (module level, so a worker process can run it)."""
    out = []
    plan: list[tuple[Checkpoint, int | None, str | None]] = [(c, None, None) for c in checkpoints]
    if normalizer_cap:  # capped rows for FIRE checkpoints only (their config says which)
        plan += [(c, int(normalizer_cap), None) for c in checkpoints if has_normalizer(c.config.position_encoding)]
    if rope_scaling:  # scaled rows for published RoPE models only
        plan += [(c, None, rope_scaling) for c in checkpoints if c.kind != "fireviz" and c.config.rope_scalable]
    for k, (ckpt, cap, scaling) in enumerate(plan):
        if should_stop():
            raise JobCancelled()
        progress(k, len(plan), ckpt.name + (f" (cap {cap})" if cap else "") + (f" + {scaling}" if scaling else ""))
        out.append(
            text_attention.cached_attention_dilution(
                ckpt, tokens, query_positions, near=near, rows=rows, normalizer_cap=cap, rope_scaling=scaling
            )
        )
    progress(len(plan), len(plan), "done")
    return out


# -- FIRE fits ----------------------------------------------------------------------------------
def _fit_job(target, target_params, max_len, num_heads, mlp_width, steps, seed):
    """(validated ``fit.FitSettings``, job description): the settings' own description is the key
    (a checkpoint target's parameters carry its identity, a published model's its bias's hash,
    so a retrained checkpoint is a new fit)."""

    settings = fit.FitSettings.make(target, max_len, num_heads, mlp_width, steps, seed, target_params=target_params)
    return settings, {"kind": "fit", **settings.describe()}


def find_fit(
    target: str, target_params: dict, max_len: int, num_heads: int | None, mlp_width: int, steps: int, seed: int = 0
) -> Job | None:
    """The job ``submit_fit`` would return for these arguments, if this server has it; never submits
    (a shared link opens on its finished fit). Raises: as ``submit_fit``."""
    _, description = _fit_job(target, target_params, max_len, num_heads, mlp_width, steps, seed)
    return default_queue("fit").find(description)


def submit_fit(
    target: str,
    target_params: dict,
    max_len: int,
    num_heads: int | None,
    mlp_width: int,
    steps: int,
    seed: int = 0,
    queue_: JobQueue | None = None,
) -> Job:
    """Run ``fireviz.fit.fitting.fit_fire`` in the background on the "fit" queue (or return the job
    already fitting exactly this).

    Args: ``target`` in ``fireviz.fit.targets.target_names()`` with ``target_params`` for
      ``make_target`` (for ``checkpoint``: ``path`` and ``layer``; num_heads is then None);
      ``max_len`` fitted range (tokens); ``mlp_width``, ``steps``, ``seed`` as ``fit_fire``.
    Returns: the :class:`Job`. Progress counts optimisation steps; the message carries the
      loss. Cancelling ends the fit early with the best parameters so far: the job then ends
      ``cancelled`` and still holds a complete ``FitResult`` (``stopped=True``).
    Raises: ValueError from ``fit.FitSettings.make`` for bad parameters (before queueing, so the
      page can show it at once); CheckpointError for a bad checkpoint target.
    """

    settings, description = _fit_job(target, target_params, max_len, num_heads, mlp_width, steps, seed)
    work = functools.partial(_fit_work, settings)
    return (queue_ or default_queue("fit")).submit(description, work, label=f"fit FIRE to {target}")


def _fit_work(settings, progress, should_stop):
    """The work of ``submit_fit`` (module level, so a worker process can run it)."""

    def on_step(step: int, total: int, loss: float) -> None:
        progress(step, total, f"step {step}/{total} · loss {loss:.3g} (mean (RMSE/std)² over heads)")

    def on_start(done: int, total: int) -> None:  # the closed-form start: shown, and Stop works there too
        progress(0, settings.steps, f"closed-form start: candidate c {done}/{total}")

    return fit.run_fit(settings, progress=on_step, should_stop=should_stop, start_progress=on_start)
