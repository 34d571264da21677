"""One encoding's position bias, read out: a query row by distance, FIRE's MLP input, a
query × key grid, RoPE's position kernel, FIRE's input for fixed distances as the query moves,
and FIRE's f_θ on its input range.

The building blocks of ``fireviz.analysis.biases.bias_report`` (which runs them over every layer of a
model). Positions and distances in tokens (0-based); biases in logits. Never imports Streamlit.
"""

from __future__ import annotations

from typing import Sequence

import numpy as np
import torch

from fireviz.analysis.locality import _r


@torch.no_grad()
def bias_curve(encoding, query_position: int) -> np.ndarray:
    """One query row of an additive bias, ordered by distance.

    Args: ``encoding`` with ``kind == "additive"``; ``query_position`` i >= 0 (tokens).
    Returns: float32 ``[num_heads, i + 1]``: entry ``[h, d]`` is b_h(i, i − d) in logits for
      distances d = 0 … i (keys j = i … 0).
    Raises: TypeError for a rotary/NoPE encoding; ValueError for i < 0.
    """
    if getattr(encoding, "kind", None) != "additive":
        raise TypeError(f"{type(encoding).__name__} is a {getattr(encoding, 'kind', '?')} encoding and has no bias")
    i = int(query_position)
    if i < 0:
        raise ValueError(f"query position must be >= 0 (got {i})")
    row = encoding.bias(1, i + 1, i)[:, 0]  # [H, keys 0..i]
    return row.flip(-1).float().cpu().numpy()


@torch.no_grad()
def fire_normalized_input(encoding, query_position: int) -> np.ndarray:
    """FIRE's MLP input ψ(d)/ψ(max(L, i)) for distances d = 0 … i at query position i.

    Source: Li et al. 2024 eq. 3–4 with progressive interpolation (§3.2). In [0, 1] with
    interpolation on; the curve of a head over this input is f_θ itself.
    Returns: float32 ``[i + 1]``. Raises: TypeError if ``encoding`` is not FIRE.
    """
    if not hasattr(encoding, "normalized_distance"):
        raise TypeError(f"{type(encoding).__name__} is not FIRE (no normalized_distance)")
    i = int(query_position)
    dev = encoding.c.device
    keys = torch.arange(i, -1, -1, device=dev)  # distance 0 … i
    return encoding.normalized_distance(torch.tensor([i], device=dev), keys)[0].float().cpu().numpy()


@torch.no_grad()
def bias_matrix(encoding, query_positions: Sequence[int], key_positions: Sequence[int]) -> np.ndarray:
    """The additive bias on a query × key grid; NaN where the key is in the future (j > i),
    except for a bidirectional encoding (a T5 encoder stack), whose future keys have a bias.

    Args: an additive ``PositionEncoding``; query and key positions in tokens (0-based, any order).
    Returns: float32 ``[num_heads, len(query_positions), len(key_positions)]`` logits — the
      encoding's own ``bias_at`` (FIRE evaluates f_θ(ψ(i − j)/ψ(max(L, i))) on the grid pairs
      only, Toeplitz biases read one table over distances, the base class goes row by row
      through ``bias``): memory stays small for any grid.
    Raises: TypeError for a non-additive encoding; ValueError for negative positions.
    """
    if getattr(encoding, "kind", None) != "additive":
        raise TypeError(f"{type(encoding).__name__} is a {getattr(encoding, 'kind', '?')} encoding and has no bias")
    grid = encoding.bias_at(query_positions, key_positions)  # every PositionEncoding has one
    return grid.numpy().astype(np.float32, copy=False)


def rotary_kernel(inv_freq: torch.Tensor | np.ndarray, distances: Sequence[int] | np.ndarray) -> np.ndarray:
    """RoPE's position kernel K(d) = (1/K)·Σ_k cos(d·θ_k), the RoFormer long-term decay curve.

    Source: Su et al. 2021 (RoFormer) §3.4.3: the rotated product q_m·k_n depends on m − n
    through Σ_k cos((m − n)θ_k) (and sine terms); averaging cos over the K = head_dim/2
    frequencies is the logit for q = k = a constant unit vector and decays with |d|.
    Args: ``inv_freq`` θ_k in radians per token ``[K]`` (the encoding's buffer, so PI/YaRN
      scaling is included); ``distances`` d in tokens.
    Returns: float64 ``[len(distances)]`` in [−1, 1] (dimensionless; 1 at d = 0). The YaRN
      attention factor, which scales every logit, is not included.
    Raises: ValueError if inv_freq is empty.
    """
    theta = np.asarray(inv_freq.detach().cpu().double() if torch.is_tensor(inv_freq) else inv_freq, dtype=np.float64)
    if theta.size == 0:
        raise ValueError("inv_freq is empty")
    d = np.asarray(distances, dtype=np.float64)
    return np.cos(d[:, None] * theta[None, :]).mean(axis=1)


