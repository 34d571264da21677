"""Attention probabilities handed out by the model: what ``GPT.capture_attention`` records.

``with model.capture_attention(layers=[0, 3]) as cap: model(idx)`` opens one
:class:`AttentionCapture` for those layers' ``CausalSelfAttention`` modules (fireviz.model) in
the calling thread (``CAPTURES``). In each forward pass of that thread such a module hands the
capture the queries and keys it attends with (after the rotary rotation at their absolute
positions, a KV cache's keys prepended) and the mask it adds (the precomputed one when the
forward pass has it, else the same ``causal_attention_mask`` its query blocks build), and the
capture computes, beside the module's own fused attention,

    P = softmax(q·kᵀ/√d_head + bias + causal mask)      float32, per batch item and head

for the query rows asked for. The forward pass itself is left as it is (same kernels, same
numbers, with or without a capture: tests/model/test_model.py), so P·V through the output
projection reproduces the module's output (to float32 rounding; to bf16 rounding under
bf16 autocast, where the module attends in bf16 and P is computed from the same q, k upcast).
In training mode with attention dropout > 0 the module drops probabilities at random after
the softmax: a record holds P before dropout (its ``dropout`` says the rate that followed), so
P·V is then the expectation of the module's output, not the output itself.
A module that no thread is capturing pays one attribute test per call.

Threads: a capture records only the forward passes run by the thread that opened it, so one
model (the app shares one per checkpoint between sessions) may be captured, and run, by
several threads at once; captures of one model do not nest within a thread.

``GPT.attention_probs(idx, layers, queries)`` runs one such pass in eval mode and stops it after
the last layer asked for (``GPT.hidden_states(idx, upto_layer)``): the later blocks, the final
LayerNorm and the vocabulary projection are never computed.
"""

from __future__ import annotations

import math
import threading
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, Iterable, Iterator, cast

import numpy as np
import torch

from fireviz.core import is_int
from fireviz.model.attention import causal_attention_mask

#: largest query position a capture takes (tokens): int64's maximum
MAX_QUERY_POSITION = (1 << 63) - 1


@dataclass
class AttentionRecord:
    """One layer's attention in one forward pass.

    Attributes:
      layer: the block index.
      queries: int64 ``[Q]`` (CPU), the query positions recorded, ascending (tokens, 0-based,
        counted like the keys: a KV cache's tokens first).
      probs: float32 ``[batch, heads, Q, keys]``; row q holds query ``queries[q]``'s
        probabilities over keys ``0 … keys − 1`` (the layer's whole key length), 0 at future
        keys j > i; each row sums to 1. Before attention dropout (see ``dropout``).
      content: float32 ``[batch, heads, Q, keys]``, the content logits q·kᵀ/√d_head over every
        key (future ones included: the causal mask is in ``bias`` / applied in ``probs``), or
        None unless the capture was asked for ``logits``.
      bias: float32 ``[heads, Q, keys]``, the additive mask the layer adds (position bias, −inf
        at future keys), or None for rotary / NoPE encodings or unless asked for ``logits``.
      dropout: the attention dropout probability the module applied after these
        probabilities in this pass (0.0 in eval mode, the mode of ``GPT.attention_probs``).
    Tensors are detached, on the model's device.
    """

    layer: int
    queries: torch.Tensor
    probs: torch.Tensor
    content: torch.Tensor | None = None
    bias: torch.Tensor | None = None
    dropout: float = 0.0


def _describe(value) -> str:
    text = repr(value)
    return (
        f"{text[:60]}… of type {type(value).__name__}" if len(text) > 60 else f"{text} of type {type(value).__name__}"
    )


def _integers(value, name: str, what: str) -> list[int]:
    """``value`` (an int, an iterable of ints, an integer tensor / array of at most one dimension)
    as a list of Python ints. Raises: ValueError naming ``name`` and the forms it takes."""
    forms = f"{name} must be {what}: an int, or a list, tuple, range or 1-D integer tensor/array of them"
    if isinstance(value, (torch.Tensor, np.ndarray)):
        if isinstance(value, np.ndarray):
            integer = value.dtype.kind in ("i", "u")
        else:
            integer = not (value.is_floating_point() or value.is_complex() or value.dtype == torch.bool)
        if value.ndim > 1 or not integer:
            raise ValueError(f"{forms} (got a {value.ndim}-D {value.dtype} {type(value).__name__})")
        items: Any = value.tolist()
        return [items] if value.ndim == 0 else items
    if is_int(value):
        return [int(value)]
    if isinstance(value, (str, bytes, float, bool, np.bool_, np.floating)) or not isinstance(value, Iterable):
        raise ValueError(f"{forms} (got {_describe(value)})")
    items = list(value)
    bad = [v for v in items if not is_int(v)]
    if bad:
        raise ValueError(f"{forms} (got {_describe(bad[0])} among them; pass int(…) for a whole number)")
    return [int(v) for v in items]


def check_layers(layers: Iterable[int] | int | None, n_layer: int) -> tuple[int, ...]:
    """``layers`` (block indices: an int, an iterable or 1-D integer tensor of them; None = all
    ``n_layer``) as a sorted tuple without repeats.

    Raises: ValueError for another type, an empty selection or a layer outside 0..n_layer − 1."""
    if layers is None:
        return tuple(range(n_layer))
    items = _integers(layers, "layers", f"block indices in 0..{n_layer - 1}")
    out = [v for v in items if not 0 <= v < n_layer]
    if out or not items:
        got = f"layer {out[0]}" if out else "an empty selection"
        raise ValueError(f"layers must be block indices in 0..{n_layer - 1}, at least one (got {got})")
    return tuple(sorted(set(items)))


