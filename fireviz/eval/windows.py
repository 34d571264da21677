"""Which tokens an evaluation scores: the windows of each length (pure functions of the
documents' lengths and the settings, never of a checkpoint).

Conventions (units: tokens = bytes, loss in nats per token, bits per byte = nats / ln 2):

* A document is ``[BOS] + UTF-8 bytes`` (``fireviz.data.corpus.document_tokens``), exactly as in
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
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Sequence

import numpy as np
import torch

from fireviz.core import is_int

#: targets (tokens) scored per length unless told otherwise
DEFAULT_TOKEN_BUDGET = 65536
DEFAULT_POSITION_BUCKETS = 16
MODES = ("same_text", "nonoverlapping", "sliding")
DEFAULT_MODE = "same_text"


class EvaluationError(ValueError):
    """Settings that cannot be evaluated: a bad mode/stride/length/device/scaling request."""


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
        raise EvaluationError(
            f"stride {stride} is larger than the window ({length} tokens); use 1 <= stride <= {length}"
            if stride > length
            else f"stride must be >= 1 (got {stride})"
        )
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


def plan_windows(
    doc_ids: Sequence[str],
    doc_num_tokens: Sequence[int],
    length: int,
    *,
    mode: str = "nonoverlapping",
    stride: int | None = None,
    token_budget: int | None = DEFAULT_TOKEN_BUDGET,
    seed: int = 0,
) -> list[Window]:
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
        raise EvaluationError(
            f"no document has {length} tokens (the longest has {longest}); windows never cross "
            "documents, so this length cannot be evaluated on this data"
        )
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


def plan_same_text(
    doc_ids: Sequence[str],
    doc_num_tokens: Sequence[int],
    lengths: Sequence[int],
    *,
    token_budget: int | None = None,
    seed: int = 0,
    prefix_tokens: int | None = None,
) -> SameTextPlan:
    """The windows of a ``same_text`` evaluation: the same documents and tokens at every length.

    Args:
      doc_ids, doc_num_tokens: per document, its id and ``num_tokens`` (incl. BOS).
      lengths: window lengths in tokens (each >= 2).
      token_budget: None (default) for every qualifying document; else whole documents in
        seeded random order (``torch.Generator().manual_seed(seed)``) until
        ``documents · (M − 1) >= token_budget``.
      prefix_tokens: ``M`` itself (tokens, at least every requested length) instead of the
        largest length: e.g. one column of an evaluation made at 128 … 8192, scored on
        exactly its text, with ``lengths=[128]`` and ``prefix_tokens=8192``.
    Returns: a :class:`SameTextPlan`; lengths longer than every document map to an error
      message (they cannot be evaluated; they do not shrink the text of the others).
    Raises: EvaluationError for a bad length, budget or prefix, or if no length can be evaluated.
    """
    lengths = [_check_length(n) for n in lengths]
    if token_budget is not None and token_budget < 1:
        raise EvaluationError(f"token_budget must be >= 1 target token or None (got {token_budget})")
    if prefix_tokens is not None:
        return _plan_prefix(
            doc_ids, doc_num_tokens, lengths, token_budget, seed, check_prefix_tokens(prefix_tokens, lengths)
        )
    longest = max(doc_num_tokens, default=0)
    feasible = [n for n in lengths if n <= longest]
    if not feasible:
        raise EvaluationError(
            f"no document has {min(lengths)} tokens (the longest has {longest}); windows never "
            "cross documents, so these lengths cannot be evaluated on this data"
        )
    return _plan_prefix(doc_ids, doc_num_tokens, lengths, token_budget, seed, max(feasible))


def check_prefix_tokens(prefix_tokens, lengths: Sequence[int]) -> int:
    """``prefix_tokens`` as an int; EvaluationError unless an integer >= every length (tokens)."""
    if not is_int(prefix_tokens) or prefix_tokens < 2:
        raise EvaluationError(f"prefix_tokens (--prefix-tokens) must be an integer >= 2 tokens (got {prefix_tokens!r})")
    if prefix_tokens < max(lengths):
        raise EvaluationError(
            f"prefix_tokens (--prefix-tokens) {prefix_tokens} is shorter than the length {max(lengths)}: every length scores the "
            f"first prefix_tokens tokens of each document; give at least {max(lengths)} or leave it out"
        )
    return int(prefix_tokens)


def _plan_prefix(doc_ids, doc_num_tokens, lengths: list[int], token_budget, seed: int, M: int) -> SameTextPlan:
    longest = max(doc_num_tokens, default=0)
    eligible = sorted((i for i, n in enumerate(doc_num_tokens) if n >= M), key=lambda i: (doc_ids[i], i))
    if not eligible:
        raise EvaluationError(
            f"no document has {M} tokens (the longest has {longest}); lower prefix_tokens or leave it out"
        )
    if token_budget is not None:
        order = torch.randperm(len(eligible), generator=torch.Generator().manual_seed(int(seed))).tolist()
        take = min(len(eligible), max(1, math.ceil(token_budget / (M - 1))))
        eligible = sorted((eligible[k] for k in order[:take]), key=lambda i: (doc_ids[i], i))
    windows: dict = {}
    for n in dict.fromkeys(lengths):
        if n > M:
            windows[n] = (
                f"no document has {n} tokens (the longest has {longest}); windows never cross documents, "
                "so this length cannot be evaluated on this data"
            )
            continue
        per_doc = sliding_windows(M, n, n - 1)  # every target 1 … M − 1 once, at every length
        windows[n] = [Window(d, start, first) for d in eligible for start, first in per_doc]
    skipped = sum(1 for n in doc_num_tokens if n < M)
    return SameTextPlan(M, tuple(eligible), skipped, windows)


def _check_length(length) -> int:
    """``length`` as an int. Raises: EvaluationError unless an integer >= 2 tokens."""
    if not is_int(length) or length < 2:
        raise EvaluationError(f"evaluation length must be an integer >= 2 tokens (got {length!r})")
    return int(length)


def _check_mode(mode: str | None, stride: int | None) -> str:
    mode = DEFAULT_MODE if mode is None else mode
    if mode not in MODES:
        raise EvaluationError(f"mode must be one of {', '.join(MODES)} (got {mode!r})")
    if mode == "sliding":
        if stride is None:
            raise EvaluationError("sliding mode needs a stride (tokens), e.g. --stride 256")
        if not is_int(stride) or stride < 1:
            raise EvaluationError(f"stride must be an integer >= 1 token (got {stride!r})")
    elif stride is not None:
        raise EvaluationError(
            f"a stride applies only to mode='sliding' ({mode} windows do not overlap and have "
            "none); drop --stride or add --mode sliding"
        )
    return mode


def position_buckets(length: int, buckets: int = DEFAULT_POSITION_BUCKETS) -> tuple[list[int], list[int]]:
    """Equal-width buckets over the target positions ``1 … length − 1`` of a window.

    Returns: ``(starts, ends)``, ends exclusive, in window positions (tokens); a target at
      window position p was predicted from p tokens of context. At most ``length − 1``
      buckets. Raises: EvaluationError if ``buckets < 1`` or ``length < 2``.
    """
    _check_length(length)
    if not is_int(buckets) or buckets < 1:
        raise EvaluationError(f"position_buckets must be an integer >= 1 (got {buckets!r})")
    edges = np.unique(np.round(np.linspace(1, length, min(buckets, length - 1) + 1)).astype(np.int64))
    return edges[:-1].tolist(), edges[1:].tolist()
