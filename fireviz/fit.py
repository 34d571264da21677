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

import argparse
import contextlib
import json
import math
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import numpy as np
import torch

from .encodings import FIRE, encoding_spec, fit_target_names
from .encodings.base import ToeplitzBias
from .encodings.specs import t5_bucket_values  # noqa: F401  (public here since it was first defined in fit)
from .files import FileFormatError, atomic_write, read_json, read_safetensors, write_json_atomic
from .model import CheckpointError

#: Built-in targets ``make_target`` builds (``target_names()`` adds registered encodings);
#: ``checkpoint`` reads a trained or published model's own bias.
TARGET_NAMES: tuple[str, ...] = fit_target_names() + ("checkpoint",)
#: Built-in position encodings of a checkpoint whose learned bias can be a fit target (Toeplitz
#: biases: a function of i − j only, which Theorem 3.1 covers); see ``fittable_encodings()``.
FITTABLE_ENCODINGS: tuple[str, ...] = fit_target_names()
#: Parameters of the ``checkpoint`` target (the others' come from their ``EncodingSpec.fit_params``).
CHECKPOINT_PARAMS = frozenset({"path", "layer", "stack"})


def target_names() -> tuple[str, ...]:
    """Every fit target: each registered encoding with a ``fit_target`` spec, then ``checkpoint``."""
    return fit_target_names() + ("checkpoint",)


def fittable_encodings() -> tuple[str, ...]:
    """Registered encodings whose checkpoints can be fit targets (their spec has a fit target)."""
    return fit_target_names()


def target_params(name: str) -> frozenset[str]:
    """Keyword parameters target ``name`` takes (see ``make_target``). Raises ValueError for an unknown target."""
    if name == "checkpoint":
        return CHECKPOINT_PARAMS
    if name not in fit_target_names():
        raise ValueError(f"unknown fit target {name!r}; choose one of {', '.join(target_names())}")
    return frozenset(encoding_spec(name).fit_params)


#: Keyword parameters of each built-in target (``target_params`` for any registered one).
TARGET_PARAMS: dict[str, frozenset[str]] = {n: target_params(n) for n in TARGET_NAMES}

#: Multiple of ``max_len`` up to which ``fit_fire`` measures the error beyond the fitted range.
BEYOND_FACTOR = 4

#: Default optimisation steps of ``fit_fire`` (after the closed-form initialisation).
DEFAULT_STEPS = 300

#: Safetensors metadata key holding a fitted FIRE's constructor options (JSON).
FIRE_OPTIONS_KEY = "fireviz.fire_options"

# Grid of c·L (c times the threshold L) tried by the initialisation, from ψ nearly linear
# in d (c·L = 0.01) to strongly logarithmic (c·L = 10⁴); refined by √10 around the best.
#: Most heads one fit takes: the closed-form start costs ~0.07 s per head at max_len 512 (one
#: core), so 1024 heads is a ~1-minute start; published models have at most 128 heads a layer.
MAX_FIT_HEADS = 1024
_CL_GRID = tuple(10.0 ** e for e in np.arange(-2.0, 4.01, 1.0))
# Candidate kink positions per fit (data points; subsampled beyond this many distances).
_MAX_CANDIDATES = 1024
#: Query rows (evenly spaced, deterministic) on which the error beyond the fitted range is
#: measured: every pair (i, j ≤ i) of these rows counts.
BEYOND_ROWS = 256
_BEYOND_CHUNK = 16  # query rows evaluated at once (memory: chunk · 4·max_len · width floats)


# --------------------------------------------------------------------------------------------
# Targets
# --------------------------------------------------------------------------------------------
@dataclass
class FitTarget:
    """A Toeplitz bias to fit: ``g_h(d)`` logits for distances ``d = i − j`` (tokens).

    Attributes:
      name: one of ``TARGET_NAMES``.
      encoding: the fireviz encoding that defines the bias (T5RelativeBias, ALiBi, KerpleLog,
        KerplePower or Sandwich), evaluated through its own ``bias_by_distance``; so the
        target's extrapolation beyond the fitted range is that encoding's own formula.
      params: JSON-able description of the parameters (what the CLI and ``to_dict`` show).
    """

    name: str
    encoding: ToeplitzBias
    params: dict = field(default_factory=dict)

    @property
    def num_heads(self) -> int:
        """Number of attention heads of the target bias (its first output dimension)."""
        return self.encoding.num_heads

    @torch.no_grad()
    def bias_by_distance(self, d: torch.Tensor) -> torch.Tensor:
        """Target logits, float32 ``[num_heads, *d.shape]`` for int distances ``d`` (tokens)."""
        return self.encoding.bias_by_distance(d.to(self.encoding.device)).float().cpu()


