"""Perplexity versus evaluation length: the length-generalization curve of a checkpoint.

An evaluation is fully described by its settings (lm-evaluation-harness and YaRN's
perplexity script taught that): data + split, lengths, mode, stride, token budget, seed,
RoPE scaling, BOS convention, loss-by-position buckets, numeric precision. Every result
carries them, and results are cached on disk under a key made of the checkpoint's sha256,
the data fingerprint and those settings. A checkpoint folder's own ``results.json`` (the
shipped numbers) serves as a read-only cache under the same key.

Conventions (units: tokens = bytes, loss in nats per token, bits per byte = nats / ln 2):

* A document is ``[BOS] + UTF-8 bytes`` (``fireviz.data.document_tokens``), exactly as in
  training. A window of ``n`` tokens is ``n`` consecutive tokens of *one* document; windows
  never cross documents, so the model really sees ``n`` tokens of context. Predictions at
  window positions ``0 … n−2`` score the targets at window positions ``1 … n−1``; the first
  token of a window is context only. BOS (document position 0) is therefore never a target.
* Only documents with at least ``n`` tokens are eligible at length ``n``.
* ``mode="same_text"`` (the default and the published protocol): one fixed set of tokens
  is scored at every requested length. With ``M`` the largest requested length that some
  document holds, the documents with at least ``M`` tokens qualify (the others are
  skipped and counted in ``documents_skipped``); each contributes its first ``M`` tokens,
  cut at length ``n`` into windows that overlap by one token, ``[0, n), [n − 1, 2n − 1),
  …`` — the last target of a window is the first (context-only) token of the next — plus
  one tail window ending at ``M`` that scores only what is left
  (``sliding_windows(M, n, stride=n − 1)``). Every length therefore scores exactly the same
  targets, tokens ``1 … M − 1`` of the same documents, each once: a change from one column
  to the next is the effect of context alone.
  ``token_budget`` (default None: every qualifying document) takes whole documents in
  seeded random order until ``documents · (M − 1)`` reaches it.
* ``mode="nonoverlapping"`` (Press et al. 2022, "Train Short, Test Long", nonoverlapping
  evaluation): candidates are the windows ``[0, n), [n, 2n), …`` of every eligible
  document, enumerated in document-id order, shuffled with ``torch.Generator().manual_seed
  (seed)``; windows are taken in that order until ``token_budget`` targets are reached.
  Each window scores its ``n − 1`` targets.
* ``mode="sliding"`` with stride ``s`` (lm-evaluation-harness rolling log-likelihood; the
  sliding-window perplexity of the YaRN / Hugging Face perplexity script): eligible
  documents are shuffled the same way and taken whole until the budget is reached (the
  last one is cut to the prefix that meets the budget, at least ``n`` tokens). Window ``k``
  of a document of ``N`` tokens ends at ``e_k = min(n + k·s, N)`` and starts at ``e_k − n``;
  it scores the targets ``e_{k−1} … e_k − 1`` not yet scored (the first window scores
  ``1 … n−1``). With ``s <= n − 1`` every token ``1 … N−1`` is scored exactly once; with
  ``s = n`` the windows are the non-overlapping ones (plus a tail window that scores the
  remainder) — the same numbers as ``mode="nonoverlapping"`` when ``N`` is a multiple of
  ``n``. ``s > n`` is an error.

The selection depends only on the data, the length and the settings, never on the
checkpoint, so every checkpoint at a given length sees the same windows (paired comparison).

Uncertainty. Each length keeps its per-document sums (``per_document``: document ids,
summed nats, scored tokens). ``ci95`` is a 95 % percentile bootstrap interval of the
token-weighted bits per byte, resampling documents with replacement (``BOOTSTRAP_SAMPLES``
resamples, generator seeded with ``BOOTSTRAP_SEED``): documents, not tokens, are the
independent units. For every checkpoint but the reference (the first given unless told),
``paired_delta_bpb`` = its bits per byte minus the reference's on the same windows, with
``paired_ci95`` from the same document resampling applied to both at once (Koehn 2004,
paired bootstrap resampling) — far narrower than either interval, since the text's own
difficulty cancels.
"""
from __future__ import annotations

import argparse
import hashlib
import json
import math
import os
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterable, Sequence

import numpy as np
import torch
import torch.nn.functional as F

from . import __version__, synthetic
from .checkpoints import checkpoint_files, checkpoint_sha256, load_model  # noqa: F401  (the one door)
from .data import (DOMAINS, DataError, Document, data_fingerprint, DocumentTokens, load_documents,
                   split_documents)
from .encodings import check_normalizer_cap, fire_modules
from .files import FileFormatError, read_json, write_json_atomic
from .memory import available_bytes, forward_bytes, gib
from .model import GPT, CheckpointError, GPTConfig, load_state_checked, nonfinite_parameters

DEFAULT_LENGTHS = (128, 256, 512, 1024, 2048, 4096, 8192)
#: targets (tokens) scored per length unless told otherwise
DEFAULT_TOKEN_BUDGET = 65536
DEFAULT_POSITION_BUCKETS = 16
MODES = ("same_text", "nonoverlapping", "sliding")
DEFAULT_MODE = "same_text"
#: sequences per length when evaluating on a synthetic task (``--data synthetic:copy``)
SYNTHETIC_SEQUENCES = 256
#: document resamples of the bootstrap intervals, and the seed of their generator
BOOTSTRAP_SAMPLES = 2000
BOOTSTRAP_SEED = 0
#: fewer documents than this get no interval (``ci95``/``paired_ci95`` None), not a falsely narrow one
MIN_INTERVAL_DOCUMENTS = 10
ROPE_SCALINGS = ("pi", "yarn")
SPLITS = ("validation", "train", "all")
#: bumped whenever the numbers a given setting produces would change; part of the cache key
EVAL_FORMAT_VERSION = 1
BOS_CONVENTION = ("each document starts with BOS (id 256) as in training; windows are taken from a "
                  "document's [BOS]+bytes sequence and never cross documents; the first token of a "
                  "window is context only, so BOS is never a target")
_PER_LENGTH_FIELDS = ("length", "nats_per_token", "perplexity", "bits_per_byte", "tokens_scored", "windows",
                      "loss_by_position")
#: fields added after the first round of results: checked when present, required in same_text
_PER_DOCUMENT_FIELDS = ("doc", "nats", "tokens")

ProgressFn = Callable[[int, int, str], None]
StopFn = Callable[[], bool]


#: ``error`` of a length a ``cache_only`` call found no result for.
NOT_COMPUTED = "not computed yet"


class EvaluationError(ValueError):
    """Settings that cannot be evaluated: a bad mode/stride/length/device/scaling request."""


class NonFiniteLossError(EvaluationError):
    """A checkpoint's loss is NaN/inf: reported (naming the non-finite weights, if any), never
    cached or shown as a number; the CLI exits non-zero."""


class EvaluationCancelled(RuntimeError):
    """Raised when ``should_stop()`` returned True; lengths finished before stay cached."""


# ---------------------------------------------------------------------------------------------
# Window selection (pure functions of document lengths and settings)
# ---------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Window:
    """One evaluation window.

    Attributes:
      doc: index into the evaluated document list.
      start: position (tokens) of the window's first token in the document's ``[BOS]+bytes``.
      first_target: window position of the first scored target, ``1 <= first_target < n``;
        targets are window positions ``first_target … n − 1``.
    """

    doc: int
    start: int
    first_target: int


def nonoverlapping_windows(num_tokens: int, length: int) -> list[tuple[int, int]]:
    """The non-overlapping windows of one document (Press et al. 2022).

    Args: ``num_tokens`` of the document (incl. BOS) and window ``length``, both in tokens.
    Returns: ``[(start, first_target)]`` = ``[(0, 1), (n, 1), (2n, 1), …]`` for every window
      that fits entirely; the remainder shorter than ``n`` is not scored.
    Raises: EvaluationError if ``length < 2``.
    """
    _check_length(length)
    return [(start, 1) for start in range(0, num_tokens - length + 1, length)]


def sliding_windows(num_tokens: int, length: int, stride: int) -> list[tuple[int, int]]:
    """Sliding windows over one document, scoring only targets not yet scored.

    The rolling scheme of lm-evaluation-harness (``loglikelihood_rolling``) and the YaRN /
    Hugging Face sliding-window perplexity script: window ``k`` ends at
    ``e_k = min(length + k·stride, num_tokens)``, starts at ``e_k − length`` and scores
    targets ``e_{k−1} … e_k − 1`` (the first window: ``1 … length − 1``).

    Args: document ``num_tokens`` (incl. BOS) >= ``length`` >= 2; ``1 <= stride <= length``.
    Returns: ``[(start, first_target)]`` in document order. With ``stride <= length − 1`` every
      token ``1 … num_tokens − 1`` is a target exactly once (``num_tokens − 1`` targets);
      with ``stride = length`` the windows are the non-overlapping ones plus a tail window.
    Raises: EvaluationError for ``stride`` outside ``[1, length]``, ``length < 2``, or a
      document shorter than ``length``.
    """
    _check_length(length)
    if not 1 <= stride <= length:
        raise EvaluationError(f"stride {stride} is larger than the window ({length} tokens); use 1 <= stride <= "
                              f"{length}" if stride > length else f"stride must be >= 1 (got {stride})")
    if num_tokens < length:
        raise EvaluationError(f"a document of {num_tokens} tokens is shorter than the window ({length})")
    out = [(0, 1)]
    end = length
    while end < num_tokens:
        new_end = min(end + stride, num_tokens)
        start = new_end - length
        # A window's position 0 has no prediction, so at most length−1 new targets per window.
        first_target = max(end - start, 1)
        out.append((start, first_target))
        end = new_end
    return out


