"""Uncertainty of evaluation numbers: bootstrap intervals over documents and paired differences.

Uncertainty. Each length keeps its per-document sums (``per_document``: document ids,
summed nats, scored tokens). ``ci95`` is a 95 % percentile bootstrap interval of the
token-weighted bits per byte, resampling documents with replacement (``BOOTSTRAP_SAMPLES``
resamples, generator seeded with ``BOOTSTRAP_SEED``): documents, not tokens, are the
independent units. For every checkpoint but the reference (the first given unless told),
``paired_delta_bpb`` = its bits per byte minus the reference's on the same windows, with
``paired_ci95`` from the same document resampling applied to both at once (Koehn 2004,
paired bootstrap resampling) — far narrower than either interval, since the text's own
difficulty cancels.

Context use (mode ``context``): every context length scores the same targets, so each entry at a
context length ``c`` also carries its paired difference against the same checkpoint's entry at
the full context ``M − K`` (``full_delta_bpb``, ``full_ci95``: :class:`FullContextDifference`,
added by :func:`with_full_context_differences`) — the value of the context beyond ``c``.
"""

from __future__ import annotations

import functools
import math
import os
from pathlib import Path
from typing import Any, Mapping, Sequence, cast

import numpy as np

from fireviz.eval.results import EvalResult, FullContextDifference, PairedDifference
from fireviz.eval.windows import EvaluationError

#: document resamples of the bootstrap intervals, and the seed of their generator
BOOTSTRAP_SAMPLES = 2000
BOOTSTRAP_SEED = 0
#: fewer documents than this get no interval (``ci95``/``paired_ci95`` None), not a falsely narrow one
MIN_INTERVAL_DOCUMENTS = 10


def bootstrap_indices(num_documents: int, samples: int = BOOTSTRAP_SAMPLES, seed: int = BOOTSTRAP_SEED) -> np.ndarray:
    """Document resamples with replacement, int64 ``[samples, num_documents]``.

    Deterministic (numpy ``default_rng(seed)``); the same matrix for every checkpoint with
    the same number of documents, which is what makes the paired bootstrap paired. Drawn once
    per arguments and shared: the array is read-only.
    Raises: EvaluationError for ``num_documents < 1`` or ``samples < 1``.
    """
    if num_documents < 1 or samples < 1:
        raise EvaluationError(f"a bootstrap needs >= 1 document and >= 1 sample (got {num_documents}, {samples})")
    return _drawn_indices(int(num_documents), int(samples), int(seed))


@functools.lru_cache(maxsize=16)
def _drawn_indices(num_documents: int, samples: int, seed: int) -> np.ndarray:
    idx = np.random.default_rng(seed).integers(0, num_documents, size=(samples, num_documents))
    idx.flags.writeable = False
    return idx


def bootstrap_ci95(
    nats: Sequence[float], tokens: Sequence[int], *, samples: int = BOOTSTRAP_SAMPLES, seed: int = BOOTSTRAP_SEED
) -> list[float] | None:
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


def bootstrap_ratio_ci95(
    numerators, denominators, *, samples: int = BOOTSTRAP_SAMPLES, seed: int = BOOTSTRAP_SEED
) -> list[float] | None:
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


