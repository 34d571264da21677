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

A fit is described by one frozen :class:`FitSettings` (the target, max_len, width, steps,
seed, learning rate), validated once; :func:`run_fit` computes it and :func:`fit_fire` is the
same call with plain arguments. The errors are measured by ``fireviz.fit.measure``.

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
from dataclasses import dataclass, field
from typing import Callable, Mapping, cast

import numpy as np
import torch

from fireviz.core import as_float, as_int, as_seed
from fireviz.encodings import FIRE
from fireviz.fit.measure import BEYOND_CHUNK, measure_fit
from fireviz.fit.result import BEYOND_FACTOR, FitResult, json_safe
from fireviz.fit.targets import FitTarget, check_num_heads, make_target, target_names
from fireviz.model import check_fits, fit_bytes

#: Default optimisation steps of ``fit_fire`` (after the closed-form initialisation).
DEFAULT_STEPS = 300
#: Default Adam learning rate of ``fit_fire`` for log c and the kink positions.
DEFAULT_LR = 3e-3


# Grid of c·L (c times the threshold L) tried by the initialisation, from ψ nearly linear
# in d (c·L = 0.01) to strongly logarithmic (c·L = 10⁴); refined by √10 around the best.
_CL_GRID = tuple(10.0**e for e in np.arange(-2.0, 4.01, 1.0))
# Candidate kink positions per fit (data points; subsampled beyond this many distances).
_MAX_CANDIDATES = 1024


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
        for p, m, v in zip(self.params, self.m, self.v, strict=True):
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
def _check_numbers(max_len, mlp_width, steps, seed, lr) -> tuple[int, int, int, int, float]:
    """The fit's numbers as plain ints / float, each checked (no checkpoint is read for this).
    Raises: ValueError naming the argument."""
    return (
        as_int(max_len, "max_len", 2, hint="the fitted range in tokens; FIRE needs at least two distances"),
        as_int(mlp_width, "mlp_width", 2, hint="one unit for the linear term, the rest for kinks"),
        as_int(steps, "steps", 0, hint="Adam steps after the closed-form start"),
        as_seed(seed),
        as_float(lr, "lr", 0, lo_open=True, hint=f"the Adam learning rate; the default is {DEFAULT_LR}"),
    )