def make_target(name: str, num_heads: int | None = None, **params) -> FitTarget:
    """Build a fit target by name, with its parameters.

    Args:
      name: one of ``TARGET_NAMES``.
      num_heads: heads (>= 1); not needed for ``checkpoint`` (taken from the checkpoint).
      params by target:
        * ``t5``: ``num_buckets`` (32), ``max_distance`` (128 tokens), ``values``
          ("random" (default) | "decay" | numbers, see ``t5_bucket_values``), ``seed`` (0).
          Causal bucketing (``relative_position_bucket``, Raffel et al. 2020 §2.1).
        * ``alibi``: ``slope`` (None → ``alibi_slopes(num_heads)``, Press et al. 2022 §3;
          a number → that slope for every head). Bias ``−m_h·d``.
        * ``kerple_log`` / ``kerple_power``: ``r1``, ``r2`` (a number or ``num_heads``
          numbers; None → a seeded draw from the reference init r1 ~ U(0, 2), r2 ~ U(0, 1),
          clamped to >= 0.01), ``seed`` (0). Bias ``−r1·log(1 + r2·d)`` resp. ``−r1·d^r2``
          (Chi et al. 2022, §4.2).
        * ``sandwich``: ``dbar`` (128, even). Bias ``(S(d) − dbar/2)/r_h``, ``r_h = 8h/H``
          (Chi et al. 2023, §5).
        * ``checkpoint``: ``path`` (a checkpoint folder or Hub id), ``layer`` (0); see
          ``target_from_checkpoint``.
    Returns: a ``FitTarget``.
    Raises: ValueError for an unknown target or parameter, num_heads < 1, an ALiBi slope
      that is not > 0, Kerple r1 or r2 outside (0.01, ∞) (r2 <= 2 for the power variant),
      bad T5 bucketing/values, an odd dbar, a checkpoint whose heads differ from
      ``num_heads``; CheckpointError/ValueError from ``target_from_checkpoint``.
    """
    allowed = target_params(name)  # raises for an unknown target
    unknown = set(params) - allowed
    if unknown:
        raise ValueError(f"target {name!r} does not take parameter(s) {sorted(unknown)}; allowed: "
                         f"{', '.join(sorted(allowed)) or 'none'}")
    if name == "checkpoint":
        if "path" not in params:
            raise ValueError("target 'checkpoint' needs path=<checkpoint folder> (CLI: --checkpoint PATH)")
        target = target_from_checkpoint(params["path"], int(params.get("layer", 0)), params.get("stack"))
        if num_heads is not None and num_heads != target.num_heads:
            raise ValueError(f"checkpoint {params['path']} has {target.num_heads} heads, not {num_heads}; "
                             "omit num_heads (CLI: --heads) to use the checkpoint's")
        return target
    if num_heads is None or int(num_heads) < 1:
        raise ValueError(f"num_heads must be >= 1 (got {num_heads})")
    if int(num_heads) > MAX_FIT_HEADS:
        raise ValueError(f"num_heads={num_heads} is more than the {MAX_FIT_HEADS} heads a fit takes (published models "
                         f"have at most 128 per layer); fit fewer heads, e.g. --heads 8")
    enc, shown = encoding_spec(name).fit_target(int(num_heads), **params)  # the encoding's own spec builds it
    return FitTarget(name, enc, shown)


def target_from_checkpoint(path: str, layer: int = 0, stack: str | None = None) -> FitTarget:
    """The learned (or fixed) bias of one layer of a trained fireviz GPT checkpoint, or of a
    published model (a transformers folder or Hub id read through ``fireviz.hub``: T5-family
    tables of ``stack`` — decoder by default; for the bidirectional encoder its keys before
    the query, i.e. d = i − j >= 0 — or ALiBi slopes).

    Loads ``fireviz.checkpoints.load_model(path)`` (safetensors only) and takes
    ``model.encoding(layer)``; for T5, ALiBi, Kerple and Sandwich that bias depends on
    ``d = i − j`` only, so its ``bias_by_distance`` is the target (and its extrapolation).
    Returns: ``FitTarget(name="checkpoint", ...)`` with params ``path``, ``layer``,
      ``encoding`` (the checkpoint's encoding name) and ``seq_len`` (its training length).
    Raises: CheckpointError (CheckpointNotFoundError for a path with nothing there; not a
      checkpoint folder, corrupt files); ValueError if the layer is out of range or the encoding is not one of t5, alibi, kerple_log, kerple_power, sandwich.
    """
    from . import hub
    from .checkpoints import CheckpointNotFoundError, load_model

    local = Path(str(path)).expanduser()
    if (local.is_absolute() or str(path).startswith((".", "~")) or local.exists()) and not local.is_dir():
        raise CheckpointNotFoundError(f"checkpoint {path} not found: give a folder holding config.json and "
                                      "model.safetensors (e.g. checkpoints/<name>) or a Hugging Face repo id")
    model = None
    cfg_file = local / "config.json"
    if local.is_dir() and cfg_file.is_file():
        try:
            if hub.is_transformers_config(read_json(cfg_file)):
                model = hub.load_published(str(local), stack=stack or "decoder")
        except FileFormatError:
            pass  # the checkpoint loader names the problem
    elif hub.looks_like_hub_id(str(path)):
        try:
            model = hub.load_published(str(path), stack=stack or "decoder")
        except hub.NotPublishedModelError:
            model = None  # a fireviz checkpoint on the Hub
    if model is None:
        if stack is not None:
            raise ValueError("stack applies to published encoder–decoder models only; drop it for a fireviz checkpoint")
        model = load_model(str(local) if local.is_dir() else str(path))
    cfg = model.config
    if not 0 <= int(layer) < cfg.n_layer:
        raise ValueError(f"layer {layer} is out of range: checkpoint {path} has layers 0..{cfg.n_layer - 1}")
    allowed = fittable_encodings()
    enc = model.encoding(int(layer))
    if cfg.position_encoding not in allowed or not isinstance(enc, ToeplitzBias):
        raise ValueError(f"checkpoint {path} uses position encoding {cfg.position_encoding!r}; fitting FIRE "
                         f"needs a Toeplitz bias: one of {', '.join(allowed)}")
    enc.requires_grad_(False)
    params = {"path": str(path), "layer": int(layer), "encoding": cfg.position_encoding, "seq_len": cfg.seq_len}
    if isinstance(model, hub.PublishedModel):
        params.update(published=model.config.family, revision=model.config.revision, stack=model.config.stack)
    return FitTarget("checkpoint", enc, params)