def paired_difference(
    candidate: Mapping[str, Any],
    reference: Mapping[str, Any],
    *,
    samples: int = BOOTSTRAP_SAMPLES,
    seed: int = BOOTSTRAP_SEED,
) -> PairedDifference | None:
    """Paired bits-per-byte difference of two per-length entries scored on the same windows.

    Args: two ``summarize`` entries (with ``per_document``) of the same length.
    Returns: ``{"paired_delta_bpb": candidate − reference (bits per byte), "paired_ci95":
      [low, high]}`` — the interval from resampling documents jointly (paired bootstrap,
      Koehn 2004; None for fewer than ``MIN_INTERVAL_DOCUMENTS`` documents); None when the entries did not score the same documents and tokens
      (different windows cannot be paired). Entries with ``bytes`` per document (a tokenizer of
      its own) pair only on one shared text (the same ``text`` key, ``windows.plan_shared_text``):
      per document each one's bits per byte over the bytes its own targets cover, the difference
      weighted by the reference's bytes (equal bytes: exactly Σ Δnats / Σ bytes / ln 2). Raises nothing.
    """
    a, b = candidate.get("per_document"), reference.get("per_document")
    if not (isinstance(a, dict) and isinstance(b, dict)) or a.get("doc") != b.get("doc") or not a.get("doc"):
        return None
    if "bytes" in a or "bytes" in b:  # a tokenizer of its own: the same text, per document in bytes
        if not (candidate.get("text") and candidate.get("text") == reference.get("text")):
            return None  # not planned as one text together (plan_shared_text)
        a_bytes = np.asarray(a.get("bytes", a["tokens"]), dtype=np.float64)
        b_bytes = np.asarray(b.get("bytes", b["tokens"]), dtype=np.float64)
        if (a_bytes <= 0).any() or (b_bytes <= 0).any():
            return None
        # per document, bits per byte of each over the bytes its own targets cover, weighted by
        # the reference's bytes (equal bytes: exactly the difference of summed nats / bytes)
        tokens = b_bytes
        diff = (
            np.asarray(a["nats"], dtype=np.float64) / a_bytes - np.asarray(b["nats"], dtype=np.float64) / b_bytes
        ) * b_bytes
    else:
        if a.get("tokens") != b.get("tokens"):
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


def with_paired_differences(results: Sequence[EvalResult], reference: int | str = 0) -> list[EvalResult]:
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
    out: list[EvalResult] = []
    for k, r in enumerate(results):
        entries = []
        for entry in r["per_length"]:
            e: dict[str, Any] = {key: v for key, v in entry.items() if key not in _PAIRED_KEYS}
            if k != ref and "error" not in e and e["length"] in ref_entries:
                diff = paired_difference(e, ref_entries[e["length"]])
                if diff is not None:
                    e.update(diff, paired_reference=ref_name)
            entries.append(e)
        out.append(cast(EvalResult, {**r, "paired_reference": ref_name, "per_length": entries}))
    return out


_FULL_KEYS = tuple(FullContextDifference.__annotations__)


def full_context_difference(
    entry: Mapping[str, Any], full: Mapping[str, Any], full_context: int
) -> FullContextDifference | None:
    """``entry`` (context length ``c``) against ``full`` (the same checkpoint at ``M − K``), paired
    over documents (:func:`paired_difference`); None when they did not score the same documents
    and tokens. Raises nothing."""
    diff = paired_difference(entry, full)
    if diff is None:
        return None
    return {"full_delta_bpb": diff["paired_delta_bpb"], "full_ci95": diff["paired_ci95"], "full_context": full_context}


def with_full_context_differences(results: Sequence[EvalResult]) -> list[EvalResult]:
    """Copies of ``results`` whose entries at every context length but full carry the
    :class:`FullContextDifference` fields against the same result's full-context entry (a result
    whose ``settings`` hold ``full_context``: mode ``context``); other results, entries without
    per-document losses and results without a full-context entry get none. The inputs are not
    modified."""
    out: list[EvalResult] = []
    for r in results:
        full_context = (r.get("settings") or {}).get("full_context")
        full = next((e for e in r["per_length"] if e.get("length") == full_context and "error" not in e), None)
        entries = []
        for entry in r["per_length"]:
            e: dict[str, Any] = {k: v for k, v in entry.items() if k not in _FULL_KEYS}
            if full is not None and full_context is not None and "error" not in e and e["length"] != full_context:
                diff = full_context_difference(e, full, full_context)
                if diff is not None:
                    e.update(diff)
            entries.append(e)
        out.append(cast(EvalResult, {**r, "per_length": entries}))
    return out


