"""Attention with the position bias computed inside FlexAttention: no [heads, queries, keys] tensor.

``torch.nn.attention.flex_attention`` takes a *score modification* ``score_mod(score, b, h,
q_idx, kv_idx)`` that the compiler fuses into the attention kernel. Here it adds the position
bias from small per-distance / per-query tables, so long contexts (32k on a GPU) never
materialise the ``[heads, q, k]`` bias that ``attention.attention`` takes as a mask:

* a Toeplitz bias (T5, ALiBi, Kerple, Sandwich, or any ``ToeplitzBias``): ``table[h, i − j]``
  from one ``bias_by_distance`` call over distances 0 … T − 1;
* FIRE (Li et al. 2024, eq. 3–4; ``mlp_depth`` 1): x = ψ(i − j) · 1/ψ(max(L, i)) from the
  per-distance ψ table and the per-query normalizers, then f_θ(x) = slope[h, s]·x + intercept[h, s]
  with s the segment of x among f_θ's ≤ width breakpoints, found by a branchless binary search
  (log₂ width table reads per score, ``piecewise_tables``; issue 49: the unrolled MLP cost over a
  hundred FP32 operations per score);
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


#: FlexAttention tiles for training with a score_mod on CUDA (forward BLOCK_M/N, backward
#: BLOCK_M1/N1/M2/N2, one pipeline stage): measured on an H200, the defaults asked for ~242 KiB of
#: shared memory against its 227 KiB (benchmarks/gpu.py)
TRAINING_KERNEL_OPTIONS = {
    "BLOCK_M": 64, "BLOCK_N": 64, "BLOCK_M1": 32, "BLOCK_N1": 64, "BLOCK_M2": 64, "BLOCK_N2": 32, "num_stages": 1,
}  # fmt: skip


#: compiled variants of flex_attention kept per process (one per score_mod kind × shape; a new
#: query offset compiles nothing): evaluation at a handful of lengths for a few encodings needs a
#: few dozen; PyTorch's default 8 was exceeded on an H200. Past it causal_flex raises (Dynamo's
#: FailOnRecompileLimitHit) instead of running the dense fallback; ``torch._dynamo.reset()`` clears.
RECOMPILE_LIMIT = 64


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
        causal_flex(q, torch.zeros_like(q), torch.zeros_like(q))  # one buffer thrice: refused on CUDA
        return True
    except Exception as e:  # ImportError, compiler errors (no C++ compiler, unsupported device)
        _UNAVAILABLE.append(f"{type(e).__name__}: {(str(e).splitlines() or [''])[0][:200]}")
        return False


def unavailable_reason() -> str:
    """Why ``flex_available()`` returned False ('' if it did not)."""
    return _UNAVAILABLE[0] if _UNAVAILABLE else ""


def _block_mask(q_len: int, k_len: int, q_offset: int, device):
    from torch.nn.attention.flex_attention import create_block_mask

    offset = torch.tensor(q_offset, device=device)  # a tensor: a new offset compiles nothing again

    def causal(b, h, q_idx, kv_idx):
        return q_idx + offset >= kv_idx

    return create_block_mask(causal, None, None, q_len, k_len, device=str(device))


def piecewise_tables(encoding) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, list[int]]:
    """FIRE's f_θ (``mlp_depth`` 1) as tables a score_mod reads in O(log width) per score.

    f_θ,h(x) = slope[h, s]·x + intercept[h, s], s = #{breakpoints < x} (``FIRE.piecewise_linear``,
    Li et al. 2024 eq. 3–4 with a one-hidden-layer ReLU MLP). Returns ``(bps [2^m − 1], slope
    [H, 2^m], intercept [H, 2^m], steps)``, float32: the breakpoints padded with +inf to 2^m − 1
    entries (2^m > the number of breakpoints), the segment tables padded by repeating the last
    segment, and ``steps = [2^(m−1), …, 1]`` for the branchless search
    ``s += step·(bps[s + step − 1] < x)`` (each step one read of a small table, instead of the
    width's multiply-adds per score).
    """
    bps, slope, intercept = encoding.piecewise_linear()
    n = bps.numel()
    m = max(1, n.bit_length())  # 2^m − 1 >= n
    size = 1 << m
    pad = size - 1 - n
    bps = torch.cat([bps.float(), bps.new_full((pad,), float("inf")).float()]).contiguous()
    slope = torch.cat([slope, slope[:, -1:].expand(-1, size - slope.shape[1])], dim=1).float().contiguous()
    intercept = torch.cat([intercept, intercept[:, -1:].expand(-1, size - intercept.shape[1])], dim=1)
    return bps, slope, intercept.float().contiguous(), [1 << k for k in range(m - 1, -1, -1)]


def score_mod_for(encoding, q_len: int, k_len: int, q_offset: int):
    """The ``score_mod`` that adds ``encoding``'s bias for queries at ``q_offset …`` over keys
    ``0 … k_len − 1``, or None for an encoding without an additive bias.

    Raises: FlexUnavailable for an additive encoding it has no fused form for (FIRE with
      ``mlp_depth`` 2, a custom non-Toeplitz bias): use the SDPA path.
    """
    if getattr(encoding, "kind", None) != "additive":
        return None
    device = next((t.device for t in list(encoding.parameters()) + list(encoding.buffers())), torch.device("cpu"))
    # the tables carry gradients when autograd is on (training on CUDA: FlexAttention's backward
    # reaches the captured tables, and through them the encoding's parameters)
    # q_offset and the last distance enter as 0-d tensors, not Python ints, and the tables cover the
    # distances 0 … k_len − 1 whatever the offset: a new int or table size would compile the kernel
    # again (past the recompile limit PyTorch falls back to a dense path)
    offset = torch.tensor(q_offset, device=device)
    if isinstance(encoding, ToeplitzBias):
        table = encoding.bias_by_distance(torch.arange(k_len, device=device)).float().contiguous()
        top = torch.tensor(table.shape[1] - 1, device=device)

        def toeplitz(score, b, h, q_idx, kv_idx):
            d = torch.minimum((q_idx + offset - kv_idx).clamp(min=0), top)  # future pairs are masked anyway
            return score + table[h, d]

        return toeplitz
    if hasattr(encoding, "normalized_distance") and getattr(encoding, "mlp_depth", 1) == 1:
        psi = encoding.psi(torch.arange(k_len, device=device)).float().contiguous()  # ψ(d)
        pos = torch.arange(q_offset, q_offset + q_len, device=device)
        inv_norm = (
            (1.0 / encoding.normalizer(pos) if encoding.progressive_interpolation else torch.ones(q_len, device=device))
            .float()
            .contiguous()
        )
        bps, slope, intercept, steps = piecewise_tables(encoding)
        top = torch.tensor(psi.numel() - 1, device=device)

        def fire(score, b, h, q_idx, kv_idx):
            x = psi[torch.minimum((q_idx + offset - kv_idx).clamp(min=0), top)] * inv_norm[q_idx]
            s = torch.zeros_like(q_idx)
            for step in steps:  # branchless binary search: s = #{breakpoints < x} = searchsorted(bps, x)
                s = s + step * (bps[s + (step - 1)] < x).to(s.dtype)
            return score + slope[h, s] * x + intercept[h, s]

        return fire
    raise FlexUnavailable(
        f"{type(encoding).__name__} has no fused FlexAttention form here (FIRE needs mlp_depth 1); use the SDPA path"
    )


def causal_flex(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, encoding=None, q_offset: int | None = None):
    """Causal attention ``softmax(q·kᵀ/√d + bias)·v`` through compiled FlexAttention.

    Args: q ``[B, H, Tq, D]``, k, v ``[B, H, Tk, D]`` (queries the last Tq of Tk positions unless
      ``q_offset`` is given); ``encoding``: the position encoding of this layer (None: no bias).
    Returns: ``[B, H, Tq, D]`` in q's dtype. With autograd on, gradients reach q, k, v and the
      bias tables (so the encoding's parameters); PyTorch has FlexAttention's backward on CUDA only.
    Raises: FlexUnavailable (see ``score_mod_for``), ValueError for a ``q_offset`` outside 0 … Tk − Tq,
      or the compiler's error.
    """
    q_len, k_len = q.shape[2], k.shape[2]
    q_offset = k_len - q_len if q_offset is None else int(q_offset)
    if not 0 <= q_offset <= k_len - q_len:  # the tables cover distances 0 … k_len − 1 only
        raise ValueError(
            f"queries at {q_offset}…{q_offset + q_len - 1} need keys up to there; got {k_len} keys "
            "(q_offset must lie in 0 … k_len − q_len)"
        )
    mod = score_mod_for(encoding, q_len, k_len, q_offset) if encoding is not None else None
    # q, k, v are views of one qkv projection: Inductor refuses inputs sharing a buffer on CUDA
    q, k, v = q.contiguous(), k.contiguous(), v.contiguous()
    options = None
    if q.is_cuda and torch.is_grad_enabled() and mod is not None:
        # training with captured bias tables: the default tiles exceed a Hopper SM's shared memory
        options = TRAINING_KERNEL_OPTIONS
    # past the recompile limit PyTorch would silently run FlexAttention's dense reference path
    # (the [B, H, Tq, Tk] scores this module exists to avoid): raise instead, with a higher limit
    with torch._dynamo.config.patch(recompile_limit=RECOMPILE_LIMIT, fail_on_recompile_limit_hit=True):
        return _compiled()(
            q, k, v, score_mod=mod, block_mask=_block_mask(q_len, k_len, q_offset, q.device), kernel_options=options
        )
