"""Perplexity versus evaluation length: the length-generalization curve of a checkpoint.

An evaluation is fully described by its settings (``fireviz.eval.settings.EvalSettings``:
data + split, lengths, mode, stride, token budget, seed, RoPE scaling, BOS convention,
loss-by-position buckets, numeric precision, FIRE's normalizer cap). Every result carries
them, and results are cached on disk under a key made of the checkpoint's sha256, the data
fingerprint and those settings (``fireviz.eval.cache``). A checkpoint folder's own
``results.json`` (the shipped numbers) serves as a read-only cache under the same key.
``evaluate_many`` computes what is missing; ``cached_results`` only looks (nothing computed,
no weights scored: what a page shows without a click).

The pieces: the text and its windows per length (``fireviz.eval.plan`` over
``fireviz.eval.windows``: the same-text, context-use, non-overlapping and sliding protocols), the device,
attention path and memory checks (``fireviz.eval.device``), progress and cancellation
(``fireviz.eval.progress``), the scoring (``fireviz.eval.scoring``), intervals and paired
differences (``fireviz.eval.stats``), zero-shot RoPE scaling and the cap (``fireviz.eval.variants``);
the command line (``python -m fireviz eval``) is ``fireviz.cli.eval``. The names a caller of
the evaluation needs (its defaults, modes, errors) can be imported from here; the rest from
the modules that define them. Units: tokens = bytes, loss in nats per token, bits per byte =
nats / ln 2.
"""

from __future__ import annotations

import math
import os
import threading
import time
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable, Sequence, cast

import numpy as np
import torch

from fireviz import __version__
from fireviz.checkpoints import CausalLMCheckpoint, Checkpoint, resolve_any
from fireviz.checkpoints.causal_lm import HF_ROPE_SCALINGS
from fireviz.core import write_json_atomic
from fireviz.core.distributed import init_distributed
from fireviz.data.tokenizers import BYTE_TOKENIZER, bos_description
from fireviz.encodings import fire_modules
from fireviz.eval.cache import EvalCache, _lookup, cache_key, entry_mac, published_results
from fireviz.eval.device import device_name, memory_refusals, use_flex
from fireviz.eval.plan import Plan, plan_text, plan_tokenized, targets

# what a caller of the evaluation needs besides the above, importable from here (pages, scripts)
from fireviz.eval.progress import (
    EvaluationCancelled,  # noqa: F401
    Progress,
    ProgressFn,
    StopFn,
)
from fireviz.eval.results import EvalResult, LengthEntry
from fireviz.eval.scoring import score_windows, summarize
from fireviz.eval.settings import (
    DEFAULT_LENGTHS,  # noqa: F401
    SYNTHETIC_SEQUENCES,  # noqa: F401
    EvalSettings,
    check_setting_names,
    checkpoint_list,
)
from fireviz.eval.stats import (
    _reference_index,
    bootstrap_ratio_ci95,
    with_full_context_differences,
    with_paired_differences,
)
from fireviz.eval.variants import (
    ROPE_SCALINGS,
    apply_normalizer_cap,
    rope_scaled_model,
)
from fireviz.eval.windows import (
    MODES,  # noqa: F401
    EvaluationError,
    Window,
)
from fireviz.model import GPT, GPTConfig, nonfinite_parameters

#: ``error`` of a length ``cached_results`` found no result for (the entry also has ``not_computed``)
NOT_COMPUTED = "not computed yet"


class NonFiniteLossError(EvaluationError):
    """A checkpoint's loss is NaN/inf: reported (naming the non-finite weights, if any), never
    cached or shown as a number; the CLI exits non-zero."""


@dataclass
class _Loaded:
    """A checkpoint as evaluated: the :class:`Checkpoint`, the normalizer cap in effect (FIRE only)
    and, when it is scored, the model (None for a cache lookup)."""

    ckpt: Any  # a Checkpoint or a CausalLMCheckpoint (the same interface)
    cap: int | None
    model: GPT | None = None
    #: the text as this checkpoint's tokenizer reads it (set by ``_prepare``)
    plan: Plan | None = None

    @property
    def name(self) -> str:
        return self.ckpt.name

    @property
    def config(self) -> GPTConfig:
        return self.ckpt.config


#: per checkpoint identity (sha256 of its weights and config, which fixes both): the names of
#: its non-finite weights, and whether its model has FIRE modules (the cap applies)
_NONFINITE: dict[str, list[str]] = {}
_HAS_FIRE: dict[str, bool] = {}
_MEMO_LOCK = threading.Lock()


def _refuse_nonfinite(name: str, bad: list[str]) -> None:
    """Raises: NonFiniteLossError naming the first non-finite weights, if ``bad`` names any."""
    if bad:  # no number for such weights, not even a cached or published one
        raise NonFiniteLossError(
            f"{name}: the weights contain NaN/inf in "
            f"{', '.join(bad[:3])}{' …' if len(bad) > 3 else ''}, so every loss is NaN; "
            "restore or retrain the checkpoint (nothing was evaluated or cached)"
        )


