"""Attention on a text: where each head's probability goes, measured by running the model.

The bias report (``fireviz.analysis.biases``) reads the position encoding alone; this module runs the
whole model on ``[BOS] + bytes`` of a text and reads the attention probabilities the model
hands out (``GPT.attention_probs``: computed by each attention module from its own queries,
keys and bias, the pass stopped after the last layer needed; ``fireviz.model.capture``):

* ``attention_dilution(model, tokens)``: per layer and head, the share of attention on the
  nearest keys at chosen query positions — why FIRE's loss rises past the training length
  (its normalizer ψ(max(L, i)) keeps growing, far keys look near, attention spreads thin).
  ``cached_attention_dilution`` keeps results on disk.
* ``attention_pattern(model, tokens, layer)``: one layer's full query × key probabilities per
  head, as BertViz and CircuitsVis draw them, and the bias's share of each head's logits.
"""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

import numpy as np
import torch

from fireviz.analysis.biases import (
    DEFAULT_DILUTION_MULTIPLES,
    _capped_copy,
    _check_positions,
    _rl,
    default_query_positions,
)
from fireviz.checkpoints import CausalLMCheckpoint, Checkpoint
from fireviz.core import is_int, read_json, write_json_atomic
from fireviz.data import text_bytes
from fireviz.encodings import check_normalizer_cap, fire_modules
from fireviz.eval import default_cache_dir
from fireviz.model import BOS_ID, GPT, memory, nonfinite_parameters


# -- attention dilution ------------------------------------------------------------------------
@dataclass
class DilutionResult:
    """Share of attention on the nearest keys, per layer, head and query position.

    Attributes: ``query_positions`` (tokens, 0-based), ``near`` (keys j with 0 <= i − j < near
    count as near), ``rows`` (consecutive query rows averaged per position), ``share`` float64
    ``[layers, heads, positions]`` (probability in [0, 1], averaged over rows and batch),
    ``train_seq_len`` (tokens), ``checkpoint``, ``encoding``, ``tokens`` (scored sequence
    length per batch item), ``normalizer_cap`` (tokens, FIRE measured capped; else None).
    """

    query_positions: list[int]
    near: int
    rows: int
    share: np.ndarray
    train_seq_len: int
    checkpoint: str | None = None
    encoding: str | None = None
    tokens: int = 0
    normalizer_cap: int | None = None

    def to_dict(self) -> dict:
        """JSON-ready dict with ``share`` as nested lists [layer][head][position]."""
        return {
            "checkpoint": self.checkpoint,
            "encoding": self.encoding,
            "train_seq_len": self.train_seq_len,
            "normalizer_cap": self.normalizer_cap,
            "query_positions": list(self.query_positions),
            "near": self.near,
            "rows": self.rows,
            "tokens": self.tokens,
            "units": {"position": "tokens (0-based)", "share": "attention probability"},
            "share": _rl(self.share),
        }


def _near_shares(probs: torch.Tensor, queries: list[int], positions: Sequence[int], rows: int, near: int) -> np.ndarray:
    """float64 ``[heads, positions]``: each head's attention on its ``near`` nearest keys, averaged
    over the ``rows`` query rows ending at each position (and the batch). ``probs`` float32
    ``[batch, heads, len(queries), keys]`` (an ``AttentionRecord``'s) for the ascending query
    positions ``queries``, which hold every such row."""
    index = {r: q for q, r in enumerate(queries)}
    keys = torch.arange(probs.shape[-1], device=probs.device)
    out = np.zeros((probs.shape[1], len(positions)), dtype=np.float64)
    for p, i in enumerate(positions):
        r0 = max(0, i - rows + 1)
        dist = torch.arange(r0, i + 1, device=probs.device)[:, None] - keys[None, :]  # [r, keys]
        rows_p = probs[:, :, index[r0] : index[i] + 1]  # the rows r0 … i (consecutive in queries)
        near_mass = (rows_p * ((dist >= 0) & (dist < near))).sum(-1)  # [B, H, r]
        out[:, p] = near_mass.mean(dim=(0, 2)).double().cpu().numpy()
    return out


