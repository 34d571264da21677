"""FIRE: Functional Interpolation for Relative Positions Encoding.

Source: Li et al. 2024 (ICLR), "Functional Interpolation for Relative Positions Improves
Long Context Transformers", eq. 3–4 and §3.2:

    b(i, j) = f_θ( ψ(i − j) / ψ(max(L, i)) ),   ψ(x) = log(|c·x| + 1),

f_θ an MLP 1 → width → num_heads with ReLU, c and L learned (L = |multiplier · init_L|).

Compiled path (exact; used on CPU for mlp_depth 1 when numba is installed): one kernel
writes every row: per row the segments of the piecewise-linear f_θ (below) are contiguous
runs of keys, since x is monotone in |i − j|, so each output entry is one multiply-add; the
causal mask's −inf is written in the same pass (``masked_bias``), and a second kernel gives
the gradients of ψ(d), the normalizers and the segment coefficients (float64 sums), from
which autograd reaches c, L and the MLP. Never a [q, k, width] or [q, k, 2H] intermediate.

CUDA path (exact; the attention mask on CUDA, ``SEGMENT_PATH_DEVICES``): ``masked_bias_segments``
and ``fire_segments.segment_bias`` — per row the same segments, found by ``searchsorted`` of the
ψ-per-distance table, turned into per-key slope and intercept by a cumsum of per-unit deltas, the
causal −inf folded in; plain differentiable torch ops (no atomics into a few bins in the backward,
no graph break under ``torch.compile``).

Torch path (exact; ``bias`` on a GPU, mlp_depth 2 on CPU, no numba, or ``FIRE_NO_NUMBA=1``): rows whose
normalizer is shared – queries at i < L, and i >= cap when a cap is set – form a Toeplitz
block, so f_θ runs once per distance and the rows are a sliding window of that table. Other rows use the fact that a one-hidden-layer ReLU MLP of a
scalar is piecewise linear with at most ``width`` breakpoints: f(x) = A[s]·x + B[s] with s
the segment of x, found by ``searchsorted`` — no [q, k, width] intermediate. Both equal the
plain formula (``bias_reference``) to float32 rounding (tests assert 1e-5).
"""

from __future__ import annotations

import math
from typing import cast

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from fireviz.core import LazyKernel, is_int, mask_output, numba_kernel_call
from fireviz.encodings.base import (
    BIAS_QUERY_BLOCK,
    PositionEncoding,
    _grid_positions,
    check_position_offset,
    query_positions,
    relative_distance,
)
from fireviz.encodings.fire_segments import segment_bias


def toeplitz_from_table(table: torch.Tensor, q_len: int, k_len: int) -> torch.Tensor:
    """Expand per-distance values into a Toeplitz bias.

    Args: ``table [H, q_len + k_len − 1]`` holding the value for distances
      ``d_min … d_max`` in order, where ``d_min = q_offset − k_len + 1``.
    Returns: ``[H, q_len, k_len]`` with out[h, r, j] = table[h, r − j + k_len − 1]
      (a sliding-window view, then one copy; its backward is a strided sum, not a scatter).
    """
    return table.flip(-1).unfold(-1, k_len, 1).flip(1)


# -- optional compiled kernels (numba, see fireviz.kernels) -----------------------------------
#: query-row chunks of the compiled backward (partial sums per chunk); fixed, not per thread
BACKWARD_CHUNKS = 16