def _check_scaling(ckpt: Checkpoint, s: EvalSettings) -> None:
    """Raises: EvaluationError for RoPE scaling asked of a checkpoint that is not RoPE, or a
    scaling its kind does not take (``ROPE_SCALINGS`` for fireviz, ``HF_ROPE_SCALINGS`` and pi
    for a published model)."""
    if s.rope_scaling is not None:
        kinds = ROPE_SCALINGS if ckpt.kind == "fireviz" else HF_ROPE_SCALINGS + ("pi",)
        if s.rope_scaling not in kinds:
            raise EvaluationError(
                f"rope_scaling={s.rope_scaling!r} does not apply to {ckpt.path} ({ckpt.kind} checkpoint); "
                f"it takes {', '.join(kinds)}"
            )
    cfg: Any = ckpt.config  # a published model's CausalLMConfig says whether its RoPE can be scaled
    if s.rope_scaling is not None and ckpt.kind != "fireviz" and not cfg.rope_scalable:
        raise EvaluationError(
            f"rope_scaling={s.rope_scaling!r} does not apply to {ckpt.path}: "
            + (
                f"its {cfg.model_type} code builds a fixed rotary table without rope_parameters"
                if ckpt.config.position_encoding == "rope"
                else f"it uses position_encoding={ckpt.config.position_encoding!r}, not RoPE (needs a RoPE model)"
            )
        )
    if s.rope_scaling == "longrope" and ckpt.kind != "fireviz":
        rope = cfg.raw.get("rope_parameters") or cfg.raw.get("rope_scaling") or {}
        if not (isinstance(rope, dict) and rope.get("short_factor") and rope.get("long_factor")):
            raise EvaluationError(
                f"rope_scaling='longrope' needs the model's own short_factor and long_factor (Phi-3 ships them); "
                f"{ckpt.path} has none — use yarn, dynamic, linear or llama3"
            )
    if s.rope_scaling is not None and ckpt.config.position_encoding != "rope":
        raise EvaluationError(
            f"rope_scaling={s.rope_scaling!r} needs a RoPE checkpoint; {ckpt.path} uses "
            f"position_encoding={ckpt.config.position_encoding!r}: evaluate only RoPE checkpoints with "
            "--rope-scaling (scripts/publish_results.py pairs the scaled rows with a reference of "
            "another encoding on the same text)"
        )


def _reference(loaded: list[_Loaded], reference) -> int:
    """The index of the ``reference`` checkpoint (index, name or path) among ``loaded``, checked
    before any scoring. Raises: EvaluationError."""
    reference = check_reference(reference)
    return _reference_index([{"checkpoint": c.name, "checkpoint_path": c.ckpt.path} for c in loaded], reference)


def check_reference(reference) -> int | str:
    """``reference`` (a checkpoint's index, name or path; a numpy integer as an int), checked before
    anything is queued or scored. Raises: EvaluationError for anything else."""
    if isinstance(reference, np.integer):
        reference = int(reference)
    if isinstance(reference, bool) or not isinstance(reference, (int, str)):
        raise EvaluationError(f"reference must be a checkpoint's index, name or path (got {reference!r})")
    return reference


def _checkpoints(checkpoints: Sequence[Checkpoint]) -> list[Checkpoint]:
    """``checkpoints`` as a list of :class:`Checkpoint`. Raises: EvaluationError for none, a single
    one where a list belongs, or anything that is not a resolved Checkpoint (resolve references at
    the edge: ``Checkpoint.resolve``)."""
    out = checkpoint_list(checkpoints)
    bad = [c for c in out if not isinstance(c, (Checkpoint, CausalLMCheckpoint))]
    if bad:
        raise EvaluationError(
            f"evaluate takes Checkpoint objects (got {bad[0]!r}); resolve a name or folder once with "
            "fireviz.checkpoints.Checkpoint.resolve, or call evaluate_many, which does"
        )
    return out


def _load_checkpoints(checkpoints: list[Checkpoint], s: EvalSettings) -> list[_Loaded]:
    """Every checkpoint loaded and checked before any scoring (a bad one fails at once); the weights
    are exactly the bytes its identity names (``Checkpoint.load``)."""
    loaded = []
    for ckpt in checkpoints:
        _check_scaling(ckpt, s)
        model = ckpt.load()
        bad = nonfinite_parameters(model)
        with _MEMO_LOCK:
            _NONFINITE[ckpt.sha256] = bad
        _refuse_nonfinite(ckpt.name, bad)
        cap = apply_normalizer_cap(model, s.normalizer_cap)
        loaded.append(_Loaded(ckpt, cap, model))
    return loaded


