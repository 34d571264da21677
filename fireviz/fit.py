"""Fit FIRE to another relative-position bias: Theorem 3.1 of the FIRE paper, made numerical.

Source: Li et al. 2024 (ICLR), "Functional Interpolation for Relative Positions Improves Long
Context Transformers", arXiv 2310.04418, eq. 3–4 (FIRE) and Theorem 3.1 (FIRE can represent
T5's bucketed bias, ALiBi, Kerple and Sandwich).

FIRE's bias is ``b(i, j) = f_θ(ψ(i − j) / ψ(max(L, i)))`` with ``ψ(x) = log(|c·x| + 1)`` and
``f_θ`` a 1 → width → heads ReLU MLP. The construction behind the theorem: with the threshold
``L ≥ max_len`` every query of the fitted range ``0 ≤ j ≤ i < max_len`` shares the normalizer
``ψ(L)``, so on that range FIRE is a function of the distance ``d = i − j`` alone,

    b(i, j) = f_θ(x_d),   x_d = ψ(d) / ψ(L) ∈ [0, 1],

and any Toeplitz target ``g_h(d)`` is matched by choosing ``c`` and a piecewise-linear ``f_θ``
through the points ``(x_d, g_h(d))``. Fitting therefore runs on ``max_len`` distances, each
weighted by its number of pairs ``max_len − d`` so the 1-D error *is* the all-pairs error:

1. for a grid of ``c``, place the hidden units' kinks at data points chosen greedily by
   orthogonal least squares (the kink that most reduces the weighted error, all heads
   together), with one unit reserved for the linear term ``ReLU(x) = x``;
2. keep the best ``c``; solve the output layer in closed form (weighted least squares);
3. refine ``log c`` and the kinks with Adam, the output layer re-solved in closed form at
   every step (variable projection), keeping the best iterate.

The loss is the mean over heads of ``(RMSE_h / std_h)²`` on the fitted range, so heads with
small biases (ALiBi's gentle slopes) are fitted as well, relatively, as steep ones.
Beyond the fitted range (queries up to ``4 × max_len``) FIRE's normalizer becomes ``ψ(i)``:
it stretches the fitted function over the longer context (progressive interpolation) while
the target keeps its own formula; ``FitResult`` reports that difference as it is.

Limits (counting kinks): f_θ of width W is piecewise linear with at most W kinks. A T5 table
of 32 arbitrary values (16 one-distance buckets, then runs up to max_distance) needs about
46 kinks to be exact, and Sandwich's kernel (dbar = 128) has ~130 local extrema below 512
tokens (its high-frequency terms, ~20 % of each head's std at scales under 10 tokens), so at
width 32 both stay near 20 % per head; width 128 fits them to ~0.01 % and ~4 %.
"""

from __future__ import annotations

import contextlib
import math
import threading
import time
from dataclasses import dataclass
from typing import Callable

import numpy as np
import torch

from .encodings import FIRE
from .encodings.specs import t5_bucket_values  # noqa: F401  (public here since it was first defined in fit)
from .fit_result import (
    BEYOND_FACTOR,
    FitResult,
)
from .fit_targets import (
    TARGET_NAMES,  # noqa: F401
    FitTarget,
    make_target,
)


#: Default optimisation steps of ``fit_fire`` (after the closed-form initialisation).
DEFAULT_STEPS = 300


# Grid of c·L (c times the threshold L) tried by the initialisation, from ψ nearly linear
# in d (c·L = 0.01) to strongly logarithmic (c·L = 10⁴); refined by √10 around the best.
_CL_GRID = tuple(10.0**e for e in np.arange(-2.0, 4.01, 1.0))
# Candidate kink positions per fit (data points; subsampled beyond this many distances).
_MAX_CANDIDATES = 1024
#: Query rows (evenly spaced, deterministic) on which the error beyond the fitted range is
#: measured: every pair (i, j ≤ i) of these rows counts.
BEYOND_ROWS = 256
_BEYOND_CHUNK = 16  # query rows evaluated at once (memory: chunk · 4·max_len · width floats)


