"""What decides an evaluation's numbers: the settings, validated once (``EvalSettings.make``).

An evaluation is fully described by its settings (lm-evaluation-harness and YaRN's perplexity
script taught that): data + split, lengths, mode, stride, token budget, seed, RoPE scaling,
BOS convention, loss-by-position buckets, numeric precision, FIRE's normalizer cap.
:meth:`EvalSettings.length_settings` is the per-length part of the cache key
(``fireviz.eval.cache.cache_key``); ``EVAL_FORMAT_VERSION`` is bumped whenever the numbers a
given setting produces would change. Units: tokens = bytes.
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from dataclasses import dataclass, field, fields

import torch

from fireviz.checkpoints.causal_lm import HF_ROPE_SCALINGS
from fireviz.core import is_int
from fireviz.data import DOMAINS, synthetic
from fireviz.data.tokenizers import BOS_MODES
from fireviz.encodings import check_normalizer_cap
from fireviz.eval.device import resolve_device
from fireviz.eval.variants import ROPE_SCALINGS
from fireviz.eval.windows import (
    DEFAULT_CONTEXT_LENGTHS,
    DEFAULT_CONTEXT_PREFIX,
    DEFAULT_CONTEXT_STRIDE,
    DEFAULT_CONTEXT_TARGETS,
    DEFAULT_MODE,
    DEFAULT_POSITION_BUCKETS,
    DEFAULT_TOKEN_BUDGET,
    FULL_CONTEXT,
    EvaluationError,
    _check_length,
    _check_mode,
    check_context,
    check_prefix_tokens,
)

#: every rope_scaling a checkpoint of some kind takes
ALL_ROPE_SCALINGS = tuple(dict.fromkeys(ROPE_SCALINGS + HF_ROPE_SCALINGS))
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


def resolve_token_budget(mode: str, token_budget: int | None | str = "auto") -> int | None:
    """The token budget a mode uses: ``"auto"`` → None (every qualifying document) for
    ``same_text`` and ``context``, ``DEFAULT_TOKEN_BUDGET`` for the random-window modes; an int >= 1
    or None as given. Raises: EvaluationError for anything else."""
    if isinstance(token_budget, str) and token_budget == "auto":
        return None if mode in ("same_text", "context") else DEFAULT_TOKEN_BUDGET
    if token_budget is not None and (not is_int(token_budget) or token_budget < 1):
        raise EvaluationError(
            f"token_budget must be an integer >= 1, None (every window) or 'auto' (got {token_budget!r})"
        )
    return None if token_budget is None else int(token_budget)


def _check_seed_draws(data: str, mode: str, token_budget: int | None, seed: int) -> None:
    """Raises: EvaluationError for a seed that draws nothing — mode ``same_text`` (or ``context``)
    without a token budget scores every qualifying document, so another seed would only change the
    cache key."""
    if mode in ("same_text", "context") and token_budget is None and seed != 0 and not synthetic.is_synthetic(data):
        raise EvaluationError(
            f"seed={seed} changes nothing in mode={mode!r} without a token budget: every qualifying "
            "document is scored, none is drawn; drop --seed, or add --token-budget N to draw documents "
            "with it"
        )


#: the seeds ``torch.Generator().manual_seed`` takes (the windows are drawn with it)
SEED_RANGE = (-(2**63), 2**64 - 1)


def _integer(name: str, value, lo: int, hi: int | None = None, fix: str = "", span: str = "") -> int:
    """``value`` as an int (a numpy integer too) in ``lo`` … ``hi``. Raises: EvaluationError
    naming ``name`` (``span`` says the range, ``fix`` the remedy) for anything else: a bool,
    a float (2.0 included), a string, NaN."""
    if not is_int(value) or value < lo or (hi is not None and value > hi):
        span = span or (f">= {lo}" if hi is None else f"in {lo}..{hi}")
        raise EvaluationError(f"{name} must be an integer {span} (got {value!r}){fix}")
    return int(value)


def check_lengths(lengths) -> tuple[int, ...]:
    """The evaluation lengths as ints (tokens), in the order given, duplicates once.
    Raises: EvaluationError for no lengths, a single number or string instead of a list,
    or a length that is not an integer >= 2."""
    if isinstance(lengths, (str, bytes)) or not isinstance(lengths, Iterable):
        raise EvaluationError(f"lengths must be a list of integers >= 2 tokens, e.g. [128, 256] (got {lengths!r})")
    lengths = [_check_length(n) for n in lengths]
    if not lengths:
        raise EvaluationError("no evaluation lengths given")
    return tuple(dict.fromkeys(lengths))


def checkpoint_list(checkpoints) -> list:
    """``checkpoints`` as a list. Raises: EvaluationError for none, or for one path or string given
    where a list belongs (iterating it would read its characters as checkpoints)."""
    if isinstance(checkpoints, (str, bytes, os.PathLike)):
        raise EvaluationError(
            f"checkpoints must be a list of checkpoint folders or names, e.g. [{str(checkpoints)!r}] "
            f"(got the single {type(checkpoints).__name__} {str(checkpoints)!r}); use evaluate_checkpoint for one"
        )
    if not isinstance(checkpoints, Iterable):
        raise EvaluationError(f"checkpoints must be a list of checkpoint folders or names (got {checkpoints!r})")
    out = list(checkpoints)
    if not out:
        raise EvaluationError("no checkpoints given")
    return out


def _names_full(lengths) -> bool:
    """Whether ``lengths`` (any value) is a list naming the context length ``"full"``."""
    if isinstance(lengths, (str, bytes)) or not isinstance(lengths, Iterable):
        return False
    return any(isinstance(n, str) and n == FULL_CONTEXT for n in lengths)


def _context_settings(lengths, stride, prefix_tokens, context_targets) -> tuple[tuple[int, ...], int, int, int]:
    """mode ``context``: ``(context lengths, s, M, K)`` resolved and checked — defaults
    ``DEFAULT_CONTEXT_LENGTHS`` + full, s = 64, M = 8192, K = 256; ``"full"`` is ``M − K``.
    Raises: EvaluationError naming the setting and the fix (``windows.check_context``)."""
    stride = DEFAULT_CONTEXT_STRIDE if stride is None else stride
    M = DEFAULT_CONTEXT_PREFIX if prefix_tokens is None else prefix_tokens
    if not is_int(M) or M < 3:
        raise EvaluationError(f"prefix_tokens (--prefix-tokens) must be an integer >= 3 tokens (got {M!r})")
    K = _integer(
        "context_targets (--context-targets)",
        DEFAULT_CONTEXT_TARGETS if context_targets is None else context_targets,
        1,
    )
    M = int(M)
    check_context([], M, K, stride)  # K fits M before "full" (M − K) means anything
    if lengths is None:
        lengths = (*DEFAULT_CONTEXT_LENGTHS, FULL_CONTEXT)
    if not isinstance(lengths, (str, bytes)) and isinstance(lengths, Iterable):
        lengths = [M - K if isinstance(n, str) and n == FULL_CONTEXT else n for n in lengths]
    lengths = check_lengths(lengths)
    check_context(lengths, M, K, stride)
    return lengths, stride, M, K


def _windows_settings(data: str, mode, lengths, stride, prefix_tokens, context_targets):
    """``(lengths, mode, stride, prefix_tokens, context_targets)`` checked and resolved: what picks
    the windows (mode ``context``: context lengths, s, M and K, see ``_context_settings``).
    Raises: EvaluationError naming the bad setting and the fix."""
    context = mode == "context" and not synthetic.is_synthetic(data)
    if _names_full(lengths) and not context:
        raise EvaluationError(
            f"the length {FULL_CONTEXT!r} (the whole prefix M − K) is a context length of mode='context'; "
            "give lengths in tokens, or add --mode context"
        )
    if not context:
        lengths = check_lengths(DEFAULT_LENGTHS if lengths is None else lengths)
    if stride is not None:
        stride = _integer("stride", stride, 1, fix="; give a whole number of tokens, e.g. --stride 256")
    mode = _check_mode(mode, stride)
    if context:  # the lengths are context lengths; M, K and s resolved and checked together
        lengths, stride, prefix_tokens, context_targets = _context_settings(
            lengths, stride, prefix_tokens, context_targets
        )
    elif context_targets is not None:
        raise EvaluationError(
            f"context_targets applies to mode='context' on text (got mode={mode!r}, data {data!r}); "
            "drop --context-targets or add --mode context"
        )
    elif prefix_tokens is not None:
        if mode != "same_text" or synthetic.is_synthetic(data):
            raise EvaluationError(
                f"prefix_tokens applies to mode='same_text' or mode='context' on text (got mode={mode!r}, "
                f"data {data!r}); drop --prefix-tokens"
            )
        prefix_tokens = check_prefix_tokens(prefix_tokens, lengths)
    return lengths, mode, stride, prefix_tokens, context_targets


def _check_data(data) -> str:
    if not isinstance(data, (str, os.PathLike)) or not str(data).strip():
        raise EvaluationError(
            f"data must be a domain ({', '.join(DOMAINS)}), a file or folder path, or "
            f"{synthetic.PREFIX}<task> (got {data!r})"
        )
    return str(data)


#: ``make``'s default for a setting it derives itself (not an argument of ``make``)
DERIVED = "derived"


def _setting(default, *, job: bool = True, cache: bool = True, record: bool = True, omit_none: bool = False):
    """A field of :class:`EvalSettings` and what it is part of: ``default`` is what
    :meth:`EvalSettings.make` takes when it is not given (``DERIVED``: not an argument, ``make``
    computes it); ``job``: the job key (:meth:`EvalSettings.describe`); ``cache``: the per-length
    cache key (:meth:`EvalSettings.length_settings`); ``record``: the settings saved with every
    result (:meth:`EvalSettings.record`); ``omit_none``: left out of the keys while None (so the
    keys of settings made before it existed are unchanged)."""
    meta = {"input_default": default, "job": job, "cache": cache, "record": record, "omit_none": omit_none}
    return field(metadata=meta)


@dataclass(frozen=True)
class EvalSettings:
    """Everything that decides an evaluation's numbers, validated once (``EvalSettings.make``).

    Its fields are the one list of evaluation settings: each declares (``_setting``) its default
    for ``make`` and whether it is part of the job key (:meth:`describe`), the per-length cache key
    (:meth:`length_settings`) and the saved record (:meth:`record`), in the record's order.

    Fields (units: tokens): ``data`` (a domain, path or ``synthetic:<task>``), ``split`` (resolved:
    None is ``"validation"``), ``lengths`` (user order, duplicates once), ``mode``
    (``windows.MODES``, or ``"synthetic"`` for a task), ``stride``, ``token_budget`` (resolved:
    None = every qualifying document/window; for a task the sequences per length), ``seed``,
    ``rope_scaling``, ``position_buckets``, ``precision`` (from the device), ``batch_tokens``
    (resolved; no number depends on it), ``bos`` (the BOS convention), ``normalizer_cap``,
    ``bos_mode`` (None: each model's own BOS convention; else ``fireviz.data.tokenizers.BOS_MODES``),
    ``prefix_tokens`` (same_text: the prefix ``M`` every length scores, None = the largest length,
    see ``windows.plan_same_text``; context: ``M``, resolved), ``context_targets`` (context only:
    ``K``, the targets per document; None in the other modes), ``device`` (resolved).
    In mode ``context`` the ``lengths`` are context lengths ``c`` (``"full"`` resolved to
    ``M − K``) and ``stride`` is ``s``, the targets a window scores (resolved, default 64); see
    ``windows.plan_context``.
    """

    data: str = _setting(None, cache=False)
    split: str | None = _setting(None)
    lengths: tuple[int, ...] = _setting(None, cache=False)
    mode: str = _setting(DEFAULT_MODE)
    stride: int | None = _setting(None)
    token_budget: int | None = _setting("auto")
    seed: int = _setting(0)
    rope_scaling: str | None = _setting(None)
    position_buckets: int = _setting(DEFAULT_POSITION_BUCKETS)
    precision: str = _setting(DERIVED)
    batch_tokens: int = _setting(None, job=False, cache=False)
    bos: str = _setting(DERIVED, job=False)
    # the cache key holds the cap in effect for each checkpoint (None for one without FIRE modules)
    normalizer_cap: int | None = _setting(None, cache=False)
    # as the plan resolves them (same_text: M defaults to the largest length): keyed and recorded per plan
    prefix_tokens: int | None = _setting(None, cache=False, record=False, omit_none=True)
    context_targets: int | None = _setting(None, record=False, omit_none=True)
    device: torch.device = _setting("auto", job=False, cache=False, record=False)
    # BOS convention besides each model's own (None): fireviz.data.tokenizers.BOS_MODES
    bos_mode: str | None = _setting(None, record=False, omit_none=True)

    @classmethod
    def make(cls, data, lengths=None, **settings) -> "EvalSettings":
        """Validated settings, every field normalized: integers are ints (numpy integers too; a
        float, bool or string is refused, never rounded), so equal settings are one cache key.
        ``settings``: any of ``SETTING_NAMES`` (the fields with a default, ``device``
        ``"auto"``/``"cpu"``/``"cuda"`` and ``token_budget`` ``"auto"`` included). ``lengths`` None:
        ``DEFAULT_LENGTHS`` (mode ``context``: 128 … 4096 and full). Each setting is validated here
        and nowhere else. Raises: EvaluationError naming the bad or unknown one and the fix."""
        check_setting_names(settings)
        v = {f.name: settings.get(f.name, f.metadata["input_default"]) for f in fields(cls) if f.name in SETTING_NAMES}
        data = _check_data(data)
        lengths, mode, stride, prefix_tokens, context_targets = _windows_settings(
            data, v["mode"], lengths, v["stride"], v["prefix_tokens"], v["context_targets"]
        )
        token_budget = resolve_token_budget(mode, v["token_budget"])
        seed = _integer(
            "seed", v["seed"], *SEED_RANGE, fix="; give a whole number, e.g. 0", span="in -2**63 … 2**64 − 1"
        )
        _check_seed_draws(data, mode, token_budget, seed)
        rope_scaling = v["rope_scaling"]
        if rope_scaling is not None and rope_scaling not in ALL_ROPE_SCALINGS:
            raise EvaluationError(
                f"rope_scaling must be one of {', '.join(ALL_ROPE_SCALINGS)} or None (got {rope_scaling!r}): "
                f"{', '.join(ROPE_SCALINGS)} for fireviz checkpoints, {', '.join(HF_ROPE_SCALINGS)} for published models"
            )
        position_buckets = _integer(
            "position_buckets", v["position_buckets"], 1, fix=f"; e.g. {DEFAULT_POSITION_BUCKETS}"
        )
        batch_tokens = v["batch_tokens"]
        if batch_tokens is not None:
            batch_tokens = _integer(
                "batch_tokens", batch_tokens, 1, fix="; omit it for the default (8192 on CPU, 16384 on CUDA)"
            )
        try:  # before any checkpoint is read
            normalizer_cap = check_normalizer_cap(v["normalizer_cap"])
        except ValueError as e:
            raise EvaluationError(str(e)) from None
        dev = resolve_device(v["device"])
        bos_mode = v["bos_mode"]
        if bos_mode is not None and bos_mode not in BOS_MODES:
            raise EvaluationError(
                f"bos_mode must be one of {', '.join(BOS_MODES)} or None for each model's own convention "
                f"(got {bos_mode!r})"
            )
        mode, split, token_budget = _split_and_task(data, mode, stride, v["split"], token_budget)
        return cls(
            data=data,
            split=split,
            lengths=lengths,
            mode=mode,
            stride=stride,
            token_budget=token_budget,
            seed=seed,
            rope_scaling=rope_scaling,
            position_buckets=position_buckets,
            precision="bfloat16-autocast" if dev.type == "cuda" else "float32",
            batch_tokens=batch_tokens or (16384 if dev.type == "cuda" else 8192),
            bos=BOS_CONVENTION,
            normalizer_cap=normalizer_cap,
            prefix_tokens=prefix_tokens,
            context_targets=context_targets,
            device=dev,
            bos_mode=bos_mode,
        )

    def _values(self, flag: str, given: dict) -> dict:
        """``{field: value}`` of the fields marked ``flag`` (``given`` overrides a value), in field
        order; a field marked ``omit_none`` left out of a key while None."""
        out = {}
        for f in fields(self):
            if not f.metadata[flag]:
                continue
            value = given[f.name] if f.name in given else getattr(self, f.name)
            if value is None and f.metadata["omit_none"] and flag != "record":
                continue
            out[f.name] = value
        return out

    def describe(self) -> dict:
        """What decides this evaluation's numbers, canonical and JSON-able (an evaluation job's key,
        ``fireviz.ui.jobs``): equal for every spelling of one computation (``device="auto"`` or
        ``"cpu"`` on a CPU machine, ``token_budget="auto"`` or its resolved value, ``split=None`` or
        ``"validation"``, lengths in any order): ``format`` (``EVAL_FORMAT_VERSION``) and the fields
        marked ``job``; the device counts through the precision it decides; ``batch_tokens`` changes
        no number and is left out."""
        return {"format": EVAL_FORMAT_VERSION, **self._values("job", {"lengths": sorted(self.lengths)})}

    def length_settings(self, n: int, prefix_tokens: int | None, cap: int | None, flex: bool) -> dict:
        """The settings that decide the numbers at length ``n``: the cache key's settings —
        ``format``, ``length``, the fields marked ``cache``, the prefix ``M`` the plan resolved
        (same_text, context), the normalizer cap in effect for this checkpoint (FIRE only), the
        attention path where it changes bf16 numbers (``flex``, GPU only) and a task's format."""
        out = {"format": EVAL_FORMAT_VERSION, "length": n, **self._values("cache", {})}
        if flex:  # bf16 numbers differ slightly between the two paths: part of the key (GPU only)
            out["attention"] = "flex"
        if prefix_tokens is not None:  # same_text, context: the windows at n depend on the prefix M
            out["prefix_tokens"] = prefix_tokens
        if cap is not None:  # only FIRE has a normalizer; other checkpoints keep their plain key
            out["normalizer_cap"] = cap
        if self.mode == "synthetic":
            out["task_format"] = self.task_format()
        return out

    def record(self, plan) -> dict:
        """The ``settings`` every result carries: ``format`` and the fields marked ``record`` (the
        split and document count as the plan ``fireviz.eval.plan.Plan`` read them), then what the
        plan resolved — same_text: ``prefix_tokens``, ``documents_scored``, ``documents_skipped``;
        context: those and ``context_targets`` K and ``full_context`` M − K; a task: its format."""
        values = self._values("record", {"split": plan.split, "lengths": list(self.lengths)})
        out: dict = {"format": EVAL_FORMAT_VERSION}
        for k, value in values.items():
            out[k] = value
            if k == "bos":  # the document count follows the BOS convention in every saved record
                out["documents"] = plan.documents
                if self.bos_mode is not None:
                    out["bos_mode"] = self.bos_mode
        if plan.same_text is not None:
            out.update(
                prefix_tokens=plan.same_text.prefix_tokens,
                documents_scored=len(plan.same_text.documents),
                documents_skipped=plan.same_text.documents_skipped,
            )
        if plan.context is not None:
            out.update(
                prefix_tokens=plan.context.prefix_tokens,
                context_targets=plan.context.targets,
                full_context=plan.context.full,
                documents_scored=len(plan.context.documents),
                documents_skipped=plan.context.documents_skipped,
            )
        if self.mode == "synthetic":
            out["task_format"] = self.task_format()  # as in length_settings: results.json rows match the cache key
        return out

    def task_format(self) -> int:
        """The synthetic evaluation's format, part of its cache key: 2 = sequences of n + 1 tokens
        (the training format at seq_len n) drawn from seed 0's set; 3 = the same from another
        ``seed`` (``synthetic.evaluation_seed``; format 2 entries made before seeds drew anything
        are never read back for one)."""
        return 2 if self.seed == 0 else 3


