"""Background jobs in a page: the progress panel, evaluations run (once) in the background, captions."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

import streamlit as st

from fireviz.checkpoints import CausalLMCheckpoint, Checkpoint
from fireviz.eval import PUBLISHED_RESULTS, EvalSettings, EvaluationError, lookup
from fireviz.model import CheckpointError
from fireviz.plots.presentation import job_error_text
from fireviz.ui import jobs
from fireviz.ui.state import error, key, plain


def job_panel(job_key: str, queue_name: str, page: str, cancel_label: str | None = "Stop", poll_s: float = 0.5) -> None:
    """Live status of a background job: a progress bar, its message, a cancel button
    (none if ``cancel_label`` is None).

    Runs as an ``st.fragment`` re-run every ``poll_s`` seconds while the job is queued or
    running; when it finishes it reruns the whole page, which then draws the result. Call
    it only for an unfinished job.

    The cancel button only asks the job to stop (its panel then says "stopping"); the page is
    rerun by the poll that finds the job finished, never while the job still runs. A whole-page
    rerun while the poll's timer is armed can lose the timer in Streamlit (1.67): a poll that
    arrives just as that run ends starts a new script runner, the finished run's last messages —
    the timer's re-arming among them — are dropped, and the page stays on its progress bar. A
    rerun for a finished job draws no panel, so nothing is lost there.
    """

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
                f"{plain(snap['label'])}: queued ({ahead} job(s) ahead). It runs in the background: reloading "
                "the page or opening it in another tab finds it here."
            )
        stopping = job.cancel_requested  # read once: the text and the button agree
        said = " · stopping: what it finished is shown when it ends" if stopping else ""
        text = f"{plain(snap['label'])}: {plain(snap['message'])} · {snap['elapsed_s']:.0f} s{said}"
        st.progress(snap["fraction"], text=text)
        if cancel_label:
            st.button(
                cancel_label,
                key=key(page, f"cancel_{job_key}"),
                on_click=q.cancel,  # before this run draws, so the text above already says "stopping"
                args=(job_key,),
                disabled=stopping,
            )

    _panel()


@dataclass(frozen=True)
class EvalSpec:
    """One evaluation a page asks for: checkpoints resolved once, settings built once, and the
    suffix its rows' labels get (``" + yarn"``, ``" cap 512"``)."""

    checkpoints: tuple[Checkpoint, ...]
    settings: EvalSettings
    suffix: str = ""


def eval_spec(checkpoints: Sequence[Checkpoint], data: str, lengths, suffix: str = "", **settings) -> EvalSpec | None:
    """The :class:`EvalSpec` of a page's choices: ``EvalSettings.make(data, lengths, **settings)``,
    built once here. Settings that cannot be evaluated are said (problem and fix) and give None."""
    try:
        return EvalSpec(tuple(checkpoints), EvalSettings.make(data, lengths, **settings), suffix)
    except EvaluationError as e:  # settings that cannot be evaluated: refused before anything is queued
        error(f"Cannot evaluate these settings: {e}", "Change them in the sidebar.")
        return None


def resolve_checkpoints(infos: Sequence) -> dict[str, Checkpoint | CausalLMCheckpoint]:
    """``{folder: Checkpoint}`` of the picked checkpoints (``CheckpointInfo``; a published causal LM:
    a ``CausalLMCheckpoint``), each resolved once per run. One that cannot be read is said (its
    problem and the fix) and left out: it fails alone."""
    out: dict[str, Checkpoint | CausalLMCheckpoint] = {}
    for i in infos:
        try:
            out[i.path] = CausalLMCheckpoint.resolve(i.path) if i.is_causal_lm else Checkpoint.resolve(i.path)
        except CheckpointError as e:  # its message names the problem and the fix
            error(f"Cannot read a checkpoint: {e}")
    return out


def _cached(spec: EvalSpec):
    """``(labelled results, None)`` of ``fireviz.eval.lookup`` — what is already in the cache,
    nothing computed — or ``([], error text)`` as a failed job would have it."""

    try:
        results = lookup(spec.checkpoints, spec.settings)
    except (CheckpointError, ValueError, OSError) as e:  # DataError, EvaluationError, NonFiniteLossError
        return [], f"{type(e).__name__}: {e}"
    return [{**r, "label": f"{r['checkpoint']}{spec.suffix}"} for r in results], None


def _show_failure(error_text: str) -> None:
    text, bad_checkpoint = job_error_text(error_text)
    if bad_checkpoint:
        error(f"Cannot evaluate: {text}")
    else:
        error(f"The evaluation failed: {text}", "Change the settings (lengths, stride, data) and run again.")