# --------------------------------------------------------------------------------------------
# The 1-D problem
# --------------------------------------------------------------------------------------------
def _x_of_d(d: torch.Tensor, c: torch.Tensor, L: float, eps: float) -> torch.Tensor:
    """x_d = ψ(d)/(ψ(L) + eps) in float64, FIRE's formula for a query at i ≤ L."""
    c = c.abs()
    return torch.log1p(c * d) / (torch.log1p(c * L) + eps)


def _hidden(x: torch.Tensor, knots: torch.Tensor) -> torch.Tensor:
    """Design matrix ``[n, K + 2]``: 1, x (= ReLU(x), x ≥ 0), ReLU(x − t_k)."""
    return torch.cat([torch.ones_like(x)[:, None], x[:, None], torch.relu(x[:, None] - knots[None, :])], dim=1)


def _solve_output(Hs: torch.Tensor, Ys: torch.Tensor, ridge: float = 1e-11) -> tuple[torch.Tensor, torch.Tensor]:
    """Weighted least squares for the output layer: β ``[K+2, H]`` and the loss.

    ``Hs [n, K+2]`` and ``Ys [n, H]`` are already scaled by sqrt(weight); the loss is the
    mean over heads of the weighted squared residual (weights sum to 1). A tiny ridge,
    relative to each column's norm, keeps duplicate kinks solvable.
    """
    G = Hs.T @ Hs
    diag = G.diagonal()
    G = G + torch.diag(ridge * (diag + diag.mean()))
    beta = torch.linalg.solve(G, Hs.T @ Ys)
    r = Hs @ beta - Ys
    return beta, (r * r).sum(0).mean()


def _greedy_knots(x: torch.Tensor, s: torch.Tensor, Ys: torch.Tensor, cand: torch.Tensor, k: int) -> torch.Tensor:
    """Orthogonal least squares: pick ``k`` kinks among the data points ``x[cand]``.

    Each step adds the candidate column ReLU(x − x_m) that most reduces the weighted
    squared error summed over heads (after orthogonalising against the chosen columns).
    Returns: float64 ``[k']`` kink positions, k' ≤ k (fewer if candidates run out).
    """
    base = s[:, None] * torch.stack([torch.ones_like(x), x], dim=1)
    Q, _ = torch.linalg.qr(base)
    A = s[:, None] * torch.relu(x[:, None] - x[cand][None, :])  # [n, M]
    A = A - Q @ (Q.T @ A)
    R = Ys - Q @ (Q.T @ Ys)  # [n, H]
    norms0 = (s[:, None] * torch.relu(x[:, None] - x[cand][None, :])).pow(2).sum(0) + 1e-300
    chosen: list[int] = []
    alive = torch.ones(cand.numel(), dtype=torch.bool)
    nrm = A.pow(2).sum(0)
    for _ in range(k):
        ok = alive & (nrm > 1e-12 * norms0)
        if not ok.any():
            break
        score = (R.T @ A).pow(2).sum(0) / nrm.clamp(min=1e-300)
        score = torch.where(ok, score, torch.full_like(score, -1.0))
        m = int(score.argmax())
        q = A[:, m] / nrm[m].sqrt()
        R = R - q[:, None] * (q @ R)[None, :]
        proj = q @ A
        A = A - q[:, None] * proj[None, :]
        nrm = (nrm - proj * proj).clamp(min=0)
        alive[m] = False
        chosen.append(m)
    return x[cand[torch.tensor(chosen, dtype=torch.long)]] if chosen else x.new_zeros(0)


class _Adam:
    """Adam (Kingma & Ba 2015, Algorithm 1; β = (0.9, 0.999), ε = 1e-8) on a few tensors.

    Written out because ``torch.optim`` imports torch._dynamo on first use (seconds of
    start-up for a one-shot ``python -m fireviz fit``); the update is the textbook one.
    """

    def __init__(self, params: list[torch.Tensor], lr: float, betas=(0.9, 0.999), eps: float = 1e-8):
        self.params, self.lr, self.betas, self.eps, self.t = params, lr, betas, eps, 0
        self.m = [torch.zeros_like(p) for p in params]
        self.v = [torch.zeros_like(p) for p in params]

    def zero_grad(self) -> None:
        for p in self.params:
            p.grad = None

    @torch.no_grad()
    def step(self) -> None:
        self.t += 1
        b1, b2 = self.betas
        for p, m, v in zip(self.params, self.m, self.v):
            if p.grad is None:
                continue
            m.mul_(b1).add_(p.grad, alpha=1 - b1)
            v.mul_(b2).addcmul_(p.grad, p.grad, value=1 - b2)
            m_hat = m / (1 - b1**self.t)
            v_hat = v / (1 - b2**self.t)
            p.sub_(self.lr * m_hat / (v_hat.sqrt() + self.eps))