# --------------------------------------------------------------------------------------------
# Result
# --------------------------------------------------------------------------------------------
@dataclass
class FitResult:
    """Outcome of ``fit_fire``.

    Attributes:
      module: the fitted ``FIRE`` (float32, ``init_L = max_len``, multiplier 1, so
        ``threshold() = max_len`` tokens); ``bias(q, k)`` gives its logits.
      target: the ``FitTarget`` fitted.
      max_len: fitted range, tokens: all pairs ``0 ≤ j ≤ i < max_len``.
      loss_curve: objective per step (mean over heads of (RMSE_h/std_h)², fitted range);
        entry 0 is the closed-form initialisation.
      relative_rmse: RMSE over all fitted pairs and heads / std of the target over them.
      relative_rmse_per_head: the same per head, ``[num_heads]``.
      max_abs_error: max |FIRE − target| over fitted pairs and heads (logits).
      rmse: RMSE over the fitted range (logits).
      relative_rmse_beyond / max_abs_error_beyond / rmse_beyond / relative_rmse_beyond_per_head:
        the same over pairs with query ``max_len ≤ i < 4·max_len`` (all ``j ≤ i``), against
        the target's own formula at those distances; see ``beyond_rows``.
      beyond_rows: query rows measured beyond: all of ``max_len … 4·max_len − 1`` when
        they are at most ``BEYOND_ROWS`` (256), else 256 evenly spaced ones (every pair
        ``j ≤ i`` of a measured row counts).
      distance, target_values, fitted_values: per-distance curves inside the fitted range:
        ``d = 0..max_len−1`` and float32 ``[num_heads, max_len]`` logits (FIRE is a function
        of d there); ``weights``: pairs per distance, ``max_len − d``.
      beyond_query: the query position of the beyond curves, ``4·max_len − 1``;
        beyond_distance, beyond_target, beyond_fitted: that row's curves, ``d = 0..4·max_len−1``.
      steps, steps_run, stopped: requested steps, steps taken, whether ``should_stop`` ended it.
      seconds: wall-clock seconds of the whole fit including the evaluation.
      mlp_width, seed, c: width of f_θ, the seed, the fitted c.
    """

    module: FIRE
    target: FitTarget
    max_len: int
    loss_curve: list[float]
    relative_rmse: float
    relative_rmse_per_head: list[float]
    max_abs_error: float
    rmse: float
    relative_rmse_beyond: float
    relative_rmse_beyond_per_head: list[float]
    max_abs_error_beyond: float
    rmse_beyond: float
    beyond_rows: int
    distance: np.ndarray
    target_values: np.ndarray
    fitted_values: np.ndarray
    weights: np.ndarray
    beyond_query: int
    beyond_distance: np.ndarray
    beyond_target: np.ndarray
    beyond_fitted: np.ndarray
    steps: int
    steps_run: int
    stopped: bool
    seconds: float
    mlp_width: int
    seed: int
    c: float

    @property
    def residuals(self) -> np.ndarray:
        """Target − fitted per distance inside the fitted range, float32 ``[num_heads, max_len]`` (logits)."""
        return self.target_values - self.fitted_values

    @property
    def beyond_residuals(self) -> np.ndarray:
        """Target − fitted along the last query row, float32 ``[num_heads, 4·max_len]`` (logits)."""
        return self.beyond_target - self.beyond_fitted

    def fire_options(self) -> dict:
        """Constructor keywords that rebuild ``module`` (``FIRE(**options)``)."""
        return fire_options(self.module)

    def save(self, path: str | Path) -> Path:
        """Write the fitted module to ``path`` (safetensors; see ``save_fitted_fire``)."""
        return save_fitted_fire(self.module, path, extra={"target": self.target.name,
                                                          "max_len": self.max_len,
                                                          "relative_rmse": self.relative_rmse})

    def to_dict(self, curves: bool = True) -> dict:
        """JSON-able summary (what ``python -m fireviz fit --out`` writes).

        Keys:
          ``target`` (name), ``target_params``, ``max_len``, ``num_heads``, ``mlp_width``,
          ``steps``, ``steps_run``, ``stopped``, ``seed``, ``seconds``;
          metrics ``relative_rmse``, ``relative_rmse_per_head`` (list [H]), ``max_abs_error``,
          ``rmse`` and the same with suffix ``_beyond``; ``beyond_factor`` (4),
          ``beyond_rows``; ``loss_curve`` (list, entry 0 = initialisation);
          ``fire``: ``{"options": FIRE constructor keywords, "c": fitted c,
          "L": threshold in tokens}``.
          With ``curves`` (default): ``inside`` = ``{"distance": [max_len], "weight":
          [max_len], "target": [H][max_len], "fitted": [H][max_len], "residual":
          [H][max_len]}`` and ``beyond`` = ``{"query_position": 4·max_len − 1, "distance":
          [4·max_len], "target", "fitted", "residual": [H][4·max_len]}`` (logits;
          residual = target − fitted, the convention of ``fireviz.plots.fit_figure``).
        Non-finite numbers (a constant target's relative error) are written as null.
        """
        out = {
            "target": self.target.name,
            "target_params": self.target.params,
            "max_len": self.max_len,
            "num_heads": self.target.num_heads,
            "mlp_width": self.mlp_width,
            "steps": self.steps,
            "steps_run": self.steps_run,
            "stopped": self.stopped,
            "seed": self.seed,
            "seconds": self.seconds,
            "relative_rmse": self.relative_rmse,
            "relative_rmse_per_head": self.relative_rmse_per_head,
            "max_abs_error": self.max_abs_error,
            "rmse": self.rmse,
            "relative_rmse_beyond": self.relative_rmse_beyond,
            "relative_rmse_beyond_per_head": self.relative_rmse_beyond_per_head,
            "max_abs_error_beyond": self.max_abs_error_beyond,
            "rmse_beyond": self.rmse_beyond,
            "beyond_factor": BEYOND_FACTOR,
            "beyond_rows": self.beyond_rows,
            "loss_curve": self.loss_curve,
            "fire": {"options": self.fire_options(), "c": self.c, "L": float(self.module.threshold().detach())},
        }
        if curves:
            out["inside"] = {"distance": self.distance.tolist(), "weight": self.weights.tolist(),
                             "target": self.target_values.tolist(), "fitted": self.fitted_values.tolist(),
                             "residual": self.residuals.tolist()}
            out["beyond"] = {"query_position": self.beyond_query, "distance": self.beyond_distance.tolist(),
                             "target": self.beyond_target.tolist(), "fitted": self.beyond_fitted.tolist(),
                             "residual": self.beyond_residuals.tolist()}
        return _json_safe(out)


