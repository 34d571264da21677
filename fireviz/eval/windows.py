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
* ``mode="context"`` (context use): fixed targets, more or less context before them. Every
  document with at least ``M`` tokens (``prefix_tokens``, default 8192) qualifies; its targets
  are the last ``K`` (``context_targets``, default 256) of its first ``M`` tokens, positions
  ``M − K … M − 1``. The lengths are context lengths ``c``: the targets are cut into blocks of
  ``s`` (``stride``, default 64), and each block is scored by one window of ``c + s`` tokens
  that ends at the block's end and scores only the block (its last ``s`` positions; a last
  partial block of ``r < s`` targets, its last ``r``), so every target has at least ``c`` and
  fewer than ``c + s`` tokens before it, and is scored exactly once per ``c``. ``c = M − K`` is
  *full*: one window of the ``M`` tokens scoring its last ``K``, so every target sees its
  whole document prefix. ``c`` must be ``M − K`` or leave room for its windows
  (``c + max(s, K) <= M``); ``token_budget`` takes whole documents in seeded random order
  until ``documents · K`` reaches it. The same targets at every ``c``: a change along a row is
  the value of more context alone (``same_text`` mixes that with how many targets sit near a
  window start).

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
MODES = ("same_text", "nonoverlapping", "sliding", "context")
DEFAULT_MODE = "same_text"
#: mode="context": the prefix M, the targets K per document and the stride s (tokens) by default
DEFAULT_CONTEXT_PREFIX = 8192
DEFAULT_CONTEXT_TARGETS = 256
DEFAULT_CONTEXT_STRIDE = 64
#: mode="context": the context lengths c (tokens) by default, besides ``FULL_CONTEXT`` (M − K)
DEFAULT_CONTEXT_LENGTHS = (128, 256, 512, 1024, 2048, 4096)
#: the name of the context length M − K (every target with its whole document prefix)
FULL_CONTEXT = "full"


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
    if mode in ("same_text", "context"):
        raise EvaluationError(f"mode={mode!r} plans every length at once: use plan_{mode}")
    if mode == "sliding" and stride is not None and stride > length:  # _check_mode: sliding has a stride
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
        assert stride is not None  # sliding (_check_mode)
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


def plan_shared_text(
    doc_ids: Sequence[str],
    byte_ends: dict[str, Sequence],
    lengths: Sequence[int],
    *,
    token_budget: int | None = None,
    seed: int = 0,
    prefix_tokens: int | None = None,
) -> tuple[dict[str, SameTextPlan], list[int]]:
    """``same_text`` for checkpoints with different tokenizers: one text per document, in bytes.

    Each tokenizer ``t`` has, per document, the byte offset where each of its tokens ends
    (``byte_ends[t][d]``, non-decreasing; ``fireviz.data.tokenizers``). With ``M`` the largest
    requested length that every tokenizer holds in some document (or ``prefix_tokens``), the
    documents holding ``M`` tokens in every tokenizer qualify (``token_budget``: whole documents in
    seeded random order until ``documents · (M − 1)`` reaches it, as :func:`plan_same_text`). Each
    qualifying document's text is its first ``P_d`` bytes, ``P_d`` the most bytes any tokenizer's
    first ``M`` tokens cover; every tokenizer then scores all its tokens that end within those
    bytes (at least ``M``), cut at each length as :func:`plan_same_text` cuts ``M``. So every
    tokenizer scores the same document prefix at every length, to within the bytes of one token
    at its end (a token that crosses ``P_d`` is left out) and, for a model without BOS, of its first
    token (context only, never predicted); per document the bytes covered are
    what bits per byte divide by. The byte tokenizer alone gets exactly :func:`plan_same_text`'s windows.
    Returns: ``({tokenizer: SameTextPlan}, [P_d per document index, 0 if not scored])``.
    Raises: EvaluationError for a bad length, budget or prefix, or no length every tokenizer can evaluate.
    """
    lengths = [_check_length(n) for n in lengths]
    if token_budget is not None and token_budget < 1:
        raise EvaluationError(f"token_budget must be >= 1 target token or None (got {token_budget})")
    names = list(byte_ends)
    sizes = [min(len(byte_ends[t][d]) for t in names) for d in range(len(doc_ids))]
    longest = max(sizes, default=0)
    if prefix_tokens is not None:
        M = check_prefix_tokens(prefix_tokens, lengths)
    else:
        feasible = [n for n in lengths if n <= longest]
        if not feasible:
            raise EvaluationError(
                f"no document has {min(lengths)} tokens in every tokenizer (the longest has {longest}); windows "
                "never cross documents, so these lengths cannot be evaluated on this data"
            )
        M = max(feasible)
    eligible = _prefix_documents(doc_ids, sizes, M, token_budget, seed, M - 1)
    span = [0] * len(doc_ids)
    for d in eligible:
        span[d] = max(int(byte_ends[t][d][M - 1]) for t in names)
    skipped = sum(1 for n in sizes if n < M)
    plans = {}
    for t in names:
        counts = {d: int(np.searchsorted(np.asarray(byte_ends[t][d]), span[d], side="right")) for d in eligible}
        windows = _cut_prefixes(lengths, M, counts, longest, " in every tokenizer")
        plans[t] = SameTextPlan(M, tuple(eligible), skipped, windows)
    return plans, span


