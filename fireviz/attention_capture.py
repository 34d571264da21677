"""Attention probabilities handed out by the model: what ``GPT.capture_attention`` records.

``with model.capture_attention(layers=[0, 3]) as cap: model(idx)`` puts one
:class:`AttentionCapture` on those layers' ``CausalSelfAttention`` modules (fireviz.model).
In each forward pass such a module hands the capture the queries and keys it attends with
(after the rotary rotation at their absolute positions, a KV cache's keys prepended) and the
mask it adds (the precomputed one when the forward pass has it, else the same
``causal_attention_mask`` its query blocks build), and the capture computes, beside the
module's own fused attention,

    P = softmax(q·kᵀ/√d_head + bias + causal mask)      float32, per batch item and head

for the query rows asked for. The forward pass itself is left as it is (same kernels, same
numbers, with or without a capture: tests/test_model.py), so P·V through the output
projection reproduces the module's output (to float32 rounding; to bf16 rounding under
bf16 autocast, where the module attends in bf16 and P is computed from the same q, k upcast).
A module without a capture pays one attribute test per call.

``GPT.attention_probs(idx, layers, queries)`` runs one such pass in eval mode and stops it after
the last layer asked for (``GPT.hidden_states(idx, upto_layer)``): the later blocks, the final
LayerNorm and the vocabulary projection are never computed.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Iterable

import numpy as np
import torch

from .attention import causal_attention_mask


@dataclass
class AttentionRecord:
    """One layer's attention in one forward pass.

    Attributes:
      layer: the block index.
      queries: int64 ``[Q]`` (CPU), the query positions recorded, ascending (tokens, 0-based,
        counted like the keys: a KV cache's tokens first).
      probs: float32 ``[batch, heads, Q, keys]``; row q holds query ``queries[q]``'s
        probabilities over keys ``0 … keys − 1`` (the layer's whole key length), 0 at future
        keys j > i; each row sums to 1.
      content: float32 ``[batch, heads, Q, keys]``, the content logits q·kᵀ/√d_head over every
        key (future ones included: the causal mask is in ``bias`` / applied in ``probs``), or
        None unless the capture was asked for ``logits``.
      bias: float32 ``[heads, Q, keys]``, the additive mask the layer adds (position bias, −inf
        at future keys), or None for rotary / NoPE encodings or unless asked for ``logits``.
    Tensors are detached, on the model's device.
    """

    layer: int
    queries: torch.Tensor
    probs: torch.Tensor
    content: torch.Tensor | None = None
    bias: torch.Tensor | None = None


def check_layers(layers: Iterable[int] | int | None, n_layer: int) -> tuple[int, ...]:
    """``layers`` (block indices; None = all ``n_layer``) as a sorted tuple without repeats.

    Raises: ValueError for an empty selection or a layer that is not an integer in 0..n_layer − 1."""
    if layers is None:
        return tuple(range(n_layer))
    items = [layers] if isinstance(layers, (int, np.integer)) else list(layers)
    bad = [v for v in items if isinstance(v, bool) or not isinstance(v, (int, np.integer)) or not 0 <= v < n_layer]
    if bad or not items:
        raise ValueError(f"layers must be block indices in 0..{n_layer - 1} (got {layers!r})")
    return tuple(sorted({int(v) for v in items}))


def check_queries(queries: Iterable[int] | torch.Tensor | None) -> torch.Tensor | None:
    """``queries`` (query positions, tokens) as a sorted int64 CPU tensor without repeats; None stays None.

    Raises: ValueError for an empty selection or a position that is not an integer >= 0."""
    if queries is None:
        return None
    items = queries.flatten().tolist() if torch.is_tensor(queries) else list(queries)
    bad = [v for v in items if isinstance(v, bool) or not isinstance(v, (int, np.integer)) or v < 0]
    if bad or not items:
        raise ValueError(f"queries must be query positions, integers >= 0 (got {bad[:3] or queries!r})")
    return torch.tensor(sorted({int(v) for v in items}), dtype=torch.long)


def _runs(positions: list[int]) -> list[tuple[int, int]]:
    """Ascending ``positions`` as ``[(start, stop), …]`` runs of consecutive positions."""
    runs: list[tuple[int, int]] = []
    for p in positions:
        if runs and runs[-1][1] == p:
            runs[-1] = (runs[-1][0], p + 1)
        else:
            runs.append((p, p + 1))
    return runs


class AttentionCapture:
    """The attention of chosen layers in the forward passes run under ``GPT.capture_attention``.

    Attributes: ``layers`` (sorted block indices), ``queries`` (int64 ``[Q]`` sorted query
    positions in tokens, or None for every query of a pass), ``logits`` (also keep
    ``content`` and ``bias``), ``records`` ``{layer: AttentionRecord}`` — for each layer, its
    latest pass under the capture. ``cap[layer]`` is ``records[layer]`` (KeyError for a layer
    that has not run under the capture). Memory: ``Q × keys`` float32 per batch item, head and
    layer (with ``logits`` twice that, plus the bias: ``Q × keys`` per head).
    """

    def __init__(self, layers: tuple[int, ...], queries: torch.Tensor | None = None, logits: bool = False):
        self.layers, self.queries, self.logits = layers, queries, bool(logits)
        self.records: dict[int, AttentionRecord] = {}

    def __getitem__(self, layer: int) -> AttentionRecord:
        return self.records[layer]

    @torch.no_grad()
    def record(
        self,
        layer: int,
        q: torch.Tensor,
        k: torch.Tensor,
        encoding,
        q_offset: int,
        mask: torch.Tensor | None = None,
        position_offset: int = 0,
    ) -> None:
        """Called by ``CausalSelfAttention.forward`` with what it attends with: store ``records[layer]``.

        Args: ``q [B, H, T, head_dim]`` the call's queries at positions ``q_offset …`` and
          ``k [B, H, keys, head_dim]`` all its keys, both as the module attends with them;
          ``encoding`` its position encoding; ``mask`` the precomputed ``causal_attention_mask``
          of the whole call if the module has one (else the rows asked for get their own,
          ``position_offset`` tokens shifting every position as in the forward pass).
        Raises: ValueError if a query position asked for is not in this call.
        """
        T, keys = q.shape[2], k.shape[2]
        rows = list(range(q_offset, q_offset + T)) if self.queries is None else self.queries.tolist()
        if not rows:  # an empty pass: nothing to record
            return
        if rows[0] < q_offset or rows[-1] >= q_offset + T:
            raise ValueError(
                f"layer {layer} attends from query positions {q_offset}..{q_offset + T - 1} in this pass; "
                f"the capture asks for {rows[0]}..{rows[-1]} (give queries inside the input)"
            )
        kf = k.float().transpose(-1, -2)
        probs, content, bias = [], [], []
        for start, stop in _runs(rows):
            c = q[:, :, start - q_offset : stop - q_offset].float() @ kf / math.sqrt(q.shape[-1])  # [B, H, r, keys]
            if mask is not None:
                m = mask[..., start - q_offset : stop - q_offset, :]
            else:
                m = causal_attention_mask(encoding, stop - start, keys, start, q.device, position_offset)
            if m.dtype == torch.bool:  # [r, keys]: True = may attend (rotary, NoPE)
                logits, b = c.masked_fill(~m.to(c.device), float("-inf")), None
            else:  # [H, r, keys]: bias with −inf at future keys
                b = m.float().to(c.device)
                logits = c + b
            probs.append(torch.softmax(logits, dim=-1))
            if self.logits:
                content.append(c)
                bias.append(b)
        self.records[layer] = AttentionRecord(
            layer=layer,
            queries=torch.tensor(rows, dtype=torch.long),
            probs=torch.cat(probs, dim=2),
            content=torch.cat(content, dim=2) if self.logits else None,
            bias=torch.cat(bias, dim=1) if self.logits and bias[0] is not None else None,
        )