def _split_and_task(data: str, mode: str, stride, split, token_budget):
    """``(mode, split, token_budget)`` resolved: a synthetic task is scored on whole sequences
    (mode ``"synthetic"``, split ``"synthetic"``, ``SYNTHETIC_SEQUENCES`` per length by default);
    text gets split None → ``"validation"``. Raises: EvaluationError for a mode, stride or split
    that does not apply."""
    if synthetic.is_synthetic(data):
        # every length gets its own task sequences of exactly that length (the same for every
        # checkpoint); only the answer positions are scored
        if mode != DEFAULT_MODE or stride is not None:
            raise EvaluationError(f"{data} is scored on whole task sequences, one per window; drop --mode/--stride")
        if split not in (None, "validation"):
            raise EvaluationError(f"{data} draws fresh task sequences, it has no {split!r} split; drop --split")
        return "synthetic", "synthetic", SYNTHETIC_SEQUENCES if token_budget is None else token_budget
    # resolved here, so split=None and split="validation" are one cache key, as they are one text
    split = "validation" if split is None else split
    if split not in SPLITS:
        raise EvaluationError(f"split must be one of {', '.join(SPLITS)} (got {split!r})")
    return mode, split, token_budget


#: the keyword arguments of :meth:`EvalSettings.make` besides ``data`` and ``lengths``: every field
#: with a default of its own (the others ``make`` derives), in field order
SETTING_NAMES = tuple(
    f.name for f in fields(EvalSettings) if f.metadata["input_default"] != DERIVED and f.name not in ("data", "lengths")
)


def check_setting_names(settings: dict, also: tuple[str, ...] = ()) -> None:
    """Raises: EvaluationError naming any key of ``settings`` that is neither an evaluation
    setting (``SETTING_NAMES``) nor one of ``also``."""
    unknown = sorted(str(k) for k in settings if k not in SETTING_NAMES and k not in also)
    if unknown:
        raise EvaluationError(
            f"unknown evaluation setting(s) {', '.join(unknown)}; the settings are "
            f"{', '.join(SETTING_NAMES + tuple(also))}"
        )