def _describe_checkpoints(checkpoints: list[Checkpoint], s: EvalSettings) -> list[_Loaded]:
    """Every checkpoint with the normalizer cap in effect, its weights not read (for a cache lookup).
    Raises: EvaluationError for RoPE scaling of a checkpoint that is not RoPE."""
    described = []
    for ckpt in checkpoints:
        _check_scaling(ckpt, s)
        cap = None
        if (
            s.normalizer_cap is not None and ckpt.kind == "fireviz"
        ):  # the cap counts where the model has FIRE modules (apply_normalizer_cap)
            with _MEMO_LOCK:
                has_fire = _HAS_FIRE.get(ckpt.sha256)
            if has_fire is None:
                with torch.device("meta"):  # the structure only: nothing is allocated, no weights are read
                    has_fire = bool(fire_modules(GPT(ckpt.config)))
                with _MEMO_LOCK:
                    _HAS_FIRE[ckpt.sha256] = has_fire
            cap = s.normalizer_cap if has_fire else None
        described.append(_Loaded(ckpt, cap))
    return described


def _weights_are_finite(c: _Loaded) -> None:
    """Raises: NonFiniteLossError if ``c``'s weights hold NaN/inf (read once per checkpoint identity);
    CheckpointError if its files changed since it was resolved."""
    with _MEMO_LOCK:
        bad = _NONFINITE.get(c.ckpt.sha256)
    if bad is None:
        bad = nonfinite_parameters(c.ckpt.load())  # refuses files changed since their identity was read
        with _MEMO_LOCK:
            _NONFINITE[c.ckpt.sha256] = bad
    _refuse_nonfinite(c.name, bad)


def _unscorable(c: _Loaded, n: int, windows: list[Window] | str, tokens: int | None = None) -> str | None:
    """Why length ``n`` cannot be evaluated for ``c`` (no windows, beyond absolute position embeddings), or None.
    ``tokens``: what the model reads at once there (``Plan.read_tokens``; default ``n``)."""
    if isinstance(windows, str):
        return windows
    tokens = n if tokens is None else tokens
    if c.config.absolute_position_embedding and tokens > c.config.seq_len:
        what = f"length {n}" if tokens == n else f"context length {n} (windows of {tokens} tokens)"
        return f"absolute position embeddings cover {c.config.seq_len} tokens; {what} cannot be evaluated"
    return None


def _length_key(c: _Loaded, s: EvalSettings, plan: Plan, n: int, report) -> tuple[dict, str, bool]:
    """``(length settings, cache key, FlexAttention used)`` of checkpoint ``c`` at length ``n``."""
    flex = use_flex(s.device, plan.read_tokens(n), report) if c.ckpt.kind == "fireviz" else False
    length_settings = s.length_settings(n, plan.prefix_tokens(), c.cap, flex)
    if plan.text_key:  # a text shared with other tokenizers (or another BOS): its own key
        length_settings["text"] = plan.text_key
    return length_settings, cache_key(c.ckpt.sha256, plan.fingerprint, length_settings), flex


def _result(c: _Loaded, s: EvalSettings, plan: Plan, per_length: list[LengthEntry], seconds: float) -> EvalResult:
    """One checkpoint's result (see ``evaluate_checkpoint``), paired differences not yet added."""
    out = {
        "checkpoint": c.name,
        "checkpoint_path": c.ckpt.path,
        "checkpoint_sha256": c.ckpt.sha256,
        "position_encoding": c.config.position_encoding,
        "train_seq_len": c.config.seq_len,
        "settings": s.record(plan),
        "data_fingerprint": plan.fingerprint,
        "fireviz_version": __version__,
        "device": device_name(s.device),
        "seconds": seconds,
        "normalizer_cap": c.cap,
        "per_length": per_length,
    }
    if c.ckpt.kind != "fireviz":  # a published model: its kind and model type (its own tokenizer)
        out["checkpoint_kind"] = c.ckpt.kind
        out["model_type"] = getattr(c.config, "model_type", None)
    if c.ckpt.tokenizer is not BYTE_TOKENIZER or s.bos_mode is not None:  # the BOS this checkpoint was scored with
        tokenizer = c.ckpt.tokenizer
        out["settings"] = {**out["settings"], "bos": bos_description(tokenizer, s.bos_mode)}
    return cast(EvalResult, out)


def _refuse_nonfinite_loss(c: _Loaded, model, n: int, mean: float) -> None:
    """Raises: NonFiniteLossError for a NaN/inf mean loss (or a perplexity beyond float range),
    naming the non-finite weights behind it if any."""
    if math.isfinite(mean) and mean < 700:
        return
    bad = nonfinite_parameters(model)
    why = (
        f"the weights contain NaN/inf in {', '.join(bad[:3])}{' …' if len(bad) > 3 else ''}; "
        "restore or retrain the checkpoint"
        if bad
        else "the weights are finite, so the logits overflow on this text at this length"
    )
    raise NonFiniteLossError(f"{c.name}: loss is {mean:.6g} at length {n}: {why} (nothing was cached)")


