"""What decides an evaluation's numbers: the settings, validated once (``EvalSettings.make``).

An evaluation is fully described by its settings (lm-evaluation-harness and YaRN's perplexity
script taught that): data + split, lengths, mode, stride, token budget, seed, RoPE scaling,
BOS convention, loss-by-position buckets, numeric precision, FIRE's normalizer cap.
:meth:`EvalSettings.length_settings` is the per-length part of the cache key
(``fireviz.eval_cache.cache_key``); ``EVAL_FORMAT_VERSION`` is bumped whenever the numbers a
given setting produces would change. Units: tokens = bytes.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from . import synthetic
from .encodings import check_normalizer_cap
from .eval_device import resolve_device
from .eval_variants import ROPE_SCALINGS
from .windows import (
    DEFAULT_MODE,
    DEFAULT_POSITION_BUCKETS,
    DEFAULT_TOKEN_BUDGET,
    EvaluationError,
    _check_length,
    _check_mode,
    check_prefix_tokens,
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
    the sequences per length), ``seed``, ``rope_scaling``, ``split`` (resolved: None is
    ``"validation"``), ``position_buckets``,
    ``normalizer_cap``, ``device`` (resolved), ``precision``, ``batch_tokens`` (resolved; not
    part of any cache key), ``prefix_tokens`` (same_text only: the prefix ``M`` every length
    scores, None = the largest length; see ``windows.plan_same_text``). The per-length cache
    key is :meth:`length_settings`.
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
    prefix_tokens: int | None = None

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
        prefix_tokens=None,
    ) -> "EvalSettings":
        """Validated settings (the arguments of :func:`evaluate_many`). Raises: EvaluationError naming the bad one."""
        lengths = list(lengths)
        if not lengths:
            raise EvaluationError("no evaluation lengths given")
        for n in lengths:
            _check_length(n)
        mode = _check_mode(mode, stride)
        if prefix_tokens is not None:
            if mode != "same_text" or synthetic.is_synthetic(data):
                raise EvaluationError(
                    f"prefix_tokens applies to mode='same_text' on text (got mode={mode!r}, data {data!r}); "
                    "drop --prefix-tokens"
                )
            prefix_tokens = check_prefix_tokens(prefix_tokens, lengths)
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
        else:  # resolved here, so split=None and split="validation" are one cache key, as they are one text
            split = "validation" if split is None else split
            if split not in SPLITS:
                raise EvaluationError(f"split must be one of {', '.join(SPLITS)} (got {split!r})")
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
            prefix_tokens=prefix_tokens,
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