def _json_safe(obj):
    if isinstance(obj, float):
        return obj if math.isfinite(obj) else None
    if isinstance(obj, dict):
        return {k: _json_safe(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_json_safe(v) for v in obj]
    return obj


# --------------------------------------------------------------------------------------------
# Saving and loading a fitted FIRE
# --------------------------------------------------------------------------------------------
def fire_options(module: FIRE) -> dict:
    """The constructor keywords of a ``FIRE`` module (JSON-able), e.g. for safetensors metadata."""
    return {"num_heads": module.num_heads, "mlp_width": module.mlp_width, "init_L": module.init_L,
            "eps": module.eps, "progressive_interpolation": module.progressive_interpolation,
            "log_transform": module.log_transform, "learn_threshold": module.learn_threshold,
            "mlp_depth": module.mlp_depth, "normalizer_cap": module.normalizer_cap}


def save_fitted_fire(module: FIRE, path: str | Path, extra: dict | None = None) -> Path:
    """Save a FIRE module as safetensors: ``state_dict()`` plus its options as metadata.

    The metadata key ``fireviz.fire_options`` holds ``fire_options(module)`` as JSON;
    ``extra`` (JSON-able) goes under ``fireviz.fit``. No pickle.
    Returns: the path written. Raises: OSError if it cannot be written.
    """
    from safetensors.torch import save_file

    path = Path(path)
    state = {k: v.detach().contiguous().cpu() for k, v in module.state_dict().items()}
    meta = {FIRE_OPTIONS_KEY: json.dumps(fire_options(module))}
    if extra:
        meta["fireviz.fit"] = json.dumps(_json_safe(extra))
    atomic_write(path, lambda tmp: save_file(state, str(tmp), metadata=meta))
    return path


def load_fitted_fire(path: str | Path) -> FIRE:
    """Load a FIRE module written by ``save_fitted_fire`` / ``FitResult.save`` (safetensors).

    Returns: ``FIRE`` with the saved weights, float32, on CPU.
    Raises: FileNotFoundError if ``path`` does not exist; ValueError if the file is not
      safetensors, lacks the ``fireviz.fire_options`` metadata, or its tensors do not match
      those options.
    """
    from safetensors import SafetensorError

    path = Path(path)
    if not path.exists():
        raise FileNotFoundError(f"{path} does not exist; write one with FitResult.save or "
                                "`python -m fireviz fit --save-module PATH`")
    try:
        state, meta = read_safetensors(path)
    except (SafetensorError, OSError) as e:
        raise ValueError(f"{path} is not a readable safetensors file ({e})") from e
    if FIRE_OPTIONS_KEY not in meta:
        raise ValueError(f"{path} has no '{FIRE_OPTIONS_KEY}' metadata: not written by save_fitted_fire")
    opts = json.loads(meta[FIRE_OPTIONS_KEY])
    module = FIRE(**opts)
    try:
        module.load_state_dict(state, strict=True)
    except RuntimeError as e:
        raise ValueError(f"{path}: tensors do not match the saved FIRE options {opts}: {e}") from e
    return module


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
            m_hat = m / (1 - b1 ** self.t)
            v_hat = v / (1 - b2 ** self.t)
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
def fit_fire(target: FitTarget | str, max_len: int, num_heads: int | None = None, mlp_width: int = 32,
             steps: int = DEFAULT_STEPS, seed: int = 0,
             progress: Callable[[int, int, float], None] | None = None,
             should_stop: Callable[[], bool] | None = None, lr: float = 3e-3,
             start_progress: Callable[[int, int], None] | None = None) -> FitResult:
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


def _fit(target, max_len, num_heads, mlp_width, steps, seed, progress, should_stop, lr,
         start_progress=None) -> FitResult:
    t0 = time.perf_counter()
    if isinstance(target, str):
        target = make_target(target, num_heads)
    if not isinstance(max_len, (int, np.integer)) or max_len < 2:
        raise ValueError(f"max_len must be an integer >= 2 tokens (got {max_len!r}); FIRE needs at "
                         "least two distances to fit")
    if mlp_width < 2:
        raise ValueError(f"mlp_width must be >= 2 (got {mlp_width}): one unit for the linear term, "
                         "the rest for kinks")
    if steps < 0:
        raise ValueError(f"steps must be >= 0 (got {steps})")
    if num_heads is not None and num_heads != target.num_heads:
        raise ValueError(f"num_heads={num_heads} but target {target.name!r} has {target.num_heads} heads")
    max_len, H = int(max_len), target.num_heads
    from .memory import check_fits, fit_bytes
    check_fits(fit_bytes(H, max_len, mlp_width, BEYOND_FACTOR, _BEYOND_CHUNK), "cpu",
               f"fitting {H} heads over max_len {max_len}", "lower max_len or the number of heads")

    with torch.random.fork_rng(devices=[]):  # leave the caller's RNG stream untouched
        torch.manual_seed(seed)
        module = FIRE(H, mlp_width=mlp_width, init_L=float(max_len))
    L, eps = float(module.threshold().detach()), module.eps

    # 1-D data: distances, pair weights, per-head standardised targets.
    d = torch.arange(max_len, dtype=torch.float64)
    y = target.bias_by_distance(torch.arange(max_len)).double().T  # [n, H]
    w = (max_len - d) / (max_len - d).sum()
    s = w.sqrt()
    mean = (w[:, None] * y).sum(0)
    std = ((w[:, None] * (y - mean) ** 2).sum(0)).sqrt()
    scale = torch.where(std > 1e-12 * (1 + mean.abs()), std, torch.ones_like(std))
    Ys = s[:, None] * (y - mean) / scale

    # 2. closed-form start: best c on the grid, kinks by orthogonal least squares.
    K = mlp_width - 1
    cand = _candidates(max_len)
    best = None

    def try_c(cl: float, k: int = K):
        nonlocal best
        c = torch.tensor(cl / L, dtype=torch.float64)
        x = _x_of_d(d, c, L, eps)
        knots = _greedy_knots(x, s, Ys, cand, k)
        _, loss = _solve_output(s[:, None] * _hidden(x, knots), Ys)
        if best is None or float(loss) < best[0]:
            best = (float(loss), c, knots, cl)

    total_start = len(_CL_GRID) + 2
    stopped = False
    for k, cl in enumerate(_CL_GRID, 1):  # coarse grid of c·L, then the two half-way points around the best
        try_c(cl)
        if start_progress is not None:
            start_progress(k, total_start)
        if should_stop is not None and should_stop():
            stopped = True
            break
    coarse = best[3]
    for k, factor in enumerate((10 ** -0.5, 10 ** 0.5) if not stopped else (), len(_CL_GRID) + 1):
        try_c(coarse * factor)
        if start_progress is not None:
            start_progress(k, total_start)
    _, c0, knots0, _ = best
    n_live = knots0.numel()
    if n_live < K:  # too few distinct data points: park the spare kinks beyond x = 1 (never active)
        knots0 = torch.cat([knots0, torch.full((K - n_live,), 2.0, dtype=torch.float64)])

    # 3. refine log c and the kinks (variable projection: output layer solved each step).
    log_c = torch.nn.Parameter(c0.log().clone())
    knots = torch.nn.Parameter(knots0.clone())
    live = torch.arange(K) < n_live
    opt = _Adam([log_c, knots], lr=lr)

    def objective():
        x = _x_of_d(d, log_c.exp(), L, eps)
        kn = torch.where(live, knots, knots.detach())
        return _solve_output(s[:, None] * _hidden(x, kn), Ys)

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

    # Write the best iterate into the module: unit 0 = ReLU(x) (linear term), units k ≥ 1 =
    # ReLU(x − t_k); output = per-head scale · β + mean.
    with torch.no_grad():
        log_c_best, knots_best = best_state
        c_best = log_c_best.exp().float().double()  # the module stores c in float32
        x = _x_of_d(d, c_best, L, eps)
        beta, _ = _solve_output(s[:, None] * _hidden(x, knots_best), Ys)
        beta = beta * scale[None, :]  # [K + 2, H]
        lin1, lin2 = module.mlp[0], module.mlp[2]
        module.c.fill_(float(c_best))
        lin1.weight.fill_(1.0)
        lin1.bias.zero_()
        lin1.bias[1:] = (-knots_best).float()
        lin2.weight.copy_(beta[1:].T.float())
        lin2.bias.copy_((beta[0] + mean).float())
        if n_live < K:  # parked kinks: the unit stays off on [0, 1]; zero its output anyway
            lin2.weight[:, 1 + n_live:] = 0.0

    return _evaluate(module, target, max_len, curve, steps, steps_run, stopped, t0, mlp_width, seed)


@torch.no_grad()
def _evaluate(module: FIRE, target: FitTarget, max_len: int, curve: list[float], steps: int, steps_run: int,
              stopped: bool, t0: float, mlp_width: int, seed: int) -> FitResult:
    """Measure the float32 module inside and beyond the fitted range (see ``FitResult``)."""
    H, n = target.num_heads, max_len
    # Inside: every query i < max_len ≤ L has normalizer ψ(L), so the row of query n−1
    # holds the value of every distance 0..n−1 exactly as every other row does.
    fitted = module.bias(1, n, q_offset=n - 1)[:, 0].flip(-1).double()  # [H, n], d = 0..n−1
    tgt = target.bias_by_distance(torch.arange(n)).double()
    w = (n - torch.arange(n, dtype=torch.float64))
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
        q = torch.as_tensor(rows[start: start + _BEYOND_CHUNK])
        q = torch.cat([q, q[-1:].expand(_BEYOND_CHUNK - q.numel())])
        x = psi_d[None, :] / module.normalizer(q)[:, None]  # [chunk, top]
        causal = torch.arange(top)[None, :] <= q[:, None]
        causal[min(rows.size - start, _BEYOND_CHUNK):] = False  # padding rows
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
    var_b = max(float(s2.sum()) / (count * H) - mean_b ** 2, 0.0)
    rmse_b = math.sqrt(float(sse_b.sum()) / (count * H))
    rel_b = _ratio(rmse_b, math.sqrt(var_b))
    rel_bh = [_ratio(math.sqrt(float(e) / count), math.sqrt(float(v))) for e, v in zip(sse_b, var_bh)]

    q_last = top - 1
    beyond_fit = module.mlp_forward(psi_d / module.normalizer(torch.tensor([q_last])))  # [H, top], d = 0..top−1
    c_val = float(module.c.detach())
    return FitResult(
        module=module, target=target, max_len=n, loss_curve=curve,
        relative_rmse=rel, relative_rmse_per_head=rel_h, max_abs_error=max_abs, rmse=rmse,
        relative_rmse_beyond=rel_b, relative_rmse_beyond_per_head=rel_bh, max_abs_error_beyond=max_b,
        rmse_beyond=rmse_b, beyond_rows=int(rows.size),
        distance=np.arange(n), target_values=tgt.float().numpy(), fitted_values=fitted.float().numpy(),
        weights=w.numpy(), beyond_query=q_last, beyond_distance=np.arange(top),
        beyond_target=table.float().numpy(), beyond_fitted=beyond_fit.numpy(),
        steps=steps, steps_run=steps_run, stopped=stopped, seconds=time.perf_counter() - t0,
        mlp_width=mlp_width, seed=seed, c=c_val,
    )


def _ratio(num: float, den: float) -> float:
    if den > 0:
        return num / den
    return 0.0 if num == 0 else math.inf


# --------------------------------------------------------------------------------------------
# CLI
# --------------------------------------------------------------------------------------------
class _CLIError(Exception):
    pass


def parse_numbers(text: str, what: str) -> list[float] | float:
    """``"0.5"`` → 0.5, ``"0.5, 1,2"`` → [0.5, 1.0, 2.0]: a per-head parameter as typed on the
    command line or in the app (Kerple r1/r2, T5 bucket values).

    Raises: ValueError naming ``what`` for text that is empty or not comma-separated numbers.
    """
    try:
        vals = [float(v) for v in text.split(",") if v.strip()]
    except ValueError:
        raise ValueError(f"{what} must be a number or comma-separated numbers (got {text!r}); "
                         "example: 0.5 or 0.5,1,1.5,2") from None
    if not vals:
        raise ValueError(f"{what} is empty; give a number or comma-separated numbers")
    return vals[0] if len(vals) == 1 else vals


def _numbers(text: str, what: str) -> list[float] | float:
    try:
        return parse_numbers(text, what)
    except ValueError as e:
        raise _CLIError(str(e)) from None


def _t5_values(text: str):
    if text in ("random", "decay"):
        return text
    p = Path(text)
    if text.endswith(".json"):
        try:
            return read_json(p)
        except FileFormatError as e:
            raise _CLIError(f"--t5-values: cannot read {text} ({e}); give random, decay, numbers, or a JSON file") from None
    vals = _numbers(text, "--t5-values")
    return [vals] if isinstance(vals, float) else vals


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m fireviz fit",
        description="Fit FIRE (Li et al. 2024) to a T5/ALiBi/Kerple/Sandwich bias or a checkpoint's "
                    "learned bias (Theorem 3.1) on all pairs 0 <= j <= i < max-len.")
    p.add_argument("--target", required=True, help=f"one of {', '.join(target_names())}, or a checkpoint folder, a transformers model folder or a Hub id")
    p.add_argument("--max-len", type=int, required=True, help="fitted range in tokens (>= 2)")
    p.add_argument("--heads", type=int, default=None, help="heads (default 8; a checkpoint's own)")
    p.add_argument("--width", type=int, default=32, help="FIRE MLP width (default 32)")
    p.add_argument("--steps", type=int, default=DEFAULT_STEPS, help=f"refinement steps (default {DEFAULT_STEPS})")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", default=None, help="write the result JSON here (FitResult.to_dict)")
    p.add_argument("--save-module", default=None, help="write the fitted FIRE here (safetensors)")
    p.add_argument("--no-curves", action="store_true", help="leave per-distance curves out of the JSON")
    p.add_argument("--quiet", action="store_true", help="no progress on stderr")
    g = p.add_argument_group("target parameters")
    g.add_argument("--num-buckets", type=int, help="t5: buckets (32)")
    g.add_argument("--max-distance", type=int, help="t5: max distance in tokens (128)")
    g.add_argument("--t5-values", help="t5: random (default) | decay | comma list per bucket | file.json")
    g.add_argument("--slope", type=float, help="alibi: one slope for every head (default: standard slopes)")
    g.add_argument("--r1", help="kerple_*: r1, one number or one per head (default: seeded draw)")
    g.add_argument("--r2", help="kerple_*: r2, one number or one per head (default: seeded draw)")
    g.add_argument("--dbar", type=int, help="sandwich: dbar (128)")
    g.add_argument("--target-seed", type=int, help="t5 random values / Kerple draws: seed (0)")
    g.add_argument("--checkpoint", help="checkpoint: folder or Hub id")
    g.add_argument("--layer", type=int, help="checkpoint: layer (0)")
    g.add_argument("--param", action="append", metavar="NAME=VALUE",
                   help="any target's parameter as JSON (repeatable), e.g. --param r2=0.5 (see make_target)")
    g.add_argument("--stack", choices=("decoder", "encoder"),
                   help="checkpoint: a published encoder-decoder model's stack (default decoder)")
    return p


