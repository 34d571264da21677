"""What a training step is a function of: its learning rate, its windows, its seeds.

Every quantity here is a pure function of the step and the settings, which is what makes
``--resume`` exact: the training windows of step ``s`` come from a generator seeded by
``(seed, "data", s)``, dropout from ``(seed, "dropout", s, rank)``, the learning rate from
``lr_at`` (linear warmup, then cosine decay to ``min_lr``: Loshchilov & Hutter 2017, SGDR,
without restarts). Validation windows are fixed per run.
"""

from __future__ import annotations

import hashlib
import math

import numpy as np
import torch

from fireviz.data import DataError, Document, DocumentTokens
from fireviz.train.config import TrainConfig, TrainingError


def lr_at(step: int, tc: TrainConfig) -> float:
    """Learning rate for optimizer step ``step`` (0-based): linear warmup, then cosine.

    ``lr·(step+1)/warmup_steps`` for step < warmup_steps; then
    ``min_lr + ½(1 + cos(π·p))·(lr − min_lr)`` with p = (step − warmup)/(max_steps − warmup)
    (SGDR's cosine without restarts, Loshchilov & Hutter 2017; the schedule nanoGPT uses).
    """
    if step < tc.warmup_steps:
        return tc.lr * (step + 1) / tc.warmup_steps
    span = max(1, tc.max_steps - tc.warmup_steps)
    p = min(1.0, (step - tc.warmup_steps) / span)
    return tc.final_lr + 0.5 * (1.0 + math.cos(math.pi * p)) * (tc.lr - tc.final_lr)


def derive_seed(*parts) -> int:
    """A 63-bit seed from any parts (sha256 of their repr joined by ':'): stable across runs."""
    text = ":".join(str(p) for p in parts)
    return int.from_bytes(hashlib.sha256(text.encode()).digest()[:8], "big") >> 1


def window_starts(step: int, tc: TrainConfig, num_tokens: int, seq_len: int) -> torch.Tensor:
    """Starts of the global batch of step ``step``: int64 ``[batch_size]`` in
    ``[0, num_tokens − seq_len − 1]`` (a window holds seq_len + 1 tokens: inputs and targets).
    Uniform, from a generator seeded by ``(seed, step)`` only.
    Raises: TrainingError when the stream holds no window (num_tokens <= seq_len)."""
    if num_tokens <= seq_len:
        raise TrainingError(
            f"the training data holds {num_tokens} tokens, not one window of {seq_len} + 1; "
            "use more data or a shorter seq_len"
        )
    g = torch.Generator().manual_seed(derive_seed(tc.seed, "data", step))
    return torch.randint(0, num_tokens - seq_len, (tc.batch_size,), generator=g)


def position_offsets(step: int, tc: TrainConfig, rank: int = 0) -> list[int] | None:
    """Absolute starting positions (tokens) of this process's micro-batches at ``step``:
    ``grad_accum`` ints drawn uniformly from ``[0, tc.random_position_offset]`` with a
    generator seeded by ``(seed, "position_offset", step, rank)`` only (so a resumed run draws
    the same ones); None when the option is off (nothing is drawn, no RNG is touched)."""
    if not tc.random_position_offset:
        return None
    g = torch.Generator().manual_seed(derive_seed(tc.seed, "position_offset", step, rank))
    return torch.randint(0, tc.random_position_offset + 1, (tc.grad_accum,), generator=g).tolist()


def _token_docs(docs) -> list:
    """Documents as sliceable token sequences sorted by id: ``Document`` s (``[BOS] + bytes``,
    read lazily) sorted here, or token documents of a shard folder (``fireviz.data.shards``), which
    come sorted by id already."""
    if docs and isinstance(docs[0], Document):
        return [DocumentTokens(d) for d in sorted(docs, key=lambda d: d.id)]
    return list(docs)


def validation_windows(docs: list, length: int, count: int) -> torch.Tensor:
    """A fixed, deterministic validation set: int64 ``[n, length + 1]`` token windows, n ≤ count.

    ``docs``: ``Document`` s, or a shard folder's token documents (``TokenShards.documents``).
    Windows lie inside single documents (never crossing a boundary). Round k takes the
    window at offset k·length of every document (sorted by id) that still has length + 1
    tokens there, so round 0 windows start with the document's BOS. Rounds continue until
    ``count`` windows are taken or no document has room.
    Raises: DataError if no document holds length + 1 tokens.
    """
    toks = _token_docs(docs)
    out: list[torch.Tensor] = []
    k = 0
    while len(out) < count:
        room = [t for t in toks if len(t) >= (k + 1) * length + 1]
        if not room:
            break
        for t in room[: count - len(out)]:
            out.append(t[k * length : (k + 1) * length + 1])
        k += 1
    if not out:
        longest = max(len(t) for t in toks)
        raise DataError(
            f"no validation document holds {length + 1} tokens (the longest has {longest}); "
            f"validation at {length} tokens needs longer documents or a shorter seq_len"
        )
    return torch.stack(out)


def random_validation_windows(docs: list, length: int, count: int, seed: int = 0) -> torch.Tensor:
    """A fixed validation set drawn like the evaluation's random windows: int64 ``[n, length + 1]``.

    Candidates are the non-overlapping windows of ``length + 1`` tokens of every document that
    holds one (windows never cross a boundary), in document (id) then position order; ``count``
    of them are drawn with ``torch.Generator().manual_seed(seed)`` (n = min(count, candidates)), so,
    unlike ``validation_windows`` (document starts), a window's position in its document is spread
    like the text's. The candidates are counted, never listed: memory does not grow with the corpus.
    ``docs``: as :func:`validation_windows`. Raises: DataError if no document holds ``length + 1`` tokens.
    """
    toks = _token_docs(docs)
    sizes = np.asarray([len(t) for t in toks], dtype=np.int64)
    per_doc = np.maximum(0, -(-(sizes - length) // (length + 1)))  # len(range(0, size − length, length + 1))
    first = np.concatenate([[0], np.cumsum(per_doc)])
    if first[-1] == 0:
        raise DataError(f"no validation document holds {length + 1} tokens (the longest has {int(sizes.max())})")
    pick = torch.randperm(int(first[-1]), generator=torch.Generator().manual_seed(int(seed)))[:count].tolist()
    out = []
    for k in sorted(pick):
        i = int(np.searchsorted(first, k, side="right")) - 1
        s = int(k - first[i]) * (length + 1)
        out.append(toks[i][s : s + length + 1])
    return torch.stack(out)