def _cut_prefixes(lengths, M: int, counts: dict[int, int], longest: int, where: str = "") -> dict:
    """Per length ``n``: each document's first ``counts[d]`` tokens (``d`` in ``counts``' order) cut
    into windows overlapping by one token (``sliding_windows(counts[d], n, n − 1)``: every target
    once); a length above ``M`` holds why it has none (``where`` qualifies "tokens")."""
    windows: dict = {}
    for n in dict.fromkeys(lengths):
        if n > M:
            windows[n] = (
                f"no document has {n} tokens{where} (the longest has {longest}); windows never cross documents, "
                "so this length cannot be evaluated on this data"
            )
            continue
        cuts = {size: sliding_windows(size, n, n - 1) for size in set(counts.values())}  # once per size
        windows[n] = [Window(d, start, first) for d, size in counts.items() for start, first in cuts[size]]
    return windows


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


def _prefix_documents(doc_ids, doc_num_tokens, M: int, token_budget, seed: int, per_document: int) -> list[int]:
    """The documents holding ``M`` tokens, sorted by id; with ``token_budget``, whole documents in
    seeded random order until ``documents · per_document`` targets reach it.
    Raises: EvaluationError when no document holds ``M`` tokens."""
    eligible = sorted((i for i, n in enumerate(doc_num_tokens) if n >= M), key=lambda i: (doc_ids[i], i))
    if not eligible:
        raise EvaluationError(
            f"no document has {M} tokens (the longest has {max(doc_num_tokens, default=0)}); lower "
            "prefix_tokens or leave it out"
        )
    if token_budget is not None:
        order = torch.randperm(len(eligible), generator=torch.Generator().manual_seed(int(seed))).tolist()
        take = min(len(eligible), max(1, math.ceil(token_budget / per_document)))
        eligible = sorted((eligible[k] for k in order[:take]), key=lambda i: (doc_ids[i], i))
    return eligible


def _plan_prefix(doc_ids, doc_num_tokens, lengths: list[int], token_budget, seed: int, M: int) -> SameTextPlan:
    longest = max(doc_num_tokens, default=0)
    eligible = _prefix_documents(doc_ids, doc_num_tokens, M, token_budget, seed, M - 1)
    windows = _cut_prefixes(lengths, M, dict.fromkeys(eligible, M), longest)  # every target 1 … M − 1 once
    skipped = sum(1 for n in doc_num_tokens if n < M)
    return SameTextPlan(M, tuple(eligible), skipped, windows)


@dataclass(frozen=True)
class ContextPlan:
    """The fixed targets of a ``context`` evaluation (see the module docstring).

    Attributes (tokens):
      prefix_tokens: ``M``; targets: ``K`` per document (positions ``M − K … M − 1``);
      stride: ``s``, the targets one window scores (its last ``s`` positions).
      documents: indices (into the evaluated list) of the documents scored, sorted by id.
      documents_skipped: documents shorter than ``M`` (not scored at any context length).
      windows: context length ``c`` → the windows scoring every target once with ``c`` …
        ``c + s − 1`` tokens before it (full, ``c = M − K``: one window of ``M`` per document).
      window_tokens: ``c`` → tokens per window: ``c + s``, or ``M`` for full.
    """

    prefix_tokens: int
    targets: int
    stride: int
    documents: tuple[int, ...]
    documents_skipped: int
    windows: dict
    window_tokens: dict

    @property
    def full(self) -> int:
        """The full context length ``M − K`` (tokens): every target sees its whole document prefix."""
        return self.prefix_tokens - self.targets