def _reference_index(results: Sequence[Mapping[str, Any]], reference: int | str) -> int:
    if isinstance(reference, int) and not isinstance(reference, bool):
        if 0 <= reference < len(results):
            return reference
        raise EvaluationError(f"reference index {reference} is out of range for {len(results)} checkpoint(s)")
    ref = str(reference)
    for key in ("checkpoint_path", "label"):  # an exact path (or label) first
        hits = [k for k, r in enumerate(results) if r.get(key) is not None and str(r.get(key)) == ref]
        if hits:
            return hits[0]
    local = Path(ref).expanduser()
    if local.exists():  # a path spelled another way (./y/alibi, y/alibi/, absolute): the same folder
        same = [
            k
            for k, r in enumerate(results)
            if r.get("checkpoint_path") and os.path.realpath(str(r["checkpoint_path"])) == os.path.realpath(local)
        ]
        if same:
            return same[0]
    # by name: a bare name, or a Hub id as given; a path names only its own folder (y/alibi is not x/alibi)
    names = (ref,) if ("/" in ref or os.sep in ref) else (ref, Path(ref).name)
    hits = [k for k, r in enumerate(results) if r.get("checkpoint") in names]
    if len(hits) > 1:
        paths = ", ".join(str(results[k].get("checkpoint_path")) for k in hits)
        raise EvaluationError(
            f"reference {ref!r} names {len(hits)} of the checkpoints ({paths}); give the path of "
            "the one to pair against"
        )
    if hits:
        return hits[0]
    given = ", ".join(r.get("checkpoint", "?") for r in results)
    raise EvaluationError(
        f"reference {reference!r} is not one of the evaluated checkpoints ({given}); give one "
        "of them, e.g. --reference " + results[0].get("checkpoint", "CKPT")
    )


def missing_interval_note(results) -> str | None:
    """Why some entries of ``results`` (``EvalResult``s, or rows shaped like them) have no 95 %
    interval, in one sentence naming the lengths (tokens), or None when every computed entry has
    one. Two reasons: fewer than ``stats.MIN_INTERVAL_DOCUMENTS`` documents (sequences) scored —
    a bootstrap over so few would look far more certain than it is, and computing again changes
    nothing; or no per-document losses kept (an entry made by an older fireviz) — computing again
    gives the interval."""
    entries = [e for r in results for e in r.get("per_length", []) if "error" not in e and e.get("ci95") is None]
    few = sorted({e["length"] for e in entries if "per_document" in e})
    old = sorted({e["length"] for e in entries if "per_document" not in e})
    parts = []
    if few:
        parts.append(
            f"no interval at {', '.join(map(str, few))}: fewer than {MIN_INTERVAL_DOCUMENTS} documents (sequences) "
            "scored, and a bootstrap over so few would look far more certain than it is (score more text for one)"
        )
    if old:
        parts.append(
            f"no interval at {', '.join(map(str, old))}: these entries carry no per-document losses (made by an "
            "older fireviz); computing them again gives the interval"
        )
    return "; ".join(parts) if parts else None


#: share of a length's scored tokens from one document above which a note says so
DOMINANT_DOCUMENT_SHARE = 0.5


def dominant_document_note(results, share: float = DOMINANT_DOCUMENT_SHARE) -> str | None:
    """A sentence naming the lengths (tokens) where one document holds more than ``share`` of the
    scored tokens — the number then mostly describes that document (a new user's sliding run scored
    3 documents, 80 % of the tokens from one table file) — or None. Reads each entry's
    ``per_document`` tokens; entries without them are not judged."""
    worst: dict[int, tuple[float, str]] = {}
    for r in results:
        for e in r.get("per_length", []):
            pd = e.get("per_document")
            if "error" in e or not pd or not pd.get("tokens"):
                continue
            tokens = pd["tokens"]
            total = sum(tokens)
            k = max(range(len(tokens)), key=tokens.__getitem__)
            frac = tokens[k] / total if total else 0.0
            if frac > share and frac > worst.get(e["length"], (0.0, ""))[0]:
                worst[e["length"]] = (frac, str(pd["doc"][k]))
    if not worst:
        return None
    parts = [f"{n}: {100 * f:.0f} % from {doc!r}" for n, (f, doc) in sorted(worst.items())]
    return (
        f"one document holds most of the scored tokens at {'; '.join(parts)} — those numbers mostly describe "
        "that document (score more documents, e.g. a larger --token-budget or the same_text mode)"
    )