@torch.no_grad()
def attention_dilution(
    model: GPT,
    tokens: torch.Tensor,
    query_positions: Sequence[int] | None = None,
    near: int = 16,
    rows: int = 8,
    checkpoint: str | None = None,
    normalizer_cap: int | None = None,
) -> DilutionResult:
    """Per head, the attention probability on the nearest ``near`` keys at growing query positions.

    Runs ``model`` once on ``tokens[..., :max(query_positions) + 1]`` (``GPT.attention_probs``)
    and takes every layer's attention probabilities of only the chosen query rows, as each
    ``CausalSelfAttention`` computes them from its own queries and keys (rotated at absolute
    positions for rotary kinds; YaRN's factor included) and its bias (additive kinds):
    softmax(q·k/√d_head + bias + causal mask). Memory is ∝ rows × length per head, never
    length². The pass stops after the last block (no vocabulary projection).
    For each position i the share is averaged over the ``rows`` queries i − rows + 1 … i
    (and the batch) to reduce token noise. A bias stretched by progressive interpolation
    (FIRE) can spread attention thin past the training length: the share falls.

    Args:
      tokens: LongTensor ``[T]`` or ``[batch, T]`` of token ids (e.g. ``[BOS] + UTF-8 bytes``
        of a real document), T > max query position.
      query_positions: tokens, 0-based; default m·seq_len − 1 for m = 1, 2, 4, 8, 16.
      near: how many nearest keys (including the query's own position) count as near.
      rows: consecutive query rows averaged per position (clipped at position 0).
      normalizer_cap: FIRE only: measure with ψ(min(max(L, i), cap)) (tokens); the model is
        left as it was. Recorded as ``normalizer_cap`` (None for other encodings).
    Returns: ``DilutionResult`` with ``share [layers, heads, positions]``.
    Raises: ValueError if tokens are not 1-D/2-D integers, too short for the largest query
      position, for bad query positions, near/rows not integers >= 1 or a bad normalizer cap;
      the model's own ValueError for a model with absolute position embeddings asked past its
      training length.
    """
    if not torch.is_tensor(tokens) or tokens.dtype not in (torch.int64, torch.int32) or tokens.dim() not in (1, 2):
        raise ValueError("tokens must be a 1-D or 2-D integer (Long) tensor of token ids")
    if any(not is_int(v) or v < 1 for v in (near, rows)):
        raise ValueError(f"near and rows must be integers >= 1 (got near={near!r}, rows={rows!r})")
    cfg = model.config
    positions = _check_positions(
        query_positions
        if query_positions is not None
        else default_query_positions(cfg.seq_len, DEFAULT_DILUTION_MULTIPLES)
    )
    idx = tokens.long()[None] if tokens.dim() == 1 else tokens.long()
    n = positions[-1] + 1
    if idx.shape[1] < n:
        raise ValueError(
            f"tokens hold {idx.shape[1]} positions but query position {positions[-1]} needs "
            f"{n}; give a longer text or smaller query positions"
        )
    device = next(model.parameters()).device
    idx = idx[:, :n].to(device)
    capped = normalizer_cap is not None and bool(fire_modules(model))
    model = _capped_copy(model, normalizer_cap)
    queries = sorted({r for i in positions for r in range(max(0, i - rows + 1), i + 1)})
    cap = model.attention_probs(idx, queries=queries)
    for layer in range(cfg.n_layer):
        _refuse_nonfinite_probs(model, cap[layer].probs, checkpoint)
    share = np.stack([_near_shares(cap[layer].probs, queries, positions, rows, near) for layer in range(cfg.n_layer)])
    return DilutionResult(
        query_positions=positions,
        near=int(near),
        rows=int(rows),
        share=share,
        train_seq_len=int(cfg.seq_len),
        checkpoint=checkpoint,
        encoding=cfg.position_encoding,
        tokens=n,
        normalizer_cap=int(normalizer_cap) if capped and normalizer_cap else None,
    )


def _refuse_nonfinite_probs(model: GPT, probs: torch.Tensor, checkpoint: str | None) -> None:
    """Raises: ValueError when attention probabilities hold NaN/inf (a blank heatmap or a NaN share
    otherwise), naming the non-finite weights behind them and the fix."""
    if bool(torch.isfinite(probs).all()):
        return
    bad = nonfinite_parameters(model)
    who = f"{checkpoint}: " if checkpoint else ""
    if bad:
        raise ValueError(
            f"{who}the weights contain NaN/inf in {', '.join(bad[:3])}{' …' if len(bad) > 3 else ''}, so every "
            "attention probability is NaN; restore or retrain the checkpoint"
        )
    raise ValueError(
        f"{who}the attention probabilities overflowed to NaN/inf on this text although every weight is finite; "
        "try a shorter text (and report it: this is a bug)"
    )


#: bumped when the numbers a given dilution setting produces would change (part of the cache key)
DILUTION_FORMAT_VERSION = 1


