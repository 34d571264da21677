"""Scaled dot-product attention with an additive position bias, fast on CPU too.

``F.scaled_dot_product_attention`` takes the bias as a float ``attn_mask``. Measured facts
that shape this module (torch 2.13, CPU, [16, 4, 512, 32], fwd+bwd, see benchmarks/README.md):

* a 3-D ``[heads, q, k]`` mask sends SDPA to its slow math path; the same mask expanded
  (a stride-0 view, no copy) to 4-D ``[batch, heads, q, k]`` runs the fused flash kernel;
* the fused kernel's *backward* with a mask is slow on CPU: 2.4× its causal backward on an
  Intel Xeon (it cannot skip the future half, and adds the mask per tile), so even a static
  bias (ALiBi) cost ~1.4× NoPE per training step there;
* a mask that *requires grad* (T5, Kerple, FIRE) always takes the math path, which
  materialises every [batch, heads, q, k] intermediate at once.

So during CPU training every causal float mask (``attention(..., causal=True)``: the model's)
goes through ``BiasedAttention``: the fused flash kernel's forward in causal query chunks (each
over the keys it may see), which also returns the log-sum-exp of each query row, and a backward
in causal query blocks of ``BACKWARD_CHUNK`` rows that recomputes their probabilities over the
keys they may see as P = exp(q·kᵀ/√d + mask − lse) (no max or sum pass: the forward's lse is
exact) and sums the bias gradient over the batch in place when the mask needs one. That backward
is compiled (fireviz/model/csrc/biased_attention.cpp, built on first use by ``attention_kernel``: per
(batch, head) pair, its blocks in cache; a layer's forward + backward 0.84× SDPA's causal kernel
without a bias, every additive bias's training step ≤ 1.0× NoPE); where it cannot be built, the
same blocks run as torch ops batched over every pair (``_torch_backward``: 1.37× and 1.2–1.3×).
Same numbers as the math path (tests compare to 1e-5).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch
import torch.nn.functional as F

from fireviz.model.attention_kernel import backward_kernel

if TYPE_CHECKING:
    from fireviz.encodings import PositionEncoding

#: query rows per backward block. Compiled: a pair's [32, keys] blocks of P and dS (64 KiB each at
#: 512 keys) stay in L1/L2 (16 and 64 rows 5 % slower, 128 rows 12 %). Torch ops: 32 keeps the
#: [batch·heads, rows, keys] blocks in cache (2 MiB each at batch 16, 4 heads; 128 rows 25 % slower)
BACKWARD_CHUNK = 32

#: query rows per forward call of the fused kernel: a [heads, q, k] mask makes it visit every key,
#: so 128-row chunks over the keys each may see skip most of the masked future (0.78× the time
#: of one call at length 512; 64 rows 0.82×, 256 rows 0.93×)
FORWARD_CHUNK = 128

#: log-probabilities at or below this become −inf in the backward (P ≤ e⁻⁶⁰ ≈ 8.8e-27 → 0).
#: Subnormal floats cost Intel CPUs a microcode assist per operation: torch's exp was ~3× slower
#: on inputs whose result is subnormal (ALiBi's far keys), and the GEMMs on P and dS ~2× slower
#: when products of tiny probabilities underflow. What is dropped is < 1e-22 of a row whose
#: largest probability is ≥ 1/Tk, far below float32 rounding.
UNDERFLOW = -60.0

#: SDPA's fused CPU kernel, called directly for its per-row log-sum-exp (the public
#: ``F.scaled_dot_product_attention`` returns only the output).
_flash_forward = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu.default


class BiasedAttention(torch.autograd.Function):
    """softmax(q·kᵀ/√d + mask)·v with gradients for q, k, v and (if it requires grad) the mask.

    Inputs: q ``[B, H, Tq, D]``, k, v ``[B, H, Tk, D]`` (Tq == Tk or queries are the last
    Tq positions), float32 on CPU; mask float32 ``[H, Tq, Tk]`` with −inf at disallowed keys;
    every query must see at least one key. Output ``[B, H, Tq, D]``. No dropout (callers
    fall back to SDPA). Source: the standard attention backward, dS = P ⊙ (dP − rowsum(dO ⊙ O))
    with P recomputed from the forward's log-sum-exp (Dao et al. 2022, FlashAttention,
    Alg. 2), and the bias gradient Σ_batch dS.
    """

    @staticmethod
    def forward(ctx, q, k, v, mask):
        mask = mask.detach()
        B, _, Tq, _ = q.shape
        offset = k.shape[2] - Tq
        outs, lses = [], []
        for s in range(0, Tq, FORWARD_CHUNK):  # each query chunk over the keys it may see
            e = min(s + FORWARD_CHUNK, Tq)
            keys = offset + e
            chunk_mask = mask[None, :, s:e, :keys].expand(B, -1, -1, -1)
            out, lse = _flash_forward(q[:, :, s:e], k[:, :, :keys], v[:, :, :keys], 0.0, False, attn_mask=chunk_mask)
            outs.append(out)
            lses.append(lse)
        out, lse = (outs[0], lses[0]) if len(outs) == 1 else (torch.cat(outs, 2), torch.cat(lses, 2))
        ctx.save_for_backward(q, k, v, mask, out, lse)
        return out

    @staticmethod
    @torch.autograd.function.once_differentiable  # a second derivative raises instead of being wrong
    def backward(ctx, dout):
        q, k, v, mask, out, lse = ctx.saved_tensors
        kernel = backward_kernel()
        if kernel is not None:  # the compiled backward (fireviz/model/csrc/biased_attention.cpp)
            dq, dk, dv, dmask = kernel.biased_attention_backward(
                q, k, v, mask, out, lse, dout, ctx.needs_input_grad[3], BACKWARD_CHUNK, UNDERFLOW
            )
            return dq, dk, dv, (dmask if ctx.needs_input_grad[3] else None)
        return _torch_backward(q, k, v, mask, out, lse, dout, ctx.needs_input_grad[3])


def _torch_backward(q, k, v, mask, out, lse, dout, mask_grad: bool):
    """``BiasedAttention``'s backward in torch ops (where the compiled one is not built): the same
    blocks, batched over every (batch, head) pair. Returns dq, dk, dv, dmask (None unless mask_grad)."""
    B, H, Tq, D = q.shape
    Tk = k.shape[2]
    scale = D**-0.5
    offset = Tk - Tq  # queries are the last Tq positions
    # One contiguous [B·H, T, D] copy of each input up front: the chunks below then feed
    # BLAS directly (slices of the permuted qkv view would be copied per chunk and matmul).
    qs = (q * scale).reshape(B * H, Tq, D)  # the 1/√d scale folded into q (used by dk too)
    k3, v3 = k.reshape(B * H, Tk, D).contiguous(), v.reshape(B * H, Tk, D).contiguous()
    do3 = dout.reshape(B * H, Tq, D).contiguous()
    delta = (do3 * out.reshape(B * H, Tq, D)).sum(-1, keepdim=True)  # rowsum(dO ⊙ O)
    lse3 = lse.reshape(B * H, Tq, 1)
    dq = torch.empty(B * H, Tq, D, dtype=q.dtype, device=q.device)
    dk = torch.zeros(B * H, Tk, D, dtype=k.dtype, device=k.device)
    dv = torch.zeros(B * H, Tk, D, dtype=v.dtype, device=v.device)
    dmask = torch.zeros_like(mask) if mask_grad else None
    for s in range(0, Tq, BACKWARD_CHUNK):
        e = min(s + BACKWARD_CHUNK, Tq)
        keys = offset + e  # causal: later keys carry probability 0 for these rows
        kk, vv = k3[:, :keys], v3[:, :keys]
        P = torch.bmm(qs[:, s:e], kk.transpose(1, 2))
        P.view(B, H, e - s, keys).add_(mask[:, s:e, :keys])
        # the probabilities (exp(−inf) = 0 above the diagonal; see UNDERFLOW)
        F.threshold_(P.sub_(lse3[:, s:e]), UNDERFLOW, float("-inf")).exp_()  # type: ignore[attr-defined]
        dS = torch.bmm(do3[:, s:e], vv.transpose(1, 2)).sub_(delta[:, s:e]).mul_(P)  # P ⊙ (dP − δ)
        if dmask is not None:
            torch.sum(dS.view(B, H, e - s, keys), 0, out=dmask[:, s:e, :keys])
        # (in-place baddbmm_ on these strided slices measured slower than bmm and +=)
        dq[:, s:e] = torch.bmm(dS, kk).mul_(scale)
        dk[:, :keys] += torch.bmm(dS.transpose(1, 2), qs[:, s:e])
        dv[:, :keys] += torch.bmm(P.transpose(1, 2), do3[:, s:e])
    return dq.view(B, H, Tq, D), dk.view(B, H, Tk, D), dv.view(B, H, Tk, D), dmask


def _use_biased_attention(q, k, v, mask, dropout_p, causal: bool) -> bool:
    """Whether a float mask goes through ``BiasedAttention``: CPU float32 training without
    dropout (when anything needs a gradient), for a ``[heads, Tq, Tk]`` mask the caller
    vouches is causal with the queries the last Tq ≤ Tk positions (its chunks read only the
    keys a causal query may see). Elsewhere SDPA (inference, GPU, dropout, bf16, other masks)."""
    if not causal or dropout_p != 0.0 or not torch.is_grad_enabled() or q.device.type != "cpu":
        return False
    if not any(t.requires_grad for t in (q, k, v, mask)):
        return False
    Tq, Tk = q.shape[2], k.shape[2]
    if mask.dim() != 3 or tuple(mask.shape) != (q.shape[1], Tq, Tk) or not 0 < Tq <= Tk:
        return False
    return all(t.dtype == torch.float32 for t in (q, k, v, mask))


def attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    mask: torch.Tensor | None,
    dropout_p: float = 0.0,
    causal: bool = False,
) -> torch.Tensor:
    """Multi-head attention ``[B, H, Tq, D]`` with an optional mask.

    Args:
      q ``[B, H, Tq, D]``; k, v ``[B, H, Tk, D]``.
      mask: None (plain causal, Tq == Tk), bool ``[Tq, Tk]`` (True = attend), or float
        ``[H, Tq, Tk]`` logits, −inf where a query may not attend (cast to q's dtype); any
        pattern SDPA accepts.
      dropout_p: attention dropout probability (training only).
      causal: the caller vouches that a float mask is −inf exactly at the keys after each
        query, the queries being the last Tq of Tk positions (what ``causal_attention_mask``
        makes, and all the model passes); CPU training then takes ``BiasedAttention``, which
        reads only those keys. False (the default) always uses SDPA.
    Returns: ``[B, H, Tq, D]`` in q's dtype.
    """
    if mask is None:
        return F.scaled_dot_product_attention(q, k, v, is_causal=True, dropout_p=dropout_p)
    if mask.dtype == torch.bool:
        return F.scaled_dot_product_attention(
            q, k, v, attn_mask=mask.expand(q.shape[0], q.shape[1], *mask.shape), dropout_p=dropout_p
        )
    mask = mask.to(q.dtype)
    if _use_biased_attention(q, k, v, mask, dropout_p, causal):
        return BiasedAttention.apply(q, k, v, mask)
    return F.scaled_dot_product_attention(
        q, k, v, attn_mask=mask[None].expand(q.shape[0], *mask.shape), dropout_p=dropout_p
    )


def causal_attention_mask(
    encoding: PositionEncoding, q_len: int, k_len: int, q_offset: int, device: torch.device, position_offset: int = 0
) -> torch.Tensor:
    """The mask ``attention`` takes for queries at ``q_offset…`` over keys ``0…k_len−1`` (all
    shifted by ``position_offset`` tokens, see ``PositionEncoding.bias``).

    Returns float32 ``[heads, q_len, k_len]`` (bias, −inf above the causal diagonal) for
    additive encodings, on the encoding's device; bool ``[q_len, k_len]`` (True = may
    attend) on ``device`` otherwise.
    Raises: ValueError for bad lengths/offset (``query_positions``).
    """
    if encoding.kind == "additive":
        if position_offset:
            return encoding.masked_bias(q_len, k_len, q_offset, position_offset)
        return encoding.masked_bias(q_len, k_len, q_offset)  # bias and −inf in as few passes as it can
    i = torch.arange(q_offset, q_offset + q_len, device=device)[:, None]
    return torch.arange(k_len, device=device)[None, :] <= i
