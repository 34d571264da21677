"""FIRE's causal bias from per-row breakpoints: plain differentiable torch ops (the CUDA path).

Source: Li et al. 2024 (ICLR, arXiv 2310.04418), eq. 3–4:

    b_h(i, j) = f_θ,h( ψ(i − j) / N_i ),   N_i = ψ(max(L, i)) (+ eps, optionally capped),
    ψ(x) = log(|c·x| + 1),   f_θ,h(x) = b₂[h] + Σ_k W₂[h, k]·ReLU(w_k·x + b_k)   (mlp_depth 1).

The structure used (exact, no approximation):

* Along a row (query i, distance d = i − j = 0 … i) the MLP input x = ψ(d)/N_i is nondecreasing
  in d, so hidden unit k switches state once per row, at the key distance
  p[i, k] = #{d : ψ(d) ≤ t_k·N_i} (w_k > 0, on from there) or #{d : ψ(d) < t_k·N_i} (w_k < 0, on
  below there), t_k = −b_k/w_k. ``searchsorted`` of the ψ-per-distance table gives p (integers,
  no gradient: f is continuous, so the breakpoints carry none).
* Hence a row's bias is A[h, i, j]·x + B[h, i, j] with A, B piecewise constant along the row:
  A = Σ_k W₂[h, k]·w_k·[unit k on], B = b₂[h] + Σ_k W₂[h, k]·b_k·[unit k on]. Each unit
  adds ±W₂·w (±W₂·b) at its switch into ``[H, rows, keys + 1]`` delta tensors (what is on from
  key 0, b₂ included, as one more delta at key 0), and a ``cumsum`` along the row gives A and
  B — O(keys) per row, whatever the width.
* Autograd then needs no atomics into a few bins: the backward of ``cumsum`` is a reversed
  cumsum (the prefix sums the issue asks for), that of ``scatter_add`` (the deltas) a ``gather``
  at the ≤ width breakpoints of each row, and the row sum reaches W₂, w, b. c and L reach the
  bias through the ψ-per-distance table and the per-row normalizers, ordinary tensors.
* In keys j = i − d a unit's state flips at key i − p + 1, so the deltas go straight into the
  key layout ``[H, rows, keys]`` (row-major, what SDPA reads), and the causal mask is one more
  delta: −inf into the intercept at key i + 1, which the cumsum carries to every later key. The
  MLP input x = ψ(i − j)/N_i reads ψ through a sliding-window view of the per-distance table.

Every Python int used is a shape; no value leaves the device (no ``.item()``, no boolean
indexing), so ``torch.compile`` traces it without a graph break. A row at i < L is just a row
whose normalizer is ψ(L): rows below L form a Toeplitz block by construction, at the same cost.
The forward's ``scatter_add`` sums at most ``width`` deltas into one slot (units whose
breakpoint falls at the same key), so its float order there may vary run to run on CUDA unless
``torch.use_deterministic_algorithms(True)``.
"""

from __future__ import annotations

import torch


