"""Perplexity versus evaluation length: the length-generalization curve of a checkpoint.

An evaluation is fully described by its settings (lm-evaluation-harness and YaRN's
perplexity script taught that): data + split, lengths, mode, stride, token budget, seed,
RoPE scaling, BOS convention, loss-by-position buckets, numeric precision. Every result
carries them, and results are cached on disk under a key made of the checkpoint's sha256,
the data fingerprint and those settings. A checkpoint folder's own ``results.json`` (the
shipped numbers) serves as a read-only cache under the same key.

Which tokens are scored at each length (the same-text, non-overlapping and sliding
protocols) is ``fireviz.windows``; intervals and paired differences are ``fireviz.stats``;
the command line (``python -m fireviz eval``) is ``fireviz.eval_cli``. Their names are
re-exported here (the evaluation API in one place; the CLI is not). Units: tokens = bytes, loss in nats per
token, bits per byte = nats / ln 2.
"""

from __future__ import annotations

import math
import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Iterable, Sequence

import numpy as np
import torch

from . import __version__, synthetic
from .checkpoints import checkpoint_files, checkpoint_sha256, load_model  # noqa: F401  (the one door)
from .data import DOMAINS, DataError, Document, data_fingerprint, DocumentTokens, load_documents, split_documents
from .encodings import check_normalizer_cap
from .files import write_json_atomic
from .memory import memory_problem
from .model import GPT, CheckpointError, GPTConfig, load_state_checked, nonfinite_parameters  # noqa: F401
from .stats import (
    bootstrap_indices,  # noqa: F401  (re-exported)
    bootstrap_ratio_ci95,
    with_paired_differences,
    _reference_index,
)
from .eval_cache import (
    _lookup,
    _valid_entry,  # noqa: F401
    cache_key,
    default_cache_dir,
    published_results,
)
from .eval_variants import ROPE_SCALINGS, apply_normalizer_cap, rope_scaled_model
from .scoring import score_windows, summarize
from .windows import (
    DEFAULT_MODE,
    DEFAULT_POSITION_BUCKETS,
    DEFAULT_TOKEN_BUDGET,
    MODES,  # noqa: F401
    EvaluationError,
    SameTextPlan,
    Window,
    _check_length,
    _check_mode,
    plan_same_text,
    plan_windows,
)

DEFAULT_LENGTHS = (128, 256, 512, 1024, 2048, 4096, 8192)
#: sequences per length when evaluating on a synthetic task (``--data synthetic:copy``)
SYNTHETIC_SEQUENCES = 256
SPLITS = ("validation", "train", "all")
#: bumped whenever the numbers a given setting produces would change; part of the cache key
EVAL_FORMAT_VERSION = 1
BOS_CONVENTION = (
    "each document starts with BOS (id 256) as in training; windows are taken from a "
    "document's [BOS]+bytes sequence and never cross documents; the first token of a "
    "window is context only, so BOS is never a target"
)

ProgressFn = Callable[[int, int, str], None]
StopFn = Callable[[], bool]


#: ``error`` of a length a ``cache_only`` call found no result for.
NOT_COMPUTED = "not computed yet"


class NonFiniteLossError(EvaluationError):
    """A checkpoint's loss is NaN/inf: reported (naming the non-finite weights, if any), never
    cached or shown as a number; the CLI exits non-zero."""


class EvaluationCancelled(RuntimeError):
    """Raised when ``should_stop()`` returned True; lengths finished before stay cached."""


#: On CUDA, lengths from which evaluation computes the bias inside FlexAttention (``fireviz.flex``)
#: instead of materialising [heads, block, keys] per query block. CPU always uses the SDPA path.
FLEX_MIN_LENGTH = 8192


def _flex_ok(report) -> bool:
    from . import flex

    if flex.flex_available():
        return True
    report(f"FlexAttention unavailable ({flex.unavailable_reason()}); long lengths use the SDPA path")
    return False


