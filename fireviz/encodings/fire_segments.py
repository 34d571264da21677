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
* Hence a row's bias is A[h, i, d]·x + B[h, i, d] with A, B piecewise constant in d:
  A = Σ_k W₂[h, k]·w_k·[unit k on], B = b₂[h] + Σ_k W₂[h, k]·b_k·[unit k on]. Each unit
  adds ±W₂·w (±W₂·b) at its breakpoint into a ``[2, H, rows, D + 1]`` delta tensor, and a
  ``cumsum`` along d gives A and B — O(D) per row, whatever the width.
* Autograd then needs no atomics into a few bins: the backward of ``cumsum`` is a reversed
  cumsum (the prefix sums the issue asks for), that of ``scatter_add`` (the deltas) a ``gather``
  at the ≤ width breakpoints of each row, and the row sum reaches W₂, w, b. c and L reach the
  bias through the ψ-per-distance table and the per-row normalizers, ordinary tensors.
* Everything is computed in distance layout ``[H, rows, D]`` (D = the largest distance + 1);
  one skew (a reversal, −inf padding, a slice and a view: no scatter, no index tensor) turns
  it into the key layout ``[H, rows, keys]`` with −inf after each query's position.

Every Python int used is a shape; no value leaves the device (no ``.item()``, no boolean
indexing), so ``torch.compile`` traces it without a graph break. A row at i < L is just a row
whose normalizer is ψ(L): rows below L form a Toeplitz block by construction, at the same cost.
The forward's ``scatter_add`` sums at most ``width`` deltas into one slot (units whose
breakpoint falls at the same key), so its float order there may vary run to run on CUDA unless
``torch.use_deterministic_algorithms(True)``.
"""

from __future__ import annotations

import torch


def skew_to_keys(dist: torch.Tensor, q_offset: int, k_len: int) -> torch.Tensor:
    """Distance layout → key layout with the causal −inf.

    Args: ``dist [..., q_len, D]`` with ``dist[..., r, d]`` the value of query ``q_offset + r`` at
      distance d (``D = q_offset + q_len`` distances 0 … D − 1; entries past a row's own position
      are never read); ``k_len >= D`` keys.
    Returns: ``[..., q_len, k_len]`` contiguous: ``out[..., r, j] = dist[..., r, q_offset + r − j]``
      for j ≤ q_offset + r, −inf after. Built from a flip, a pad, a slice and views (their
      backward is the same moves reversed).
    Raises: ValueError when D != q_offset + q_len or k_len < D.
    """
    q_len, D = dist.shape[-2], dist.shape[-1]
    if D != q_offset + q_len or k_len < D:
        raise ValueError(
            f"skew_to_keys needs D = q_offset + q_len <= k_len (got D={D}, q_len={q_len}, q_offset={q_offset}, k_len={k_len})"
        )
    width = q_len + k_len  # row r of the padded tensor: dist[r] reversed (m = D − 1 − d), then −inf
    padded = torch.cat([dist.flip(-1), dist.new_full((*dist.shape[:-1], width - D), float("-inf"))], dim=-1)
    lead = dist.shape[:-2]
    flat = padded.reshape(*lead, q_len * width)
    # out[r, j] = padded[r, q_len − 1 − r + j] = flat[q_len − 1 + r·(width − 1) + j]
    start = q_len - 1
    window = flat[..., start : start + q_len * (width - 1)].reshape(*lead, q_len, width - 1)
    return window[..., :k_len].contiguous()


def segment_rows(
    psi_d: torch.Tensor,
    norm: torch.Tensor,
    w1: torch.Tensor,
    b1: torch.Tensor,
    w2: torch.Tensor,
    b2: torch.Tensor,
) -> torch.Tensor:
    """f_θ(ψ(d)/N_r) for every row r and distance d, in distance layout, without a width axis.

    Args (one dtype, float32 or float64; one device):
      psi_d ``[D]``: ψ(d) for d = 0 … D − 1, nondecreasing (what ψ is on d ≥ 0).
      norm ``[R]``: the rows' normalizers N_r > 0.
      w1, b1 ``[W]``: the hidden layer (``Linear(1, W)``'s weight[:, 0] and bias).
      w2 ``[H, W]``, b2 ``[H]``: the output layer.
    Returns: ``[H, R, D]``, equal to ``b2 + w2 @ relu(w1·x + b1)`` at x = psi_d[d]/norm[r] (up to
      rounding; exactly the same piecewise-linear function), differentiable in every input.
    """
    H, W = w2.shape
    R, D = norm.shape[0], psi_d.shape[0]
    pos = w1 > 0
    neg = w1 < 0
    safe_w = torch.where(pos | neg, w1, torch.ones_like(w1))
    t = torch.where(pos | neg, -b1 / safe_w, torch.zeros_like(b1)).detach()  # breakpoints in x
    thresholds = (t[None, :] * norm.detach()[:, None]).contiguous()  # [R, W] in ψ units
    psi_sorted = psi_d.detach().contiguous()
    right = torch.searchsorted(psi_sorted, thresholds, right=True)  # #{ψ(d) <= t·N}: on from here (w > 0)
    left = torch.searchsorted(psi_sorted, thresholds, right=False)  # #{ψ(d) < t·N}: on below here (w < 0)
    # w = 0: on everywhere (position 0) when b > 0, nowhere (position D) otherwise
    const_pos = torch.where(b1 > 0, torch.zeros_like(right[0]), torch.full_like(right[0], D))
    p = torch.where(pos, right, torch.where(neg, left, const_pos[None, :].expand(R, W)))  # [R, W]
    sign = torch.where(neg, -torch.ones_like(w1), torch.ones_like(w1))  # w < 0: on at 0, off at p
    alpha = w2 * w1  # [H, W] slope contributions
    beta = w2 * b1  # [H, W] intercept contributions
    coef = torch.stack([alpha, beta])  # [2, H, W]
    delta = torch.zeros(2, H, R, D + 1, dtype=coef.dtype, device=coef.device)
    delta = delta.scatter_add(-1, p[None, None].expand(2, H, R, W), (coef * sign)[:, :, None, :].expand(2, H, R, W))
    # units with w < 0 are on from d = 0: their coefficient is a constant, added after the cumsum
    base = (coef * neg.to(coef.dtype)).sum(-1)  # [2, H]
    ab = delta[..., :D].cumsum(-1) + base[:, :, None, None]  # [2, H, R, D]
    x = psi_d[None, :] / norm[:, None]  # [R, D]
    return torch.addcmul(ab[1] + b2[:, None, None], ab[0], x)