def segment_bias(
    psi: torch.Tensor,
    norm: torch.Tensor,
    q_offset: int,
    w1: torch.Tensor,
    b1: torch.Tensor,
    w2: torch.Tensor,
    b2: torch.Tensor,
) -> torch.Tensor:
    """FIRE's causal bias f_θ(ψ(i − j)/N_i) with −inf at j > i, without a width axis.

    Args (one dtype, float32 or float64; one device):
      psi ``[q_len + k_len − 1]``: ψ(d) for the distances d = q_offset − k_len + 1 … q_offset + q_len − 1
        of the rectangle, in order (ψ(|d|) where d < 0: finite, never used).
      norm ``[q_len]``: the normalizers N_i > 0 of queries q_offset … q_offset + q_len − 1.
      q_offset: the first query's index among the keys 0 … k_len − 1 (q_offset + q_len <= k_len).
      w1, b1 ``[W]``: the hidden layer (``Linear(1, W)``'s weight[:, 0] and bias).
      w2 ``[H, W]``, b2 ``[H]``: the output layer.
    Returns: ``[H, q_len, k_len]``, row-major: ``b2 + w2 @ relu(w1·x + b1)`` at x = ψ(i − j)/N_i (the
      same piecewise-linear function, up to rounding) for j <= i, −inf after; differentiable in
      every input.
    Raises: ValueError when the lengths do not fit (see Args).
    """
    H, W = w2.shape
    R = norm.shape[0]
    K = (psi.shape[0] + 1) - R
    D = q_offset + R  # distances 0 … D − 1 occur
    if K < D or q_offset < 0:
        raise ValueError(f"segment_bias needs 0 <= q_offset and q_offset + q_len <= k_len (got {q_offset}, {R}, {K})")
    # ψ(d) for d = 0 … D − 1, ascending: where each row's units switch
    psi_up = psi.detach()[K - 1 - q_offset :].contiguous()
    pos, neg = w1 > 0, w1 < 0
    live = pos | neg
    t = torch.where(live, -b1 / torch.where(live, w1, torch.ones_like(w1)), torch.zeros_like(b1)).detach()
    thresholds = (t[None, :] * norm.detach()[:, None]).contiguous()  # [R, W], in ψ units
    right = torch.searchsorted(psi_up, thresholds, right=True)  # w > 0: on at d >= #{ψ(d) <= t·N}
    left = torch.searchsorted(psi_up, thresholds, right=False)  # w < 0: on at d < #{ψ(d) < t·N}
    # w = 0: on at every d >= 0 when b > 0, at none otherwise
    const = torch.where(b1 > 0, torch.zeros_like(right[0]), torch.full_like(right[0], D))
    p = torch.where(pos, right, torch.where(neg, left, const[None, :].expand(R, W)))  # [R, W]
    # in keys j = i − d: w >= 0 units are on for j <= i − p, w < 0 units for j >= i − p + 1
    i = torch.arange(q_offset, D, device=psi.device)[:, None]
    switch = (i - p + 1).clamp(0, K)  # [R, W] key index in 0 … K
    sign = torch.where(neg, torch.ones_like(w1), -torch.ones_like(w1))  # on from the switch / off from it
    on_at_0 = (~neg).to(w1.dtype)  # w >= 0 units are on from key 0 until their switch
    slope_c, icpt_c = w2 * w1, w2 * b1  # [H, W]: each unit's slope and intercept contribution
    # one more "unit" at key 0 carries what is on from the start (and b₂): no separate pass adds it
    switch = torch.cat([switch, torch.zeros_like(switch[:, :1])], dim=1)[None].expand(H, R, W + 1)
    a_src = torch.cat([slope_c * sign, (slope_c * on_at_0).sum(-1, keepdim=True)], dim=1)
    b_src = torch.cat([icpt_c * sign, (icpt_c * on_at_0).sum(-1, keepdim=True) + b2[:, None]], dim=1)
    keys = torch.arange(K + 1, device=psi.device)
    zeros = torch.zeros((), dtype=w2.dtype, device=w2.device)
    # the causal −inf goes into the intercept's deltas at key i + 1 (its cumsum is −inf after i)
    b_start = torch.where(keys[None, :] == i + 1, float("-inf"), zeros).expand(H, R, K + 1)
    a_delta = zeros.expand(H, R, K + 1).scatter_add(-1, switch, a_src[:, None, :].expand(H, R, W + 1))
    b_delta = b_start.scatter_add(-1, switch, b_src[:, None, :].expand(H, R, W + 1))
    slope = a_delta[..., :K].cumsum(-1)  # [H, R, K]: the per-key slope and intercept of f_θ
    intercept = b_delta[..., :K].cumsum(-1)
    # x = ψ(i − j)/N_i: ψ's rows are sliding windows of the per-distance table (a view; its
    # backward is a strided sum, no scatter)
    x = psi.flip(-1).unfold(-1, K, 1).flip(0) / norm[:, None]  # [R, K]
    return torch.addcmul(intercept, slope, x)