def resolve_device(device: str | torch.device = "auto") -> torch.device:
    """``"auto"`` → CUDA when available, else CPU; ``"cpu"``, ``"cuda"``, ``"cuda:1"`` as given.

    Raises: EvaluationError for CUDA requested without an available GPU, or an unknown name.
    """
    if str(device) == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        dev = torch.device(device)
    except (RuntimeError, TypeError) as e:
        raise EvaluationError(f"unknown device {device!r}; use auto, cpu or cuda") from e
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise EvaluationError(
            "device 'cuda' requested but no CUDA GPU is available (torch.cuda.is_available() "
            "is False); use --device cpu or auto"
        )
    if dev.type not in ("cpu", "cuda"):
        raise EvaluationError(f"device {device!r} is not supported; use auto, cpu or cuda")
    return dev


def _load_eval_documents(data: str | os.PathLike, split: str | None) -> tuple[list[Document], str]:
    split = split or "validation"
    if split not in SPLITS:
        raise EvaluationError(f"split must be one of {', '.join(SPLITS)} (got {split!r})")
    docs = load_documents(data)
    if split == "all":
        return docs, split
    try:
        return split_documents(docs, split), split
    except DataError as e:
        hint = (
            ""
            if isinstance(data, str) and data in DOMAINS
            else " — for a small file of your own use split='all' (--split all)"
        )
        raise DataError(f"{e}{hint}") from e


def resolve_token_budget(mode: str, token_budget: int | None | str = "auto") -> int | None:
    """The token budget a mode uses: ``"auto"`` → None (every qualifying document) for
    ``same_text``, ``DEFAULT_TOKEN_BUDGET`` for the random-window modes; an int >= 1 or
    None as given. Raises: EvaluationError for anything else."""
    if isinstance(token_budget, str) and token_budget == "auto":
        return None if mode == "same_text" else DEFAULT_TOKEN_BUDGET
    if token_budget is not None and (
        isinstance(token_budget, bool) or not isinstance(token_budget, (int, np.integer)) or token_budget < 1
    ):
        raise EvaluationError(
            f"token_budget must be an integer >= 1, None (every window) or 'auto' (got {token_budget!r})"
        )
    return None if token_budget is None else int(token_budget)