def _build_row_kernel():
    """Compile (once; numba caches to disk) FIRE's fused row kernels.

    ``fire_rows`` writes ``out[h, r, j] = slope[h, s]·x + intercept[h, s]`` with
    ``x = psi[r − j + K − 1] / norm[r]``, s its segment, and −inf at j > q_offset + r when
    ``causal``; ``fire_rows_backward`` returns the float64 gradients of psi, norm, slope and
    intercept for an upstream gradient ``g [H, Q, K]``.
    """
    import numba

    @numba.njit(parallel=True, cache=True, nogil=True)
    def fire_rows(out, psi, norm, bps, slope, intercept, q_offset, causal):  # pragma: no cover - compiled
        H, Q, K = out.shape
        nb = bps.shape[0]
        neg_inf = np.float32(-np.inf)
        for r in numba.prange(Q):
            end = K
            if causal:
                end = min(q_offset + r + 1, K)
            nr = norm[r]
            xs = np.empty(end, np.float32)
            s = 0
            run_start = 0
            run_seg = -1
            for j in range(end + 1):
                if j < end:
                    x = psi[r - j + K - 1] / nr
                    xs[j] = x
                    # segment = searchsorted(bps, x) (left); x is monotone on each side of
                    # the diagonal, so walking from the previous segment is O(1) amortised
                    while s < nb and bps[s] < x:
                        s += 1
                    while s > 0 and bps[s - 1] >= x:
                        s -= 1
                    if s == run_seg:
                        continue
                if run_seg >= 0:  # flush the run [run_start, j) of one segment
                    for h in range(H):
                        a = slope[h, run_seg]
                        b = intercept[h, run_seg]
                        row = out[h, r]
                        for jj in range(run_start, j):
                            row[jj] = a * xs[jj] + b
                run_start = j
                run_seg = s
            for h in range(H):
                row = out[h, r]
                for jj in range(end, K):
                    row[jj] = neg_inf

    @numba.njit(parallel=True, cache=True, nogil=True)
    def fire_rows_backward(g, psi, norm, bps, slope, q_offset, causal, nchunks):  # pragma: no cover - compiled
        H, Q, K = g.shape
        S = slope.shape[1]
        nb = bps.shape[0]
        p_psi = np.zeros((nchunks, psi.shape[0]))
        p_slope = np.zeros((nchunks, H, S))
        p_icpt = np.zeros((nchunks, H, S))
        d_norm = np.zeros(Q)
        step = (Q + nchunks - 1) // nchunks
        for t in numba.prange(nchunks):  # per-chunk partial sums: no two threads share a slot
            for r in range(t * step, min(Q, (t + 1) * step)):
                end = K
                if causal:
                    end = min(q_offset + r + 1, K)
                nr = norm[r]
                s = 0
                acc = 0.0
                for j in range(end):
                    idx = r - j + K - 1
                    x = psi[idx] / nr
                    while s < nb and bps[s] < x:
                        s += 1
                    while s > 0 and bps[s - 1] >= x:
                        s -= 1
                    gx = 0.0
                    for h in range(H):
                        gv = g[h, r, j]
                        p_slope[t, h, s] += gv * x
                        p_icpt[t, h, s] += gv
                        gx += gv * slope[h, s]
                    # x = psi[idx] / norm[r]
                    p_psi[t, idx] += gx / nr
                    acc -= gx * x / nr
                d_norm[r] = acc
        return p_psi, d_norm, p_slope, p_icpt  # partial sums: reduced by the caller, in order

    return fire_rows, fire_rows_backward


#: ``_row_kernel()``: the compiled ``(forward, backward)`` row kernels, or None without numba
#: (the torch path is then used; both are exact).
_row_kernel = LazyKernel(_build_row_kernel)


def _piecewise_eval(x: torch.Tensor, bps: torch.Tensor, slope: torch.Tensor, intercept: torch.Tensor):
    """``slope[h, s]·x + intercept[h, s]`` with ``s = searchsorted(bps, x)``, no autograd.

    ``x [r, k]`` float32 → ``([H, r, k] float32, s [r, k] int32)``.
    """
    with torch.no_grad():
        H = slope.shape[0]
        s = torch.searchsorted(bps, x.contiguous(), out_int32=True)
        # One gather of 2H contiguous floats per pair ([r, k, 2H]) beats H strided gathers.
        coef = F.embedding(s, torch.cat([slope.t(), intercept.t()], dim=1))
        a, b = coef[..., :H].permute(2, 0, 1), coef[..., H:].permute(2, 0, 1)
        return torch.addcmul(b, a, x, out=torch.empty((H, *x.shape), device=x.device, dtype=x.dtype)), s


