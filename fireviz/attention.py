"""Scaled dot-product attention with an additive position bias, fast on CPU too.

``F.scaled_dot_product_attention`` takes the bias as a float ``attn_mask``. Two measured
facts shape this module (torch 2.13, CPU, [16, 4, 512, 32], see benchmarks/README.md):

* a 3-D ``[heads, q, k]`` mask sends SDPA to its slow math path; the same mask expanded
  (a stride-0 view, no copy) to 4-D ``[batch, heads, q, k]`` runs the fused kernel, as
  fast as ``is_causal=True``;
* a mask that *requires grad* (T5, Kerple, FIRE) always takes the math path, which
  materialises every [batch, heads, q, k] intermediate at once (~2.5× the causal cost).

``BiasedAttention`` keeps the fused kernel for the forward pass and does the backward in
causal query chunks: each chunk recomputes its probabilities over the keys it may see
(two batched GEMMs on contiguous [batch·heads, T, d] copies made once), and the bias
gradient is summed over the batch there. The elementwise middle (mask, softmax, dS, the
batch sum) is one compiled numba pass when numba is installed, else seven torch ops. Same
numbers as the math path (tests compare to 1e-5); on a quiet 2-core machine about 1.5×
the causal fused forward+backward, and 1.8–3.5× on a contended one (many short parallel
regions wait for preempted threads; see benchmarks/README.md).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch
import torch.nn.functional as F

from .kernels import LazyKernel, numba_kernel_call

if TYPE_CHECKING:
    from .encodings import PositionEncoding

#: query rows per backward chunk; 64–128 keeps a chunk's [batch, heads, rows, keys] in cache
BACKWARD_CHUNK = 128


def _build_softmax_grad():
    """Compile (once; numba caches to disk) the fused elementwise part of the backward.

    ``softmax_grad(S, dP, mask, delta, dmask, B, row0, offset)``: for every (batch·head,
    row i, key j) of a chunk with ``S [B·H, c, keys]`` the scaled scores and ``dP`` =
    dO·Vᵀ, P = softmax_j(S + mask[h, row0 + i]) and dS = P ⊙ (dP − delta); writes dS over
    S, P over dP and dmask[h, row0 + i, j] = Σ_b dS — one pass instead of seven tensor ops.
    Keys past the causal limit ``offset + row0 + i`` are written as 0 without work.
    """
    import math

    import numba

    @numba.njit(parallel=True, cache=True, nogil=True)
    def softmax_grad(S, dP, mask, delta, dmask, B, row0, offset):  # pragma: no cover - compiled
        BH, c, keys = S.shape
        H = BH // B
        for hi in numba.prange(H * c):
            h = hi // c
            i = hi - h * c
            lim = min(offset + row0 + i + 1, keys)
            mrow = mask[h, row0 + i]
            acc = dmask[h, row0 + i]
            for j in range(acc.shape[0]):
                acc[j] = 0.0
            for b in range(B):
                bh = b * H + h
                srow = S[bh, i]
                prow = dP[bh, i]
                m = -math.inf
                for j in range(lim):
                    v = srow[j] + mrow[j]
                    srow[j] = v
                    if v > m:
                        m = v
                tot = 0.0
                for j in range(lim):
                    e = math.exp(srow[j] - m)
                    srow[j] = e
                    tot += e
                inv = 1.0 / tot
                d = delta[bh, row0 + i]
                for j in range(lim):
                    p = srow[j] * inv
                    ds = p * (prow[j] - d)
                    prow[j] = p
                    srow[j] = ds
                    acc[j] += ds
                for j in range(lim, keys):
                    srow[j] = 0.0
                    prow[j] = 0.0

    return softmax_grad


#: ``_softmax_grad_kernel()``: the compiled kernel, or None without numba (the backward then
#: uses torch ops; same numbers).
_softmax_grad_kernel = LazyKernel(_build_softmax_grad)


class BiasedAttention(torch.autograd.Function):
    """softmax(q·kᵀ/√d + mask)·v with gradients for q, k, v and the mask.

    Inputs: q ``[B, H, Tq, D]``, k, v ``[B, H, Tk, D]`` (Tq == Tk or queries are the last
    Tq positions), mask float ``[H, Tq, Tk]`` with −inf at disallowed keys; every query must
    see at least one key. Output ``[B, H, Tq, D]``. No dropout (callers fall back to SDPA).
    Source: the standard attention backward, dS = P ⊙ (dP − rowsum(dO ⊙ O)) (Dao et al.
    2022, FlashAttention, Alg. 2), with the bias gradient Σ_batch dS.
    """

    @staticmethod
    def forward(ctx, q, k, v, mask):
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask.detach()[None].expand(q.shape[0], *mask.shape))
        ctx.save_for_backward(q, k, v, mask, out)
        return out

    @staticmethod
    def backward(ctx, dout):
        q, k, v, mask, out = ctx.saved_tensors
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
        dq = torch.empty(B * H, Tq, D, dtype=q.dtype, device=q.device)
        dk = torch.zeros(B * H, Tk, D, dtype=k.dtype, device=k.device)
        dv = torch.zeros(B * H, Tk, D, dtype=v.dtype, device=v.device)
        kernel = _softmax_grad_kernel() if all(t.dtype == torch.float32 for t in (q, mask, dout)) else None
        if kernel is not None:
            mask_c = mask.detach().contiguous()
            dmask = torch.empty_like(mask_c)
            delta2 = delta[..., 0].contiguous()
        else:
            dmask = torch.zeros_like(mask) if ctx.needs_input_grad[3] else None
        for s in range(0, Tq, BACKWARD_CHUNK):
            e = min(s + BACKWARD_CHUNK, Tq)
            keys = offset + e  # causal: later keys carry probability 0 for these rows
            kk, vv = k3[:, :keys], v3[:, :keys]
            S = torch.bmm(qs[:, s:e], kk.transpose(1, 2))
            dP = torch.bmm(do3[:, s:e], vv.transpose(1, 2))
            if kernel is not None:  # one fused pass: S ← dS, dP ← P, dmask rows filled
                with numba_kernel_call():
                    kernel(S.numpy(), dP.numpy(), mask_c.numpy(), delta2.numpy(), dmask.numpy(), B, s, offset)
                dS, P = S, dP
            else:
                S.view(B, H, e - s, keys).add_(mask[:, s:e, :keys])
                P = torch.softmax(S, -1)
                dS = dP.sub_(delta[:, s:e]).mul_(P)  # P ⊙ (dP − δ)
                if dmask is not None:
                    torch.sum(dS.view(B, H, e - s, keys), 0, out=dmask[:, s:e, :keys])
            # (in-place baddbmm_ on these strided slices would fall back to one GEMM per batch)
            dq[:, s:e] = torch.bmm(dS, kk).mul_(scale)
            dk[:, :keys] += torch.bmm(dS.transpose(1, 2), qs[:, s:e])
            dv[:, :keys] += torch.bmm(P.transpose(1, 2), do3[:, s:e])
        return dq.view(B, H, Tq, D), dk.view(B, H, Tk, D), dv.view(B, H, Tk, D), dmask


def attention(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor | None, dropout_p: float = 0.0
) -> torch.Tensor:
    """Causal multi-head attention ``[B, H, Tq, D]`` with an optional mask.

    Args:
      q ``[B, H, Tq, D]``; k, v ``[B, H, Tk, D]``; queries are the last Tq of Tk positions.
      mask: None (plain causal, Tq == Tk), bool ``[Tq, Tk]`` (True = attend), or float
        ``[H, Tq, Tk]`` logits with −inf above the causal diagonal (cast to q's dtype).
      dropout_p: attention dropout probability (training only).
    Returns: ``[B, H, Tq, D]`` in q's dtype.
    """
    if mask is None:
        return F.scaled_dot_product_attention(q, k, v, is_causal=True, dropout_p=dropout_p)
    if mask.dtype == torch.bool:
        return F.scaled_dot_product_attention(
            q, k, v, attn_mask=mask.expand(q.shape[0], q.shape[1], *mask.shape), dropout_p=dropout_p
        )
    mask = mask.to(q.dtype)
    if mask.requires_grad and torch.is_grad_enabled() and q.device.type == "cpu" and dropout_p == 0.0:
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