def _candidates(n: int) -> torch.Tensor:
    """Indices of distances that may host a kink: all of 1..n−2, or a log+linear subsample."""
    if n - 2 <= _MAX_CANDIDATES:
        return torch.arange(1, n - 1)
    half = _MAX_CANDIDATES // 2
    lin = np.linspace(1, n - 2, half)
    geo = np.geomspace(1, n - 2, half)
    idx = np.unique(np.concatenate([np.arange(1, 64), lin, geo]).round().astype(np.int64))
    return torch.as_tensor(idx[(idx >= 1) & (idx <= n - 2)])


# --------------------------------------------------------------------------------------------
# fit_fire
# --------------------------------------------------------------------------------------------
def fit_fire(
    target: FitTarget | str,
    max_len: int,
    num_heads: int | None = None,
    mlp_width: int = 32,
    steps: int = DEFAULT_STEPS,
    seed: int = 0,
    progress: Callable[[int, int, float], None] | None = None,
    should_stop: Callable[[], bool] | None = None,
    lr: float = 3e-3,
    start_progress: Callable[[int, int], None] | None = None,
) -> FitResult:
    """Fit a FIRE bias to ``target`` on all pairs ``0 ≤ j ≤ i < max_len`` (Theorem 3.1).

    Args:
      target: a ``FitTarget`` or a target name (built by ``make_target(name, num_heads)``
        with default parameters).
      max_len: fitted range in tokens (>= 2); FIRE's threshold is set to ``L = max_len``.
      num_heads: heads; must equal the target's when both are given.
      mlp_width: hidden width of f_θ (>= 2: one unit carries the linear term, the others
        place kinks).
      steps: Adam steps refining c and the kinks after the closed-form start (>= 0).
      seed: seeds the module's construction. The fit itself draws no random numbers (grid,
        greedy least squares, full-batch Adam) and overwrites every weight, so the result
        is the same for every seed; it is recorded for provenance.
      progress: called as ``progress(step, steps, loss)`` after every step (step 0 = the
        initialisation), loss = the objective below.
      should_stop: polled before every step and between the closed-form start's candidates;
        True ends the fit early with the best parameters so far (``stopped=True``; still a
        complete, valid ``FitResult``).
      lr: Adam learning rate for log c and the kink positions.
      start_progress: called as ``start_progress(done, total)`` after each candidate c of the
        closed-form start (the slow part for many heads), before any step.
    Objective: mean over heads of (RMSE_h / std_h)² on the fitted range, the per-distance
      errors weighted by their pair counts ``max_len − d`` (equal to the all-pairs error).
    Returns: ``FitResult`` (metrics are measured on the float32 module — ``FIRE.bias`` inside,
      its eq. 3–4 pieces ``psi``/``normalizer``/``mlp_forward`` on the rows beyond — not on
      the float64 fitting surrogate).
    Runs on one CPU thread (:func:`one_torch_thread`, restored afterwards): the problem
    has only ``max_len`` distances, and on shared cores one thread is several times faster.
    Raises: ValueError for max_len < 2, mlp_width < 2, steps < 0, a heads mismatch, an
      unknown target name (and whatever ``make_target`` raises).
    """
    with one_torch_thread():
        return _fit(target, max_len, num_heads, mlp_width, steps, seed, progress, should_stop, lr, start_progress)


_THREADS_LOCK = threading.Lock()
_threads_state = {"depth": 0, "before": 1}


@contextlib.contextmanager
def one_torch_thread():
    """Run the block with ``torch.set_num_threads(1)``, restoring the count afterwards.

    The setting is process-wide and the app runs fits in worker threads, so overlapping blocks
    share it: the first to enter records the count, the last to leave restores it (a plain
    save/restore per fit left the process on one thread when two fits overlapped).
    """
    with _THREADS_LOCK:
        if _threads_state["depth"] == 0:
            _threads_state["before"] = torch.get_num_threads()
            torch.set_num_threads(1)
        _threads_state["depth"] += 1
    try:
        yield
    finally:
        with _THREADS_LOCK:
            _threads_state["depth"] -= 1
            if _threads_state["depth"] == 0:
                torch.set_num_threads(_threads_state["before"])