def dilution_cache_path(
    checkpoint: Checkpoint,
    tokens: torch.Tensor,
    query_positions: Sequence[int],
    near: int,
    rows: int,
    normalizer_cap: int | None,
    cache_dir: str | os.PathLike | None = None,
    rope_scaling: str | None = None,
) -> Path:
    """Where ``cached_attention_dilution`` keeps one result: ``<cache>/dilution/<sha256>.json``,
    the key made of the checkpoint's identity (``Checkpoint.sha256``: weights + config), the
    tokens' sha256 and the settings (a published model's zero-shot ``rope_scaling`` too, when set). ``cache_dir`` defaults to ``fireviz.eval.default_cache_dir()``.
    Raises: TypeError for a checkpoint that is not a resolved :class:`Checkpoint`."""

    if not isinstance(checkpoint, (Checkpoint, CausalLMCheckpoint)):
        raise TypeError(
            f"checkpoint must be a fireviz.checkpoints.Checkpoint or CausalLMCheckpoint (got "
            f"{type(checkpoint).__name__}): resolve it once with Checkpoint.resolve(path) (either kind: "
            "fireviz.checkpoints.resolve_any)"
        )
    tok = np.ascontiguousarray(tokens.detach().cpu().numpy().astype(np.int64))
    blob = json.dumps(
        {
            "format": DILUTION_FORMAT_VERSION,
            "checkpoint_sha256": checkpoint.sha256,
            "tokens_sha256": hashlib.sha256(tok.tobytes()).hexdigest(),
            "tokens_shape": list(tok.shape),
            "query_positions": [int(p) for p in query_positions],
            "near": int(near),
            "rows": int(rows),
            "normalizer_cap": None if normalizer_cap is None else int(normalizer_cap),
            **({"rope_scaling": rope_scaling} if rope_scaling else {}),
        },
        sort_keys=True,
    )
    root = Path(cache_dir) if cache_dir is not None else default_cache_dir()
    return root / "dilution" / f"{hashlib.sha256(blob.encode()).hexdigest()}.json"


def cached_attention_dilution(
    checkpoint: Checkpoint,
    tokens: torch.Tensor,
    query_positions: Sequence[int],
    near: int = 16,
    rows: int = 8,
    normalizer_cap: int | None = None,
    cache_dir: str | os.PathLike | None = None,
    compute: bool = True,
    rope_scaling: str | None = None,
) -> dict | None:
    """``attention_dilution(...).to_dict()`` for a resolved :class:`Checkpoint` (or a published
    ``CausalLMCheckpoint``, on tokens of its own tokenizer: :func:`published_dilution_input`), cached on disk.

    Reads the cached result when one exists for exactly these weights, tokens and settings
    (``dilution_cache_path``); else, with ``compute``, loads the checkpoint, measures and
    writes the result atomically. A damaged cache file is recomputed (never shown).
    ``rope_scaling``: a published RoPE model measured with that zero-shot scaling, its factor set
    by the largest query position (``CausalLMCheckpoint.load``), named ``<name> + <scaling>``.
    Returns: the result dict (``"cached"``: whether it was read), or None when not cached
      and ``compute`` is False.
    Raises: ValueError as ``attention_dilution`` (bad query positions before anything is read);
      TypeError for a checkpoint that is not a :class:`Checkpoint`; CheckpointError for weights
      that do not load or changed since the checkpoint was resolved (``Checkpoint.load``);
      OSError if the result cannot be written to the cache folder.
    """

    positions = _check_positions(query_positions)
    path = dilution_cache_path(checkpoint, tokens, positions, near, rows, normalizer_cap, cache_dir, rope_scaling)
    name = checkpoint.name + (f" + {rope_scaling}" if rope_scaling else "")  # its own line on the figure
    try:
        obj = read_json(path, expect=dict)
        share = np.asarray(obj["share"], dtype=np.float64)
        if (
            share.ndim == 3
            and share.shape[2] == len(positions)
            and np.isfinite(share).all()
            and obj.get("query_positions") == positions
        ):
            # the same weights may sit in another folder: name the one asked for
            return {**obj, "checkpoint": name, "cached": True}
    except (ValueError, KeyError, TypeError):  # FileFormatError is a ValueError: recompute
        pass
    if not compute:
        return None
    if rope_scaling:  # a published model's RoPE scaled zero-shot for its longest query (transformers' method)
        if not isinstance(checkpoint, CausalLMCheckpoint):
            raise ValueError("rope_scaling applies to a published causal LM's dilution (fireviz checkpoints: none)")
        model = checkpoint.load("cpu", rope_scaling, positions[-1] + 1)
    else:
        model = checkpoint.load("cpu")
    out = attention_dilution(
        model, tokens, positions, near=near, rows=rows, checkpoint=name, normalizer_cap=normalizer_cap
    ).to_dict()
    if rope_scaling:
        out["rope_scaling"] = rope_scaling
    write_json_atomic(path, out)
    return {**out, "cached": False}


