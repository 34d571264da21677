"""How well a fitted FIRE matches its target: the errors of ``fit_fire`` inside and beyond the fitted range.

Measured on the float32 module (``FIRE.bias`` inside; its eq. 3–4 pieces ``psi`` /
``normalizer`` / ``mlp_forward`` on the query rows beyond), never on the float64 fitting
surrogate of ``fireviz.fit.fitting``. Inside the fitted range ``0 ≤ j ≤ i < max_len`` every pair is
counted (per distance, weighted by its ``max_len − d`` pairs); beyond it, the pairs of up to
``BEYOND_ROWS`` query rows ``max_len ≤ i < BEYOND_FACTOR·max_len``. Errors in logits; relative
errors are RMSE / std of the target over the same pairs.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np
import torch

from fireviz.encodings import FIRE
from fireviz.fit.result import BEYOND_FACTOR, FitResult
from fireviz.fit.targets import FitTarget

if TYPE_CHECKING:
    from fireviz.fit.fitting import FitSettings

#: Query rows (evenly spaced, deterministic) on which the error beyond the fitted range is
#: measured: every pair (i, j ≤ i) of these rows counts.
BEYOND_ROWS = 256
#: Query rows evaluated at once beyond the fitted range (memory: chunk · 4·max_len · width floats).
BEYOND_CHUNK = 16


@dataclass
class _Errors:
    """Errors over a set of pairs (logits): relative RMSE overall and per head, max |error|, RMSE."""

    relative_rmse: float
    per_head: list[float]
    max_abs: float
    rmse: float


def _ratio(num: float, den: float) -> float:
    if den > 0:
        return num / den
    return 0.0 if num == 0 else math.inf


@torch.no_grad()
def _measure_inside(module: FIRE, target: FitTarget, n: int):
    """Errors on all pairs ``0 ≤ j ≤ i < n`` and the per-distance curves:
    ``(errors, fitted [H, n], target [H, n], pair weights [n])`` (float64 tensors)."""
    H = target.num_heads
    # Inside: every query i < max_len ≤ L has normalizer ψ(L), so the row of query n−1
    # holds the value of every distance 0..n−1 exactly as every other row does.
    fitted = module.bias(1, n, q_offset=n - 1)[:, 0].flip(-1).double()  # [H, n], d = 0..n−1
    tgt = target.bias_by_distance(torch.arange(n)).double()
    w = n - torch.arange(n, dtype=torch.float64)
    r = fitted - tgt
    sse_h = (w * r * r).sum(1)
    npairs = float(w.sum())
    mean_h = (w * tgt).sum(1) / npairs
    var_h = (w * (tgt - mean_h[:, None]) ** 2).sum(1) / npairs
    mean_all = float(mean_h.mean())
    var_all = float(((w * (tgt - mean_all) ** 2).sum()) / (npairs * H))
    rmse = math.sqrt(float(sse_h.sum()) / (npairs * H))
    errors = _Errors(
        relative_rmse=_ratio(rmse, math.sqrt(var_all)),
        per_head=[_ratio(math.sqrt(float(e) / npairs), math.sqrt(float(v))) for e, v in zip(sse_h, var_h, strict=True)],
        max_abs=float(r.abs().max()),
        rmse=rmse,
    )
    return errors, fitted, tgt, w


def _beyond_rows(n: int) -> np.ndarray:
    """The query rows measured beyond the fitted range: all of ``n … 4n − 1`` or ``BEYOND_ROWS`` evenly spaced."""
    top = BEYOND_FACTOR * n
    return np.unique(np.linspace(n, top - 1, min(BEYOND_ROWS, top - n)).round().astype(np.int64))


@torch.no_grad()
def _beyond_sums(module: FIRE, table: torch.Tensor, rows: np.ndarray, psi_d: torch.Tensor):
    """Per head over every pair (i in ``rows``, j ≤ i): squared-error sum, target sum and sum of
    squares ``[H]`` each, the pair count and the max |error|."""
    H, top = table.shape
    sse_b = torch.zeros(H, dtype=torch.float64)
    s1 = torch.zeros(H, dtype=torch.float64)
    s2 = torch.zeros(H, dtype=torch.float64)
    count, max_b = 0, 0.0
    for start in range(0, rows.size, BEYOND_CHUNK):
        # FIRE's formula (eq. 3–4) for queries i over d = 0..top−1, the same values as
        # ``module.bias`` (tests check it); distances d > i are masked out. Every chunk has
        # the same shape (the last one padded), so torch's kernels are set up once.
        q = torch.as_tensor(rows[start : start + BEYOND_CHUNK])
        q = torch.cat([q, q[-1:].expand(BEYOND_CHUNK - q.numel())])
        x = psi_d[None, :] / module.normalizer(q)[:, None]  # [chunk, top]
        causal = torch.arange(top)[None, :] <= q[:, None]
        causal[min(rows.size - start, BEYOND_CHUNK) :] = False  # padding rows
        fb = module.mlp_forward(x).double()  # [H, chunk, top]
        tb = table[:, None, :].expand_as(fb)
        diff = torch.where(causal, fb - tb, torch.zeros(()))
        tb = torch.where(causal, tb, torch.zeros(()))
        sse_b += (diff * diff).sum((1, 2))
        s1 += tb.sum((1, 2))
        s2 += (tb * tb).sum((1, 2))
        count += int(causal.sum())
        max_b = max(max_b, float(diff.abs().max()))
    return sse_b, s1, s2, count, max_b


@torch.no_grad()
def _measure_beyond(module: FIRE, target: FitTarget, n: int):
    """Errors on the pairs of the query rows beyond the fitted range (``_beyond_rows``) against
    the target's own formula, and the curves of the last row ``4n − 1``:
    ``(errors, rows measured, table [H, 4n] (float64), FIRE's last row [H, 4n] (float32 numpy))``."""
    H, top = target.num_heads, BEYOND_FACTOR * n
    rows = _beyond_rows(n)
    table = target.bias_by_distance(torch.arange(top)).double()  # [H, top]
    psi_d = module.psi(torch.arange(top))  # [top]
    sse_b, s1, s2, count, max_b = _beyond_sums(module, table, rows, psi_d)
    var_bh = (s2 / count - (s1 / count) ** 2).clamp(min=0)
    mean_b = float(s1.sum()) / (count * H)
    var_b = max(float(s2.sum()) / (count * H) - mean_b**2, 0.0)
    rmse_b = math.sqrt(float(sse_b.sum()) / (count * H))
    errors = _Errors(
        relative_rmse=_ratio(rmse_b, math.sqrt(var_b)),
        per_head=[_ratio(math.sqrt(float(e) / count), math.sqrt(float(v))) for e, v in zip(sse_b, var_bh, strict=True)],
        max_abs=max_b,
        rmse=rmse_b,
    )
    q_last = top - 1
    last_row = module.mlp_forward(psi_d / module.normalizer(torch.tensor([q_last])))  # [H, top], d = 0..top−1
    return errors, int(rows.size), table, last_row.numpy()


@torch.no_grad()
def measure_fit(
    module: FIRE, settings: "FitSettings", curve: list[float], steps_run: int, stopped: bool, t0: float
) -> FitResult:
    """The ``FitResult`` of a fitted ``module``: its errors inside and beyond the fitted range
    (see the module docstring), the per-distance curves, and the fit's record (``curve`` = the
    objective per step, ``steps_run``, ``stopped``; ``seconds`` counted from ``t0``, a
    ``time.perf_counter()`` reading)."""
    target, n = settings.target, settings.max_len
    inside, fitted, tgt, w = _measure_inside(module, target, n)
    beyond, rows, table, last_row = _measure_beyond(module, target, n)
    top = BEYOND_FACTOR * n
    return FitResult(
        settings=settings,
        module=module,
        target=target,
        max_len=n,
        loss_curve=curve,
        relative_rmse=inside.relative_rmse,
        relative_rmse_per_head=inside.per_head,
        max_abs_error=inside.max_abs,
        rmse=inside.rmse,
        relative_rmse_beyond=beyond.relative_rmse,
        relative_rmse_beyond_per_head=beyond.per_head,
        max_abs_error_beyond=beyond.max_abs,
        rmse_beyond=beyond.rmse,
        beyond_rows=rows,
        distance=np.arange(n),
        target_values=tgt.float().numpy(),
        fitted_values=fitted.float().numpy(),
        weights=w.numpy(),
        beyond_query=top - 1,
        beyond_distance=np.arange(top),
        beyond_target=table.float().numpy(),
        beyond_fitted=last_row,
        steps=settings.steps,
        steps_run=steps_run,
        stopped=stopped,
        seconds=time.perf_counter() - t0,
        mlp_width=settings.mlp_width,
        seed=settings.seed,
        c=float(module.c.detach()),
    )