def _check_fit_args(target, max_len, num_heads, mlp_width, steps) -> FitTarget:
    if isinstance(target, str):
        target = make_target(target, num_heads)
    if not isinstance(max_len, (int, np.integer)) or max_len < 2:
        raise ValueError(
            f"max_len must be an integer >= 2 tokens (got {max_len!r}); FIRE needs at least two distances to fit"
        )
    if mlp_width < 2:
        raise ValueError(f"mlp_width must be >= 2 (got {mlp_width}): one unit for the linear term, the rest for kinks")
    if steps < 0:
        raise ValueError(f"steps must be >= 0 (got {steps})")
    if num_heads is not None and num_heads != target.num_heads:
        raise ValueError(f"num_heads={num_heads} but target {target.name!r} has {target.num_heads} heads")
    from .memory import check_fits, fit_bytes

    check_fits(
        fit_bytes(target.num_heads, int(max_len), mlp_width, BEYOND_FACTOR, _BEYOND_CHUNK),
        "cpu",
        f"fitting {target.num_heads} heads over max_len {max_len}",
        "lower max_len or the number of heads",
    )
    return target


@dataclass
class _FitData:
    """The 1-D problem: distances ``d [n]``, √pair-weights ``s [n]``, per-head standardised
    targets ``Ys [n, H]`` (weighted by s) and the ``mean``/``scale [H]`` that undo it."""

    d: torch.Tensor
    s: torch.Tensor
    Ys: torch.Tensor
    mean: torch.Tensor
    scale: torch.Tensor


def _fit_data(target: FitTarget, max_len: int) -> _FitData:
    d = torch.arange(max_len, dtype=torch.float64)
    y = target.bias_by_distance(torch.arange(max_len)).double().T  # [n, H]
    w = (max_len - d) / (max_len - d).sum()  # pairs (i, j) with i − j = d among 0 <= j <= i < max_len
    s = w.sqrt()
    mean = (w[:, None] * y).sum(0)
    std = ((w[:, None] * (y - mean) ** 2).sum(0)).sqrt()
    scale = torch.where(std > 1e-12 * (1 + mean.abs()), std, torch.ones_like(std))
    return _FitData(d, s, s[:, None] * (y - mean) / scale, mean, scale)


def _closed_form_start(fd: _FitData, L: float, eps: float, K: int, max_len: int, should_stop, start_progress):
    """Best c on a grid of c·L, kinks by orthogonal least squares: ``(c0, knots0 [K], n_live, stopped)``."""
    cand = _candidates(max_len)
    best = None

    def try_c(cl: float):
        nonlocal best
        c = torch.tensor(cl / L, dtype=torch.float64)
        x = _x_of_d(fd.d, c, L, eps)
        knots = _greedy_knots(x, fd.s, fd.Ys, cand, K)
        _, loss = _solve_output(fd.s[:, None] * _hidden(x, knots), fd.Ys)
        if best is None or float(loss) < best[0]:
            best = (float(loss), c, knots, cl)

    total_start, stopped = len(_CL_GRID) + 2, False
    for k, cl in enumerate(_CL_GRID, 1):  # coarse grid of c·L, then the two half-way points around the best
        try_c(cl)
        if start_progress is not None:
            start_progress(k, total_start)
        if should_stop is not None and should_stop():
            stopped = True
            break
    coarse = best[3]
    for k, factor in enumerate((10**-0.5, 10**0.5) if not stopped else (), len(_CL_GRID) + 1):
        try_c(coarse * factor)
        if start_progress is not None:
            start_progress(k, total_start)
    _, c0, knots0, _ = best
    n_live = knots0.numel()
    if n_live < K:  # too few distinct data points: park the spare kinks beyond x = 1 (never active)
        knots0 = torch.cat([knots0, torch.full((K - n_live,), 2.0, dtype=torch.float64)])
    return c0, knots0, n_live, stopped