def check_context(contexts: Sequence[int], prefix_tokens: int, targets: int, stride: int) -> None:
    """Raises: EvaluationError, naming the setting and the fix, unless ``targets`` K fits the prefix
    ``M`` (``1 <= K <= M − 2``: every target has a token before it and ``c >= 2``) and every context
    length ``c`` is full (``M − K``) or leaves room for its windows of ``c + s`` tokens
    (``c + max(s, K) <= M``: the first targets, at position ``M − K``, have at most ``M − K`` tokens
    before them; a window longer than ``M`` does not fit)."""
    M, K, s = prefix_tokens, targets, stride
    if not 1 <= K <= M - 2:
        raise EvaluationError(
            f"context_targets (--context-targets) K = {K} does not fit the prefix M = {M} tokens: the "
            f"targets are the last K of the first M tokens and need at least 2 tokens before them; give "
            f"1 <= K <= {M - 2} (or a longer --prefix-tokens)"
        )
    for c in contexts:
        if c == M - K:
            continue
        if c + s > M:
            raise EvaluationError(
                f"context length {c} does not fit: its windows of c + s = {c + s} tokens ({c} of context "
                f"+ the stride s = {s} scored) are longer than the prefix M = {M}; the longest context "
                f"is full = M − K = {M - K} (--lengths ...,full), or give a longer --prefix-tokens"
            )
        if c + max(s, K) > M:
            below = f"; below it, c <= {M - max(s, K)} (windows of c + s within M)" if s > K else ""
            raise EvaluationError(
                f"context length {c} does not fit: the first targets, at position M − K = {M - K}, have "
                f"only {M - K} tokens before them; the longest context is full = M − K = {M - K} (every "
                f"target with its whole prefix){below}, or give a longer --prefix-tokens"
            )


def context_windows(prefix_tokens: int, targets: int, stride: int, context: int) -> tuple[int, list[tuple[int, int]]]:
    """The windows of one document at context length ``c`` (see ``check_context`` for what fits).

    Returns: ``(window tokens, [(start, first_target)])``: for ``c = M − K`` (full) one window
      ``[0, M)`` scoring its last ``K``; else per block of ``s`` targets ``[t0, t1)`` (the last
      one may hold fewer) the window ``[t1 − c − s, t1)``, scoring window positions
      ``t0 − start … c + s − 1``: each target ``M − K … M − 1`` once, with ``c … c + s − 1``
      tokens before it.
    Raises: EvaluationError as ``check_context``.
    """
    M, K, s, c = prefix_tokens, targets, stride, context
    check_context([c], M, K, s)
    if c == M - K:
        return M, [(0, M - K)]
    out = []
    for t0 in range(M - K, M, s):
        start = min(t0 + s, M) - c - s
        out.append((start, t0 - start))
    return c + s, out


def plan_context(
    doc_ids: Sequence[str],
    doc_num_tokens: Sequence[int],
    contexts: Sequence[int],
    *,
    prefix_tokens: int = DEFAULT_CONTEXT_PREFIX,
    targets: int = DEFAULT_CONTEXT_TARGETS,
    stride: int = DEFAULT_CONTEXT_STRIDE,
    token_budget: int | None = None,
    seed: int = 0,
) -> ContextPlan:
    """The windows of a ``context`` evaluation: the same targets at every context length.

    Args: ``doc_ids``, ``doc_num_tokens`` per document (incl. BOS); ``contexts`` the context
      lengths ``c`` (tokens, >= 2); ``prefix_tokens`` M, ``targets`` K, ``stride`` s (tokens);
      ``token_budget`` None (every document holding M tokens) or targets: whole documents in
      seeded random order (``torch.Generator().manual_seed(seed)``) until ``documents · K`` reaches it.
    Returns: a :class:`ContextPlan`.
    Raises: EvaluationError for settings that do not fit (``check_context``), or no document of M tokens.
    """
    contexts = list(dict.fromkeys(_check_length(c) for c in contexts))
    if not all(is_int(v) and v >= 1 for v in (prefix_tokens, targets, stride)):
        raise EvaluationError(
            f"prefix_tokens, targets and stride must be integers >= 1 (got {prefix_tokens}, {targets}, {stride})"
        )
    if token_budget is not None and token_budget < 1:
        raise EvaluationError(f"token_budget must be >= 1 target token or None (got {token_budget})")
    M, K, s = int(prefix_tokens), int(targets), int(stride)
    check_context(contexts, M, K, s)
    docs = _prefix_documents(doc_ids, doc_num_tokens, M, token_budget, seed, K)
    windows, sizes = {}, {}
    for c in contexts:
        sizes[c], per_doc = context_windows(M, K, s, c)
        windows[c] = [Window(d, start, first) for d in docs for start, first in per_doc]
    skipped = sum(1 for n in doc_num_tokens if n < M)
    return ContextPlan(M, K, s, tuple(docs), skipped, windows, sizes)


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
    elif mode == "context":  # the targets one window scores (default DEFAULT_CONTEXT_STRIDE)
        if stride is not None and (not is_int(stride) or stride < 1):
            raise EvaluationError(f"stride must be an integer >= 1 token (got {stride!r})")
    elif stride is not None:
        raise EvaluationError(
            f"a stride applies only to mode='sliding' and mode='context' ({mode} windows do not overlap "
            "and have none); drop --stride or add --mode sliding"
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