def _score_length(
    c: _Loaded,
    model: GPT,
    n: int,
    windows: list[Window],
    plan: Plan,
    s: EvalSettings,
    prog: Progress,
    shard: tuple[int, int] = (0, 1),
) -> dict:
    """Score one length of one checkpoint: its per-length entry (loss, intervals, accuracy for a task).
    Raises: NonFiniteLossError for a NaN/inf loss; EvaluationCancelled."""
    w = plan.window_tokens(n)
    done_before, finished, n_tokens = prog.done, 0, plan.work(n, windows)

    def on_batch(k: int) -> None:
        nonlocal finished
        finished += k
        prog.done = done_before + plan.work(n, windows[:finished])
        prog.report(f"{c.name} L={n}: {finished}/{len(windows)} windows{prog.eta()}")
        prog.check_stop()

    prog.report(f"{c.name} L={n}: 0/{len(windows)} windows ({targets(windows, w):,} tokens){prog.eta()}")
    doc_bytes: dict[int, int] = {}
    nats, counts, doc_nats, doc_scored, doc_correct = score_windows(
        model,
        plan.doc_tokens,
        windows,
        w,
        device=s.device,
        batch_tokens=s.batch_tokens,
        on_batch=on_batch,
        with_accuracy=True,
        doc_bytes=plan.doc_bytes if plan.encoded is not None else None,
        bos_window=plan.bos_window,
        bytes_out=doc_bytes,
        shard=shard,
    )
    prog.done = done_before + n_tokens
    _refuse_nonfinite_loss(c, model, n, float(nats.sum() / max(int(counts.sum()), 1)))
    order = sorted(doc_nats, key=lambda i: (plan.ids[i], i))
    per_document = {
        "doc": [plan.ids[i] for i in order],
        "nats": [doc_nats[i] for i in order],
        "tokens": [doc_scored[i] for i in order],
    }
    scored_bytes = None
    if plan.encoded is not None:  # a tokenizer's own text: bits per byte over the bytes the targets cover
        per_document["bytes"] = [doc_bytes.get(i, 0) for i in order]
        scored_bytes = sum(per_document["bytes"])
    entry = summarize(
        w, nats, counts, len(windows), s.position_buckets, per_document=per_document, scored_bytes=scored_bytes
    )
    if plan.text_key:
        entry["text"] = plan.text_key
    if s.mode == "synthetic":  # answer accuracy: next-token argmax right, and whole answers right
        entry["length"], entry["sequence_tokens"] = n, w  # the model reads n tokens, as in training at n
        correct = np.array([doc_correct[i] for i in order], dtype=np.float64)
        toks = np.array(per_document["tokens"], dtype=np.float64)
        entry["accuracy"] = float(correct.sum() / toks.sum())
        entry["sequence_accuracy"] = float((correct == toks).mean())
        entry["accuracy_ci95"] = bootstrap_ratio_ci95(correct, toks)
        entry["first_answer_position"] = windows[0].first_target
    if plan.context is not None:  # context length n: the same K targets per document at every n
        entry["length"], entry["window_tokens"] = n, w
        entry["prefix_tokens"], entry["context_targets"] = plan.context.prefix_tokens, plan.context.targets
        entry["full_context"] = plan.context.full
        entry["documents_skipped"] = plan.context.documents_skipped
    elif plan.same_text is not None:
        entry["prefix_tokens"] = plan.same_text.prefix_tokens
        entry["documents_skipped"] = plan.same_text.documents_skipped
    elif s.mode != "synthetic":  # documents shorter than the window hold none: counted, not dropped silently
        entry["documents_skipped"] = sum(1 for t in plan.sizes if t < n)
    if c.cap is not None:
        entry["normalizer_cap"] = c.cap
    return entry


def _write_entry(
    entry_path: Path, key: str, c: _Loaded, plan: Plan, length_settings: dict, entry: dict, n: int
) -> None:
    """One length's cache entry, written atomically; a full disk costs the entry, not the evaluation
    (issue #38: a RuntimeWarning says so)."""
    try:
        write_json_atomic(
            entry_path,
            {
                "key": key,
                "checkpoint_sha256": c.ckpt.sha256,
                "data_fingerprint": plan.fingerprint,
                "settings": length_settings,
                "fireviz_version": __version__,
                "result": entry,
                "mac": entry_mac(key, entry),  # HMAC under this user's secret: a hand edit is not served
            },
        )
    except OSError as e:
        warnings.warn(
            f"could not cache {c.name} at length {n} ({e.strerror or type(e).__name__}); the number "
            "is kept in this result but will be computed again next time: free space in the cache "
            "folder ($FIREVIZ_CACHE_DIR/eval or ~/.cache/fireviz/eval)",
            RuntimeWarning,
            stacklevel=3,
        )


