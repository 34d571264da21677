"""A fit's result (``FitResult``: the fitted FIRE, errors inside and beyond the fitted range,
the loss curve) and a fitted FIRE module on disk (safetensors only, options in its metadata)."""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from fireviz.core import atomic_write, parse_json, read_safetensors
from fireviz.encodings import FIRE
from fireviz.fit.targets import FitTarget

if TYPE_CHECKING:
    from fireviz.fit.fitting import FitSettings

#: Multiple of ``max_len`` up to which ``fit_fire`` measures the error beyond the fitted range.
BEYOND_FACTOR = 4

#: Safetensors metadata key holding a fitted FIRE's constructor options (JSON).
FIRE_OPTIONS_KEY = "fireviz.fire_options"


@dataclass
class FitResult:
    """Outcome of ``fit_fire``.

    Attributes:
      settings: the ``FitSettings`` fitted (every setting that decides the numbers; ``to_dict``
        writes its ``describe()``).
      module: the fitted ``FIRE`` (float32, ``init_L = max_len``, multiplier 1, so
        ``threshold() = max_len`` tokens); ``bias(q, k)`` gives its logits.
      target: the ``FitTarget`` fitted (``settings.target``).
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
        they are at most ``fit_measure.BEYOND_ROWS`` (256), else 256 evenly spaced ones (every pair
        ``j ≤ i`` of a measured row counts).
      distance, target_values, fitted_values: per-distance curves inside the fitted range:
        ``d = 0..max_len−1`` and float32 ``[num_heads, max_len]`` logits (FIRE is a function
        of d there); ``weights``: pairs per distance, ``max_len − d``.
      beyond_query: the query position of the beyond curves, ``4·max_len − 1``;
        beyond_distance, beyond_target, beyond_fitted: that row's curves, ``d = 0..4·max_len−1``.
      steps, steps_run, stopped: requested steps, steps taken, whether ``should_stop`` ended it.
      seconds: wall-clock seconds of the whole fit including the evaluation.
      mlp_width, seed, c: width of f_θ, the seed, the fitted c; ``lr``: the Adam learning rate.
    """

    settings: "FitSettings"
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
    def lr(self) -> float:
        """The Adam learning rate of the fit (``settings.lr``)."""
        return self.settings.lr

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
        """Write the fitted module to ``path`` (safetensors; see ``save_fitted_fire``), with the fit's
        settings (``FitSettings.describe()``: target, target_params, max_len, …) and relative RMSE."""
        return save_fitted_fire(
            self.module, path, extra={**self.settings.describe(), "relative_rmse": self.relative_rmse}
        )

    def to_dict(self, curves: bool = True) -> dict:
        """JSON-able summary (what ``python -m fireviz fit --out`` writes).

        Keys:
          the fit's settings, ``FitSettings.describe()``: ``target`` (name), ``target_params``
          (a checkpoint target's with its ``checkpoint_sha256``), ``num_heads``, ``max_len``,
          ``mlp_width``, ``steps``, ``seed``, ``lr``; then ``steps_run``, ``stopped``, ``seconds``;
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
            **self.settings.describe(),
            "steps_run": self.steps_run,
            "stopped": self.stopped,
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
            out["inside"] = {
                "distance": self.distance.tolist(),
                "weight": self.weights.tolist(),
                "target": self.target_values.tolist(),
                "fitted": self.fitted_values.tolist(),
                "residual": self.residuals.tolist(),
            }
            out["beyond"] = {
                "query_position": self.beyond_query,
                "distance": self.beyond_distance.tolist(),
                "target": self.beyond_target.tolist(),
                "fitted": self.beyond_fitted.tolist(),
                "residual": self.beyond_residuals.tolist(),
            }
        return json_safe(out)


def json_safe(obj):
    if isinstance(obj, float):
        return obj if math.isfinite(obj) else None
    if isinstance(obj, dict):
        return {k: json_safe(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [json_safe(v) for v in obj]
    return obj


def fire_options(module: FIRE) -> dict:
    """The constructor keywords of a ``FIRE`` module (JSON-able), e.g. for safetensors metadata."""
    return {
        "num_heads": module.num_heads,
        "mlp_width": module.mlp_width,
        "init_L": module.init_L,
        "eps": module.eps,
        "progressive_interpolation": module.progressive_interpolation,
        "log_transform": module.log_transform,
        "learn_threshold": module.learn_threshold,
        "mlp_depth": module.mlp_depth,
        "normalizer_cap": module.normalizer_cap,
    }


def save_fitted_fire(module: FIRE, path: str | Path, extra: dict | None = None) -> Path:
    """Save a FIRE module as safetensors: ``state_dict()`` plus its options as metadata.

    The metadata key ``fireviz.fire_options`` holds ``fire_options(module)`` as JSON;
    ``extra`` (JSON-able) goes under ``fireviz.fit.fitting``. No pickle.
    Returns: the path written. Raises: OSError if it cannot be written.
    """
    from safetensors.torch import save_file

    path = Path(path)
    state = {k: v.detach().contiguous().cpu() for k, v in module.state_dict().items()}
    meta = {FIRE_OPTIONS_KEY: json.dumps(fire_options(module))}
    if extra:
        meta["fireviz.fit"] = json.dumps(json_safe(extra))
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
        raise FileNotFoundError(
            f"{path} does not exist; write one with FitResult.save or `python -m fireviz fit --save-module PATH`"
        )
    try:
        state, meta = read_safetensors(path)
    except (SafetensorError, OSError) as e:
        raise ValueError(f"{path} is not a readable safetensors file ({e})") from e
    if FIRE_OPTIONS_KEY not in meta:
        raise ValueError(f"{path} has no '{FIRE_OPTIONS_KEY}' metadata: not written by save_fitted_fire")
    opts = parse_json(meta[FIRE_OPTIONS_KEY], f"the FIRE options in {path}")  # bounded: FileFormatError, a ValueError
    if not isinstance(opts, dict):
        raise ValueError(
            f"{path}: its '{FIRE_OPTIONS_KEY}' metadata is not a JSON object; not written by save_fitted_fire"
        )
    module = FIRE(**opts)
    try:
        module.load_state_dict(state, strict=True)
    except RuntimeError as e:
        raise ValueError(f"{path}: tensors do not match the saved FIRE options {opts}: {e}") from e
    return module