def plan_windows(doc_ids: Sequence[str], doc_num_tokens: Sequence[int], length: int, *,
                 mode: str = "nonoverlapping", stride: int | None = None,
                 token_budget: int | None = DEFAULT_TOKEN_BUDGET, seed: int = 0) -> list[Window]:
    """The deterministic evaluation windows at one length (see the module docstring).

    Args:
      doc_ids, doc_num_tokens: per document, its id and ``num_tokens`` (incl. BOS).
      length: window length ``n`` in tokens (>= 2).
      mode: ``"nonoverlapping"`` or ``"sliding"`` (needs ``stride``).
      token_budget: targets to score (>= 1), or None for every eligible window/document.
        Non-overlapping: windows are added until ``windows·(n−1) >= budget``. Sliding: whole
        documents, the last cut to a prefix so that the targets just reach the budget.
      seed: shuffling seed (``torch.Generator().manual_seed(seed)``).
    Returns: windows sorted by (document, start); independent of any checkpoint.
    Raises: EvaluationError if no document has ``length`` tokens, or for a bad mode,
      stride or budget.
    """
    _check_length(length)
    mode = _check_mode(mode, stride)
    if mode == "same_text":
        raise EvaluationError("mode='same_text' plans every length at once: use plan_same_text")
    if mode == "sliding" and stride > length:
        raise EvaluationError(f"stride {stride} is larger than the window ({length} tokens)")
    if token_budget is not None and token_budget < 1:
        raise EvaluationError(f"token_budget must be >= 1 target token or None (got {token_budget})")
    eligible = sorted((i for i, n in enumerate(doc_num_tokens) if n >= length), key=lambda i: (doc_ids[i], i))
    if not eligible:
        longest = max(doc_num_tokens, default=0)
        raise EvaluationError(f"no document has {length} tokens (the longest has {longest}); windows never cross "
                              "documents, so this length cannot be evaluated on this data")
    gen = torch.Generator().manual_seed(int(seed))
    budget = math.inf if token_budget is None else token_budget
    chosen: list[Window] = []
    if mode == "nonoverlapping":
        # candidate k is the k-th of every eligible document's nonoverlapping_windows, in order; it is
        # found from the cumulative counts, so memory is 8 bytes per candidate (the permutation), not a
        # Python tuple each (a 50 MB document holds ~10⁵ windows)
        ends = np.cumsum([(doc_num_tokens[d] - length) // length + 1 for d in eligible])
        scored = 0
        for part in torch.randperm(int(ends[-1]), generator=gen).split(4096):
            for k in part.tolist():
                if scored >= budget:
                    break
                i = int(np.searchsorted(ends, k, side="right"))
                chosen.append(Window(eligible[i], int(k - (ends[i - 1] if i else 0)) * length, 1))
                scored += length - 1
            if scored >= budget:
                break
    else:
        scored = 0
        for k in torch.randperm(len(eligible), generator=gen).tolist():
            if scored >= budget:
                break
            d = eligible[k]
            n_tok = doc_num_tokens[d]
            if scored + n_tok - 1 > budget:  # cut the last document to the prefix that meets the budget
                n_tok = max(length, int(budget - scored) + 1)
            chosen.extend(Window(d, s, f) for s, f in sliding_windows(n_tok, length, stride))
            scored += n_tok - 1
    return sorted(chosen, key=lambda w: (w.doc, w.start))


@dataclass(frozen=True)
class SameTextPlan:
    """The fixed text of a ``same_text`` evaluation (see the module docstring).

    Attributes:
      prefix_tokens: ``M``, the largest requested length some document holds (tokens).
      documents: indices (into the evaluated list) of the documents scored, sorted.
      documents_skipped: documents shorter than ``M`` (not scored at any length).
      windows: length → windows over the first ``M`` tokens of each scored document;
        a length no document holds maps to its error message instead.
    """

    prefix_tokens: int
    documents: tuple[int, ...]
    documents_skipped: int
    windows: dict


def plan_same_text(doc_ids: Sequence[str], doc_num_tokens: Sequence[int], lengths: Sequence[int], *,
                   token_budget: int | None = None, seed: int = 0) -> SameTextPlan:
    """The windows of a ``same_text`` evaluation: the same documents and tokens at every length.

    Args:
      doc_ids, doc_num_tokens: per document, its id and ``num_tokens`` (incl. BOS).
      lengths: window lengths in tokens (each >= 2).
      token_budget: None (default) for every qualifying document; else whole documents in
        seeded random order (``torch.Generator().manual_seed(seed)``) until
        ``documents · (M − 1) >= token_budget``.
    Returns: a :class:`SameTextPlan`; lengths longer than every document map to an error
      message (they cannot be evaluated; they do not shrink the text of the others).
    Raises: EvaluationError for a bad length or budget, or if no length can be evaluated.
    """
    lengths = [int(n) for n in lengths]
    for n in lengths:
        _check_length(n)
    if token_budget is not None and token_budget < 1:
        raise EvaluationError(f"token_budget must be >= 1 target token or None (got {token_budget})")
    longest = max(doc_num_tokens, default=0)
    feasible = [n for n in lengths if n <= longest]
    if not feasible:
        raise EvaluationError(f"no document has {min(lengths)} tokens (the longest has {longest}); windows never "
                              "cross documents, so these lengths cannot be evaluated on this data")
    M = max(feasible)
    eligible = sorted((i for i, n in enumerate(doc_num_tokens) if n >= M), key=lambda i: (doc_ids[i], i))
    if token_budget is not None:
        order = torch.randperm(len(eligible), generator=torch.Generator().manual_seed(int(seed))).tolist()
        take = min(len(eligible), max(1, math.ceil(token_budget / (M - 1))))
        eligible = sorted((eligible[k] for k in order[:take]), key=lambda i: (doc_ids[i], i))
    windows: dict = {}
    for n in dict.fromkeys(lengths):
        if n > M:
            windows[n] = (f"no document has {n} tokens (the longest has {longest}); windows never cross documents, "
                          "so this length cannot be evaluated on this data")
            continue
        per_doc = sliding_windows(M, n, n - 1)  # every target 1 … M − 1 once, at every length
        windows[n] = [Window(d, start, first) for d in eligible for start, first in per_doc]
    skipped = sum(1 for n in doc_num_tokens if n < M)
    return SameTextPlan(M, tuple(eligible), skipped, windows)


def _check_length(length: int) -> None:
    if int(length) != length or length < 2:
        raise EvaluationError(f"evaluation length must be an integer >= 2 tokens (got {length!r})")


def _check_mode(mode: str | None, stride: int | None) -> str:
    mode = DEFAULT_MODE if mode is None else mode
    if mode not in MODES:
        raise EvaluationError(f"mode must be one of {', '.join(MODES)} (got {mode!r})")
    if mode == "sliding":
        if stride is None:
            raise EvaluationError("sliding mode needs a stride (tokens), e.g. --stride 256")
        if int(stride) != stride or stride < 1:
            raise EvaluationError(f"stride must be an integer >= 1 token (got {stride!r})")
    elif stride is not None:
        raise EvaluationError(f"a stride applies only to mode='sliding' ({mode} windows do not overlap and have "
                              "none); drop --stride or add --mode sliding")
    return mode


def position_buckets(length: int, buckets: int = DEFAULT_POSITION_BUCKETS) -> tuple[list[int], list[int]]:
    """Equal-width buckets over the target positions ``1 … length − 1`` of a window.

    Returns: ``(starts, ends)``, ends exclusive, in window positions (tokens); a target at
      window position p was predicted from p tokens of context. At most ``length − 1``
      buckets. Raises: EvaluationError if ``buckets < 1`` or ``length < 2``.
    """
    _check_length(length)
    if buckets < 1:
        raise EvaluationError(f"position_buckets must be >= 1 (got {buckets})")
    edges = np.unique(np.round(np.linspace(1, length, min(buckets, length - 1) + 1)).astype(np.int64))
    return edges[:-1].tolist(), edges[1:].tolist()


# ---------------------------------------------------------------------------------------------
# Scoring
# ---------------------------------------------------------------------------------------------
def _as_long(tokens) -> torch.Tensor:
    """A window's token ids (torch tensor or numpy array of any integer type) as int64."""
    if isinstance(tokens, torch.Tensor):
        return tokens.long()
    return torch.from_numpy(np.ascontiguousarray(tokens, dtype=np.int64))  # a numpy window


def score_windows(model: GPT, doc_tokens: Callable[[int], torch.Tensor], windows: Sequence[Window], length: int, *,
                  device: torch.device | str = "cpu", batch_tokens: int = 8192,
                  on_batch: Callable[[int], None] | None = None, with_accuracy: bool = False) -> tuple:
    """Summed next-token loss by window position over ``windows`` of ``length`` tokens.

    Runs the model on batches of ``max(1, batch_tokens // length)`` windows under
    ``torch.inference_mode()`` (bf16 autocast on CUDA; float32 on CPU); the loss is
    ``F.cross_entropy`` in float32 of the prediction at window position ``p − 1`` for the
    token at position ``p``, kept only for ``p >= window.first_target``.

    Args:
      model: a GPT in eval mode on ``device``.
      doc_tokens: document index → its ``[BOS] + bytes`` token ids ``[num_tokens]`` (a torch
        tensor or a numpy integer array; each window is copied out as int64).
      windows: from ``plan_windows``; all of ``length`` tokens.
      on_batch: called with the number of windows finished after each batch (may raise
        ``EvaluationCancelled`` to stop).
    Returns: ``(nats_sum float64 [length], counts int64 [length], nats_by_doc,
      tokens_by_doc)``: the first two indexed by window position (index 0 is always zero,
      never a target); the last two map each document index to its summed nats (float)
      and scored tokens (int). With ``with_accuracy`` a fifth: document index → targets
      whose argmax prediction is right (int).
    Raises: ValueError from the model (e.g. absolute embeddings past ``seq_len``).
    """
    device = torch.device(device)
    nats = torch.zeros(length, dtype=torch.float64)
    counts = torch.zeros(length, dtype=torch.int64)
    per_batch = max(1, int(batch_tokens) // length)
    pos = torch.arange(1, length)  # target positions
    doc_nats: dict[int, float] = {}
    doc_tokens_scored: dict[int, int] = {}
    doc_correct: dict[int, int] = {}
    use_autocast = device.type == "cuda"
    with torch.inference_mode():
        for b in range(0, len(windows), per_batch):
            batch = windows[b: b + per_batch]
            x = torch.stack([_as_long(doc_tokens(w.doc)[w.start: w.start + length]) for w in batch]).to(device)
            first = torch.tensor([w.first_target for w in batch])
            with torch.autocast(device_type=device.type, dtype=torch.bfloat16, enabled=use_autocast):
                logits = model(x)
            nll = F.cross_entropy(logits[:, :-1].float().reshape(-1, logits.shape[-1]), x[:, 1:].reshape(-1),
                                  reduction="none").view(len(batch), length - 1).double().cpu()
            keep = pos[None, :] >= first[:, None]  # [batch, length − 1]
            kept = nll * keep
            nats[1:] += kept.sum(0)
            counts[1:] += keep.sum(0)
            for w, row_nats, row_count in zip(batch, kept.sum(1).tolist(), keep.sum(1).tolist()):
                doc_nats[w.doc] = doc_nats.get(w.doc, 0.0) + row_nats
                doc_tokens_scored[w.doc] = doc_tokens_scored.get(w.doc, 0) + int(row_count)
            if with_accuracy:
                hit = ((logits[:, :-1].argmax(-1) == x[:, 1:]).cpu() & keep).sum(1).tolist()
                for w, h in zip(batch, hit):
                    doc_correct[w.doc] = doc_correct.get(w.doc, 0) + int(h)
            del logits, nll
            if on_batch is not None:
                on_batch(len(batch))
    if with_accuracy:
        return nats.numpy(), counts.numpy(), doc_nats, doc_tokens_scored, doc_correct
    return nats.numpy(), counts.numpy(), doc_nats, doc_tokens_scored


def bootstrap_indices(num_documents: int, samples: int = BOOTSTRAP_SAMPLES, seed: int = BOOTSTRAP_SEED) -> np.ndarray:
    """Document resamples with replacement, int64 ``[samples, num_documents]``.

    Deterministic (numpy ``default_rng(seed)``); the same matrix for every checkpoint with
    the same number of documents, which is what makes the paired bootstrap paired.
    Raises: EvaluationError for ``num_documents < 1`` or ``samples < 1``.
    """
    if num_documents < 1 or samples < 1:
        raise EvaluationError(f"a bootstrap needs >= 1 document and >= 1 sample (got {num_documents}, {samples})")
    return np.random.default_rng(seed).integers(0, num_documents, size=(samples, num_documents))


def bootstrap_ci95(nats: Sequence[float], tokens: Sequence[int], *, samples: int = BOOTSTRAP_SAMPLES,
                   seed: int = BOOTSTRAP_SEED) -> list[float] | None:
    """95 % percentile bootstrap interval of the token-weighted bits per byte over documents.

    Args: per document, summed nats (float) and scored tokens (int, > 0 in total).
    Returns: ``[low, high]`` in bits per byte (2.5th and 97.5th percentiles of
      ``Σ nats / Σ tokens / ln 2`` over ``samples`` document resamples); None for fewer than
      ``MIN_INTERVAL_DOCUMENTS`` documents (with 2 or 3 the bootstrap has a handful of distinct
      resamples and its interval looks far more certain than it is).
    Raises: EvaluationError for mismatched lengths or no scored token.
    """
    nats, tokens = np.asarray(nats, dtype=np.float64), np.asarray(tokens, dtype=np.float64)
    if nats.shape != tokens.shape or nats.ndim != 1 or tokens.sum() <= 0:
        raise EvaluationError("bootstrap needs one summed loss and one positive token count per document")
    if len(nats) < MIN_INTERVAL_DOCUMENTS:
        return None  # too few documents: a bootstrap over them would look far more certain than it is
    idx = bootstrap_indices(len(nats), samples, seed)
    stats = nats[idx].sum(1) / tokens[idx].sum(1) / math.log(2)
    lo, hi = np.percentile(stats, [2.5, 97.5])
    return [float(lo), float(hi)]


def bootstrap_ratio_ci95(numerators, denominators, *, samples: int = BOOTSTRAP_SAMPLES,
                         seed: int = BOOTSTRAP_SEED) -> list[float] | None:
    """95 % percentile bootstrap interval of Σ numerators / Σ denominators over units
    resampled with replacement (e.g. correct answers / answer tokens over sequences); None
    for fewer than ``MIN_INTERVAL_DOCUMENTS`` units.
    Raises: EvaluationError for mismatched lengths or a zero denominator sum."""
    num, den = np.asarray(numerators, dtype=np.float64), np.asarray(denominators, dtype=np.float64)
    if num.shape != den.shape or num.ndim != 1 or den.sum() <= 0:
        raise EvaluationError("a ratio bootstrap needs one numerator and one positive denominator per unit")
    if len(num) < MIN_INTERVAL_DOCUMENTS:
        return None
    idx = bootstrap_indices(len(num), samples, seed)
    lo, hi = np.percentile(num[idx].sum(1) / den[idx].sum(1), [2.5, 97.5])
    return [float(lo), float(hi)]


def paired_difference(candidate: dict, reference: dict, *, samples: int = BOOTSTRAP_SAMPLES,
                      seed: int = BOOTSTRAP_SEED) -> dict | None:
    """Paired bits-per-byte difference of two per-length entries scored on the same windows.

    Args: two ``summarize`` entries (with ``per_document``) of the same length.
    Returns: ``{"paired_delta_bpb": candidate − reference (bits per byte), "paired_ci95":
      [low, high]}`` — the interval from resampling documents jointly (paired bootstrap,
      Koehn 2004; None for fewer than ``MIN_INTERVAL_DOCUMENTS`` documents); None when the entries did not score the same documents and tokens
      (different windows cannot be paired). Raises nothing.
    """
    a, b = candidate.get("per_document"), reference.get("per_document")
    if not (isinstance(a, dict) and isinstance(b, dict)) or a.get("doc") != b.get("doc") \
            or a.get("tokens") != b.get("tokens") or not a.get("doc"):
        return None
    tokens = np.asarray(a["tokens"], dtype=np.float64)
    diff = np.asarray(a["nats"], dtype=np.float64) - np.asarray(b["nats"], dtype=np.float64)
    if tokens.sum() <= 0:
        return None
    delta = float(diff.sum() / tokens.sum() / math.log(2))
    if len(tokens) < MIN_INTERVAL_DOCUMENTS:
        return {"paired_delta_bpb": delta, "paired_ci95": None}  # too few documents for an interval
    idx = bootstrap_indices(len(tokens), samples, seed)
    stats = diff[idx].sum(1) / tokens[idx].sum(1) / math.log(2)
    lo, hi = np.percentile(stats, [2.5, 97.5])
    return {"paired_delta_bpb": delta, "paired_ci95": [float(lo), float(hi)]}


_PAIRED_KEYS = ("paired_delta_bpb", "paired_ci95", "paired_reference")


def with_paired_differences(results: Sequence[dict], reference: int | str = 0) -> list[dict]:
    """Copies of ``results`` whose per-length entries, for every result but the reference,
    carry ``paired_delta_bpb``, ``paired_ci95`` and ``paired_reference`` against the
    reference's entry of the same length (see :func:`paired_difference`); lengths that
    cannot be paired (other windows, an error) get none. The inputs are not modified.

    Args: ``reference``: an index into ``results``, a checkpoint name or path, or a label.
    Returns: the new list; each result also gets ``paired_reference`` (the reference's label
      or checkpoint name).
    Raises: EvaluationError for a reference that is not among the results.
    """
    if not results:
        return []
    ref = _reference_index(results, reference)
    ref_name = results[ref].get("label") or results[ref]["checkpoint"]
    if not results[ref].get("label") and [r.get("checkpoint") for r in results].count(ref_name) > 1:
        ref_name = results[ref].get("checkpoint_path") or ref_name  # runs/x vs checkpoints/x: say which
    ref_entries = {e["length"]: e for e in results[ref]["per_length"] if "error" not in e}
    out = []
    for k, r in enumerate(results):
        entries = []
        for e in r["per_length"]:
            e = {key: v for key, v in e.items() if key not in _PAIRED_KEYS}
            if k != ref and "error" not in e and e["length"] in ref_entries:
                diff = paired_difference(e, ref_entries[e["length"]])
                if diff is not None:
                    e.update(diff, paired_reference=ref_name)
            entries.append(e)
        out.append({**r, "paired_reference": ref_name, "per_length": entries})
    return out


def _reference_index(results: Sequence[dict], reference: int | str) -> int:
    if isinstance(reference, int) and not isinstance(reference, bool):
        if 0 <= reference < len(results):
            return reference
        raise EvaluationError(f"reference index {reference} is out of range for {len(results)} checkpoint(s)")
    ref = str(reference)
    for key in ("checkpoint_path", "label"):  # an exact path (or label) first
        hits = [k for k, r in enumerate(results) if r.get(key) is not None and str(r.get(key)) == ref]
        if hits:
            return hits[0]
    hits = [k for k, r in enumerate(results) if r.get("checkpoint") in (ref, Path(ref).name)]
    if len(hits) > 1:
        paths = ", ".join(str(results[k].get("checkpoint_path")) for k in hits)
        raise EvaluationError(f"reference {ref!r} names {len(hits)} of the checkpoints ({paths}); give the path of "
                              "the one to pair against")
    if hits:
        return hits[0]
    given = ", ".join(r.get("checkpoint", "?") for r in results)
    raise EvaluationError(f"reference {reference!r} is not one of the evaluated checkpoints ({given}); give one "
                          "of them, e.g. --reference " + results[0].get("checkpoint", "CKPT"))


def summarize(length: int, nats_by_pos: np.ndarray, counts_by_pos: np.ndarray, windows: int,
              buckets: int = DEFAULT_POSITION_BUCKETS, per_document: dict | None = None) -> dict:
    """The per-length numbers from per-position sums (see ``score_windows``).

    Returns: ``{"length", "nats_per_token" (token-weighted mean, nats), "perplexity" (exp of
      it), "bits_per_byte" (nats / ln 2; one token is one byte), "tokens_scored", "windows",
      "loss_by_position": {"bucket_starts", "bucket_ends" (exclusive, window positions in
      tokens), "nats" (mean per token, None for an empty bucket), "tokens"}}``; with
      ``per_document`` (``{"doc": [ids], "nats": [summed nats], "tokens": [scored]}``) also
      that, ``documents`` and ``ci95`` (:func:`bootstrap_ci95`, bits per byte).
    Raises: EvaluationError if nothing was scored.
    """
    total = int(counts_by_pos.sum())
    if total == 0:
        raise EvaluationError(f"no tokens were scored at length {length}")
    mean = float(nats_by_pos.sum() / total)
    if not (math.isfinite(mean) and mean < 700):
        raise EvaluationError(f"the mean loss at length {length} is {mean} nats/token (perplexity beyond float range): "
                              "the checkpoint's weights or this text produce NaN, inf or exploding logits; check "
                              "model.safetensors — nothing was cached")
    starts, ends = position_buckets(length, buckets)
    b_nats, b_tok = [], []
    for s, e in zip(starts, ends):
        c = int(counts_by_pos[s:e].sum())
        b_tok.append(c)
        b_nats.append(float(nats_by_pos[s:e].sum() / c) if c else None)
    out = {"length": int(length), "nats_per_token": mean, "perplexity": math.exp(mean),
           "bits_per_byte": mean / math.log(2), "tokens_scored": total, "windows": int(windows),
           "loss_by_position": {"bucket_starts": starts, "bucket_ends": ends, "nats": b_nats, "tokens": b_tok}}
    if per_document is not None:
        out["documents"] = len(per_document["doc"])
        out["per_document"] = per_document
        out["ci95"] = bootstrap_ci95(per_document["nats"], per_document["tokens"])
    return out


# ---------------------------------------------------------------------------------------------
# Checkpoints, devices, cache
# ---------------------------------------------------------------------------------------------
def rope_scaled_model(model: GPT, scaling: str, length: int) -> tuple[GPT, dict]:
    """The same RoPE weights with zero-shot PI (Chen et al. 2023) or YaRN (Peng et al. 2023).

    Factor ``s = max(1, length / seq_len)``; ``"pi"`` builds ``rope_pi`` with
    ``rope_scaling_factor = s``; ``"yarn"`` builds ``yarn`` with the same factor and
    ``original_max_position_embeddings = seq_len`` (its attention factor scales q and k
    once each). RoPE has no encoding parameters, so the state dict loads unchanged.

    Returns: ``(model in eval mode on the same device, {"position_encoding", "encoding_options"})``.
    Raises: EvaluationError if ``model`` is not a plain-RoPE checkpoint or ``scaling`` is unknown.
    """
    cfg = model.config
    if scaling not in ROPE_SCALINGS:
        raise EvaluationError(f"rope_scaling must be one of {', '.join(ROPE_SCALINGS)} or None (got {scaling!r})")
    if cfg.position_encoding != "rope":
        raise EvaluationError(f"rope_scaling={scaling!r} needs a RoPE checkpoint; this one uses "
                              f"position_encoding={cfg.position_encoding!r}")
    factor = max(1.0, length / cfg.seq_len)
    opts = {k: v for k, v in cfg.encoding_options.items() if k == "rope_theta"}
    opts["rope_scaling_factor"] = factor
    name = "rope_pi" if scaling == "pi" else "yarn"
    if name == "yarn":
        opts["original_max_position_embeddings"] = cfg.seq_len
    fields_ = {k: getattr(cfg, k) for k in GPTConfig.__dataclass_fields__}
    fields_.update(position_encoding=name, encoding_options=opts)
    device = next(model.parameters()).device
    scaled = GPT(GPTConfig(**fields_))  # fresh init is overwritten by the checkpoint's weights
    load_state_checked(scaled, {k: v.to("cpu") for k, v in model.state_dict().items()},
                       source="the RoPE checkpoint's weights")
    scaled.to(device)
    return scaled.eval(), {"position_encoding": name, "encoding_options": opts}


def memory_problem(configs: Sequence[GPTConfig], length: int, batch: int, device: torch.device,
                   batch_tokens: int) -> str | None:
    """Why ``length`` cannot be evaluated in this machine's memory, or None if it fits.

    The estimate (``fireviz.memory.forward_bytes`` of the largest of ``configs`` on ``batch``
    windows) is compared with the memory available now. The message gives both figures and the
    largest length that fits with ``batch_tokens``.
    """
    need = max(forward_bytes(c, batch, length) for c in configs)
    free = available_bytes(str(device))
    if free is None or need <= free:
        return None
    lo, hi = 2, length  # forward_bytes grows with the length: the largest that fits, by bisection
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if max(forward_bytes(c, max(1, batch_tokens // mid), mid) for c in configs) <= free:
            lo = mid
        else:
            hi = mid - 1
    return (f"length {length:,} needs about {gib(need)} of memory (estimate for {batch} window(s) of {length:,} tokens), "
            f"more than the {gib(free)} available on {device.type}; the largest length that fits is about {lo:,} "
            "tokens — ask for a shorter length (or a machine with more memory)")


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
        raise EvaluationError("device 'cuda' requested but no CUDA GPU is available (torch.cuda.is_available() "
                              "is False); use --device cpu or auto")
    if dev.type not in ("cpu", "cuda"):
        raise EvaluationError(f"device {device!r} is not supported; use auto, cpu or cuda")
    return dev


def default_cache_dir() -> Path:
    """``$FIREVIZ_CACHE_DIR`` if set, else ``~/.cache/fireviz/eval``."""
    env = os.environ.get("FIREVIZ_CACHE_DIR")
    return Path(env) if env else Path.home() / ".cache" / "fireviz" / "eval"


def cache_key(checkpoint_hash: str, fingerprint: str, length_settings: dict) -> str:
    """sha256 (hex) of the checkpoint hash, data fingerprint and canonical settings JSON."""
    blob = json.dumps({"checkpoint_sha256": checkpoint_hash, "data_fingerprint": fingerprint,
                       "settings": length_settings}, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(blob.encode("utf-8")).hexdigest()


def _number(v: object) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


def _valid_entry(entry: object, length: int) -> bool:
    # what summarize() writes, checked deep enough that a damaged cache entry or results.json
    # is recomputed (or ignored) rather than shown or crashing a figure
    if not isinstance(entry, dict) or any(k not in entry for k in _PER_LENGTH_FIELDS) or entry["length"] != length:
        return False
    nats, ppl, bpb = (entry[k] for k in ("nats_per_token", "perplexity", "bits_per_byte"))
    if not (_number(nats) and _number(ppl) and _number(bpb) and nats >= 0):
        return False
    if not (math.isclose(ppl, math.exp(nats), rel_tol=1e-6) and math.isclose(bpb, nats / math.log(2), rel_tol=1e-6)):
        return False
    if not all(isinstance(entry[k], int) and not isinstance(entry[k], bool) and entry[k] > 0
               for k in ("tokens_scored", "windows")):
        return False
    if "seconds" in entry and not _number(entry["seconds"]):
        return False
    if "per_document" in entry or "ci95" in entry:
        pd, ci = entry.get("per_document"), entry.get("ci95")
        if not (isinstance(pd, dict) and all(isinstance(pd.get(k), list) for k in _PER_DOCUMENT_FIELDS)
                and len({len(pd[k]) for k in _PER_DOCUMENT_FIELDS}) == 1 and pd["doc"]
                and all(isinstance(v, str) for v in pd["doc"]) and all(_number(v) for v in pd["nats"])
                and all(isinstance(v, int) and not isinstance(v, bool) and v > 0 for v in pd["tokens"])
                and sum(pd["tokens"]) == entry["tokens_scored"] and entry.get("documents") == len(pd["doc"])):
            return False
        if ci is None and len(pd["doc"]) < MIN_INTERVAL_DOCUMENTS:
            pass  # too few documents: no interval
        elif not (isinstance(ci, list) and len(ci) == 2 and all(_number(v) for v in ci) and ci[0] <= ci[1]):
            return False
    lbp = entry["loss_by_position"]
    if not (isinstance(lbp, dict) and all(isinstance(lbp.get(k), list) for k in ("bucket_starts", "bucket_ends",
                                                                                    "nats", "tokens"))):
        return False
    return all(v is None or _number(v) for v in lbp["nats"]) and \
        all(_number(v) for k in ("bucket_starts", "bucket_ends", "tokens") for v in lbp[k])


#: A checkpoint folder's published evaluations (scripts/publish_results.py writes them).
PUBLISHED_RESULTS = "results.json"


def published_results(checkpoint: str | os.PathLike, checkpoint_hash: str, fingerprint: str) -> list[dict]:
    """The results in ``<checkpoint>/results.json`` computed on exactly these weights and data.

    Args: ``checkpoint_hash`` = ``checkpoint_sha256(checkpoint)``, ``fingerprint`` = the data
      fingerprint. Returns: the matching result dicts (as ``evaluate_many`` returns them); []
      when the file is missing, unreadable or made from other weights/data. A shipped
      checkpoint's numbers thus show without recomputing on a fresh machine, and a stale
      results.json (weights retrained, corpus changed) is never used. Raises nothing.
    """
    try:
        obj = read_json(Path(checkpoint) / PUBLISHED_RESULTS, expect=(dict, list))
    except FileFormatError:
        return []
    items = obj if isinstance(obj, list) else [obj]
    return [r for r in items if isinstance(r, dict) and r.get("checkpoint_sha256") == checkpoint_hash
            and r.get("data_fingerprint") == fingerprint and isinstance(r.get("settings"), dict)
            and isinstance(r.get("per_length"), list)]


def _published_read(published: list[dict], length_settings: dict, length: int) -> dict | None:
    # every setting that is part of the cache key must match, the format version included
    for r in published:
        s = r["settings"]
        if any(s.get(k) != v for k, v in length_settings.items() if k not in ("length", "normalizer_cap")):
            continue
        # the cap in effect for this checkpoint (None for a plain FIRE row and for every non-FIRE one)
        if r.get("normalizer_cap") != length_settings.get("normalizer_cap"):
            continue
        for e in r["per_length"]:
            if isinstance(e, dict) and e.get("length") == length and _valid_entry(e, length):
                return {k: v for k, v in e.items() if k not in ("cached", "source")}
    return None


def _cache_read(path: Path, key: str, length: int) -> dict | None:
    try:
        obj = read_json(path, expect=dict)
    except FileFormatError:
        return None
    if not isinstance(obj, dict) or obj.get("key") != key or not _valid_entry(obj.get("result"), length):
        return None
    return obj["result"]


# ---------------------------------------------------------------------------------------------
# Public API
# ---------------------------------------------------------------------------------------------
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
        hint = "" if isinstance(data, str) and data in DOMAINS else " — for a small file of your own use split='all' (--split all)"
        raise DataError(f"{e}{hint}") from e


def resolve_token_budget(mode: str, token_budget: int | None | str = "auto") -> int | None:
    """The token budget a mode uses: ``"auto"`` → None (every qualifying document) for
    ``same_text``, ``DEFAULT_TOKEN_BUDGET`` for the random-window modes; an int >= 1 or
    None as given. Raises: EvaluationError for anything else."""
    if isinstance(token_budget, str) and token_budget == "auto":
        return None if mode == "same_text" else DEFAULT_TOKEN_BUDGET
    if token_budget is not None and (isinstance(token_budget, bool) or not isinstance(token_budget, (int, np.integer))
                                     or token_budget < 1):
        raise EvaluationError(f"token_budget must be an integer >= 1, None (every window) or 'auto' "
                              f"(got {token_budget!r})")
    return None if token_budget is None else int(token_budget)


def apply_normalizer_cap(model: GPT, cap: int | None) -> int | None:
    """Set FIRE's normalizer cap ψ(min(max(L, i), cap)) (tokens) on every FIRE module of ``model``.

    Returns: the cap in effect — ``cap`` for a FIRE/FIRE-S checkpoint, None for any other
      (its bias has no normalizer, so its numbers are the uncapped ones). ``cap=None``
      restores the checkpoint's own setting.
    Raises: EvaluationError for a cap that is not an integer >= 1.
    """
    try:
        cap = check_normalizer_cap(cap)
    except ValueError as e:
        raise EvaluationError(str(e)) from None
    modules = fire_modules(model)
    if not modules:
        return None
    own = model.config.encoding_options.get("normalizer_cap")
    for m in modules:
        m.normalizer_cap = float(cap) if cap is not None else (None if own is None else float(own))
    return cap


def evaluate_many(checkpoints: Sequence[str | os.PathLike], data: str | os.PathLike,
                  lengths: Iterable[int] = DEFAULT_LENGTHS, *, mode: str = DEFAULT_MODE,
                  stride: int | None = None, token_budget: int | None | str = "auto", seed: int = 0,
                  rope_scaling: str | None = None, split: str | None = None,
                  position_buckets: int = DEFAULT_POSITION_BUCKETS, device: str | torch.device = "auto",
                  batch_tokens: int | None = None, progress: ProgressFn | None = None,
                  should_stop: StopFn | None = None, cache_dir: str | os.PathLike | None = None,
                  use_cache: bool = True, use_published: bool = True, normalizer_cap: int | None = None,
                  reference: int | str = 0, require_intervals: bool = True,
                  cache_only: bool = False) -> list[dict]:
    """Evaluate several checkpoints on the same windows (paired comparison); one result each.

    See ``evaluate_checkpoint`` for the arguments and the result; the data is loaded and the
    windows are planned once. ``progress(done, total, message)`` counts target tokens over
    all checkpoints and lengths (cached lengths count as done at once). Every result but
    the ``reference`` one (index or checkpoint name; default the first) carries, per length,
    ``paired_delta_bpb`` and ``paired_ci95`` against it (``with_paired_differences``).
    Raises: as ``evaluate_checkpoint``; a checkpoint that does not load raises
      CheckpointError before any scoring.
    """
    t_start = time.perf_counter()
    lengths = list(lengths)
    if not lengths:
        raise EvaluationError("no evaluation lengths given")
    for n in lengths:
        _check_length(n)
    lengths = list(dict.fromkeys(int(n) for n in lengths))  # user order, duplicates once
    mode = _check_mode(mode, stride)
    token_budget = resolve_token_budget(mode, token_budget)
    if rope_scaling is not None and rope_scaling not in ROPE_SCALINGS:
        raise EvaluationError(f"rope_scaling must be one of {', '.join(ROPE_SCALINGS)} or None (got {rope_scaling!r})")
    if position_buckets < 1:
        raise EvaluationError(f"position_buckets must be >= 1 (got {position_buckets})")
    if batch_tokens is not None and not (isinstance(batch_tokens, int) and batch_tokens >= 1):
        raise EvaluationError(f"batch_tokens must be an integer >= 1 (got {batch_tokens!r}); omit it for the "
                              "default (8192 on CPU, 16384 on CUDA)")
    try:  # before any checkpoint is read
        normalizer_cap = check_normalizer_cap(normalizer_cap)
    except ValueError as e:
        raise EvaluationError(str(e)) from None
    dev = resolve_device(device)
    precision = "bfloat16-autocast" if dev.type == "cuda" else "float32"
    batch_tokens = int(batch_tokens or (16384 if dev.type == "cuda" else 8192))

    # Checkpoints first: a bad one is an error before minutes of work.
    loaded = []
    for ckpt in checkpoints:
        sha = checkpoint_sha256(ckpt)
        model = load_model(ckpt)
        bad = nonfinite_parameters(model)
        if bad:  # no number for such weights, not even a cached or published one
            raise NonFiniteLossError(f"{Path(str(ckpt)).name or ckpt}: the weights contain NaN/inf in "
                                     f"{', '.join(bad[:3])}{' …' if len(bad) > 3 else ''}, so every loss is NaN; "
                                     "restore or retrain the checkpoint (nothing was evaluated or cached)")
        if rope_scaling is not None and model.config.position_encoding != "rope":
            raise EvaluationError(f"rope_scaling={rope_scaling!r} needs a RoPE checkpoint; {ckpt} uses "
                                  f"position_encoding={model.config.position_encoding!r}")
        cap = apply_normalizer_cap(model, None if normalizer_cap is None else int(normalizer_cap))
        loaded.append((ckpt, sha, model, cap))
    if not loaded:
        raise EvaluationError("no checkpoints given")
    if isinstance(reference, str):
        _reference_index([{"checkpoint": Path(str(c)).name or str(c), "checkpoint_path": str(c)}
                          for c, *_ in loaded], reference)  # a wrong reference fails before scoring
    elif not (0 <= reference < len(loaded)):
        raise EvaluationError(f"reference index {reference} is out of range for {len(loaded)} checkpoint(s)")

    plans: dict[int, list[Window] | str] = {}
    same_text: SameTextPlan | None = None
    token_cache: dict[int, torch.Tensor] = {}
    if synthetic.is_synthetic(data):
        # every length gets its own task sequences of exactly that length (the same for every
        # checkpoint); only the answer positions are scored
        if mode != DEFAULT_MODE or stride is not None:
            raise EvaluationError(f"{data} is scored on whole task sequences, one per window; drop --mode/--stride")
        task = synthetic.load_task(data)
        count = SYNTHETIC_SEQUENCES if token_budget is None else max(1, int(token_budget))
        mode, split, token_budget = "synthetic", "synthetic", count
        fingerprint = task.fingerprint()
        docs, ids = [], []
        for n in lengths:
            try:
                first = task.split(n)
            except DataError as e:
                plans[n] = str(e)
                continue
            seqs = task.sequences(n, count, synthetic.EVALUATION_SEED + n)
            start = len(ids)
            for k in range(count):
                token_cache[start + k] = seqs[k]
                ids.append(f"{task.name}/{n}/{k:05d}")
            plans[n] = [Window(start + k, 0, first) for k in range(count)]
        n_documents = count
    else:
        docs, split = _load_eval_documents(data, split)
        fingerprint = data_fingerprint(docs)
        ids, sizes = [d.id for d in docs], [d.num_tokens for d in docs]
        n_documents = len(docs)
        if mode == "same_text":
            same_text = plan_same_text(ids, sizes, lengths, token_budget=token_budget, seed=seed)
            plans = dict(same_text.windows)
        else:
            for n in lengths:
                try:
                    plans[n] = plan_windows(ids, sizes, n, mode=mode, stride=stride, token_budget=token_budget,
                                            seed=seed)
                except EvaluationError as e:
                    plans[n] = str(e)

    for n, plan in list(plans.items()):  # memory before work: refuse a length that cannot fit
        if isinstance(plan, list) and plan:
            problem = memory_problem([m.config for *_, m, _ in loaded], n, min(max(1, batch_tokens // n), len(plan)),
                                     dev, batch_tokens)
            if problem:
                plans[n] = problem

    def doc_tokens(i: int):
        if i not in token_cache:  # [BOS]+bytes at one byte per token; windows are copied out of it
            token_cache[i] = DocumentTokens(docs[i])
        return token_cache[i]

    settings = {"format": EVAL_FORMAT_VERSION, "data": str(data), "split": split, "lengths": lengths,
                "mode": mode, "stride": stride, "token_budget": token_budget, "seed": int(seed),
                "rope_scaling": rope_scaling, "position_buckets": int(position_buckets), "precision": precision,
                "batch_tokens": batch_tokens, "bos": BOS_CONVENTION, "documents": n_documents,
                "normalizer_cap": None if normalizer_cap is None else int(normalizer_cap)}
    if same_text is not None:
        settings.update(prefix_tokens=same_text.prefix_tokens, documents_scored=len(same_text.documents),
                        documents_skipped=same_text.documents_skipped)
    cache_root = Path(cache_dir) if cache_dir is not None else default_cache_dir()
    if use_cache and cache_root.exists() and not cache_root.is_dir():
        raise EvaluationError(f"the cache folder {cache_root} is a file; give a folder (--cache-dir) or --no-cache")
    setup_seconds = time.perf_counter() - t_start  # loading checkpoints + data, planning windows

    def plan_tokens(plan: list[Window], n: int) -> int:
        return sum(n - w.first_target for w in plan)

    total = sum(plan_tokens(p, n) for n, p in plans.items() if isinstance(p, list)) * len(loaded)
    done = 0
    t_scoring = None  # when the first computed (not cached) batch started: the ETA's clock
    done_at_start = 0

    def report(message: str) -> None:
        if progress is not None:
            progress(done, total, message)

    def eta() -> str:
        if t_scoring is None or done <= done_at_start:
            return ""
        rate = (done - done_at_start) / max(time.perf_counter() - t_scoring, 1e-9)
        left = (total - done) / rate if rate > 0 else float("inf")
        return f", {rate:,.0f} tokens/s, ~{_duration(left)} left" if math.isfinite(left) else ""

    def check_stop() -> None:
        if should_stop is not None and should_stop():
            raise EvaluationCancelled("evaluation cancelled; finished lengths are cached")

    results = []
    for ckpt, sha, model, cap in loaded:
        t_ckpt = time.perf_counter()
        name = Path(str(ckpt)).name or str(ckpt)
        cfg = model.config
        on_device = None
        per_length = []
        published = published_results(ckpt, sha, fingerprint) if use_cache and use_published else []
        for n in lengths:
            plan = plans[n]
            if isinstance(plan, str):
                per_length.append({"length": n, "error": plan})
                continue
            n_tokens = plan_tokens(plan, n)
            if cfg.absolute_position_embedding and n > cfg.seq_len:
                per_length.append({"length": n, "error": f"absolute position embeddings cover {cfg.seq_len} "
                                                          f"tokens; length {n} cannot be evaluated"})
                done += n_tokens
                report(f"{name} L={n}: skipped")
                continue
            length_settings = {"format": EVAL_FORMAT_VERSION, "length": n, "mode": mode, "stride": stride,
                               "token_budget": token_budget, "seed": int(seed), "rope_scaling": rope_scaling,
                               "split": split, "position_buckets": int(position_buckets), "precision": precision,
                               "bos": BOS_CONVENTION}
            use_flex = dev.type == "cuda" and n >= FLEX_MIN_LENGTH and _flex_ok(report)
            if use_flex:  # bf16 numbers differ slightly between the two paths: part of the key (GPU only)
                length_settings["attention"] = "flex"
            if same_text is not None:  # the windows at n depend on the prefix M
                length_settings["prefix_tokens"] = same_text.prefix_tokens
            if cap is not None:  # only FIRE has a normalizer; other checkpoints keep their plain key
                length_settings["normalizer_cap"] = cap
            key = cache_key(sha, fingerprint, length_settings)
            entry_path = cache_root / f"{key}.json"
            cached = _cache_read(entry_path, key, n) if use_cache else None
            source = "cache"
            if cached is None and published:
                # read from results.json every time, never copied into the cache: a corrected
                # results.json takes effect at once, and a read-only cache does not matter
                cached, source = _published_read(published, length_settings, n), PUBLISHED_RESULTS
            if cached is not None and require_intervals and "per_document" not in cached:
                cached = None  # made before per-document losses were kept: no interval, no pairing
            if cached is not None:
                per_length.append({**cached, "cached": True, "source": source})
                done += n_tokens
                report(f"{name} L={n}: cached")
                continue
            if cache_only:  # nothing is computed: the length is reported as not computed yet
                per_length.append({"length": n, "error": NOT_COMPUTED, "not_computed": True})
                done += n_tokens
                continue
            check_stop()
            t0 = time.perf_counter()
            if t_scoring is None:
                t_scoring, done_at_start = t0, done
            if on_device is None:
                on_device = model.to(dev)
            scored_model, extra = on_device, {}
            if rope_scaling is not None:
                scored_model, extra = rope_scaled_model(on_device, rope_scaling, n)
            scored_model.set_attention_backend("flex" if use_flex else "sdpa")
            finished = 0

            def on_batch(k: int, n=n, plan=plan, n_tokens=n_tokens) -> None:
                nonlocal done, finished
                finished += k
                done = done_before + sum(n - w.first_target for w in plan[:finished])
                report(f"{name} L={n}: {finished}/{len(plan)} windows{eta()}")
                check_stop()

            done_before = done
            report(f"{name} L={n}: 0/{len(plan)} windows ({n_tokens:,} tokens){eta()}")
            nats, counts, doc_nats, doc_scored, doc_correct = score_windows(
                scored_model, doc_tokens, plan, n, device=dev, batch_tokens=batch_tokens, on_batch=on_batch,
                with_accuracy=True)
            done = done_before + n_tokens
            mean = float(nats.sum() / max(int(counts.sum()), 1))
            if not (math.isfinite(mean) and mean < 700):  # NaN/inf, or a perplexity beyond float range
                bad = nonfinite_parameters(scored_model)
                why = (f"the weights contain NaN/inf in {', '.join(bad[:3])}{' …' if len(bad) > 3 else ''}; "
                       "restore or retrain the checkpoint" if bad else
                       "the weights are finite, so the logits overflow on this text at this length")
                raise NonFiniteLossError(f"{name}: loss is {mean:.6g} at length {n}: {why} (nothing was cached)")
            order = sorted(doc_nats, key=lambda i: (ids[i], i))
            per_document = {"doc": [ids[i] for i in order], "nats": [doc_nats[i] for i in order],
                            "tokens": [doc_scored[i] for i in order]}
            entry = summarize(n, nats, counts, len(plan), position_buckets, per_document=per_document)
            if mode == "synthetic":  # answer accuracy: next-token argmax right, and whole answers right
                correct = np.array([doc_correct[i] for i in order], dtype=np.float64)
                toks = np.array(per_document["tokens"], dtype=np.float64)
                entry["accuracy"] = float(correct.sum() / toks.sum())
                entry["sequence_accuracy"] = float((correct == toks).mean())
                entry["accuracy_ci95"] = bootstrap_ratio_ci95(correct, toks)
                entry["first_answer_position"] = plan[0].first_target
            if same_text is not None:
                entry["prefix_tokens"] = same_text.prefix_tokens
                entry["documents_skipped"] = same_text.documents_skipped
            elif mode != "synthetic":  # documents shorter than the window hold none: counted, not dropped silently
                entry["documents_skipped"] = sum(1 for t in sizes if t < n)
            if cap is not None:
                entry["normalizer_cap"] = cap
            entry.update(extra)
            entry["seconds"] = time.perf_counter() - t0
            if use_cache:
                write_json_atomic(entry_path, {"key": key, "checkpoint_sha256": sha, "data_fingerprint": fingerprint,
                                               "settings": length_settings, "fireviz_version": __version__,
                                               "result": entry})
            per_length.append({**entry, "cached": False, "source": "computed"})
        if on_device is not None and dev.type == "cuda":
            model.to("cpu")
            torch.cuda.empty_cache()
        seconds = time.perf_counter() - t_ckpt + setup_seconds
        results.append({"checkpoint": name, "checkpoint_path": str(ckpt), "checkpoint_sha256": sha,
                        "position_encoding": cfg.position_encoding, "train_seq_len": cfg.seq_len,
                        "settings": settings, "data_fingerprint": fingerprint, "fireviz_version": __version__,
                        "device": _device_name(dev), "seconds": seconds, "normalizer_cap": cap,
                        "per_length": per_length})
    results = with_paired_differences(results, reference)
    report("done")
    return results


def _duration(seconds: float) -> str:
    seconds = max(0, int(round(seconds)))
    if seconds < 60:
        return f"{seconds} s"
    if seconds < 3600:
        return f"{seconds // 60} min {seconds % 60:02d} s"
    return f"{seconds // 3600} h {seconds % 3600 // 60:02d} min"


def evaluate_checkpoint(checkpoint: str | os.PathLike, data: str | os.PathLike,
                        lengths: Iterable[int] = DEFAULT_LENGTHS, **kwargs) -> dict:
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


# ---------------------------------------------------------------------------------------------
# CLI
# ---------------------------------------------------------------------------------------------
def _ci_text(ci, signed: bool = False) -> str:
    f = "+.3f" if signed else ".3f"
    return f" [{ci[0]:{f}}, {ci[1]:{f}}]" if isinstance(ci, list) and len(ci) == 2 else ""


def format_table(results: Sequence[dict]) -> str:
    """A plain-text report: what was scored per length (documents, windows, tokens), then one
    row per checkpoint with "bpb [95 % CI]" cells, then the paired differences against the
    reference checkpoint with their 95 % intervals (bits per byte)."""
    lengths = list(dict.fromkeys(e["length"] for r in results for e in r["per_length"]))
    def width(rows, head):
        return [max(len(x) for x in col) for col in zip(head, *rows)]

    def render(head, rows):
        widths = width(rows, head)

        def line(cells):
            return "  ".join(c.rjust(w) if i >= 3 else c.ljust(w) for i, (c, w) in enumerate(zip(cells, widths)))
        return [line(head), line(["-" * w for w in widths])] + [line(r) for r in rows]

    names = [r["checkpoint"] for r in results]
    # two checkpoints in folders of the same name (runs/x and checkpoints/x): show their paths
    shown = {id(r): (r.get("checkpoint_path") or r["checkpoint"]) if names.count(r["checkpoint"]) > 1
             else r["checkpoint"] for r in results}

    def enc(r):
        cap = r.get("normalizer_cap")
        return (r["position_encoding"] + (f"+{r['settings']['rope_scaling']}" if r["settings"].get("rope_scaling")
                                          else "") + (f" cap {cap}" if cap else ""))

    s0 = results[0]["settings"] if results else {}
    text = f"text: {s0.get('data')} ({s0.get('split')} split), mode {s0.get('mode')}"
    if s0.get("mode") == "same_text":
        d = s0.get("documents_scored")
        text += (f": the first {s0.get('prefix_tokens')} tokens of each of {d} document{'s' if d != 1 else ''} at "
                 f"every length ({s0.get('documents_skipped')} shorter documents skipped)")
    if s0.get("mode") == "synthetic":
        text = (f"task: {s0.get('data')}, {s0.get('token_budget')} fresh sequences of each length (the same for every "
                "checkpoint); only the answer positions are scored")
    out = [text]
    scored_head = ["length", "", ""] + [str(n) for n in lengths]
    first: dict = {}  # per length, the first checkpoint that scored it (an absolute-embedding one may not)
    for r in results:
        for e in r["per_length"]:
            if "error" not in e:
                first.setdefault(e["length"], e)
    scored_rows = []
    shown_rows = [("documents", "documents"), ("windows", "windows"), ("tokens scored", "tokens_scored")]
    if s0.get("mode") in ("nonoverlapping", "sliding"):
        shown_rows.insert(1, ("documents too short", "documents_skipped"))
    for label, key in shown_rows:
        scored_rows.append([label, "", ""] + [f"{first[n][key]:,}" if key in first.get(n, {}) else "" for n in lengths])
    out += render(scored_head, scored_rows)
    head = ["checkpoint", "enc", "train"] + [str(n) for n in lengths]
    rows = []
    for r in results:
        cells = {e["length"]: ("error" if "error" in e else f"{e['bits_per_byte']:.3f}" + _ci_text(e.get("ci95")))
                 for e in r["per_length"]}
        rows.append([shown[id(r)], enc(r), str(r["train_seq_len"])] + [cells.get(n, "") for n in lengths])
    out += ["", "bits per byte [95 % bootstrap interval over documents] by evaluation length in tokens"]
    out += render(head, rows)
    if any("accuracy" in e for r in results for e in r["per_length"]):
        acc_rows = []
        for r in results:
            cells = {e["length"]: f"{e['accuracy']:.3f}" + _ci_text(e.get("accuracy_ci95"))
                     + f" / {e['sequence_accuracy']:.2f}" for e in r["per_length"] if "accuracy" in e}
            acc_rows.append([shown[id(r)], enc(r), str(r["train_seq_len"])] + [cells.get(n, "") for n in lengths])
        out += ["", "answer accuracy [95 % interval over sequences] / share of sequences copied without error"]
        out += render(head, acc_rows)
    few = sorted({e["length"] for r in results for e in r["per_length"]
                  if "error" not in e and "per_document" in e and e.get("ci95") is None})
    if few:
        out += [f"(no interval at {', '.join(map(str, few))}: fewer than {MIN_INTERVAL_DOCUMENTS} documents "
                "(sequences) scored; a bootstrap over so few would look far more certain than it is)"]
    caps = sorted({r["normalizer_cap"] for r in results if r.get("normalizer_cap")})
    if caps:
        short = [n for n in lengths if n <= min(caps)]
        out += [f"(the normalizer cap changes FIRE only at query positions beyond {min(caps)} tokens"
                + (f": at {', '.join(map(str, short))} the capped numbers equal the plain ones)" if short else ")")]
    paired = [r for r in results if any("paired_delta_bpb" in e for e in r["per_length"])]
    if paired:
        ref = paired[0]["per_length"][0].get("paired_reference") or next(
            e["paired_reference"] for e in paired[0]["per_length"] if "paired_reference" in e)
        prow = []
        for r in paired:
            cells = {e["length"]: f"{e['paired_delta_bpb']:+.3f}" + _ci_text(e.get("paired_ci95"), signed=True)
                     for e in r["per_length"] if "paired_delta_bpb" in e}
            prow.append([shown[id(r)], enc(r), str(r["train_seq_len"])] + [cells.get(n, "") for n in lengths])
        out += ["", f"paired difference in bits per byte vs {ref} on the same windows [95 % interval]; "
                    "negative = better than the reference"]
        out += render(head, prow)
    errors = [f"  {r['checkpoint']} L={e['length']}: {e['error']}" for r in results for e in r["per_length"]
              if "error" in e]
    if errors:
        out += ["errors:"] + list(dict.fromkeys(errors))
    return "\n".join(out)


def _parse_lengths(text: str) -> list[int]:
    try:
        lengths = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"lengths must be comma-separated integers (got {text!r})")
    if not lengths:
        raise argparse.ArgumentTypeError("give at least one length")
    return lengths


def _parse_budget(text: str):
    if text == "auto":
        return "auto"
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"token budget must be an integer, 0 (every window) or auto (got {text!r})")
    if value < 0:
        raise argparse.ArgumentTypeError(f"token budget must be >= 0 (got {value})")
    return value or None


def build_parser() -> argparse.ArgumentParser:
    """The ``python -m fireviz eval`` argument parser."""
    p = argparse.ArgumentParser(prog="python -m fireviz eval",
                                description="Perplexity / bits per byte vs evaluation length for checkpoints.")
    p.add_argument("checkpoints", nargs="+", metavar="CKPT", help="checkpoint folder(s)")
    p.add_argument("--data", default="prose",
                   help=f"{', '.join(DOMAINS)}, a PATH.jsonl[.gz|.xz] / .txt / folder, or synthetic:copy (a task: "
                        f"--token-budget is then the sequences per length, default {SYNTHETIC_SEQUENCES}) (default "
                        "%(default)s, the "
                        "bundled checkpoints' training domain)")
    p.add_argument("--lengths", type=_parse_lengths, default=list(DEFAULT_LENGTHS),
                   help="comma-separated window lengths in tokens (default %(default)s)")
    p.add_argument("--mode", choices=MODES, default=DEFAULT_MODE,
                   help="same_text (default): the first M tokens of every document holding the largest length M, "
                        "at every length; nonoverlapping: random windows per length; sliding: with --stride")
    p.add_argument("--stride", type=int, default=None, help="sliding-window stride in tokens (--mode sliding)")
    p.add_argument("--token-budget", type=_parse_budget, default="auto",
                   help=f"target tokens per length; default: every qualifying document for same_text, "
                        f"{DEFAULT_TOKEN_BUDGET} for the random-window modes; 0 = every window")
    p.add_argument("--normalizer-cap", type=int, default=None, metavar="N",
                   help="FIRE/FIRE-S: evaluate with the normalizer ψ(min(max(L, i), N)), N in tokens "
                        "(e.g. the training length); other checkpoints are unaffected")
    p.add_argument("--reference", default=None, metavar="CKPT",
                   help="checkpoint the others are paired against (default: the first given)")
    p.add_argument("--seed", type=int, default=0, help="window selection seed")
    p.add_argument("--split", choices=SPLITS, default="validation",
                   help="documents to evaluate on (default %(default)s; 'all' for a small file of your own)")
    p.add_argument("--rope-scaling", choices=ROPE_SCALINGS, default=None,
                   help="zero-shot RoPE extension (factor = length / training length)")
    p.add_argument("--position-buckets", type=int, default=DEFAULT_POSITION_BUCKETS,
                   help="equal-width buckets of the loss-by-position curve (default %(default)s)")
    p.add_argument("--device", default="auto", help="auto (default), cpu or cuda")
    p.add_argument("--batch-tokens", type=int, default=None,
                   help="tokens per forward batch (default 8192 on CPU, 16384 on CUDA; not part of the cache key)")
    p.add_argument("--cache-dir", default=None, help="default $FIREVIZ_CACHE_DIR or ~/.cache/fireviz/eval")
    p.add_argument("--no-cache", action="store_true", help="neither read nor write cached results")
    p.add_argument("--out", default=None, help="write the results as JSON here (atomically)")
    p.add_argument("--figure", default=None, metavar="FILE",
                   help="also write the perplexity-vs-length figure: .svg, .pdf or .png (for a paper: 6.9 in "
                        "wide, serif 8 pt) or .html (interactive)")
    p.add_argument("--quiet", action="store_true", help="no progress bar")
    return p


def main(argv: list[str] | None = None) -> int:
    """``python -m fireviz eval``. Returns 0 on success, 2 for bad input (one stderr line),
    or when no length of any checkpoint could be evaluated, 130 when interrupted."""
    args = build_parser().parse_intermixed_args(argv)
    bar = None
    if args.out:  # refuse a bad output path before the evaluation, not after it
        out = Path(args.out)
        blocker = next((p for p in out.parents if p.exists() and not p.is_dir()), None)  # folders are made
        if out.is_dir() or blocker is not None:
            print(f"fireviz eval: error: --out {out} " + ("is a folder" if out.is_dir() else f"lies under {blocker}, "
                  "which is a file") + "; give a file path such as results.json", file=sys.stderr)
            return 2

    def progress(done: int, total: int, message: str) -> None:
        nonlocal bar
        if args.quiet or (bar is None and total == 0):
            return
        if bar is None:  # created on the first report, so an early error prints one line only
            from tqdm.auto import tqdm
            # no rate or ETA: a cached length jumps ahead at once and would make both meaningless
            # tokens, not windows: a 16k-token window is 128× a 128-token one; the message has the ETA
            bar = tqdm(total=total, file=sys.stderr, dynamic_ncols=True,
                       bar_format="{desc}: {percentage:3.0f}%|{bar}| {n_fmt}/{total_fmt} tokens [{elapsed}]")
        bar.total = total
        bar.n = done
        bar.set_description_str(message[:100], refresh=False)
        bar.refresh()

    try:
        results = evaluate_many(args.checkpoints, args.data, args.lengths, mode=args.mode, stride=args.stride,
                                token_budget=args.token_budget, seed=args.seed, rope_scaling=args.rope_scaling,
                                split=args.split, position_buckets=args.position_buckets, device=args.device,
                                batch_tokens=args.batch_tokens, progress=progress, cache_dir=args.cache_dir,
                                use_cache=not args.no_cache, normalizer_cap=args.normalizer_cap,
                                reference=0 if args.reference is None else args.reference)
    except (CheckpointError, DataError, EvaluationError) as e:
        if bar is not None:
            bar.close()
        print(f"fireviz eval: error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        if bar is not None:
            bar.close()
        print("fireviz eval: interrupted; finished lengths are cached", file=sys.stderr)
        return 130
    if bar is not None:
        bar.close()
    print(format_table(results))
    if args.out:
        write_json_atomic(args.out, results)
        print(f"wrote {args.out}")
    if args.figure and any("error" not in e for r in results for e in r["per_length"]):
        from . import plots  # the CLI layer draws; the library above only computes
        try:
            shown = [{**r, "per_length": [e for e in r["per_length"] if "error" not in e]} for r in results]
            print(f"wrote {plots.write_figure(plots.perplexity_figure([r for r in shown if r['per_length']]), args.figure)}")
        except (ValueError, plots.FigureExportError, OSError) as e:
            print(f"fireviz eval: error: --figure {args.figure}: {e}", file=sys.stderr)
            return 2
    if not any("error" not in e for r in results for e in r["per_length"]):
        first = next(e["error"] for r in results for e in r["per_length"])
        print(f"fireviz eval: error: no length could be evaluated: {first}", file=sys.stderr)
        return 2
    return 0