def _evaluate_one(
    c: _Loaded,
    s: EvalSettings,
    plan: Plan,
    prog: Progress,
    cache: EvalCache,
    cache_root: Path,
    shard: tuple[int, int] = (0, 1),
) -> list[LengthEntry]:
    """One checkpoint at every length: cached where it can be, else scored (and cached; under
    ``torchrun`` each process scores its share of the batches, ``shard`` = (rank, world), and the
    first process writes the cache)."""
    on_device = None
    per_length: list[LengthEntry] = []
    read_published = cache.enabled and cache.use_published
    published = published_results(c.ckpt.folder, c.ckpt.sha256, plan.fingerprint) if read_published else []
    for n in s.lengths:
        windows = plan.windows[n]
        why = _unscorable(c, n, windows, None if isinstance(windows, str) else plan.read_tokens(n))
        if why is not None:
            per_length.append({"length": n, "error": why})
            if not isinstance(windows, str):  # its windows count as done
                prog.done += plan.work(n, windows)
                prog.report(f"{c.name} L={n}: skipped")
            continue
        assert not isinstance(windows, str)  # _unscorable gave why
        length_settings, key, flex = _length_key(c, s, plan, n, prog.report)
        entry_path = cache_root / f"{key}.json"
        found = _lookup(entry_path, key, n, length_settings, published, cache.enabled, cache.require_intervals)
        if found is not None:
            per_length.append(cast(LengthEntry, found))
            prog.done += plan.work(n, windows)
            prog.report(f"{c.name} L={n}: cached")
            continue
        prog.check_stop()
        t0 = time.perf_counter()
        prog.start_scoring()
        if on_device is None:
            assert c.model is not None  # loaded: it is scored
            on_device = c.model.to(s.device)
        if s.rope_scaling is not None and c.ckpt.kind != "fireviz":  # transformers' own scaling, per length
            scored = c.ckpt.load(s.device, s.rope_scaling, plan.read_tokens(n))
            extra = dict(scored.extra)
        else:
            scored, extra = (
                rope_scaled_model(on_device, s.rope_scaling, plan.read_tokens(n))
                if s.rope_scaling is not None
                else (on_device, {})
            )
        scored.set_attention_backend("flex" if flex else "sdpa")
        entry = _score_length(c, scored, n, windows, plan, s, prog, shard)
        entry.update(extra)
        entry["seconds"] = time.perf_counter() - t0
        if cache.enabled and shard[0] == 0:
            _write_entry(entry_path, key, c, plan, length_settings, entry, n)
        if shard[1] > 1:  # the entry is on disk before any process looks this key up again
            import torch.distributed as dist

            dist.barrier()
        per_length.append(cast(LengthEntry, {**entry, "cached": False, "source": "computed"}))
    if on_device is not None and c.model is not None and s.device.type == "cuda":
        c.model.to("cpu")
        torch.cuda.empty_cache()
    return per_length


def evaluate(
    checkpoints: Sequence[Checkpoint | CausalLMCheckpoint],
    settings: EvalSettings,
    *,
    cache: EvalCache | None = None,
    reference: int | str = 0,
    progress: ProgressFn | None = None,
    should_stop: StopFn | None = None,
) -> list[EvalResult]:
    """Evaluate several checkpoints on the same windows (paired comparison); one result each.

    Args: ``checkpoints`` resolved once at the edge (``Checkpoint.resolve``); ``settings`` built
      once (``EvalSettings.make``); ``cache`` where finished lengths are kept and looked up
      (:class:`fireviz.eval.cache.EvalCache`; default: the default folder, read and written, the
      checkpoints' results.json read too); ``reference`` the index, name or path of the
      checkpoint the others are paired against; ``progress(done, total, message)`` counts target
      tokens (mode context: tokens read, ``Plan.work``) over all checkpoints and lengths (cached
      lengths count as done at once); ``should_stop()`` is checked between batches.
    Returns: one :class:`fireviz.eval.results.EvalResult` per checkpoint (see
      ``evaluate_checkpoint`` for every field). Every result but the reference one carries, per
      length, ``paired_delta_bpb`` and ``paired_ci95`` against it; in mode ``context`` every entry
      but full also its difference against the same checkpoint's full context (``full_delta_bpb``,
      ``full_ci95``, ``full_context``).
    Raises: EvaluationError (not Checkpoint objects, a reference not among them, a cache folder
      that cannot be written — before anything is read), CheckpointError (a checkpoint that does
      not load, or changed since it was resolved — before any scoring), DataError,
      NonFiniteLossError, EvaluationCancelled.
    """
    t_start = time.perf_counter()
    cache = cache or EvalCache()
    d = init_distributed(settings.device.type)  # torchrun: the batches are split across the processes
    cache_root, loaded, ref = _prepare(checkpoints, settings, cache, reference, load=True)
    setup_seconds = time.perf_counter() - t_start  # loading checkpoints + data, planning windows
    total = sum(_plan_of(c).work(n, w) for c in loaded for n, w in _plan_of(c).windows.items() if isinstance(w, list))
    prog = Progress(total, progress, should_stop)
    results = []
    for c in loaded:
        t_ckpt = time.perf_counter()
        per_length = _evaluate_one(c, settings, _plan_of(c), prog, cache, cache_root, (d.rank, d.world))
        results.append(_result(c, settings, _plan_of(c), per_length, time.perf_counter() - t_ckpt + setup_seconds))
    out = with_paired_differences(with_full_context_differences(results), ref)
    prog.report("done")
    return out


