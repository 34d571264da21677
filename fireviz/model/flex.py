"""Attention with the position bias computed inside FlexAttention: no [heads, queries, keys] tensor.

``torch.nn.attention.flex_attention`` takes a *score modification* ``score_mod(score, b, h,
q_idx, kv_idx)`` that the compiler fuses into the attention kernel. Here it adds the position
bias from small per-distance / per-query tables, so long contexts (32k on a GPU) never
materialise the ``[heads, q, k]`` bias that ``attention.attention`` takes as a mask:

* a Toeplitz bias (T5, ALiBi, Kerple, Sandwich, or any ``ToeplitzBias``): ``table[h, i − j]``
  from one ``bias_by_distance`` call over distances 0 … T − 1;
* FIRE (Li et al. 2024, eq. 3–4; ``mlp_depth`` 1): x = ψ(i − j) · 1/ψ(max(L, i)) from the
  per-distance ψ table and the per-query normalizers, then f_θ(x) = b₂ + Σ_k W₂[h, k]·ReLU(W₁[k]·x
  + b₁[k]) unrolled over the hidden units;
* no bias (NoPE, or RoPE after the rotation): the causal mask alone.

The causal mask is a ``BlockMask``, so blocks above the diagonal are skipped. On CPU, PyTorch
runs compiled FlexAttention for inference only; tests compare it with ``attention.attention``
at several lengths (≤ 1e-4 in logits). ``flex_available()`` says whether it compiles here;
callers fall back to the SDPA path with a clear message when it does not.
"""

from __future__ import annotations

import functools

import torch

from fireviz.encodings.base import ToeplitzBias

#: Why FlexAttention is unavailable, once found out (None: not tried yet / available).
_UNAVAILABLE: list[str] = []


class FlexUnavailable(RuntimeError):
    """FlexAttention cannot run here (no such torch module, or it did not compile)."""


@functools.lru_cache(maxsize=None)
def _compiled():
    from torch.nn.attention.flex_attention import flex_attention

    return torch.compile(flex_attention, dynamic=False)


def flex_available() -> bool:
    """True if ``torch.nn.attention.flex_attention`` imports and compiles a tiny call here."""
    if _UNAVAILABLE:
        return False
    try:
        from torch.nn.attention.flex_attention import create_block_mask  # noqa: F401

        q = torch.zeros(1, 1, 16, 8)
        causal_flex(q, q, q)
        return True
    except Exception as e:  # ImportError, compiler errors (no C++ compiler, unsupported device)
        _UNAVAILABLE.append(f"{type(e).__name__}: {(str(e).splitlines() or [''])[0][:200]}")
        return False


def unavailable_reason() -> str:
    """Why ``flex_available()`` returned False ('' if it did not)."""
    return _UNAVAILABLE[0] if _UNAVAILABLE else ""


def _block_mask(q_len: int, k_len: int, q_offset: int, device):
    from torch.nn.attention.flex_attention import create_block_mask

    def causal(b, h, q_idx, kv_idx):
        return q_idx + q_offset >= kv_idx

    return create_block_mask(causal, None, None, q_len, k_len, device=str(device))


def score_mod_for(encoding, q_len: int, k_len: int, q_offset: int):
    """The ``score_mod`` that adds ``encoding``'s bias for queries at ``q_offset …`` over keys
    ``0 … k_len − 1``, or None for an encoding without an additive bias.

    Raises: FlexUnavailable for an additive encoding it has no fused form for (FIRE with
      ``mlp_depth`` 2, a custom non-Toeplitz bias): use the SDPA path.
    """
    if getattr(encoding, "kind", None) != "additive":
        return None
    device = next((t.device for t in list(encoding.parameters()) + list(encoding.buffers())), torch.device("cpu"))
    if isinstance(encoding, ToeplitzBias):
        with torch.no_grad():
            table = encoding.bias_by_distance(torch.arange(q_offset + q_len, device=device)).float().contiguous()
        top = table.shape[1] - 1

        def toeplitz(score, b, h, q_idx, kv_idx):
            d = (q_idx + q_offset - kv_idx).clamp(0, top)  # future pairs are masked anyway
            return score + table[h, d]

        return toeplitz
    if hasattr(encoding, "normalized_distance") and getattr(encoding, "mlp_depth", 1) == 1:
        with torch.no_grad():
            psi = encoding.psi(torch.arange(q_offset + q_len, device=device)).float().contiguous()  # ψ(d)
            pos = torch.arange(q_offset, q_offset + q_len, device=device)
            inv_norm = (
                (
                    1.0 / encoding.normalizer(pos)
                    if encoding.progressive_interpolation
                    else torch.ones(q_len, device=device)
                )
                .float()
                .contiguous()
            )
            lin1, lin2 = encoding.mlp[0], encoding.mlp[2]
            w1, b1 = lin1.weight[:, 0].float().contiguous(), lin1.bias.float().contiguous()
            w2, b2 = lin2.weight.float().contiguous(), lin2.bias.float().contiguous()
        top, width = psi.numel() - 1, w1.numel()

        def fire(score, b, h, q_idx, kv_idx):
            x = psi[(q_idx + q_offset - kv_idx).clamp(0, top)] * inv_norm[q_idx]
            acc = b2[h]
            for k in range(width):  # f_θ unrolled: one fused expression, no [.., width] tensor
                acc = acc + w2[h, k] * torch.relu(x * w1[k] + b1[k])
            return score + acc

        return fire
    raise FlexUnavailable(
        f"{type(encoding).__name__} has no fused FlexAttention form here (FIRE needs mlp_depth 1); use the SDPA path"
    )


def causal_flex(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, encoding=None, q_offset: int | None = None):
    """Causal attention ``softmax(q·kᵀ/√d + bias)·v`` through compiled FlexAttention.

    Args: q ``[B, H, Tq, D]``, k, v ``[B, H, Tk, D]`` (queries the last Tq of Tk positions unless
      ``q_offset`` is given); ``encoding``: the position encoding of this layer (None: no bias).
    Returns: ``[B, H, Tq, D]`` in q's dtype. Inference only (no gradient through the bias tables).
    Raises: FlexUnavailable (see ``score_mod_for``), or the compiler's error.
    """
    q_len, k_len = q.shape[2], k.shape[2]
    q_offset = k_len - q_len if q_offset is None else int(q_offset)
    mod = score_mod_for(encoding, q_len, k_len, q_offset) if encoding is not None else None
    return _compiled()(q, k, v, score_mod=mod, block_mask=_block_mask(q_len, k_len, q_offset, q.device))