@dataclass(frozen=True)
class FitSettings:
    """Everything that decides a fit's numbers, validated on construction (:meth:`FitSettings.make`,
    or ``FitSettings(target, max_len, …)`` with a built ``FitTarget``: the same checks).

    Fields: ``target`` (the built ``FitTarget``: its name, JSON-able ``params`` and heads; a
    ``checkpoint`` target is the loaded layer's bias, its params carry the weights' sha256),
    ``max_len`` (fitted range in tokens, >= 2: every pair ``0 ≤ j ≤ i < max_len``; FIRE's
    threshold is ``L = max_len``), ``mlp_width`` (hidden units of f_θ, >= 2: one carries the
    linear term, the others place kinks), ``steps`` (Adam steps after the closed-form start,
    >= 0), ``seed`` (0 … 2⁶⁴ − 1; seeds the module's construction; the fit draws no random
    numbers, so it is provenance only), ``lr`` (Adam learning rate for log c and the kinks, a
    finite number > 0). Integers are ints or numpy ints, never bools, floats or strings.
    ``num_heads`` is the target's. :meth:`describe` is the JSON description (the job key's
    settings and ``FitResult.to_dict``'s), :meth:`caption` the same in words.
    """

    target: FitTarget = field(hash=False)
    max_len: int
    mlp_width: int
    steps: int
    seed: int
    lr: float = DEFAULT_LR

    @classmethod
    def make(
        cls,
        target: FitTarget | str,
        max_len: int,
        num_heads: int | None = None,
        mlp_width: int = 32,
        steps: int = DEFAULT_STEPS,
        seed: int = 0,
        lr: float = DEFAULT_LR,
        target_params: dict | None = None,
    ) -> "FitSettings":
        """Validated settings (the arguments of :func:`fit_fire`). ``target`` is a ``FitTarget`` or
        a target name, built here by ``make_target(target, num_heads, **target_params)`` after
        every other argument is checked (a checkpoint target is read last).

        Raises: ValueError naming the argument for a target that is neither a name nor a
          ``FitTarget``, ``target_params`` that are not a dict (or given with a ``FitTarget``),
          max_len not an integer >= 2, mlp_width not an integer >= 2, steps not an integer >= 0,
          a seed outside 0 … 2⁶⁴ − 1, lr not a finite number > 0, ``num_heads`` not an integer in
          1 … MAX_FIT_HEADS or different from the target's; whatever ``make_target`` raises
          (CheckpointError for a checkpoint target that does not load); a fit that would not fit
          in memory or a target whose bias is not finite on the distances fitted and measured.
        """
        numbers = _check_numbers(max_len, mlp_width, steps, seed, lr)  # cheap checks before any loading
        heads = None if num_heads is None else check_num_heads(num_heads)
        if isinstance(target, str):
            if target_params is not None and not isinstance(target_params, Mapping):
                raise ValueError(
                    f"target_params must be a dict of the target's parameters (got {target_params!r}), "
                    "e.g. {'slope': 0.5}"
                )
            target = make_target(target, heads, **(target_params or {}))
        elif not isinstance(target, FitTarget):
            raise ValueError(
                f"target must be a target name (one of {', '.join(target_names())}) or a FitTarget (got {target!r})"
            )
        elif target_params:
            raise ValueError("target_params apply to a target name; a FitTarget is already built")
        if heads is not None and heads != target.num_heads:
            raise ValueError(f"num_heads={heads} but target {target.name!r} has {target.num_heads} heads")
        return cls(target, *numbers)

    def __post_init__(self):
        if not isinstance(self.target, FitTarget):
            raise ValueError(f"target must be a FitTarget (got {self.target!r}); FitSettings.make builds one by name")
        names = ("max_len", "mlp_width", "steps", "seed", "lr")
        for name, value in zip(names, _check_numbers(*(getattr(self, n) for n in names)), strict=True):
            object.__setattr__(self, name, value)  # frozen: the checked values replace what was given
        _check_fit_fits(self.target, self.max_len, self.mlp_width)

    @property
    def num_heads(self) -> int:
        """Heads of the target (and of the fitted FIRE)."""
        return self.target.num_heads

    def describe(self) -> dict:
        """The fit as JSON (what decides its numbers; the job key's settings): ``target`` (name),
        ``target_params`` (the target's own description: e.g. ALiBi's slopes, a checkpoint's
        path, layer, encoding, training length and ``checkpoint_sha256``), ``num_heads``, ``max_len`` (tokens),
        ``mlp_width``, ``steps``, ``seed``, ``lr``. Non-finite numbers become null."""
        return json_safe(
            {
                "target": self.target.name,
                "target_params": self.target.params,
                "num_heads": self.num_heads,
                "max_len": self.max_len,
                "mlp_width": self.mlp_width,
                "steps": self.steps,
                "seed": self.seed,
                "lr": self.lr,
            }
        )

    def caption(self) -> str:
        """The fit in words, e.g. ``"FIRE (width 32) to alibi (8 heads) on all pairs 0 ≤ j ≤ i < 512
        tokens, 300 steps, seed 0"`` (what ``python -m fireviz fit`` says it is fitting)."""
        return (
            f"FIRE (width {self.mlp_width}) to {self.target.name} ({self.num_heads} heads) on all pairs "
            f"0 ≤ j ≤ i < {self.max_len} tokens, {self.steps} steps, seed {self.seed}"
        )


def _check_fit_fits(target: FitTarget, max_len: int, mlp_width: int) -> None:
    """Refuse a fit that would not fit in memory, then one whose target is not finite on the
    distances the fit uses and measures (0 … BEYOND_FACTOR·max_len − 1). Raises: ValueError."""

    check_fits(
        fit_bytes(target.num_heads, max_len, mlp_width, BEYOND_FACTOR, BEYOND_CHUNK),
        "cpu",
        f"fitting {target.num_heads} heads over max_len {max_len}",
        "lower max_len or the number of heads",
    )
    values = target.bias_by_distance(torch.arange(BEYOND_FACTOR * max_len))
    if not torch.isfinite(values).all():
        d = int(torch.nonzero(~torch.isfinite(values).all(0))[0])
        raise ValueError(
            f"target {target.name!r} has a non-finite bias at distance {d} (the fit uses distances up to "
            f"{BEYOND_FACTOR * max_len - 1}); give smaller parameters or a smaller max_len"
        )