def _prepare(checkpoints, settings: EvalSettings, cache: EvalCache, reference: int | str, load: bool):
    """What :func:`evaluate` (``load``) and :func:`lookup` do first: the cache folder (writable when
    ``load``: a cache that cannot be written fails before any work), the checkpoints (loaded, so
    a bad one is an error before minutes of work; or only described), the paired reference's
    index and the planned text, each checkpoint's in its ``plan`` (fireviz's bytes alone: one plan,
    ``plan_text``; a tokenizer of its own or a BOS convention: ``plan_tokenized``, one per tokenizer).
    Returns ``(cache_root, checkpoints, reference index)``."""
    ckpts = _checkpoints(checkpoints)
    cache_root = cache.checked_root(write=load)
    items = _describe_checkpoints(ckpts, settings)
    ref = _reference(items, reference)
    if all(c.tokenizer is BYTE_TOKENIZER for c in ckpts) and settings.bos_mode is None:
        plan = plan_text(settings)
        for c in items:
            c.plan = plan
    else:
        tokenizers: list[Any] = [c.tokenizer for c in ckpts]
        plans = plan_tokenized(settings, tokenizers)
        for c, tok in zip(items, tokenizers, strict=True):
            c.plan = plans[tok.key]
    if not load:
        return cache_root, items, ref
    # memory before the weights are read: a length that cannot fit is refused at once, not after
    # minutes of loading (issue #48: 258 s for a published model), and a checkpoint with no length
    # left to score is not loaded at all
    for plan in {id(c.plan): c.plan for c in items if c.plan is not None}.values():
        plan.windows.update(
            memory_refusals(
                plan.windows,
                [c.config for c in items if c.plan is plan],
                settings.device,
                settings.batch_tokens,
                plan.read_tokens,
            )
        )
    scored = [c for c in items if any(not isinstance(w, str) for w in _plan_of(c).windows.values())]
    for c, model in zip(scored, _load_checkpoints([c.ckpt for c in scored], settings), strict=True):
        c.model, c.cap = model.model, model.cap
    return cache_root, items, ref


def _plan_of(c: _Loaded) -> Plan:
    assert c.plan is not None  # set by _prepare
    return c.plan


def lookup(
    checkpoints: Sequence[Checkpoint | CausalLMCheckpoint],
    settings: EvalSettings,
    *,
    cache: EvalCache | None = None,
    reference: int | str = 0,
) -> list[EvalResult]:
    """What :func:`evaluate` would return, from the cache alone: nothing is computed, no model
    runs (what a page shows at once, e.g. the lengths a cancelled run finished).

    Args: as :func:`evaluate`; ``cache.require_intervals`` False (``EvalCache.for_lookup()``)
      shows an entry made before fireviz kept per-document losses as it is (no interval).
    Returns: one result per checkpoint, shaped as :func:`evaluate`'s (paired differences
      included where both entries have per-document losses): a length found in the cache or
      the checkpoint's ``results.json`` is its entry (``"cached": True``, ``source``); a length
      not found is ``{"length", "error": NOT_COMPUTED, "not_computed": True}`` — or, when it
      could not be computed anyway, ``{"length", "error"}`` with the reason (no windows,
      beyond absolute position embeddings, more memory than there is now).
      ``seconds`` is this lookup's wall time.
    Cost: a cache file read per length; the data is read and hashed once per file state
      (``fireviz.eval.plan.load_eval_documents``), a checkpoint's weights once per process (to
      refuse NaN/inf weights, as :func:`evaluate` does) and only when a number is found; the
      windows are planned each call.
    Raises: as :func:`evaluate` before its scoring (EvaluationError, DataError,
      NonFiniteLossError when a number was found for weights holding NaN/inf, CheckpointError
      for files changed since they were resolved). Never EvaluationCancelled.
    """
    t_start = time.perf_counter()
    cache = cache or EvalCache.for_lookup()
    cache_root, described, ref = _prepare(checkpoints, settings, cache, reference, load=False)
    refusals: dict[int, dict[int, str]] = {}  # per plan: memory, checked only for a length not found
    results = []
    for c in described:
        plan = _plan_of(c)
        published = published_results(c.ckpt.folder, c.ckpt.sha256, plan.fingerprint) if cache.use_published else []
        per_length: list[LengthEntry] = []
        for n in settings.lengths:
            windows = plan.windows[n]
            why = _unscorable(c, n, windows, None if isinstance(windows, str) else plan.read_tokens(n))
            if why is None:
                length_settings, key, _ = _length_key(c, settings, plan, n, lambda message: None)
                found = _lookup(
                    cache_root / f"{key}.json", key, n, length_settings, published, True, cache.require_intervals
                )
                if found is not None:
                    _weights_are_finite(c)
                    per_length.append(found)  # type: ignore[arg-type]
                    continue
                if id(plan) not in refusals:
                    refusals[id(plan)] = memory_refusals(
                        plan.windows,
                        [d.config for d in described if d.plan is plan],
                        settings.device,
                        settings.batch_tokens,
                        plan.read_tokens,
                    )
                why = refusals[id(plan)].get(n)
            per_length.append({"length": n, "error": why} if why else {"length": n, **_NOT_FOUND})  # type: ignore[typeddict-item]
        results.append(_result(c, settings, plan, per_length, time.perf_counter() - t_start))
    return with_paired_differences(with_full_context_differences(results), ref)