#: how a bias report labels the rotary kernel (:func:`rotary_kernel_curve`)
ROTARY_KERNEL_LABEL = "RoPE position kernel: mean over k of cos(d·θ_k) (RoFormer §3.4.3 long-term decay), not a bias"


def rotary_kernel_curve(encoding, max_distance: int) -> dict:
    """A rotary encoding's :func:`rotary_kernel` over distances 0 … ``max_distance`` (tokens):
    ``{"distance" int [D], "value" float64 [D], "attention_factor" (YaRN's, else 1), "label"}``."""
    d = np.arange(max_distance + 1)
    return {
        "distance": d,
        "value": rotary_kernel(encoding.inv_freq, d),
        "attention_factor": float(getattr(encoding, "attention_factor", 1.0)),
        "label": ROTARY_KERNEL_LABEL,
    }


#: distances (tokens) whose FIRE input ψ(d)/ψ(max(L, i)) is followed against the query position
FIRE_INPUT_DISTANCES = (1, 16, 64, 256)


def fire_input_vs_query(
    encoding,
    distances: Sequence[int] = FIRE_INPUT_DISTANCES,
    query_positions: Sequence[int] | None = None,
    max_position: int = 8192,
) -> dict:
    """FIRE's MLP input for fixed distances as the query moves (Li et al. 2024, eq. 3–4).

    For each distance d and query position i >= d: x(d, i) = ψ(d) / ψ(max(L, i)) (with the
    encoding's normalizer cap, if any; ψ(d) alone without progressive interpolation). Past
    the training length the normalizer keeps growing, so a fixed distance looks nearer and
    nearer to f_θ — the dilution mechanism.
    Args: a ``FIRE`` module; ``distances`` in tokens (>= 1); ``query_positions`` (tokens) or
      None for ~96 log-spaced positions from 1 to ``max_position``.
    Returns: ``{"distances": [D], "query_positions": [Q], "input": [D][Q] floats, None where
      d > i (no such key)}``.
    Raises: ValueError for a distance < 1 or an empty grid.
    """
    d = [int(x) for x in distances]
    if not d or min(d) < 1:
        raise ValueError(f"distances must be >= 1 token (got {list(distances)})")
    if query_positions is None:
        q = sorted({int(round(x)) for x in np.geomspace(1, max(2, max_position), 96)} | {max_position})
    else:
        q = sorted({int(x) for x in query_positions})
    if not q or q[0] < 0:
        raise ValueError("query positions must be a non-empty list of integers >= 0")
    with torch.no_grad():
        dev = encoding.c.device
        psi_d = encoding.psi(torch.tensor(d, device=dev, dtype=torch.float32))
        if encoding.progressive_interpolation:
            x = psi_d[:, None] / encoding.normalizer(torch.tensor(q, device=dev))[None, :]
        else:
            x = psi_d[:, None].expand(len(d), len(q))
        x = x.double().cpu().numpy()
    grid = [[_r(float(x[a, b])) if d[a] <= q[b] else None for b in range(len(q))] for a in range(len(d))]
    return {"distances": d, "query_positions": q, "input": grid}


@torch.no_grad()
def fire_mlp_curves(encoding, points: int, max_position: int, distances: Sequence[int] = FIRE_INPUT_DISTANCES) -> dict:
    """A FIRE layer's ``c``, threshold L (tokens), f_θ on ``points`` inputs evenly spaced in [0, 1]
    and its input for fixed ``distances`` up to ``max_position`` (:func:`fire_input_vs_query`).

    Returns: ``{"c", "threshold_L", "mlp_x" float32 [points], "mlp_bias" float32 [heads, points],
      "input_vs_query"}``. Memory: ``fireviz.core.memory.fire_curve_bytes``.
    """
    x = torch.linspace(0.0, 1.0, points, device=encoding.c.device)
    return {
        "c": float(encoding.c),
        "threshold_L": float(encoding.threshold()),
        "mlp_x": x.cpu().numpy(),
        "mlp_bias": encoding.mlp_forward(x).float().cpu().numpy(),
        "input_vs_query": fire_input_vs_query(encoding, distances, max_position=max_position),
    }