class _PiecewiseLinear(torch.autograd.Function):
    """``out[h] = slope[h, s]·x + intercept[h, s]``, ``s = searchsorted(bps, x)``, with a
    compact backward: per-segment sums of g and g·x (one ``scatter_add_`` each)
    for slope/intercept, and Σ_h g·slope[h, s] for x — no [r, k, 2H] gradient scatter.

    Inputs: x ``[r, k]``, slope/intercept ``[H, S]``, bps ``[S − 1]`` (no gradient).
    """

    @staticmethod
    def forward(ctx, x, slope, intercept, bps):
        out, s = _piecewise_eval(x, bps, slope, intercept)
        ctx.save_for_backward(x, slope, s)
        return out

    @staticmethod
    def backward(ctx, g):
        x, slope, s = ctx.saved_tensors
        H, S = slope.shape
        g = g.contiguous()
        idx = s.reshape(-1).long()
        gs = g.reshape(H, -1)
        d_slope = d_intercept = d_x = None
        index = idx[None].expand(H, -1)
        if ctx.needs_input_grad[1]:
            gx = (g * x).reshape(H, -1)
            d_slope = torch.zeros(H, S, dtype=g.dtype, device=g.device).scatter_add_(1, index, gx)
        if ctx.needs_input_grad[2]:
            d_intercept = torch.zeros(H, S, dtype=g.dtype, device=g.device).scatter_add_(1, index, gs)
        if ctx.needs_input_grad[0]:
            a = F.embedding(s, slope.t().contiguous())  # [r, k, H]
            d_x = torch.einsum("hrk,rkh->rk", g, a)
        return d_x, d_slope, d_intercept, None


class _FusedRows(torch.autograd.Function):
    """FIRE's whole bias block from its small inputs through the compiled kernels.

    Inputs: psi_d ``[q_len + k_len − 1]`` (ψ of distances d_min…d_max), norm ``[q_len]``,
    slope/intercept ``[H, S]``, bps ``[S − 1]`` (no gradient), shape ``(q_len, k_len,
    q_offset, causal)``. Output float32 ``[H, q_len, k_len]``; gradients flow to the four
    small inputs (autograd then takes them to c, L and the MLP).
    """

    @staticmethod
    def forward(ctx, psi_d, norm, slope, intercept, bps, shape, reuse=False):
        q_len, k_len, q_offset, causal = shape
        forward_kernel = _row_kernel()[0]
        arrays = [t.detach().float().contiguous() for t in (psi_d, norm, bps, slope, intercept)]
        # (under no_grad here: a view of the blocked forward's reused mask memory when the caller
        # keeps no graph — FIRE._fused says so — else a tensor of its own)
        shape_out = (slope.shape[0], q_len, k_len)
        out = mask_output(shape_out) if reuse else torch.empty(shape_out)
        with numba_kernel_call():
            forward_kernel(out.numpy(), *(a.numpy() for a in arrays), int(q_offset), bool(causal))
        ctx.save_for_backward(*arrays[:4])
        ctx.shape = shape
        return out

    @staticmethod
    def backward(ctx, g):
        psi_d, norm, bps, slope = ctx.saved_tensors
        q_len, k_len, q_offset, causal = ctx.shape
        g = g.float().contiguous()
        with numba_kernel_call():
            p_psi, d_norm, p_slope, p_icpt = _row_kernel()[1](
                g.numpy(),
                psi_d.numpy(),
                norm.numpy(),
                bps.numpy(),
                slope.numpy(),
                int(q_offset),
                bool(causal),
                BACKWARD_CHUNKS,
            )
        # A fixed chunk count and a sequential reduction here (not numba's parallel one, whose
        # order follows thread scheduling) make the gradient bit-identical run to run and for
        # any thread count: exact resume depends on it.
        d_psi, d_slope, d_icpt = (torch.from_numpy(a).sum(0).float() for a in (p_psi, p_slope, p_icpt))
        d_norm = torch.from_numpy(d_norm).float()
        return d_psi, d_norm, d_slope, d_icpt, None, None, None


#: devices whose ``masked_bias`` (the attention mask) takes ``masked_bias_segments``: CUDA, where
#: the compiled CPU kernels do not run and the torch path's scatter_add backward contends (issue 49).
#: The CPU keeps its kernels (same values; tests add "cpu" here to run the CUDA path on a CPU).
SEGMENT_PATH_DEVICES = {"cuda"}