#: the arguments of the convenience functions below that are not evaluation settings
_CACHE_OPTIONS = ("cache_dir", "use_cache", "use_published", "require_intervals")


def evaluate_many(
    checkpoints: Sequence[str | os.PathLike | Checkpoint],
    data: str | os.PathLike,
    lengths: Iterable[int | str] | None = None,
    *,
    progress: ProgressFn | None = None,
    should_stop: StopFn | None = None,
    reference: int | str = 0,
    cache_dir: str | os.PathLike | None = None,
    use_cache: bool = True,
    use_published: bool = True,
    require_intervals: bool = True,
    **settings,
) -> list[EvalResult]:
    """:func:`evaluate` for a script or notebook: resolves ``checkpoints`` (names, folders, Hub ids
    or :class:`Checkpoint` objects) and builds the settings from ``data``, ``lengths`` and
    ``settings`` (keywords of ``EvalSettings.make``: ``SETTING_NAMES``) — each once, before any work.
    ``cache_dir``, ``use_cache`` (False: neither read nor write), ``use_published`` and
    ``require_intervals`` make its :class:`EvalCache`. See ``evaluate_checkpoint`` for every
    argument and the result. ``checkpoints`` is a list (one path or string alone is refused: use
    ``evaluate_checkpoint``).
    Raises: as :func:`evaluate`; EvaluationError for an unknown setting; CheckpointError for a
      checkpoint reference that names nothing (both before anything is read)."""
    check_setting_names(settings)
    s = EvalSettings.make(data, lengths, **settings)
    cache = EvalCache(cache_dir, use_cache, use_published, require_intervals)
    cache.checked_root()  # a cache that cannot be written: said before a checkpoint is read
    ckpts = [resolve_any(c) for c in checkpoint_list(checkpoints)]
    return evaluate(ckpts, s, cache=cache, reference=reference, progress=progress, should_stop=should_stop)


def cached_results(
    checkpoints: Sequence[str | os.PathLike | Checkpoint],
    data: str | os.PathLike,
    lengths: Iterable[int | str] | None = None,
    *,
    reference: int | str = 0,
    cache_dir: str | os.PathLike | None = None,
    use_published: bool = True,
    require_intervals: bool = False,
    **settings,
) -> list[EvalResult]:
    """:func:`lookup` with the arguments of :func:`evaluate_many` (nothing is computed).
    Raises: as :func:`lookup`; CheckpointError for a reference that names nothing, a config.json
    that does not read, weights that are junk, truncated or do not match the config (from the
    safetensors header, no weights loaded)."""
    check_setting_names(settings)
    s = EvalSettings.make(data, lengths, **settings)
    cache = EvalCache(cache_dir, True, use_published, require_intervals)
    cache.checked_root(write=False)
    ckpts = [resolve_any(c) for c in checkpoint_list(checkpoints)]
    return lookup(ckpts, s, cache=cache, reference=reference)


_NOT_FOUND = {"error": NOT_COMPUTED, "not_computed": True}