@dataclass(frozen=True)
class EvalSettings:
    """Everything that decides an evaluation's numbers, validated once (``EvalSettings.make``).

    Fields (units: tokens): ``data`` (a domain, path or ``synthetic:<task>``), ``lengths``
    (user order, duplicates once), ``mode`` (``windows.MODES``, or ``"synthetic"`` for a task),
    ``stride``, ``token_budget`` (resolved: None = every qualifying document/window; for a task
    the sequences per length), ``seed``, ``rope_scaling``, ``split``, ``position_buckets``,
    ``normalizer_cap``, ``device`` (resolved), ``precision``, ``batch_tokens`` (resolved; not
    part of any cache key). The per-length cache key is :meth:`length_settings`.
    """

    data: str
    lengths: tuple[int, ...]
    mode: str
    stride: int | None
    token_budget: int | None
    seed: int
    rope_scaling: str | None
    split: str | None
    position_buckets: int
    normalizer_cap: int | None
    device: torch.device
    precision: str
    batch_tokens: int

    @classmethod
    def make(
        cls,
        data,
        lengths,
        *,
        mode=DEFAULT_MODE,
        stride=None,
        token_budget="auto",
        seed=0,
        rope_scaling=None,
        split=None,
        position_buckets=DEFAULT_POSITION_BUCKETS,
        device="auto",
        batch_tokens=None,
        normalizer_cap=None,
    ) -> "EvalSettings":
        """Validated settings (the arguments of :func:`evaluate_many`). Raises: EvaluationError naming the bad one."""
        lengths = list(lengths)
        if not lengths:
            raise EvaluationError("no evaluation lengths given")
        for n in lengths:
            _check_length(n)
        mode = _check_mode(mode, stride)
        token_budget = resolve_token_budget(mode, token_budget)
        if rope_scaling is not None and rope_scaling not in ROPE_SCALINGS:
            raise EvaluationError(
                f"rope_scaling must be one of {', '.join(ROPE_SCALINGS)} or None (got {rope_scaling!r})"
            )
        if position_buckets < 1:
            raise EvaluationError(f"position_buckets must be >= 1 (got {position_buckets})")
        if batch_tokens is not None and not (isinstance(batch_tokens, int) and batch_tokens >= 1):
            raise EvaluationError(
                f"batch_tokens must be an integer >= 1 (got {batch_tokens!r}); omit it for the "
                "default (8192 on CPU, 16384 on CUDA)"
            )
        try:  # before any checkpoint is read
            normalizer_cap = check_normalizer_cap(normalizer_cap)
        except ValueError as e:
            raise EvaluationError(str(e)) from None
        dev = resolve_device(device)
        if synthetic.is_synthetic(data):
            # every length gets its own task sequences of exactly that length (the same for every
            # checkpoint); only the answer positions are scored
            if mode != DEFAULT_MODE or stride is not None:
                raise EvaluationError(f"{data} is scored on whole task sequences, one per window; drop --mode/--stride")
            mode, split = "synthetic", "synthetic"
            token_budget = SYNTHETIC_SEQUENCES if token_budget is None else max(1, int(token_budget))
        return cls(
            data=str(data),
            lengths=tuple(dict.fromkeys(int(n) for n in lengths)),
            mode=mode,
            stride=stride,
            token_budget=token_budget,
            seed=int(seed),
            rope_scaling=rope_scaling,
            split=split,
            position_buckets=int(position_buckets),
            normalizer_cap=None if normalizer_cap is None else int(normalizer_cap),
            device=dev,
            precision="bfloat16-autocast" if dev.type == "cuda" else "float32",
            batch_tokens=int(batch_tokens or (16384 if dev.type == "cuda" else 8192)),
        )

    def length_settings(self, n: int, prefix_tokens: int | None, cap: int | None, flex: bool) -> dict:
        """The settings that decide the numbers at length ``n``: the cache key's settings."""
        out = {
            "format": EVAL_FORMAT_VERSION,
            "length": n,
            "mode": self.mode,
            "stride": self.stride,
            "token_budget": self.token_budget,
            "seed": self.seed,
            "rope_scaling": self.rope_scaling,
            "split": self.split,
            "position_buckets": self.position_buckets,
            "precision": self.precision,
            "bos": BOS_CONVENTION,
        }
        if flex:  # bf16 numbers differ slightly between the two paths: part of the key (GPU only)
            out["attention"] = "flex"
        if prefix_tokens is not None:  # same_text: the windows at n depend on the prefix M
            out["prefix_tokens"] = prefix_tokens
        if cap is not None:  # only FIRE has a normalizer; other checkpoints keep their plain key
            out["normalizer_cap"] = cap
        if self.mode == "synthetic":  # sequences of n + 1 tokens, the training format at seq_len n (format 2)
            out["task_format"] = 2
        return out


@dataclass
class _Loaded:
    path: str | os.PathLike
    sha: str
    model: GPT
    cap: int | None  # the normalizer cap in effect (FIRE only)

    @property
    def name(self) -> str:
        return Path(str(self.path)).name or str(self.path)