_CLI_PARAM = {  # CLI flag → (target parameter, targets that take it)
    "num_buckets": ("num_buckets", ("t5",)), "max_distance": ("max_distance", ("t5",)),
    "t5_values": ("values", ("t5",)), "slope": ("slope", ("alibi",)),
    "r1": ("r1", ("kerple_log", "kerple_power")), "r2": ("r2", ("kerple_log", "kerple_power")),
    "dbar": ("dbar", ("sandwich",)), "target_seed": ("seed", ("t5", "kerple_log", "kerple_power")),
    "checkpoint": ("path", ("checkpoint",)), "layer": ("layer", ("checkpoint",)),
    "stack": ("stack", ("checkpoint",)),
}


def _target_from_args(a: argparse.Namespace) -> FitTarget:
    from . import hub
    if a.target not in target_names() and (Path(a.target).expanduser().is_dir() or hub.looks_like_hub_id(a.target)):
        if a.checkpoint is not None:
            raise _CLIError("give the model once: --target <folder or Hub id>, or --target checkpoint --checkpoint …")
        a.checkpoint, a.target = a.target, "checkpoint"  # --target <model>: a checkpoint or published model
    if a.target not in target_names():
        raise _CLIError(f"unknown --target {a.target!r}; choose one of {', '.join(target_names())}")
    params = {}
    for item in a.param or []:  # --param NAME=VALUE (JSON value): any target's parameter
        name, sep, value = item.partition("=")
        if not sep or not name:
            raise _CLIError(f"--param takes NAME=VALUE (got {item!r}), e.g. --param slope=0.5")
        try:
            params[name.strip()] = json.loads(value)
        except ValueError:
            params[name.strip()] = value  # a bare word, e.g. values=decay
    for flag, (name, targets) in _CLI_PARAM.items():
        value = getattr(a, flag)
        if value is None:
            continue
        if a.target not in targets:
            raise _CLIError(f"--{flag.replace('_', '-')} applies to {'/'.join(targets)}, not --target {a.target}")
        if flag in ("r1", "r2"):
            value = _numbers(value, f"--{flag}")
        elif flag == "t5_values":
            value = _t5_values(value)
        params[name] = value
    if a.target == "checkpoint" and "path" not in params:
        raise _CLIError("--target checkpoint needs --checkpoint PATH (a checkpoint folder)")
    heads = a.heads if a.heads is not None or a.target == "checkpoint" else 8
    return make_target(a.target, heads, **params)


