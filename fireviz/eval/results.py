"""The shape of an evaluation's results, declared once (as lm-evaluation-harness declares its result
schema): :class:`EvalResult` per checkpoint, :class:`LengthEntry` per length, and the paired
differences an entry carries (:class:`PairedDifference`, :class:`FullContextDifference`).

These are ``TypedDict``s: results stay plain JSON (``results.json``, the cache, a job's result),
and a type checker knows every field. Units: lengths in tokens (bytes for the byte-level models),
losses in nats per token, bits per byte = nats / ln 2, seconds of wall time.
"""

from __future__ import annotations

from typing import Any, TypedDict

from typing_extensions import NotRequired


class LossByPosition(TypedDict):
    """Mean loss per token in equal-width buckets of window positions: ``bucket_starts`` and
    ``bucket_ends`` (exclusive, tokens), ``nats`` (None for an empty bucket) and ``tokens`` scored."""

    bucket_starts: list[int]
    bucket_ends: list[int]
    nats: list[float | None]
    tokens: list[int]


class PerDocument(TypedDict):
    """Per document (sorted by id): ``doc`` ids, summed ``nats`` and ``tokens`` scored — what the
    bootstrap intervals and the paired differences resample."""

    doc: list[str]
    nats: list[float]
    tokens: list[int]
    bytes: NotRequired[list[int]]  # a tokenizer of its own: the UTF-8 bytes each document's targets cover


class PairedDifference(TypedDict):
    """Bits per byte of a candidate minus its reference on the same windows (``paired_delta_bpb``),
    with its 95 % paired bootstrap interval over documents (``paired_ci95``; None below
    ``stats.MIN_INTERVAL_DOCUMENTS`` documents). ``fireviz.eval.stats.paired_difference``."""

    paired_delta_bpb: float
    paired_ci95: list[float] | None


class FullContextDifference(TypedDict):
    """Fields of a per-length entry at context length ``c`` (mode ``context``, ``c`` not full),
    against the same checkpoint's entry at the full context ``M − K`` on the same targets.

    ``full_delta_bpb``: bits per byte at ``c`` minus bits per byte at full (per document
    differences, token-weighted; above 0: the context beyond ``c`` helps). ``full_ci95``: its 95 %
    paired bootstrap interval over documents (``[low, high]``, bits per byte; None for fewer than
    ``MIN_INTERVAL_DOCUMENTS`` documents). ``full_context``: the full context length ``M − K`` (tokens).
    """

    full_delta_bpb: float
    full_ci95: list[float] | None
    full_context: int


class LengthEntry(TypedDict):
    """One length of one checkpoint: the numbers (``fireviz.eval.scoring.summarize``), or ``error``
    (why it could not be scored; ``not_computed`` when a cache lookup found nothing)."""

    length: int
    nats_per_token: NotRequired[float]
    perplexity: NotRequired[float]
    bits_per_byte: NotRequired[float]
    tokens_scored: NotRequired[int]
    windows: NotRequired[int]
    loss_by_position: NotRequired[LossByPosition]
    documents: NotRequired[int]
    per_document: NotRequired[PerDocument]
    ci95: NotRequired[list[float] | None]
    seconds: NotRequired[float]
    cached: NotRequired[bool]
    source: NotRequired[str]  # "computed", "cache" or "results.json"
    prefix_tokens: NotRequired[int]
    documents_skipped: NotRequired[int]
    normalizer_cap: NotRequired[int]
    # mode context
    window_tokens: NotRequired[int]
    context_targets: NotRequired[int]
    full_context: NotRequired[int]
    full_delta_bpb: NotRequired[float]
    full_ci95: NotRequired[list[float] | None]
    # against the reference checkpoint
    paired_delta_bpb: NotRequired[float]
    paired_ci95: NotRequired[list[float] | None]
    paired_reference: NotRequired[str]
    # a synthetic task
    sequence_tokens: NotRequired[int]
    accuracy: NotRequired[float]
    sequence_accuracy: NotRequired[float]
    accuracy_ci95: NotRequired[list[float] | None]
    first_answer_position: NotRequired[int]
    # a checkpoint with a tokenizer of its own (a published model), or text shared with one
    bytes_scored: NotRequired[int]
    tokens_per_byte: NotRequired[float]
    text: NotRequired[str]  # the tokenizers that fixed the shared text and the BOS convention
    # zero-shot RoPE scaling
    position_encoding: NotRequired[str]
    encoding_options: NotRequired[dict[str, Any]]
    rope_scaling: NotRequired[dict[str, Any]]  # a published model: the rope_parameters applied
    error: NotRequired[str]
    not_computed: NotRequired[bool]


class EvalResult(TypedDict):
    """One checkpoint's evaluation: who (``checkpoint`` name, ``checkpoint_path`` as given,
    ``checkpoint_sha256`` — ``Checkpoint.sha256``), on what (``settings``:
    ``EvalSettings.record``; ``data_fingerprint``), how (``device``, ``fireviz_version``,
    ``seconds``), and ``per_length`` entries. ``paired_reference`` names the checkpoint the
    entries' paired differences are against; ``label`` is set by the page or script showing it."""

    checkpoint: str
    checkpoint_path: str
    checkpoint_sha256: str
    position_encoding: str
    train_seq_len: int
    settings: dict[str, Any]
    data_fingerprint: str
    fireviz_version: str
    device: str
    seconds: float
    normalizer_cap: int | None
    per_length: list[LengthEntry]
    paired_reference: NotRequired[str]
    label: NotRequired[str]
    checkpoint_kind: NotRequired[str]  # "transformers" for a published model (fireviz's own: absent)
    model_type: NotRequired[str | None]


def entries(result: EvalResult) -> dict[int, LengthEntry]:
    """``{length: entry}`` of a result's scored lengths (entries with an ``error`` left out)."""
    return {e["length"]: e for e in result["per_length"] if "error" not in e}