def evaluation_jobs(page: str, specs: Sequence[EvalSpec], run: bool) -> tuple[list[dict], list, list]:
    """The background evaluations behind the Length generalization page, one per spec.

    For each :class:`EvalSpec`: the job with these checkpoints and settings in this process
    (``jobs.find_evaluation``); with ``run`` (the Run button) a missing, failed or cancelled job is
    submitted. Settings with no job here, or whose job was cancelled, show what is already cached
    (``fireviz.eval.lookup``, a direct call that computes nothing: published numbers, earlier
    runs, a cancelled run's finished lengths). Errors and cancellations are shown (problem and
    fix); unfinished jobs get a live ``job_panel``. Returns ``(results of finished jobs and cache
    lookups, unfinished jobs, cancelled jobs)`` — a page says nothing more about a cancelled job's
    settings (the warning here says what was kept).
    """

    results, pending, cancelled = [], [], []
    for spec in specs:
        job = jobs.find_evaluation(spec.checkpoints, spec.settings)
        if run and (job is None or job.status in (jobs.ERROR, jobs.CANCELLED)):
            job = jobs.submit_evaluation(spec.checkpoints, spec.settings, label_suffix=spec.suffix)
        failure = None
        if job is None or job.status == jobs.CANCELLED:
            found, failure = _cached(spec)
            results += found
            if job is not None:
                cancelled.append(job)
                st.warning(_cancelled_text(found))
        elif job.status not in jobs.FINISHED:
            pending.append(job)
        elif job.status == jobs.ERROR:
            failure = job.error
        else:
            results += job.result
        if failure:
            _show_failure(failure)
    for job in pending:
        job_panel(job.key, "evaluate", page, cancel_label="Cancel")
    return results, pending, cancelled


def _cancelled_text(found: Sequence[dict]) -> str:
    """What a cancelled evaluation left: the lengths drawn below, or nothing."""
    done = sorted(
        {e["length"] for r in found for e in r.get("per_length", []) if not e.get("not_computed") and "error" not in e}
    )
    if not done:
        return "The evaluation was cancelled before any length finished, so nothing is drawn. Press **Run** to start it again."
    return (
        f"The evaluation was cancelled; the lengths it finished ({', '.join(map(str, done))} tokens) are drawn below. "
        "Press **Run** to go on."
    )


def eval_caption(results: Sequence[dict]) -> str:
    """The evaluation settings and the device that ran them, as one caption line (plain text:
    its values come from results that may have been read from a file)."""
    return plain(_eval_caption(results))


def _eval_caption(results: Sequence[dict]) -> str:
    if not results:
        return ""
    s = results[0].get("settings", {})
    parts = [f"data {Path(str(s.get('data'))).name} ({s.get('split')} split, {s.get('documents')} documents)"]
    own = [r for r in results if any("bytes_scored" in e for e in r.get("per_length", []))]
    if s.get("bos_mode"):
        parts.append(f"BOS: {s.get('bos_mode')}")
    if own and s.get("mode") == "same_text":  # tokenizers of their own: one text in bytes
        parts.append(
            f"same text at every length and for every checkpoint: of {s.get('documents_scored')} documents, the "
            f"bytes the first {s.get('prefix_tokens')} tokens cover in the tokenizer where they cover the most "
            f"({s.get('documents_skipped')} shorter ones skipped"
            + (f"; drawn with seed {s.get('seed')}" if s.get("token_budget") else "")
            + "); lengths in each checkpoint's own tokens; curves per byte (perplexity = 2^bits per byte)"
        )
        per_byte = []
        for r in own:
            e = next((e for e in r["per_length"] if "tokens_per_byte" in e), None)
            if e is not None:
                per_byte.append(f"{r.get('label') or r['checkpoint']} {e['tokens_per_byte']:.3f}")
        parts.append("tokens per byte: " + ", ".join(per_byte) + " (fireviz checkpoints: 1)")
    elif s.get("mode") == "same_text":
        parts.append(
            f"same text at every length: the first {s.get('prefix_tokens')} tokens of "
            f"{s.get('documents_scored')} documents ({s.get('documents_skipped')} shorter ones skipped"
            + (f"; drawn with seed {s.get('seed')}" if s.get("token_budget") else "")
            + ")"
        )
    elif s.get("mode") == "context":
        parts.append(
            f"context use: the last {s.get('context_targets')} of the first {s.get('prefix_tokens')} tokens of "
            f"{s.get('documents_scored')} documents ({s.get('documents_skipped')} shorter ones skipped"
            + (f"; drawn with seed {s.get('seed')}" if s.get("token_budget") else "")
            + f"), the same targets at every context length c, each with c … c + {(s.get('stride') or 1) - 1} "
            f"tokens before it; full = {s.get('full_context')}: the whole prefix"
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
    caps = sorted({r["normalizer_cap"] for r in results if r.get("normalizer_cap")})
    if caps:
        parts.append("FIRE normalizer capped at " + ", ".join(str(c) for c in caps) + " tokens where labelled")
    devices = sorted({str(r.get("device")) for r in results})
    parts.append("device " + ", ".join(devices))
    entries = [e for r in results for e in r.get("per_length", [])]

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