def _refine(
    fd: _FitData,
    L: float,
    eps: float,
    c0,
    knots0,
    n_live: int,
    steps: int,
    lr: float,
    stopped: bool,
    progress,
    should_stop,
):
    """Adam on log c and the kinks (variable projection: the output layer solved at every step).
    Returns ``(best (log_c, knots), loss curve, steps run, stopped)``."""
    K = knots0.numel()
    log_c = torch.nn.Parameter(c0.log().clone())
    knots = torch.nn.Parameter(knots0.clone())
    live = torch.arange(K) < n_live
    opt = _Adam([log_c, knots], lr=lr)

    def objective():
        x = _x_of_d(fd.d, log_c.exp(), L, eps)
        kn = torch.where(live, knots, knots.detach())
        return _solve_output(fd.s[:, None] * _hidden(x, kn), fd.Ys)

    curve: list[float] = []
    best_loss, best_state = math.inf, (log_c.detach().clone(), knots.detach().clone())

    def record(loss: torch.Tensor, step: int) -> None:
        nonlocal best_loss, best_state
        value = float(loss.detach())
        curve.append(value)
        if value < best_loss:  # the loss of the current parameters, before stepping them
            best_loss, best_state = value, (log_c.detach().clone(), knots.detach().clone())
        if progress is not None:
            progress(step, steps, value)

    _, loss = objective()
    record(loss, 0)
    steps_run = 0
    for step in range(1, steps + 1 if not stopped else 1):
        if should_stop is not None and should_stop():
            stopped = True
            break
        if not torch.isfinite(loss):
            break
        opt.zero_grad()
        loss.backward()
        opt.step()
        steps_run = step
        _, loss = objective()  # at the new parameters; its backward drives the next step
        record(loss, step)
    return best_state, curve, steps_run, stopped


@torch.no_grad()
def _write_module(module: FIRE, fd: _FitData, L: float, eps: float, best_state, n_live: int) -> None:
    """The best iterate into the module: unit 0 = ReLU(x) (linear term), units k ≥ 1 =
    ReLU(x − t_k); output = per-head scale · β + mean."""
    log_c_best, knots_best = best_state
    K = knots_best.numel()
    c_best = log_c_best.exp().float().double()  # the module stores c in float32
    x = _x_of_d(fd.d, c_best, L, eps)
    beta, _ = _solve_output(fd.s[:, None] * _hidden(x, knots_best), fd.Ys)
    beta = beta * fd.scale[None, :]  # [K + 2, H]
    lin1, lin2 = module.mlp[0], module.mlp[2]
    module.c.fill_(float(c_best))
    lin1.weight.fill_(1.0)
    lin1.bias.zero_()
    lin1.bias[1:] = (-knots_best).float()
    lin2.weight.copy_(beta[1:].T.float())
    lin2.bias.copy_((beta[0] + fd.mean).float())
    if n_live < K:  # parked kinks: the unit stays off on [0, 1]; zero its output anyway
        lin2.weight[:, 1 + n_live :] = 0.0


def _fit(
    target, max_len, num_heads, mlp_width, steps, seed, progress, should_stop, lr, start_progress=None
) -> FitResult:
    t0 = time.perf_counter()
    target = _check_fit_args(target, max_len, num_heads, mlp_width, steps)
    max_len, H = int(max_len), target.num_heads
    with torch.random.fork_rng(devices=[]):  # leave the caller's RNG stream untouched
        torch.manual_seed(seed)
        module = FIRE(H, mlp_width=mlp_width, init_L=float(max_len))
    L, eps = float(module.threshold().detach()), module.eps
    fd = _fit_data(target, max_len)
    c0, knots0, n_live, stopped = _closed_form_start(fd, L, eps, mlp_width - 1, max_len, should_stop, start_progress)
    best_state, curve, steps_run, stopped = _refine(
        fd, L, eps, c0, knots0, n_live, steps, lr, stopped, progress, should_stop
    )
    _write_module(module, fd, L, eps, best_state, n_live)
    return _evaluate(module, target, max_len, curve, steps, steps_run, stopped, t0, mlp_width, seed)