def text_tokens(text: str) -> torch.Tensor:
    """``[BOS] + UTF-8 bytes`` of ``text`` as LongTensor ``[1 + bytes]`` (BOS id 256), the
    document encoding fireviz trains on (byte-level vocabulary)."""

    return torch.tensor([BOS_ID] + list(text_bytes(text)), dtype=torch.long)


# -- attention patterns per head ---------------------------------------------------------------
#: longest text an attention pattern is computed for (tokens): a [heads, T, T] float32 matrix
MAX_PATTERN_TOKENS = 2048


@dataclass
class AttentionPattern:
    """One layer's attention on a text, per head.

    Attributes: ``layer``; ``tokens`` (the ids scored, ``[BOS] + bytes``); ``probs`` float32
    ``[heads, T, T]`` (row i: query position i's probabilities over keys 0…i, zero above the
    diagonal); ``bias_share`` float64 ``[heads]`` or None (no additive bias): per head, the
    bias's share of the logits' spread, mean over queries i >= 1 of
    Var_j(b) / (Var_j(b) + Var_j(c)) over the keys j <= i it may see, with c = q·k/√d the
    content logit and b the position bias (0: position plays no part, 1: the bias alone
    decides); ``bias_share_by_query`` float64 ``[heads, T]`` (that ratio per query, NaN at
    i = 0); ``checkpoint``, ``encoding``, ``train_seq_len``, ``normalizer_cap``.
    """

    layer: int
    tokens: list[int]
    probs: np.ndarray
    bias_share: np.ndarray | None
    bias_share_by_query: np.ndarray | None
    train_seq_len: int
    checkpoint: str | None = None
    encoding: str | None = None
    normalizer_cap: int | None = None

    def to_dict(self) -> dict:
        """JSON-ready dict (``probs`` as nested lists [head][query][key], 6 digits)."""
        return {
            "checkpoint": self.checkpoint,
            "encoding": self.encoding,
            "layer": self.layer,
            "train_seq_len": self.train_seq_len,
            "normalizer_cap": self.normalizer_cap,
            "tokens": self.tokens,
            "units": {
                "position": "tokens (0-based)",
                "probs": "attention probability",
                "bias_share": "share of the logits' variance over keys due to the position bias",
            },
            "bias_share": None if self.bias_share is None else _rl(self.bias_share),
            "bias_share_by_query": None if self.bias_share_by_query is None else _rl(self.bias_share_by_query),
            "probs": _rl(self.probs),
        }