def _load_checkpoints(checkpoints, s: EvalSettings, reference: int | str) -> list[_Loaded]:
    """Every checkpoint loaded and checked before any scoring (a bad one fails at once)."""
    loaded = []
    for ckpt in checkpoints:
        sha, model = checkpoint_sha256(ckpt), load_model(ckpt)
        bad = nonfinite_parameters(model)
        if bad:  # no number for such weights, not even a cached or published one
            raise NonFiniteLossError(
                f"{Path(str(ckpt)).name or ckpt}: the weights contain NaN/inf in "
                f"{', '.join(bad[:3])}{' …' if len(bad) > 3 else ''}, so every loss is NaN; "
                "restore or retrain the checkpoint (nothing was evaluated or cached)"
            )
        if s.rope_scaling is not None and model.config.position_encoding != "rope":
            raise EvaluationError(
                f"rope_scaling={s.rope_scaling!r} needs a RoPE checkpoint; {ckpt} uses "
                f"position_encoding={model.config.position_encoding!r}"
            )
        loaded.append(_Loaded(ckpt, sha, model, apply_normalizer_cap(model, s.normalizer_cap)))
    if not loaded:
        raise EvaluationError("no checkpoints given")
    if isinstance(reference, str):
        _reference_index(
            [{"checkpoint": c.name, "checkpoint_path": str(c.path)} for c in loaded], reference
        )  # a wrong reference fails before scoring
    elif not (0 <= reference < len(loaded)):
        raise EvaluationError(f"reference index {reference} is out of range for {len(loaded)} checkpoint(s)")
    return loaded


@dataclass
class _Plan:
    """The text of an evaluation: per length its windows (or why none), document ids and sizes,
    the data fingerprint, the same-text plan, and the documents' tokens on demand."""

    windows: dict[int, list[Window] | str]
    ids: list[str]
    sizes: list[int]
    fingerprint: str
    split: str
    documents: int
    same_text: SameTextPlan | None = None
    docs: list = field(default_factory=list)
    tokens: dict = field(default_factory=dict)

    def window_tokens(self, n: int) -> int:
        """Tokens in a window of evaluation length ``n``: ``n`` for text; ``n + 1`` for a task, whose
        sequences are built exactly as in training at seq_len = n (a window of seq_len + 1 tokens:
        the model reads n of them and every prediction is scored; the last token is a target only)."""
        return n + 1 if self.split == "synthetic" else n

    def doc_tokens(self, i: int):
        if i not in self.tokens:  # [BOS]+bytes at one byte per token; windows are copied out of it
            self.tokens[i] = DocumentTokens(self.docs[i])
        return self.tokens[i]


def _plan_task(s: EvalSettings) -> _Plan:
    task = synthetic.load_task(s.data)
    count = s.token_budget
    windows: dict[int, list[Window] | str] = {}
    ids, tokens = [], {}
    for n in s.lengths:
        try:
            first = task.split(n + 1)  # the training format at seq_len = n (see _Plan.window_tokens)
        except DataError as e:
            windows[n] = str(e)
            continue
        seqs = task.sequences(n + 1, count, synthetic.EVALUATION_SEED + n)
        start = len(ids)
        for k in range(count):
            tokens[start + k] = seqs[k]
            ids.append(f"{task.name}/{n}/{k:05d}")
        windows[n] = [Window(start + k, 0, first) for k in range(count)]
    return _Plan(windows, ids, [], task.fingerprint(), "synthetic", count, tokens=tokens)


def _plan_text(s: EvalSettings) -> _Plan:
    if s.mode == "synthetic":
        return _plan_task(s)
    docs, split = _load_eval_documents(s.data, s.split)
    ids, sizes = [d.id for d in docs], [d.num_tokens for d in docs]
    plan = _Plan({}, ids, sizes, data_fingerprint(docs), split, len(docs), docs=docs)
    if s.mode == "same_text":
        plan.same_text = plan_same_text(ids, sizes, list(s.lengths), token_budget=s.token_budget, seed=s.seed)
        plan.windows = dict(plan.same_text.windows)
        return plan
    for n in s.lengths:
        try:
            plan.windows[n] = plan_windows(
                ids, sizes, n, mode=s.mode, stride=s.stride, token_budget=s.token_budget, seed=s.seed
            )
        except EvaluationError as e:
            plan.windows[n] = str(e)
    return plan