@torch.no_grad()
def _evaluate(
    module: FIRE,
    target: FitTarget,
    max_len: int,
    curve: list[float],
    steps: int,
    steps_run: int,
    stopped: bool,
    t0: float,
    mlp_width: int,
    seed: int,
) -> FitResult:
    """Measure the float32 module inside and beyond the fitted range (see ``FitResult``)."""
    H, n = target.num_heads, max_len
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
    rel = _ratio(rmse, math.sqrt(var_all))
    rel_h = [_ratio(math.sqrt(float(e) / npairs), math.sqrt(float(v))) for e, v in zip(sse_h, var_h)]
    max_abs = float(r.abs().max())

    # Beyond: queries max_len ≤ i < 4·max_len over all keys j ≤ i.
    top = BEYOND_FACTOR * n
    rows = np.unique(np.linspace(n, top - 1, min(BEYOND_ROWS, top - n)).round().astype(np.int64))
    table = target.bias_by_distance(torch.arange(top)).double()  # [H, top]
    sse_b = torch.zeros(H, dtype=torch.float64)
    s1 = torch.zeros(H, dtype=torch.float64)
    s2 = torch.zeros(H, dtype=torch.float64)
    count, max_b = 0, 0.0
    psi_d = module.psi(torch.arange(top))  # [top]
    for start in range(0, rows.size, _BEYOND_CHUNK):
        # FIRE's formula (eq. 3–4) for queries i over d = 0..top−1, the same values as
        # ``module.bias`` (tests check it); distances d > i are masked out. Every chunk has
        # the same shape (the last one padded), so torch's kernels are set up once.
        q = torch.as_tensor(rows[start : start + _BEYOND_CHUNK])
        q = torch.cat([q, q[-1:].expand(_BEYOND_CHUNK - q.numel())])
        x = psi_d[None, :] / module.normalizer(q)[:, None]  # [chunk, top]
        causal = torch.arange(top)[None, :] <= q[:, None]
        causal[min(rows.size - start, _BEYOND_CHUNK) :] = False  # padding rows
        fb = module.mlp_forward(x).double()  # [H, chunk, top]
        tb = table[:, None, :].expand_as(fb)
        diff = torch.where(causal, fb - tb, torch.zeros(()))
        tb = torch.where(causal, tb, torch.zeros(()))
        sse_b += (diff * diff).sum((1, 2))
        s1 += tb.sum((1, 2))
        s2 += (tb * tb).sum((1, 2))
        count += int(causal.sum())
        max_b = max(max_b, float(diff.abs().max()))
    var_bh = (s2 / count - (s1 / count) ** 2).clamp(min=0)
    mean_b = float(s1.sum()) / (count * H)
    var_b = max(float(s2.sum()) / (count * H) - mean_b**2, 0.0)
    rmse_b = math.sqrt(float(sse_b.sum()) / (count * H))
    rel_b = _ratio(rmse_b, math.sqrt(var_b))
    rel_bh = [_ratio(math.sqrt(float(e) / count), math.sqrt(float(v))) for e, v in zip(sse_b, var_bh)]

    q_last = top - 1
    beyond_fit = module.mlp_forward(psi_d / module.normalizer(torch.tensor([q_last])))  # [H, top], d = 0..top−1
    c_val = float(module.c.detach())
    return FitResult(
        module=module,
        target=target,
        max_len=n,
        loss_curve=curve,
        relative_rmse=rel,
        relative_rmse_per_head=rel_h,
        max_abs_error=max_abs,
        rmse=rmse,
        relative_rmse_beyond=rel_b,
        relative_rmse_beyond_per_head=rel_bh,
        max_abs_error_beyond=max_b,
        rmse_beyond=rmse_b,
        beyond_rows=int(rows.size),
        distance=np.arange(n),
        target_values=tgt.float().numpy(),
        fitted_values=fitted.float().numpy(),
        weights=w.numpy(),
        beyond_query=q_last,
        beyond_distance=np.arange(top),
        beyond_target=table.float().numpy(),
        beyond_fitted=beyond_fit.numpy(),
        steps=steps,
        steps_run=steps_run,
        stopped=stopped,
        seconds=time.perf_counter() - t0,
        mlp_width=mlp_width,
        seed=seed,
        c=c_val,
    )


def _ratio(num: float, den: float) -> float:
    if den > 0:
        return num / den
    return 0.0 if num == 0 else math.inf