def check_queries(queries: Iterable[int] | int | torch.Tensor | None) -> torch.Tensor | None:
    """``queries`` (query positions in tokens: an int, an iterable or 1-D integer tensor of them)
    as a sorted int64 CPU tensor without repeats; None stays None.

    Raises: ValueError for another type, an empty selection or a position outside
    0 … ``MAX_QUERY_POSITION``."""
    if queries is None:
        return None
    items = _integers(queries, "queries", "query positions (tokens, integers >= 0)")
    out = [v for v in items if not 0 <= v <= MAX_QUERY_POSITION]
    if out or not items:
        got = f"{out[0]}" if out else "an empty selection"
        raise ValueError(
            f"queries must be query positions, integers in 0..2**63 − 1, at least one (got {got}); "
            "give positions inside the input"
        )
    return torch.tensor(sorted(set(items)), dtype=torch.long)


def check_logits(logits) -> bool:
    """``logits`` as a bool. Raises: ValueError for anything but True or False."""
    if not isinstance(logits, (bool, np.bool_)):
        raise ValueError(f"logits must be True or False (got {_describe(logits)})")
    return bool(logits)


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
    latest pass under the capture (in the thread that opened it). ``cap[layer]`` is
    ``records[layer]`` (KeyError, saying why, for a layer not captured or that has not run
    under the capture). Memory: ``Q × keys`` float32 per batch item, head and layer (with
    ``logits`` twice that, plus the bias: ``Q × keys`` per head).
    Raises (constructor): ValueError for ``logits`` not a bool.
    """

    def __init__(self, layers: tuple[int, ...], queries: torch.Tensor | None = None, logits: bool = False):
        self.layers, self.queries, self.logits = tuple(layers), queries, check_logits(logits)
        self.records: dict[int, AttentionRecord] = {}

    def __getitem__(self, layer: int) -> AttentionRecord:
        try:
            return self.records[layer]
        except (KeyError, TypeError):
            pass
        if layer in self.layers:
            raise KeyError(
                f"layer {layer} has not run under this capture yet: run a forward pass inside the "
                "capture_attention block (or use GPT.attention_probs)"
            ) from None
        raise KeyError(
            f"layer {layer!r} was not captured: this capture records layers {list(self.layers)}; "
            f"ask for it with capture_attention(layers=[…, {layer!r}])"
        ) from None

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
        dropout: float = 0.0,
    ) -> None:
        """Called by ``CausalSelfAttention.forward`` with what it attends with: store ``records[layer]``.

        Args: ``q [B, H, T, head_dim]`` the call's queries at positions ``q_offset …`` and
          ``k [B, H, keys, head_dim]`` all its keys, both as the module attends with them;
          ``encoding`` its position encoding; ``mask`` the precomputed ``causal_attention_mask``
          of the whole call if the module has one (else the rows asked for get their own,
          ``position_offset`` tokens shifting every position as in the forward pass);
          ``dropout`` the attention dropout the module applies after the softmax in this call.
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
            # one mask dtype per call: every b is a tensor when the first is
            bias=torch.cat(cast(list[torch.Tensor], bias), dim=1) if self.logits and bias[0] is not None else None,
            dropout=float(dropout),
        )


class CaptureRegistry:
    """Which attention modules each thread is capturing (``CAPTURES``: the one registry).

    ``active`` is True while any thread has a capture open: the one test a module's forward
    pays; only then does it look up its capture for the calling thread (``lookup``). Each
    thread's captures live in a ``threading.local``, so a capture never sees another thread's
    passes and opening one never races another thread's.
    """

    def __init__(self):
        self.active = False
        self._open = 0
        self._lock = threading.Lock()
        self._local = threading.local()

    def _mine(self) -> dict:
        mine = getattr(self._local, "modules", None)
        if mine is None:
            mine = self._local.modules = {}
        return mine

    def lookup(self, module) -> AttentionCapture | None:
        """The capture recording ``module``'s calls in the calling thread, or None."""
        mine = getattr(self._local, "modules", None)
        return mine.get(module) if mine else None

    @contextmanager
    def open(self, cap: AttentionCapture, modules: list, model_modules: list) -> Iterator[AttentionCapture]:
        """Record ``modules``' calls in this thread into ``cap`` for the block's duration.

        Raises: RuntimeError if this thread already captures one of ``model_modules`` (the
        model's attention modules: captures of one model do not nest)."""
        mine = self._mine()
        if any(m in mine for m in model_modules):
            raise RuntimeError(
                "this model is already capturing attention in this thread (captures of one model do not "
                "nest); end that capture_attention block first, or capture all the layers in one"
            )
        with self._lock:
            self._open += 1
            self.active = True
        try:
            for m in modules:
                mine[m] = cap
            yield cap
        finally:
            for m in modules:
                mine.pop(m, None)
            with self._lock:
                self._open -= 1
                self.active = self._open > 0


#: The attention captures open in each thread (``GPT.capture_attention`` opens them).
CAPTURES = CaptureRegistry()