def _refuse_what_cannot_fit(plan: _Plan, loaded: list[_Loaded], s: EvalSettings) -> None:
    """Memory before work: a length whose estimate exceeds the available memory gets the reason instead."""
    for n, windows in list(plan.windows.items()):
        if isinstance(windows, list) and windows:
            batch = min(max(1, s.batch_tokens // n), len(windows))
            problem = memory_problem([c.model.config for c in loaded], n, batch, s.device, s.batch_tokens)
            if problem:
                plan.windows[n] = problem


def _run_settings(s: EvalSettings, plan: _Plan) -> dict:
    """The ``settings`` every result carries."""
    out = {
        "format": EVAL_FORMAT_VERSION,
        "data": s.data,
        "split": plan.split,
        "lengths": list(s.lengths),
        "mode": s.mode,
        "stride": s.stride,
        "token_budget": s.token_budget,
        "seed": s.seed,
        "rope_scaling": s.rope_scaling,
        "position_buckets": s.position_buckets,
        "precision": s.precision,
        "batch_tokens": s.batch_tokens,
        "bos": BOS_CONVENTION,
        "documents": plan.documents,
        "normalizer_cap": s.normalizer_cap,
    }
    if plan.same_text is not None:
        out.update(
            prefix_tokens=plan.same_text.prefix_tokens,
            documents_scored=len(plan.same_text.documents),
            documents_skipped=plan.same_text.documents_skipped,
        )
    if s.mode == "synthetic":
        out["task_format"] = 2  # as in length_settings: results.json rows match the cache key
    return out


class _Progress:
    """Target tokens done over all checkpoints and lengths, with a rate and an ETA from the
    first computed (not cached) batch on; ``check_stop`` raises EvaluationCancelled."""

    def __init__(self, total: int, progress: ProgressFn | None, should_stop: StopFn | None):
        self.total, self.done, self._progress, self._stop = total, 0, progress, should_stop
        self._t0: float | None = None
        self._done0 = 0

    def start_scoring(self) -> None:
        if self._t0 is None:
            self._t0, self._done0 = time.perf_counter(), self.done

    def report(self, message: str) -> None:
        if self._progress is not None:
            self._progress(self.done, self.total, message)

    def eta(self) -> str:
        if self._t0 is None or self.done <= self._done0:
            return ""
        rate = (self.done - self._done0) / max(time.perf_counter() - self._t0, 1e-9)
        left = (self.total - self.done) / rate if rate > 0 else float("inf")
        return f", {rate:,.0f} tokens/s, ~{_duration(left)} left" if math.isfinite(left) else ""

    def check_stop(self) -> None:
        if self._stop is not None and self._stop():
            raise EvaluationCancelled("evaluation cancelled; finished lengths are cached")


def _targets(windows: list[Window], n: int) -> int:
    return sum(n - w.first_target for w in windows)


def _score_length(
    c: _Loaded, model: GPT, n: int, windows: list[Window], plan: _Plan, s: EvalSettings, prog: _Progress
) -> dict:
    """Score one length of one checkpoint: its per-length entry (loss, intervals, accuracy for a task).
    Raises: NonFiniteLossError for a NaN/inf loss; EvaluationCancelled."""
    w = plan.window_tokens(n)
    done_before, finished, n_tokens = prog.done, 0, _targets(windows, w)

    def on_batch(k: int) -> None:
        nonlocal finished
        finished += k
        prog.done = done_before + _targets(windows[:finished], w)
        prog.report(f"{c.name} L={n}: {finished}/{len(windows)} windows{prog.eta()}")
        prog.check_stop()

    prog.report(f"{c.name} L={n}: 0/{len(windows)} windows ({n_tokens:,} tokens){prog.eta()}")
    nats, counts, doc_nats, doc_scored, doc_correct = score_windows(
        model,
        plan.doc_tokens,
        windows,
        w,
        device=s.device,
        batch_tokens=s.batch_tokens,
        on_batch=on_batch,
        with_accuracy=True,
    )
    prog.done = done_before + n_tokens
    mean = float(nats.sum() / max(int(counts.sum()), 1))
    if not (math.isfinite(mean) and mean < 700):  # NaN/inf, or a perplexity beyond float range
        bad = nonfinite_parameters(model)
        why = (
            f"the weights contain NaN/inf in {', '.join(bad[:3])}{' …' if len(bad) > 3 else ''}; "
            "restore or retrain the checkpoint"
            if bad
            else "the weights are finite, so the logits overflow on this text at this length"
        )
        raise NonFiniteLossError(f"{c.name}: loss is {mean:.6g} at length {n}: {why} (nothing was cached)")
    order = sorted(doc_nats, key=lambda i: (plan.ids[i], i))
    per_document = {
        "doc": [plan.ids[i] for i in order],
        "nats": [doc_nats[i] for i in order],
        "tokens": [doc_scored[i] for i in order],
    }
    entry = summarize(w, nats, counts, len(windows), s.position_buckets, per_document=per_document)
    if s.mode == "synthetic":  # answer accuracy: next-token argmax right, and whole answers right
        entry["length"], entry["sequence_tokens"] = n, w  # the model reads n tokens, as in training at n
        correct = np.array([doc_correct[i] for i in order], dtype=np.float64)
        toks = np.array(per_document["tokens"], dtype=np.float64)
        entry["accuracy"] = float(correct.sum() / toks.sum())
        entry["sequence_accuracy"] = float((correct == toks).mean())
        entry["accuracy_ci95"] = bootstrap_ratio_ci95(correct, toks)
        entry["first_answer_position"] = windows[0].first_target
    if plan.same_text is not None:
        entry["prefix_tokens"] = plan.same_text.prefix_tokens
        entry["documents_skipped"] = plan.same_text.documents_skipped
    elif s.mode != "synthetic":  # documents shorter than the window hold none: counted, not dropped silently
        entry["documents_skipped"] = sum(1 for t in plan.sizes if t < n)
    if c.cap is not None:
        entry["normalizer_cap"] = c.cap
    return entry


def _evaluate_one(
    c: _Loaded,
    s: EvalSettings,
    plan: _Plan,
    prog: _Progress,
    cache_root: Path,
    *,
    use_cache: bool,
    use_published: bool,
    require_intervals: bool,
    cache_only: bool,
) -> list[dict]:
    """One checkpoint at every length: cached where it can be, else scored (and cached)."""
    cfg, on_device, per_length = c.model.config, None, []
    published = published_results(c.path, c.sha, plan.fingerprint) if use_cache and use_published else []
    for n in s.lengths:
        windows = plan.windows[n]
        if isinstance(windows, str):
            per_length.append({"length": n, "error": windows})
            continue
        n_tokens = _targets(windows, plan.window_tokens(n))
        if cfg.absolute_position_embedding and n > cfg.seq_len:
            per_length.append(
                {
                    "length": n,
                    "error": f"absolute position embeddings cover {cfg.seq_len} tokens; length {n} cannot be evaluated",
                }
            )
            prog.done += n_tokens
            prog.report(f"{c.name} L={n}: skipped")
            continue
        use_flex = s.device.type == "cuda" and n >= FLEX_MIN_LENGTH and _flex_ok(prog.report)
        length_settings = s.length_settings(
            n, plan.same_text.prefix_tokens if plan.same_text else None, c.cap, use_flex
        )
        key = cache_key(c.sha, plan.fingerprint, length_settings)
        entry_path = cache_root / f"{key}.json"
        found = _lookup(entry_path, key, n, length_settings, published, use_cache, require_intervals)
        if found is not None or cache_only:  # cache_only: nothing is computed, the length is not computed yet
            per_length.append(found or {"length": n, "error": NOT_COMPUTED, "not_computed": True})
            prog.done += n_tokens
            if found is not None:
                prog.report(f"{c.name} L={n}: cached")
            continue
        prog.check_stop()
        t0 = time.perf_counter()
        prog.start_scoring()
        if on_device is None:
            on_device = c.model.to(s.device)
        scored, extra = (
            rope_scaled_model(on_device, s.rope_scaling, n) if s.rope_scaling is not None else (on_device, {})
        )
        scored.set_attention_backend("flex" if use_flex else "sdpa")
        entry = _score_length(c, scored, n, windows, plan, s, prog)
        entry.update(extra)
        entry["seconds"] = time.perf_counter() - t0
        if use_cache:
            write_json_atomic(
                entry_path,
                {
                    "key": key,
                    "checkpoint_sha256": c.sha,
                    "data_fingerprint": plan.fingerprint,
                    "settings": length_settings,
                    "fireviz_version": __version__,
                    "result": entry,
                },
            )
        per_length.append({**entry, "cached": False, "source": "computed"})
    if on_device is not None and s.device.type == "cuda":
        c.model.to("cpu")
        torch.cuda.empty_cache()
    return per_length


def evaluate_many(
    checkpoints: Sequence[str | os.PathLike],
    data: str | os.PathLike,
    lengths: Iterable[int] = DEFAULT_LENGTHS,
    *,
    mode: str = DEFAULT_MODE,
    stride: int | None = None,
    token_budget: int | None | str = "auto",
    seed: int = 0,
    rope_scaling: str | None = None,
    split: str | None = None,
    position_buckets: int = DEFAULT_POSITION_BUCKETS,
    device: str | torch.device = "auto",
    batch_tokens: int | None = None,
    progress: ProgressFn | None = None,
    should_stop: StopFn | None = None,
    cache_dir: str | os.PathLike | None = None,
    use_cache: bool = True,
    use_published: bool = True,
    normalizer_cap: int | None = None,
    reference: int | str = 0,
    require_intervals: bool = True,
    cache_only: bool = False,
) -> list[dict]:
    """Evaluate several checkpoints on the same windows (paired comparison); one result each.

    See ``evaluate_checkpoint`` for the arguments and the result; the settings are validated
    once (:class:`EvalSettings`), the data is loaded and the windows are planned once.
    ``progress(done, total, message)`` counts target tokens over all checkpoints and lengths
    (cached lengths count as done at once). Every result but the ``reference`` one (index or
    checkpoint name; default the first) carries, per length, ``paired_delta_bpb`` and
    ``paired_ci95`` against it (``with_paired_differences``).
    Raises: as ``evaluate_checkpoint``; a checkpoint that does not load raises
      CheckpointError before any scoring.
    """
    t_start = time.perf_counter()
    s = EvalSettings.make(
        data,
        lengths,
        mode=mode,
        stride=stride,
        token_budget=token_budget,
        seed=seed,
        rope_scaling=rope_scaling,
        split=split,
        position_buckets=position_buckets,
        device=device,
        batch_tokens=batch_tokens,
        normalizer_cap=normalizer_cap,
    )
    loaded = _load_checkpoints(checkpoints, s, reference)  # a bad checkpoint is an error before minutes of work
    plan = _plan_text(s)
    _refuse_what_cannot_fit(plan, loaded, s)
    settings = _run_settings(s, plan)
    cache_root = Path(cache_dir) if cache_dir is not None else default_cache_dir()
    if use_cache and cache_root.exists() and not cache_root.is_dir():
        raise EvaluationError(f"the cache folder {cache_root} is a file; give a folder (--cache-dir) or --no-cache")
    setup_seconds = time.perf_counter() - t_start  # loading checkpoints + data, planning windows
    total = sum(_targets(w, plan.window_tokens(n)) for n, w in plan.windows.items() if isinstance(w, list)) * len(
        loaded
    )
    prog = _Progress(total, progress, should_stop)
    results = []
    for c in loaded:
        t_ckpt = time.perf_counter()
        per_length = _evaluate_one(
            c,
            s,
            plan,
            prog,
            cache_root,
            use_cache=use_cache,
            use_published=use_published,
            require_intervals=require_intervals,
            cache_only=cache_only,
        )
        results.append(
            {
                "checkpoint": c.name,
                "checkpoint_path": str(c.path),
                "checkpoint_sha256": c.sha,
                "position_encoding": c.model.config.position_encoding,
                "train_seq_len": c.model.config.seq_len,
                "settings": settings,
                "data_fingerprint": plan.fingerprint,
                "fireviz_version": __version__,
                "device": _device_name(s.device),
                "seconds": time.perf_counter() - t_ckpt + setup_seconds,
                "normalizer_cap": c.cap,
                "per_length": per_length,
            }
        )
    results = with_paired_differences(results, reference)
    prog.report("done")
    return results


def _duration(seconds: float) -> str:
    seconds = max(0, int(round(seconds)))
    if seconds < 60:
        return f"{seconds} s"
    if seconds < 3600:
        return f"{seconds // 60} min {seconds % 60:02d} s"
    return f"{seconds // 3600} h {seconds % 3600 // 60:02d} min"


def evaluate_checkpoint(
    checkpoint: str | os.PathLike, data: str | os.PathLike, lengths: Iterable[int] = DEFAULT_LENGTHS, **kwargs
) -> dict:
    """Perplexity of one checkpoint at each evaluation length.

    Args:
      checkpoint: a checkpoint folder (config.json + model.safetensors) or a Hub repo id.
      data: ``"prose" | "latex" | "code"`` or a path accepted by ``fireviz.data.load_documents``.
      lengths: window lengths ``n`` in tokens (bytes), each >= 2.
      mode: ``"same_text"`` (default: the same documents' first M tokens at every length),
        ``"nonoverlapping"`` (random windows per length) or ``"sliding"`` with ``stride``
        tokens (1..n); see the module docstring.
      token_budget: ``"auto"`` (default: every qualifying document for same_text, 65536
        targets per length otherwise), an int (targets) or None (every eligible window).
      normalizer_cap: FIRE/FIRE-S only: evaluate with ψ(min(max(L, i), cap)), cap in tokens
        (e.g. the training length); part of the cache key and saved with the numbers
        (``normalizer_cap``); other checkpoints are evaluated as they are.
      reference: index, path or name of the checkpoint the others are paired against (a
        name shared by two of them is an error: give the path).
      cache_only: True: compute nothing; lengths found in the cache (or results.json) are
        returned as usual, the others as ``{"length", "error": NOT_COMPUTED, "not_computed": True}``
        (how the app shows what is already there, e.g. the lengths an evaluation finished
        before it was cancelled).
      require_intervals: True (default): a cached or published entry made before fireviz
        kept per-document losses (no ``ci95``, cannot be paired) is recomputed; False
        accepts it as it is (the app's cache-only lookup shows such numbers at once).
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
      "documents_skipped" for same_text; "paired_delta_bpb", "paired_ci95",
      "paired_reference" but for the reference) or {"length", "error"}]}`` with ``source``
      ``"computed"``, ``"cache"`` or ``"results.json"``;
      ``settings`` holds ``format`` (``EVAL_FORMAT_VERSION``) and the arguments above.
      ``seconds``: wall time of this call for this checkpoint (loading checkpoints and data
      and planning windows included); a per-length ``seconds`` is the scoring time when it
      was computed (also for a cached entry). With ``rope_scaling`` each per-length entry
      adds ``position_encoding`` (``rope_pi``/``yarn``) and the ``encoding_options`` used.
      All numbers are finite floats or ints (JSON without NaN).
    Raises: CheckpointError (does not load), DataError (unknown domain, no text, empty
      split), EvaluationError (bad settings, non-RoPE checkpoint with rope_scaling, CUDA
      unavailable), EvaluationCancelled. A length that cannot be evaluated (longer than every
      document, stride larger than it) is an ``{"length", "error"}`` entry, not an exception.
    """
    return evaluate_many([checkpoint], data, lengths, **kwargs)[0]


def _device_name(dev: torch.device) -> str:
    if dev.type == "cuda":
        return f"{dev} ({torch.cuda.get_device_name(dev)})"
    return "cpu"