def main(argv: list[str] | None = None) -> int:
    """``python -m fireviz fit --target NAME --max-len N [--heads H] [--width W] [--out fit.json]``.

    Fits FIRE (``fit_fire``), prints a one-line summary, writes ``FitResult.to_dict()`` as
    JSON to ``--out`` (keys include ``relative_rmse``, ``max_abs_error``,
    ``relative_rmse_beyond``, ``seconds``) and the module to ``--save-module``.
    Returns: 0 on success; 2 for bad arguments or parameters (one error line on stderr,
    no traceback).
    """
    parser = _parser()
    try:
        a = parser.parse_args(argv)
    except SystemExit as e:  # argparse already printed usage + the error
        return int(e.code or 0)
    for flag, out, example in (("--out", a.out, "fit.json"), ("--save-module", a.save_module, "fire_fit.safetensors")):
        if out and Path(out).is_dir():  # refuse before computing, not after
            print(f"fireviz fit: error: {flag} {out} is a folder; give a file path such as {Path(out) / example}",
                  file=sys.stderr)
            return 2
    try:
        target = _target_from_args(a)
        last = [0.0]

        def report_start(done: int, total: int) -> None:
            now = time.perf_counter()
            if not a.quiet and (done == total or now - last[0] > 1.0):
                last[0] = now
                print(f"closed-form start: candidate c {done}/{total}", file=sys.stderr)

        def report(step: int, total: int, loss: float) -> None:
            now = time.perf_counter()
            if not a.quiet and (step == total or now - last[0] > 1.0):
                last[0] = now
                print(f"step {step}/{total}  loss {loss:.3e}", file=sys.stderr)

        if not a.quiet:
            print(f"fitting FIRE to {target.name} ({target.num_heads} heads, max_len {a.max_len})…", file=sys.stderr)
        result = fit_fire(target, a.max_len, mlp_width=a.width, steps=a.steps, seed=a.seed, progress=report,
                          start_progress=report_start)
    except _CLIError as e:
        print(f"fireviz fit: error: {e}", file=sys.stderr)
        return 2
    except (ValueError, FileNotFoundError, CheckpointError) as e:
        print(f"fireviz fit: error: {e}", file=sys.stderr)
        return 2
    summary = (f"{target.name}: max_len={a.max_len} heads={target.num_heads} width={a.width}  "
               f"relative RMSE {100 * result.relative_rmse:.3f}%  max |err| {result.max_abs_error:.3g} logits  "
               f"beyond (to {BEYOND_FACTOR}x) relative RMSE {100 * result.relative_rmse_beyond:.1f}%  "
               f"{result.seconds:.2f} s")
    print(summary)
    try:  # atomic writes create missing parent folders; nothing half-written is left behind
        if a.out:
            write_json_atomic(a.out, _json_safe(result.to_dict(curves=not a.no_curves)))
        if a.save_module:
            result.save(a.save_module)
    except OSError as e:
        print(f"fireviz fit: error: cannot write the result: {e}", file=sys.stderr)
        return 2
    return 0