def evaluate_checkpoint(
    checkpoint: str | os.PathLike | Checkpoint,
    data: str | os.PathLike,
    lengths: Iterable[int | str] | None = None,
    **kwargs,
) -> EvalResult:
    """Perplexity of one checkpoint at each evaluation length.

    Args:
      checkpoint: a checkpoint folder (config.json + model.safetensors), a checkpoint name
        under the checkpoints root (``fire``) or a Hub repo id.
      data: ``"prose" | "latex" | "code"`` or a path accepted by ``fireviz.data.corpus.load_documents``.
      lengths: window lengths ``n`` in tokens (bytes), each >= 2; None: ``DEFAULT_LENGTHS``
        (128 … 8192). Mode ``context``: context lengths ``c`` (tokens; ``"full"`` = M − K; None:
        128 … 4096 and full).
      mode: ``"same_text"`` (default: the same documents' first M tokens at every length),
        ``"nonoverlapping"`` (random windows per length), ``"sliding"`` with ``stride``
        tokens (1..n), or ``"context"`` (context use: the last ``context_targets`` K of each
        document's first ``prefix_tokens`` M tokens, scored with ``c`` … ``c + s − 1`` tokens
        before them by windows of ``c + s`` tokens scoring their last ``s`` = ``stride``
        (default 64); full, ``c = M − K``: one window of M, every target with its whole
        prefix); see ``fireviz.eval.windows``.
      context_targets: mode ``context`` only: K, the targets per document (default 256).
      token_budget: ``"auto"`` (default: every qualifying document for same_text, 65536
        targets per length otherwise), an int (targets) or None (every eligible window).
      normalizer_cap: FIRE/FIRE-S only: evaluate with ψ(min(max(L, i), cap)), cap in tokens
        (e.g. the training length); part of the cache key and saved with the numbers
        (``normalizer_cap``); other checkpoints are evaluated as they are.
      prefix_tokens: same_text: score the first ``prefix_tokens`` tokens of every document
        that holds them at each length (default: the largest length); context: M (default 8192). One column of a
        128 … 8192 evaluation alone, on exactly its text: ``lengths=[128], prefix_tokens=8192``
        (the same cache entry as that column).
      reference: index, path or name of the checkpoint the others are paired against (a
        name shared by two of them is an error: give the path).
      require_intervals: True (default): a cached or published entry made before fireviz
        kept per-document losses (no ``ci95``, cannot be paired) is recomputed; False
        accepts it as it is (``cached_results``, the app's lookup, shows such numbers at once).
      seed: window-selection seed; the selection never depends on the checkpoint.
      rope_scaling: None, ``"pi"`` or ``"yarn"`` — zero-shot extension of a RoPE checkpoint
        with factor ``max(1, n / seq_len)`` (see ``rope_scaled_model``).
      split: ``"validation"`` (default), ``"train"`` or ``"all"`` (for a small file of your own).
      position_buckets: buckets of ``loss_by_position`` (equal width over positions 1..n−1).
      device: ``"auto"`` (CUDA with bf16 autocast when present, else CPU float32), ``"cpu"``, ``"cuda"``.
      batch_tokens: tokens per forward batch (default 8192 CPU, 16384 CUDA); windows per
        batch = max(1, batch_tokens // n), so a long window runs alone. Not part of the cache key.
      progress: ``progress(done_windows, total_windows, message)``; should_stop: ``() -> bool``,
        checked between batches.
      cache_dir: folder of cached per-length results (default ``default_cache_dir()``);
        use_cache: False to neither read nor write it. A length missing from the cache is
        also looked up in the checkpoint's own ``results.json`` (``published_results``: same
        weights sha256, data fingerprint and every cache-key setting, format version
        included; read each time, never copied into the cache) — how a shipped checkpoint
        shows its numbers at once on a fresh machine. ``use_published=False`` skips that
        (scripts/publish_results.py, which rewrites those files, must not read them).
    Returns: ``{"checkpoint", "checkpoint_path", "checkpoint_sha256", "position_encoding",
      "train_seq_len", "settings", "data_fingerprint", "fireviz_version", "device", "seconds",
      "normalizer_cap", "paired_reference", "per_length": [summarize(...) + {"documents",
      "per_document", "ci95", "seconds", "cached", "source"} (+ "prefix_tokens",
      "documents_skipped" for same_text; for context also "window_tokens", "context_targets",
      "full_context" and, but at full, "full_delta_bpb", "full_ci95" (``stats.FullContextDifference``:
      bits per byte at this context length minus at full, paired over documents);
      "paired_delta_bpb", "paired_ci95", "paired_reference" but for the reference) or
      {"length", "error"}]}`` with ``source``
      ``"computed"``, ``"cache"`` or ``"results.json"``;
      ``settings`` holds ``format`` (``EVAL_FORMAT_VERSION``) and the arguments above.
      ``seconds``: wall time of this call for this checkpoint (loading checkpoints and data
      and planning windows included); a per-length ``seconds`` is the scoring time when it
      was computed (also for a cached entry). With ``rope_scaling`` each per-length entry
      adds ``position_encoding`` (``rope_pi``/``yarn``) and the ``encoding_options`` used.
      All numbers are finite floats or ints (JSON without NaN).
    Raises: CheckpointError (does not load), DataError (unknown domain, no text, empty
      split), EvaluationError (bad settings — an integer setting given as a float, bool or
      string included —, non-RoPE checkpoint with rope_scaling, CUDA unavailable, a cache
      folder that cannot be written), EvaluationCancelled. A length that cannot be evaluated (longer than every
      document, stride larger than it) is an ``{"length", "error"}`` entry, not an exception.
    """
    return evaluate_many([checkpoint], data, lengths, **kwargs)[0]