def fit_fire(
    target: FitTarget | str,
    max_len: int,
    num_heads: int | None = None,
    mlp_width: int = 32,
    steps: int = DEFAULT_STEPS,
    seed: int = 0,
    progress: Callable[[int, int, float], None] | None = None,
    should_stop: Callable[[], bool] | None = None,
    lr: float = DEFAULT_LR,
    start_progress: Callable[[int, int], None] | None = None,
) -> FitResult:
    """Fit a FIRE bias to ``target`` on all pairs ``0 ≤ j ≤ i < max_len`` (Theorem 3.1):
    ``run_fit(FitSettings.make(target, max_len, num_heads, mlp_width, steps, seed, lr), …)``.

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
      progress, should_stop, start_progress: as :func:`run_fit`.
      lr: Adam learning rate for log c and the kink positions (> 0).
    Returns: ``FitResult`` (see :func:`run_fit`).
    Raises: ValueError naming the argument (max_len < 2, mlp_width < 2, steps < 0, a bool, float
      or string where an integer belongs, a heads mismatch, an unknown target name, whatever
      ``make_target`` raises); see ``FitSettings.make``.
    """
    with one_torch_thread():
        settings = FitSettings.make(target, max_len, num_heads, mlp_width, steps, seed, lr)
        return run_fit(settings, progress, should_stop, start_progress)


def run_fit(
    settings: FitSettings,
    progress: Callable[[int, int, float], None] | None = None,
    should_stop: Callable[[], bool] | None = None,
    start_progress: Callable[[int, int], None] | None = None,
) -> FitResult:
    """Fit FIRE as ``settings`` say (a :class:`FitSettings`, already validated).

    Args:
      progress: called as ``progress(step, steps, loss)`` after every step (step 0 = the
        initialisation), loss = the objective below.
      should_stop: polled before every step and between the closed-form start's candidates;
        True ends the fit early with the best parameters so far (``stopped=True``; still a
        complete, valid ``FitResult``).
      start_progress: called as ``start_progress(done, total)`` after each candidate c of the
        closed-form start (the slow part for many heads), before any step.
    Objective: mean over heads of (RMSE_h / std_h)² on the fitted range, the per-distance
      errors weighted by their pair counts ``max_len − d`` (equal to the all-pairs error).
    Returns: ``FitResult`` (metrics are measured on the float32 module — ``FIRE.bias`` inside,
      its eq. 3–4 pieces ``psi``/``normalizer``/``mlp_forward`` on the rows beyond — not on
      the float64 fitting surrogate; ``fireviz.fit.measure``).
    Runs on one CPU thread (:func:`one_torch_thread`, restored afterwards): the problem
    has only ``max_len`` distances, and on shared cores one thread is several times faster.
    """
    with one_torch_thread():
        return _fit(settings, progress, should_stop, start_progress)


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
    assert best is not None  # try_c ran at least once
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
    lin1, lin2 = cast(torch.nn.Linear, module.mlp[0]), cast(torch.nn.Linear, module.mlp[2])
    module.c.fill_(float(c_best))
    lin1.weight.fill_(1.0)
    lin1.bias.zero_()
    lin1.bias[1:] = (-knots_best).float()
    lin2.weight.copy_(beta[1:].T.float())
    lin2.bias.copy_((beta[0] + fd.mean).float())
    if n_live < K:  # parked kinks: the unit stays off on [0, 1]; zero its output anyway
        lin2.weight[:, 1 + n_live :] = 0.0


def _fit(s: FitSettings, progress, should_stop, start_progress) -> FitResult:
    t0 = time.perf_counter()
    max_len, H = s.max_len, s.num_heads
    with torch.random.fork_rng(devices=[]):  # leave the caller's RNG stream untouched
        torch.manual_seed(s.seed)
        module = FIRE(H, mlp_width=s.mlp_width, init_L=float(max_len))
    L, eps = float(module.threshold().detach()), module.eps
    fd = _fit_data(s.target, max_len)
    c0, knots0, n_live, stopped = _closed_form_start(fd, L, eps, s.mlp_width - 1, max_len, should_stop, start_progress)
    best_state, curve, steps_run, stopped = _refine(
        fd, L, eps, c0, knots0, n_live, s.steps, s.lr, stopped, progress, should_stop
    )
    _write_module(module, fd, L, eps, best_state, n_live)
    return measure_fit(module, s, curve, steps_run, stopped, t0)
