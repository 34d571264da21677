"""Scoring windows: summed next-token loss by window position, and one length's summary.

``score_windows`` runs a model over planned windows (``fireviz.eval.windows``) under
``torch.inference_mode()``; ``summarize`` turns the sums into the per-length entry every
result carries (nats per token, perplexity, bits per byte, loss by position, per-document
sums and the 95 % bootstrap interval of ``fireviz.eval.stats``).
"""

from __future__ import annotations

import math
from typing import Callable, Sequence

import numpy as np
import torch
import torch.nn.functional as F

from fireviz.eval.stats import bootstrap_ci95
from fireviz.eval.windows import DEFAULT_POSITION_BUCKETS, EvaluationError, Window, position_buckets
from fireviz.model import GPT


def _as_long(tokens) -> torch.Tensor:
    """A window's token ids (torch tensor or numpy array of any integer type) as int64."""
    if isinstance(tokens, torch.Tensor):
        return tokens.long()
    return torch.from_numpy(np.ascontiguousarray(tokens, dtype=np.int64))  # a numpy window


def score_windows(
    model: GPT,
    doc_tokens: Callable[[int], torch.Tensor],
    windows: Sequence[Window],
    length: int,
    *,
    device: torch.device | str = "cpu",
    batch_tokens: int = 8192,
    on_batch: Callable[[int], None] | None = None,
    with_accuracy: bool = False,
    doc_bytes: Callable[[int], np.ndarray | None] | None = None,
    bos_window: int | None = None,
    bytes_out: dict | None = None,
    shard: tuple[int, int] = (0, 1),
) -> tuple:
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
      doc_bytes: document index → int64 ``[num_tokens]``, the bytes each token covers (a model
        with its own tokenizer, ``Plan.doc_bytes``); with ``bytes_out`` (a dict) each document's
        scored target bytes are summed into it. None: one byte per token.
      bos_window: a BOS id written over every window's first (context-only) position (the
        ``"window"`` BOS convention), else None.
      shard: ``(rank, world)`` under ``torchrun``: this process scores batches ``rank, rank +
        world, …`` and the processes exchange their per-batch sums (``all_gather_object``), which
        every process then adds in batch order — so the numbers are bit for bit those of one
        process (the batches are the same windows either way). ``(0, 1)``: one process.
    Returns: ``(nats_sum float64 [length], counts int64 [length], nats_by_doc,
      tokens_by_doc)``: the first two indexed by window position (index 0 is always zero,
      never a target); the last two map each document index to its summed nats (float)
      and scored tokens (int). With ``with_accuracy`` a fifth: document index → targets
      whose argmax prediction is right (int).
    Raises: ValueError from the model (e.g. absolute embeddings past ``seq_len``).
    """
    device = torch.device(device)
    totals = _Totals(length, with_accuracy, bytes_out)
    per_batch = max(1, int(batch_tokens) // length)
    rank, world = shard
    parts: list[tuple] = []  # torchrun: the batches scored here, added with the others' below
    with torch.inference_mode():
        for b in range(0, len(windows), per_batch):
            if (b // per_batch) % world != rank:
                continue
            batch = windows[b : b + per_batch]
            part = _score_batch(model, doc_tokens, batch, length, device, with_accuracy, doc_bytes, bos_window)
            if world > 1:
                parts.append((b, *part))
            else:
                totals.add(*part)
            if on_batch is not None:
                on_batch(len(batch))
    if world > 1:  # every process adds every batch, in batch order: one process's sums, bit for bit
        import torch.distributed as dist

        gathered: list = [None] * world
        dist.all_gather_object(gathered, parts)
        for part in sorted((part for got in gathered for part in got), key=lambda part: part[0]):
            totals.add(*part[1:])
    out = (totals.nats.numpy(), totals.counts.numpy(), totals.doc_nats, totals.doc_tokens)
    return (*out, totals.doc_correct) if with_accuracy else out


class _Totals:
    """The sums ``score_windows`` returns, one batch added at a time (in batch order)."""

    def __init__(self, length: int, with_accuracy: bool, bytes_out: dict | None):
        self.nats = torch.zeros(length, dtype=torch.float64)
        self.counts = torch.zeros(length, dtype=torch.int64)
        self.doc_nats: dict[int, float] = {}
        self.doc_tokens: dict[int, int] = {}
        self.doc_correct: dict[int, int] = {}
        self.with_accuracy, self.bytes_out = with_accuracy, bytes_out

    def add(self, pos_nats: torch.Tensor, pos_counts: torch.Tensor, rows: list, row_bytes: list) -> None:
        self.nats[1:] += pos_nats
        self.counts[1:] += pos_counts
        for doc, row_nats, row_count, hit in rows:
            self.doc_nats[doc] = self.doc_nats.get(doc, 0.0) + row_nats
            self.doc_tokens[doc] = self.doc_tokens.get(doc, 0) + row_count
            if self.with_accuracy:
                self.doc_correct[doc] = self.doc_correct.get(doc, 0) + hit
        if self.bytes_out is not None:
            for doc, scored in row_bytes:
                self.bytes_out[doc] = self.bytes_out.get(doc, 0) + scored


def _score_batch(model, doc_tokens, batch, length: int, device: torch.device, with_accuracy, doc_bytes, bos_window):
    """One batch of windows through the model: ``(Σ nats by target position float64 [length − 1],
    targets by position, [(doc, nats, targets, right)] per window, [(doc, target bytes)])``."""
    x = torch.stack([_as_long(doc_tokens(w.doc)[w.start : w.start + length]) for w in batch]).to(device)
    if bos_window is not None:
        x[:, 0] = bos_window
    first = torch.tensor([w.first_target for w in batch])
    row_bytes = []
    if doc_bytes is not None:
        for w in batch:
            per_token = doc_bytes(w.doc)
            if per_token is not None:
                row_bytes.append((w.doc, int(per_token[w.start + w.first_target : w.start + length].sum())))
    with torch.autocast(device_type=device.type, dtype=torch.bfloat16, enabled=device.type == "cuda"):
        logits = model(x)
    nll = (
        F.cross_entropy(logits[:, :-1].float().reshape(-1, logits.shape[-1]), x[:, 1:].reshape(-1), reduction="none")
        .view(len(batch), length - 1)
        .double()
        .cpu()
    )
    keep = torch.arange(1, length)[None, :] >= first[:, None]  # [batch, length − 1]
    kept = nll * keep
    hit = ((logits[:, :-1].argmax(-1) == x[:, 1:]).cpu() & keep).sum(1).tolist() if with_accuracy else [0] * len(batch)
    rows = [
        (w.doc, row_nats, int(row_count), int(h))
        for w, row_nats, row_count, h in zip(batch, kept.sum(1).tolist(), keep.sum(1).tolist(), hit, strict=True)
    ]
    return kept.sum(0), keep.sum(0), rows, row_bytes


def summarize(
    length: int,
    nats_by_pos: np.ndarray,
    counts_by_pos: np.ndarray,
    windows: int,
    buckets: int = DEFAULT_POSITION_BUCKETS,
    per_document: dict | None = None,
    scored_bytes: int | None = None,
) -> dict:
    """The per-length numbers from per-position sums (see ``score_windows``).

    Returns: ``{"length", "nats_per_token" (token-weighted mean, nats), "perplexity" (exp of
      it), "bits_per_byte" (nats / ln 2 per byte: one token is one byte, or summed nats / ln 2 /
      ``scored_bytes`` for a tokenizer of its own, then also "bytes_scored" and "tokens_per_byte"),
      "tokens_scored", "windows",
      "loss_by_position": {"bucket_starts", "bucket_ends" (exclusive, window positions in
      tokens), "nats" (mean per token, None for an empty bucket), "tokens"}}``; with
      ``per_document`` (``{"doc": [ids], "nats": [summed nats], "tokens": [scored]}``) also
      that, ``documents`` and ``ci95`` (:func:`bootstrap_ci95`, bits per byte; over its ``bytes``
      per document where it has them).
    Raises: EvaluationError if nothing was scored.
    """
    total = int(counts_by_pos.sum())
    if total == 0:
        raise EvaluationError(f"no tokens were scored at length {length}")
    mean = float(nats_by_pos.sum() / total)
    if not (math.isfinite(mean) and mean < 700):
        raise EvaluationError(
            f"the mean loss at length {length} is {mean} nats/token (perplexity beyond float range): "
            "the checkpoint's weights or this text produce NaN, inf or exploding logits; check "
            "model.safetensors — nothing was cached"
        )
    starts, ends = position_buckets(length, buckets)
    b_nats, b_tok = [], []
    for s, e in zip(starts, ends, strict=True):
        c = int(counts_by_pos[s:e].sum())
        b_tok.append(c)
        b_nats.append(float(nats_by_pos[s:e].sum() / c) if c else None)
    out = {
        "length": int(length),
        "nats_per_token": mean,
        "perplexity": math.exp(mean),
        "bits_per_byte": mean / math.log(2),
        "tokens_scored": total,
        "windows": int(windows),
        "loss_by_position": {"bucket_starts": starts, "bucket_ends": ends, "nats": b_nats, "tokens": b_tok},
    }
    if scored_bytes is not None:
        if scored_bytes <= 0:
            raise EvaluationError(f"the targets at length {length} cover no bytes of text")
        out["bits_per_byte"] = float(nats_by_pos.sum()) / scored_bytes / math.log(2)
        out["bytes_scored"] = int(scored_bytes)
        out["tokens_per_byte"] = total / scored_bytes
    if per_document is not None:
        out["documents"] = len(per_document["doc"])
        out["per_document"] = per_document
        out["ci95"] = bootstrap_ci95(per_document["nats"], per_document.get("bytes", per_document["tokens"]))
    return out


# ---------------------------------------------------------------------------------------------
# Checkpoints, devices, cache
# ---------------------------------------------------------------------------------------------