@torch.no_grad()
def attention_pattern(
    model: GPT, tokens: torch.Tensor, layer: int, checkpoint: str | None = None, normalizer_cap: int | None = None
) -> AttentionPattern:
    """The attention probabilities of every head of ``layer`` on one text, and the bias's share.

    Runs the model on ``tokens`` (LongTensor ``[T]``, ``[BOS] + bytes``, 2 <= T <=
    ``MAX_PATTERN_TOKENS``) up to ``layer`` (``GPT.attention_probs``, with the logits): the
    layer's own queries and keys (rotated for RoPE) and bias give its content logits, its
    bias and its probabilities as ``fireviz.model.gpt.CausalSelfAttention`` attends with them
    (probabilities · V reproduce its output to float32 rounding). ``normalizer_cap``: FIRE/FIRE-S measured with ψ(min(max(L, i), N)) on a
    copy of the model (ignored for other encodings).
    Returns: :class:`AttentionPattern`.
    Raises: ValueError for a layer out of range, tokens that are not a 1-D integer tensor of
      2…MAX_PATTERN_TOKENS ids, or a bad cap.
    """
    if not torch.is_tensor(tokens) or tokens.dtype not in (torch.int64, torch.int32) or tokens.dim() != 1:
        raise ValueError("tokens must be a 1-D integer (Long) tensor of token ids ([BOS] + bytes)")
    T = int(tokens.numel())
    if not 2 <= T <= MAX_PATTERN_TOKENS:
        raise ValueError(f"an attention pattern takes 2 to {MAX_PATTERN_TOKENS} tokens (got {T}); cut the text")
    cfg = model.config
    if not is_int(layer) or not 0 <= int(layer) < cfg.n_layer:
        raise ValueError(f"layer {layer!r} is out of range: the model has layers 0..{cfg.n_layer - 1}")
    if normalizer_cap is not None:
        check_normalizer_cap(normalizer_cap)  # a bad cap is an error for every encoding, not only FIRE
    capped = normalizer_cap is not None and bool(fire_modules(model))
    model = _capped_copy(model, normalizer_cap)
    device = next(model.parameters()).device
    rec = model.attention_probs(tokens.long()[None].to(device), layers=int(layer), logits=True)[int(layer)]
    probs = rec.probs[0].cpu()  # [H, T, T]
    content = None if rec.content is None else rec.content[0].cpu()  # a published model: no split
    _refuse_nonfinite_probs(model, probs, checkpoint)
    bias = None if rec.bias is None else rec.bias.cpu()  # [H, T, T], −inf above the diagonal
    allowed = torch.ones(T, T, dtype=torch.bool).tril()
    share = by_query = None
    if bias is not None and content is not None:
        counts = allowed.sum(-1).double()  # keys per query: i + 1

        def var(a: torch.Tensor) -> torch.Tensor:  # variance over the allowed keys, per query
            a = a.double().masked_fill(~allowed, 0.0)
            mean = a.sum(-1) / counts
            return ((a - mean[..., None]) ** 2).masked_fill(~allowed, 0.0).sum(-1) / counts

        vb, vc = var(bias.expand_as(content)), var(content)
        ratio = (vb / (vb + vc).clamp_min(1e-30)).numpy()  # [H, T]
        ratio[:, 0] = np.nan  # one key: no spread
        by_query, share = ratio, np.nanmean(ratio[:, 1:], axis=1) if T > 1 else np.full(cfg.n_head, np.nan)
    return AttentionPattern(
        layer=int(layer),
        tokens=[int(t) for t in tokens.tolist()],
        probs=probs.numpy(),
        bias_share=share,
        bias_share_by_query=by_query,
        train_seq_len=int(cfg.seq_len),
        checkpoint=checkpoint,
        encoding=cfg.position_encoding,
        normalizer_cap=int(normalizer_cap) if capped and normalizer_cap is not None else None,
    )


#: a published model's dilution pass materialises one layer's [heads, T, T] float32 attention at a
#: time (eager attention): query positions are kept while that fits in this share of free memory
PUBLISHED_ATTENTION_MEMORY_SHARE = 0.25


def published_dilution_input(
    checkpoint: CausalLMCheckpoint,
    doc,
    multiples: Sequence[int] = DEFAULT_DILUTION_MULTIPLES,
    available_bytes: int | None = None,
) -> tuple[torch.Tensor, list[int], str | None]:
    """The tokens and query positions of a published causal LM's dilution measurement on ``doc``:
    the document in its own tokenizer (``tokenizer.encode``, its BOS convention), query positions
    ``m · seq_len − 1`` (its original length, in its tokens) that the document holds and whose
    eager attention (one layer's ``heads × T² × 4`` bytes) fits ``PUBLISHED_ATTENTION_MEMORY_SHARE``
    of ``available_bytes`` (default: this machine's free memory).
    Returns: ``(tokens LongTensor [max position + 1], positions, note)``; ``note`` says which
      positions were left out and why (None if none).
    Raises: ValueError when no position is left (the document is too short, or memory)."""
    ids = checkpoint.tokenizer.encode(doc).ids
    cfg = checkpoint.config
    free = memory.available_bytes("cpu") if available_bytes is None else available_bytes
    positions: list[int] = []
    dropped: list[int] = []
    for p in default_query_positions(cfg.seq_len, multiples):
        fits = free is None or cfg.n_head * (p + 1) ** 2 * 4 <= PUBLISHED_ATTENTION_MEMORY_SHARE * free
        (positions if p < len(ids) and fits else dropped).append(p)
    if not positions:
        raise ValueError(
            f"{checkpoint.name}: the document holds {len(ids)} of its tokens and its attention fits memory for none of "
            f"the query positions {dropped}; pick a longer document"
        )
    note = (
        f"{checkpoint.name}: query positions {', '.join(map(str, dropped))} left out (the document holds {len(ids)} of "
        "its tokens, or one layer's attention there would not fit in memory)"
        if dropped
        else None
    )
    return torch.from_numpy(ids[: positions[-1] + 1].copy()), positions, note