class FIRE(PositionEncoding):
    """FIRE additive bias for ``num_heads`` heads.

    Args:
      mlp_width: hidden width of f_θ (32 in the paper).
      init_c: initial c of ψ (0.1 in the paper).
      init_L: initial threshold L in tokens; fireviz's configs use a quarter of the
        training length, the paper's ratio (512 at 2048).
      eps: added to the normalizer ψ(max(L, i)) so i = 0 never divides by zero.
      progressive_interpolation: divide by ψ(max(L, i)) (paper default); off → input ψ(i−j).
      log_transform: ψ(x) = log(|c·x| + 1) (default); off → ψ(x) = x.
      learn_threshold: learned L (default); off → L fixed at 0 (normalizer ψ(i)).
      mlp_depth: 1 or 2 hidden layers of ``mlp_width``.
      normalizer_cap: fireviz's own option (default None, off): normalizer
        ψ(min(max(L, i), cap)), cap in tokens; e.g. the training length at evaluation time.

    Parameters: ``c`` (scalar), ``L_multiplier`` (scalar), ``mlp`` (nn.Sequential).
    Raises: ValueError for non-positive width/init_L/eps, mlp_depth not in {1, 2}, cap < 1.
    """

    kind = "additive"

    def __init__(
        self,
        num_heads: int,
        mlp_width: int = 32,
        init_c: float = 0.1,
        init_L: float = 512.0,
        eps: float = 1e-6,
        progressive_interpolation: bool = True,
        log_transform: bool = True,
        learn_threshold: bool = True,
        mlp_depth: int = 1,
        normalizer_cap: float | None = None,
    ):
        super().__init__(num_heads)
        if mlp_width < 1:
            raise ValueError(f"mlp_width must be >= 1 (got {mlp_width})")
        if not (math.isfinite(init_L) and init_L > 0 and math.isfinite(eps) and eps > 0):
            raise ValueError(f"init_L and eps must be > 0 (got init_L={init_L}, eps={eps})")
        if mlp_depth not in (1, 2):
            raise ValueError(f"mlp_depth must be 1 or 2 (got {mlp_depth})")
        if normalizer_cap is not None and not normalizer_cap >= 1:
            raise ValueError(f"normalizer_cap must be >= 1 token or None (got {normalizer_cap})")
        self.mlp_width, self.init_L, self.eps = mlp_width, float(init_L), float(eps)
        self.progressive_interpolation = progressive_interpolation
        self.log_transform = log_transform
        self.learn_threshold = learn_threshold
        self.mlp_depth = mlp_depth
        self.normalizer_cap = None if normalizer_cap is None else float(normalizer_cap)
        self.c = nn.Parameter(torch.tensor(float(init_c)))
        self.L_multiplier = nn.Parameter(torch.tensor(1.0))
        layers: list[nn.Module] = [nn.Linear(1, mlp_width), nn.ReLU()]
        if mlp_depth == 2:
            layers += [nn.Linear(mlp_width, mlp_width), nn.ReLU()]
        layers.append(nn.Linear(mlp_width, num_heads))
        self.mlp = nn.Sequential(*layers)

    # -- the formula, piece by piece -------------------------------------------------------
    def psi(self, x: torch.Tensor) -> torch.Tensor:
        """ψ(x) = log(|c·x| + 1) (or x with log_transform off); float32, x in tokens."""
        x = x.float()
        return torch.log1p(torch.abs(self.c * x)) if self.log_transform else x

    def threshold(self) -> torch.Tensor:
        """L = |multiplier · init_L| in tokens (0 when learn_threshold is off); 0-dim float32."""
        if not self.learn_threshold:
            return torch.zeros((), device=self.c.device)
        return torch.abs(self.L_multiplier * self.init_L)

    def position_parameters(self) -> dict[str, list[float]]:
        """``{"c": [c], "L": [L in tokens]}``: ψ's scale and the learned threshold (floats)."""
        return {"c": [float(self.c.detach())], "L": [float(self.threshold().detach())]}

    def normalizer(self, q_positions: torch.Tensor) -> torch.Tensor:
        """ψ(max(L, i)) + eps (capped when normalizer_cap is set), float32 ``[q]``."""
        pos = torch.maximum(q_positions.float(), self.threshold())
        if self.normalizer_cap is not None:
            pos = pos.clamp(max=self.normalizer_cap)
        return self.psi(pos) + self.eps

    def normalized_distance(self, q_positions: torch.Tensor, k_positions: torch.Tensor) -> torch.Tensor:
        """The MLP input ψ(i − j) / ψ(max(L, i)), float32 ``[q, k]`` for int positions (tokens).

        In [0, 1] for j <= i when progressive interpolation is on; masked future pairs
        (j > i) use |i − j| and are finite.
        """
        x = self.psi(q_positions[:, None] - k_positions[None, :])
        if self.progressive_interpolation:
            x = x / self.normalizer(q_positions)[:, None]
        return x

    @torch.no_grad()
    def bias_at(self, q_positions, k_positions) -> torch.Tensor:
        """See :meth:`PositionEncoding.bias_at`: f_θ(ψ(i − j)/ψ(max(L, i))) (Li et al. 2024 eq. 3–4)
        on the grid's pairs only, ≤ ~2^22 MLP activations at a time."""

        qs, ks = _grid_positions(q_positions, k_positions)
        out = torch.full((self.num_heads, qs.numel(), ks.numel()), float("nan"))
        if qs.numel() == 0 or ks.numel() == 0:
            return out
        dev = self.c.device
        kt = ks.to(dev)
        block = max(1, (1 << 22) // max(1, ks.numel() * int(self.mlp_width)))
        for start in range(0, qs.numel(), block):
            qt = qs[start : start + block].to(dev)
            out[:, start : start + block] = self.mlp_forward(self.normalized_distance(qt, kt)).float().cpu()
        out[:, ks[None, :] > qs[:, None]] = float("nan")
        return out

    def mlp_forward(self, x: torch.Tensor) -> torch.Tensor:
        """f_θ applied elementwise: ``[...]`` float32 → ``[num_heads, ...]`` logits."""
        return self.mlp(x.unsqueeze(-1)).movedim(-1, 0)

    def bias_reference(
        self, q_len: int, k_len: int, q_offset: int | None = None, position_offset: int = 0
    ) -> torch.Tensor:
        """The plain formula over all pairs at once (memory q·k·width): for tests and audits.

        Returns ``[num_heads, q_len, k_len]`` float32 logits, eq. 3–4 evaluated literally,
        future keys included (no mask), every position shifted by ``position_offset``.
        Raises: ValueError for bad lengths/offset (``query_positions``).
        """
        q_offset, k_len = query_positions(q_len, k_len, q_offset)
        P = check_position_offset(position_offset)
        dev = self.c.device
        x = self.normalized_distance(
            torch.arange(q_offset, q_offset + q_len, device=dev) + P, torch.arange(k_len, device=dev) + P
        )
        return self.mlp_forward(x)

    def masked_bias_reference(
        self, q_len: int, k_len: int, q_offset: int | None = None, position_offset: int = 0
    ) -> torch.Tensor:
        """Eq. 3–4 literally in the parameters' dtype (memory q·k·width), −inf at future keys:
        ``[num_heads, q_len, k_len]``; what the exactness checks of ``masked_bias_segments`` compare
        with (tests, ``benchmarks/gpu.py``), in float64 there. ``bias_reference`` is the same in float32.
        Raises: ValueError for bad lengths/offset.
        """
        q_offset, k_len = query_positions(q_len, k_len, q_offset)
        P = check_position_offset(position_offset)
        dev, dt = self.c.device, self.c.dtype
        i = torch.arange(q_offset, q_offset + q_len, device=dev, dtype=dt) + P
        j = torch.arange(k_len, device=dev, dtype=dt) + P

        def psi(x):
            return torch.log1p(torch.abs(self.c * x)) if self.log_transform else x

        x = psi(i[:, None] - j[None, :])
        if self.progressive_interpolation:
            pos = torch.maximum(i, self.threshold().to(dt))
            if self.normalizer_cap is not None:
                pos = pos.clamp(max=self.normalizer_cap)
            x = x / (psi(pos) + self.eps)[:, None]
        return self.mlp_forward(x).masked_fill(i[:, None] < j[None, :], float("-inf"))

    # -- fast exact evaluation -------------------------------------------------------------
    def piecewise_linear(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """f_θ as a piecewise-linear function (mlp_depth = 1 only).

        A one-hidden-layer ReLU MLP of a scalar is piecewise linear with a breakpoint at
        x = −b_k/w_k for each hidden unit with w_k ≠ 0.
        Returns ``(breakpoints [K] sorted, slope [H, K+1], intercept [H, K+1])``, float32 like
        the parameters, K ≤ mlp_width, such that f_h(x) = slope[h, s]·x + intercept[h, s] with
        s = searchsorted(breakpoints, x). Differentiable in the MLP parameters (not in the
        breakpoints, which are detached).
        Raises: ValueError when mlp_depth != 1 (a deeper MLP has no such closed form here).
        """
        if self.mlp_depth != 1:
            raise ValueError(
                f"piecewise_linear needs mlp_depth=1 (this FIRE has mlp_depth={self.mlp_depth}); "
                "use mlp_forward for deeper MLPs"
            )
        lin1, lin2 = cast(nn.Linear, self.mlp[0]), cast(nn.Linear, self.mlp[2])  # mlp_depth 1: Linear, ReLU, Linear
        w, b = lin1.weight[:, 0], lin1.bias  # [W]
        W2, b2 = lin2.weight, lin2.bias  # [H, W], [H]
        nonzero = w != 0
        t = torch.where(nonzero, -b / torch.where(nonzero, w, torch.ones_like(w)), torch.zeros_like(w))
        t_live = t[nonzero]
        order = torch.argsort(t_live.detach())
        bps = t_live[order].detach()
        K = bps.numel()
        # rank of each live unit's breakpoint; segment s lies right of breakpoints 0..s-1
        rank = torch.empty_like(order)
        rank[order] = torch.arange(K, device=w.device)
        seg = torch.arange(K + 1, device=w.device)[:, None]  # [S, 1]
        w_live, b_live = w[nonzero], b[nonzero]
        active = torch.where(w_live[None, :] > 0, rank[None, :] < seg, rank[None, :] >= seg).float()  # [S, K]
        W2_live = W2[:, nonzero]  # [H, K]
        # [H, S, K] products summed, not ``@``: these matrices are tiny and a threaded GEMM
        # call costs more than the arithmetic on a busy machine.
        slope = ((W2_live * w_live)[:, None, :] * active).sum(-1)  # [H, S]
        const = b2 + (W2[:, ~nonzero] * torch.relu(b[~nonzero])).sum(-1)
        intercept = ((W2_live * b_live)[:, None, :] * active).sum(-1) + const[:, None]
        return bps, slope, intercept

    def _rows_general(self, x: torch.Tensor, pieces=None) -> torch.Tensor:
        """f_θ on an arbitrary block of inputs ``x [r, k]`` → ``[H, r, k]``.

        ``pieces``: a precomputed ``piecewise_linear()`` (reused across blocks of one call).
        """
        if self.mlp_depth != 1:
            return self.mlp_forward(x)
        bps, slope, intercept = pieces if pieces is not None else self.piecewise_linear()
        if torch.is_grad_enabled() and (x.requires_grad or slope.requires_grad or intercept.requires_grad):
            return _PiecewiseLinear.apply(x, slope, intercept, bps)
        return _piecewise_eval(x, bps, slope, intercept)[0]

    def _needs_grad(self) -> bool:
        return torch.is_grad_enabled() and any(p.requires_grad for p in self.parameters())

    def _fused(
        self, q_len: int, k_len: int, q_offset: int, causal: bool, position_offset: int = 0
    ) -> torch.Tensor | None:
        """The compiled path: every row in one kernel pass (and one for the backward), or None
        where it does not apply (mlp_depth 2, not on CPU, numba missing)."""
        if self.mlp_depth != 1 or self.c.device.type != "cpu" or _row_kernel() is None:
            return None
        psi_d = self.psi(torch.arange(q_offset - k_len + 1, q_offset + q_len))
        if self.progressive_interpolation:  # the distances are local, the normalizer's i absolute
            norm = self.normalizer(torch.arange(q_offset, q_offset + q_len) + position_offset)
        else:
            norm = torch.ones(q_len)
        bps, slope, intercept = self.piecewise_linear()
        reuse = not torch.is_grad_enabled()  # no graph keeps the output: mask_output may reuse memory
        return _FusedRows.apply(psi_d, norm, slope, intercept, bps, (q_len, k_len, q_offset, causal), reuse)

    def masked_bias_segments(
        self, q_len: int, k_len: int, q_offset: int | None = None, position_offset: int = 0
    ) -> torch.Tensor:
        """``masked_bias`` from per-row breakpoints in plain torch ops (``fire_segments``; the CUDA path).

        Same values as the plain formula with −inf at future keys: ``[num_heads, q_len, k_len]`` in
        the parameters' dtype (float32 for a model; float64 in the exactness tests), queries at
        absolute positions position_offset + q_offset… (tokens). Per row the bias is
        A·x + B with A, B piecewise constant in the key distance, from a cumsum of per-unit
        deltas at the row's breakpoints, so the MLP never runs per score and its backward has no
        atomic adds into a few bins; no ``.item()`` or data-dependent shape (``torch.compile``
        traces it whole). With ``mlp_depth`` 2 (no piecewise form here) f_θ runs per pair, the
        plain formula's cost: ``[rows, k_len, width]`` activations per layer of the MLP.
        Queries must end at or before the last key (q_offset + q_len <= k_len, what attention asks).
        Raises: ValueError for bad lengths/offset or q_offset + q_len > k_len.
        """
        q_offset, k_len = query_positions(q_len, k_len, q_offset)
        P = check_position_offset(position_offset)
        D = q_offset + q_len  # queries' own positions: keys 0 … D − 1
        if D > k_len:
            raise ValueError(
                f"masked_bias_segments needs q_offset + q_len <= k_len (got {q_offset} + {q_len} > {k_len})"
            )
        dev, dt = self.c.device, self.c.dtype
        c = self.c
        d = torch.arange(q_offset - k_len + 1, D, device=dev, dtype=dt)  # the rectangle's distances
        psi = torch.log1p(torch.abs(c * d)) if self.log_transform else torch.abs(d)
        if self.progressive_interpolation:
            pos = torch.arange(q_offset, D, device=dev, dtype=dt) + P
            pos = torch.maximum(pos, self.threshold().to(dt))
            if self.normalizer_cap is not None:
                pos = pos.clamp(max=self.normalizer_cap)
            norm = (torch.log1p(torch.abs(c * pos)) if self.log_transform else pos) + self.eps
        else:
            norm = torch.ones(q_len, device=dev, dtype=dt)
        # Row blocks bound the intermediates (two [H, rows, keys + 1] deltas, or [rows, keys, width] with
        # mlp_depth 2) where no graph keeps them; a graph keeps them anyway: one block then.
        block = q_len if self.mlp_depth == 1 and self._needs_grad() else BIAS_QUERY_BLOCK
        parts = []
        for r0 in range(0, q_len, block):
            r1 = min(r0 + block, q_len)
            psi_rows = psi[r0 : r1 + k_len - 1]  # the distances of rows r0 … r1 − 1
            if self.mlp_depth == 1:
                lin1, lin2 = cast(nn.Linear, self.mlp[0]), cast(nn.Linear, self.mlp[2])
                w1, b1, w2, b2 = lin1.weight[:, 0], lin1.bias, lin2.weight, lin2.bias
                parts.append(segment_bias(psi_rows, norm[r0:r1], q_offset + r0, w1, b1, w2, b2))
            else:  # no closed form here: f_θ per pair, the future masked after
                x = toeplitz_from_table(psi_rows[None], r1 - r0, k_len)[0] / norm[r0:r1, None]
                future = relative_distance(r1 - r0, k_len, q_offset + r0, dev) < 0
                parts.append(self.mlp_forward(x).masked_fill(future, float("-inf")))
        return parts[0] if len(parts) == 1 else torch.cat(parts, dim=1)

    def masked_bias(
        self, q_len: int, k_len: int, q_offset: int | None = None, position_offset: int = 0
    ) -> torch.Tensor:
        """``bias`` with −inf at future keys (j > i): float32 ``[num_heads, q_len, k_len]``,
        queries at absolute positions position_offset + q_offset… (tokens); the additive
        causal mask.

        With the compiled kernels one pass writes bias and −inf together (and future keys
        cost no MLP work); on CUDA ``masked_bias_segments`` (plain torch ops,
        compile-friendly, no atomics into a few bins in the backward); otherwise the
        torch-path bias is masked (in place without autograd). Same values either way;
        differentiable in c, L and the MLP.
        Raises: ValueError for bad lengths/offset.
        """
        q_offset, k_len = query_positions(q_len, k_len, q_offset)
        P = check_position_offset(position_offset)
        if self.c.device.type in SEGMENT_PATH_DEVICES and q_offset + q_len <= k_len:
            return self.masked_bias_segments(q_len, k_len, q_offset, P)
        fused = self._fused(q_len, k_len, q_offset, causal=True, position_offset=P)
        if fused is not None:
            return fused
        b = self.bias(q_len, k_len, q_offset, P)
        future = relative_distance(q_len, k_len, q_offset, b.device) < 0
        if b.requires_grad:
            return b.masked_fill(future, float("-inf"))
        return b.masked_fill_(future, float("-inf"))  # bias() returned a fresh tensor

    def bias(self, q_len: int, k_len: int, q_offset: int | None = None, position_offset: int = 0) -> torch.Tensor:
        """FIRE logits, float32 ``[num_heads, q_len, k_len]``; queries at q_offset… (tokens).

        ``position_offset`` (tokens) shifts every query and key: the distances stay, the
        normalizer ψ(max(L, i)) takes the absolute query position position_offset + i.
        Exact to the plain formula (compiled kernels when available, see the module doc);
        peak extra memory about the output size (on the torch path, rows outside the
        Toeplitz blocks go ``BIAS_QUERY_BLOCK`` at a time).
        Raises: ValueError for bad lengths/offset.
        """
        q_offset, k_len = query_positions(q_len, k_len, q_offset)
        P = check_position_offset(position_offset)
        fused = self._fused(q_len, k_len, q_offset, causal=False, position_offset=P)
        if fused is not None:
            return fused
        dev = self.c.device
        d_min = q_offset - k_len + 1
        psi_d = self.psi(torch.arange(d_min, q_offset + q_len, device=dev))  # [q_len + k_len - 1]
        if not self.progressive_interpolation:
            return toeplitz_from_table(self._rows_general(psi_d[None, :])[:, 0], q_len, k_len)

        q_pos = torch.arange(q_offset, q_offset + q_len, device=dev) + P  # absolute: the normalizer's i
        L = self.threshold()
        # Rows sharing a normalizer: i < L (→ ψ(L)) and i >= cap (→ ψ(cap)). A row at
        # i == L goes the general way so torch.maximum's tie gradient matches the formula.
        n_low = int((q_pos.float() < L.detach()).sum())
        n_high = 0
        if self.normalizer_cap is not None and self.normalizer_cap > float(L.detach()):
            n_high = int((q_pos.float() >= self.normalizer_cap).sum())
        elif self.normalizer_cap is not None:
            n_low, n_high = q_len, 0  # cap <= L: one normalizer for every row
        # Without autograd each block is written straight into the output (peak ≈ output +
        # one block); with autograd the blocks are concatenated.
        direct = not self._needs_grad()
        out = torch.empty(self.num_heads, q_len, k_len, device=dev) if direct else None
        pieces = []

        def emit(row_start: int, block: torch.Tensor) -> None:
            if direct:
                assert out is not None
                out[:, row_start : row_start + block.shape[1]] = block
            else:
                pieces.append(block)

        if n_low:
            norm = self.normalizer(q_pos[:1].clamp(max=0))  # ψ(L) (+cap) via the same code path
            table = self._rows_general((psi_d[: n_low + k_len - 1] / norm)[None, :])[:, 0]
            emit(0, toeplitz_from_table(table, n_low, k_len))
        mid_end = q_len - n_high
        pl = self.piecewise_linear() if self.mlp_depth == 1 and mid_end > n_low else None
        for start in range(n_low, mid_end, BIAS_QUERY_BLOCK):
            stop = min(start + BIAS_QUERY_BLOCK, mid_end)
            rows = q_pos[start:stop]
            # psi(i - j) for these rows is a sliding window of psi_d
            x = toeplitz_from_table(psi_d[None, start : stop + k_len - 1], stop - start, k_len)[0]
            emit(start, self._rows_general(x / self.normalizer(rows)[:, None], pl))
        if n_high:
            norm = self.normalizer(q_pos[-1:])
            table = self._rows_general((psi_d[mid_end:] / norm)[None, :])[:, 0]
            emit(mid_end, toeplitz_from_table(table, n_high, k_len))
        if direct:
            assert out is not None
            return out
        return pieces[0] if len(pieces) == 1 else torch.cat(pieces, dim=1)


#: largest FIRE normalizer cap accepted (tokens): beyond any length evaluated, exact in float64
MAX_NORMALIZER_CAP = 1 << 40


def check_normalizer_cap(cap) -> int | None:
    """``cap`` as an int in 1 … ``MAX_NORMALIZER_CAP`` tokens, or None.

    Raises: ValueError naming the range and an example (the training length)."""
    if cap is None:
        return None
    if not is_int(cap) or not 1 <= cap <= MAX_NORMALIZER_CAP:
        raise ValueError(
            f"normalizer_cap must be an integer number of tokens in 1..{MAX_NORMALIZER_CAP} (got "
            f"{cap!r}); e.g. the training length, --normalizer-cap 512"
        )
    return int(cap)


def fire_modules(module: nn.Module) -> list[FIRE]:
    """Every FIRE module inside ``module`` (a GPT, an encoding list, or a FIRE itself)."""
    return [m for m in module.modules() if isinstance(m, FIRE)]
