"""Background jobs in a page: the progress panel, evaluations run (once) in the background, captions."""

from __future__ import annotations

from pathlib import Path
from typing import Sequence

import streamlit as st

from ..model import CheckpointError
from ..presentation import job_error_text
from .state import error, key


def job_panel(job_key: str, queue_name: str, page: str, cancel_label: str | None = "Stop", poll_s: float = 0.5) -> None:
    """Live status of a background job: a progress bar, its message, a cancel button
    (none if ``cancel_label`` is None).

    Runs as an ``st.fragment`` re-run every ``poll_s`` seconds while the job is queued or
    running; when it finishes it reruns the whole page, which then draws the result. Call
    it only for an unfinished job.
    """
    from .. import jobs

    q = jobs.default_queue(queue_name)

    @st.fragment(run_every=poll_s)
    def _panel():
        job = q.get(job_key)
        if job is None:
            return
        snap = job.snapshot()
        if snap["status"] in jobs.FINISHED:
            st.rerun(scope="app")  # the page draws finished jobs itself (and shows no panel)
        if snap["status"] == jobs.QUEUED:
            ahead = q.position(job_key)
            st.info(
                f"{snap['label']}: queued ({ahead} job(s) ahead). It runs in the background: reloading "
                "the page or opening it in another tab finds it here."
            )
        text = f"{snap['label']}: {snap['message']} · {snap['elapsed_s']:.0f} s"
        st.progress(snap["fraction"], text=text)
        if cancel_label and st.button(cancel_label, key=key(page, f"cancel_{job_key}")):
            q.cancel(job_key)
            st.rerun(scope="app")

    _panel()


def _cancelled_at(paths, data, lengths, settings) -> float:
    """When the (non-probe) evaluation with these arguments ended, or 0."""
    from .. import jobs

    job = jobs.find_evaluation(paths, data, lengths, settings)
    return (job.finished or 0.0) if job is not None else 0.0


def evaluation_jobs(
    page: str, specs: Sequence[tuple[list[str], dict, str]], data: str, lengths: Sequence[int], run: bool
) -> tuple[list[dict], list]:
    """The background evaluations behind the Length generalization page, one per spec.

    ``specs``: ``(checkpoint paths, evaluate settings, label suffix)`` or, with lengths of its own
    (instead of ``lengths``), ``(paths, settings, suffix, lengths)``. For each: the job with
    these arguments in this process (``jobs.find_evaluation``), else a cache-only probe that
    computes nothing; with ``run`` (the Run button) a missing, failed or cancelled job is
    submitted. Errors and cancellations are shown (problem and fix); unfinished jobs get a
    live ``job_panel``. Returns ``(results of finished jobs, unfinished jobs)``; stops the
    page (``st.stop``) when a checkpoint cannot be read.
    """
    from .. import jobs

    results, pending = [], []
    specs = [(spec[0], spec[1], spec[2], spec[3] if len(spec) > 3 else lengths) for spec in specs]
    try:  # this page's own probes must not cancel one another (RoPE + PI + YaRN + capped FIRE)
        keep = {jobs.evaluation_key(paths, data, lens, s, probe=True) for paths, s, _, lens in specs}
    except CheckpointError as e:  # its message names the problem and the fix
        error(f"Cannot read a checkpoint: {e}")
        st.stop()
    for paths, s, suffix, lengths in specs:
        try:
            job = jobs.find_evaluation(paths, data, lengths, s)
            if run and (job is None or job.status in (jobs.ERROR, jobs.CANCELLED)):
                job = jobs.submit_evaluation(paths, data, lengths, s, label_suffix=suffix)
        except CheckpointError as e:  # its message names the problem and the fix
            error(f"Cannot read a checkpoint: {e}")
            st.stop()
        if job is None or job.status == jobs.CANCELLED:
            # never run in this process, or cancelled: look in the on-disk cache without computing
            # (a cancelled run's finished lengths are there)
            was_cancelled = job is not None
            job = jobs.find_evaluation(paths, data, lengths, s, probe=True)
            if (
                job is None
                or job.status == jobs.CANCELLED
                or (was_cancelled and job.status == jobs.DONE and job.finished < _cancelled_at(paths, data, lengths, s))
            ):
                # none yet, cancelled before it looked (by a probe of other settings), or older than
                # the cancelled run's last cached length: look now
                job = jobs.submit_evaluation(paths, data, lengths, s, label_suffix=suffix, probe=True, keep=keep)
            if was_cancelled:
                st.warning(
                    "The evaluation was cancelled; the lengths it finished are drawn below. Press **Run** to go on."
                )
        if job.status not in jobs.FINISHED:
            pending.append(job)
        if job.status == jobs.ERROR:
            text, bad_checkpoint = job_error_text(job.error)
            if bad_checkpoint:
                error(f"Cannot evaluate: {text}")
            else:
                error(f"The evaluation failed: {text}", "Change the settings (lengths, stride, data) and run again.")
        elif job.status == jobs.DONE:
            results += job.result
    for job in pending:
        queue_name = "probe" if job.description.get("probe") else "evaluate"
        job_panel(job.key, queue_name, page, cancel_label=None if queue_name == "probe" else "Cancel")
    return results, pending


def eval_caption(results: Sequence[dict]) -> str:
    """The evaluation settings and the device that ran them, as one caption line."""
    if not results:
        return ""
    s = results[0].get("settings", {})
    parts = [f"data {Path(str(s.get('data'))).name} ({s.get('split')} split, {s.get('documents')} documents)"]
    if s.get("mode") == "same_text":
        parts.append(
            f"same text at every length: the first {s.get('prefix_tokens')} tokens of "
            f"{s.get('documents_scored')} documents ({s.get('documents_skipped')} shorter ones skipped"
            + (f"; drawn with seed {s.get('seed')}" if s.get("token_budget") else "")
            + ")"
        )
    else:
        parts += [
            f"mode {s.get('mode')}" + (f", stride {s.get('stride')}" if s.get("stride") else ""),
            f"token budget {s.get('token_budget')} per length",
            f"window seed {s.get('seed')}",
        ]
    parts.append(f"precision {s.get('precision')}")
    first = {e.get("length"): e for e in results[0].get("per_length", []) if "error" not in e}
    if first:
        parts.append(
            "scored per length: "
            + ", ".join(
                f"{n}: {e.get('documents', '?')} docs / {e.get('windows')} windows / {e.get('tokens_scored'):,} tokens"
                for n, e in sorted(first.items())
            )
        )
    caps = sorted({r.get("normalizer_cap") for r in results if r.get("normalizer_cap")})
    if caps:
        parts.append("FIRE normalizer capped at " + ", ".join(str(c) for c in caps) + " tokens where labelled")
    devices = sorted({str(r.get("device")) for r in results})
    parts.append("device " + ", ".join(devices))
    entries = [e for r in results for e in r.get("per_length", [])]
    from ..eval_cache import PUBLISHED_RESULTS

    published = sum(1 for e in entries if e.get("cached") and e.get("source") == PUBLISHED_RESULTS)
    cached = sum(1 for e in entries if e.get("cached")) - published
    parts.append(
        f"{cached}/{len(entries)} lengths from the cache"
        + (
            f", {published} from the checkpoints' shipped results.json (same weights, data and settings)"
            if published
            else ""
        )
    )
    return "Evaluation: " + " · ".join(parts) + ". Lengths in tokens (bytes); dashed = training length."
