"""Fit targets: the biases FIRE is fitted to (Theorem 3.1 of the FIRE paper, Li et al. 2024).

Every registered encoding whose spec has a ``fit_target`` (T5's buckets, ALiBi, Kerple,
Sandwich, or one registered by a user: ``fireviz.encodings.register_encoding``) is a target
built from its parameters (``make_target``), and so is the learned bias of one layer of a
trained or published model (``target_from_checkpoint``). A target is Toeplitz: a function of
the distance d = i − j only.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import torch

from .encodings import encoding_spec, fit_target_names
from .encodings.base import ToeplitzBias

#: Most heads one fit takes: the closed-form start costs ~0.07 s per head at max_len 512 (one
#: core), so 1024 heads is a ~1-minute start; published models have at most 128 heads a layer.
MAX_FIT_HEADS = 1024
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


def parse_numbers(text: str, what: str) -> list[float] | float:
    """``"0.5"`` → 0.5, ``"0.5, 1,2"`` → [0.5, 1.0, 2.0]: a per-head parameter as typed on the
    command line or in the app (Kerple r1/r2, T5 bucket values).

    Raises: ValueError naming ``what`` for text that is empty or not comma-separated numbers.
    """
    try:
        vals = [float(v) for v in text.split(",") if v.strip()]
    except ValueError:
        raise ValueError(
            f"{what} must be a number or comma-separated numbers (got {text!r}); example: 0.5 or 0.5,1,1.5,2"
        ) from None
    if not vals:
        raise ValueError(f"{what} is empty; give a number or comma-separated numbers")
    return vals[0] if len(vals) == 1 else vals


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
        raise ValueError(
            f"target {name!r} does not take parameter(s) {sorted(unknown)}; allowed: "
            f"{', '.join(sorted(allowed)) or 'none'}"
        )
    if name == "checkpoint":
        if "path" not in params:
            raise ValueError("target 'checkpoint' needs path=<checkpoint folder> (CLI: --checkpoint PATH)")
        target = target_from_checkpoint(params["path"], int(params.get("layer", 0)), params.get("stack"))
        if num_heads is not None and num_heads != target.num_heads:
            raise ValueError(
                f"checkpoint {params['path']} has {target.num_heads} heads, not {num_heads}; "
                "omit num_heads (CLI: --heads) to use the checkpoint's"
            )
        return target
    if num_heads is None or int(num_heads) < 1:
        raise ValueError(f"num_heads must be >= 1 (got {num_heads})")
    if int(num_heads) > MAX_FIT_HEADS:
        raise ValueError(
            f"num_heads={num_heads} is more than the {MAX_FIT_HEADS} heads a fit takes (published models "
            f"have at most 128 per layer); fit fewer heads, e.g. --heads 8"
        )
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
    from .checkpoints import CheckpointNotFoundError, load_model_or_published

    local = Path(str(path)).expanduser()
    if (local.is_absolute() or str(path).startswith((".", "~")) or local.exists()) and not local.is_dir():
        raise CheckpointNotFoundError(
            f"checkpoint {path} not found: give a folder holding config.json and "
            "model.safetensors (e.g. checkpoints/<name>) or a Hugging Face repo id"
        )
    model = load_model_or_published(str(local) if local.is_dir() else str(path), stack=stack or "decoder")
    if stack is not None and not isinstance(model, hub.PublishedModel):
        raise ValueError("stack applies to published encoder–decoder models only; drop it for a fireviz checkpoint")
    cfg = model.config
    if not 0 <= int(layer) < cfg.n_layer:
        raise ValueError(f"layer {layer} is out of range: checkpoint {path} has layers 0..{cfg.n_layer - 1}")
    allowed = fittable_encodings()
    enc = model.encoding(int(layer))
    if cfg.position_encoding not in allowed or not isinstance(enc, ToeplitzBias):
        raise ValueError(
            f"checkpoint {path} uses position encoding {cfg.position_encoding!r}; fitting FIRE "
            f"needs a Toeplitz bias: one of {', '.join(allowed)}"
        )
    enc.requires_grad_(False)
    params = {"path": str(path), "layer": int(layer), "encoding": cfg.position_encoding, "seq_len": cfg.seq_len}
    if isinstance(model, hub.PublishedModel):
        params.update(published=model.config.family, revision=model.config.revision, stack=model.config.stack)
    return FitTarget("checkpoint", enc, params)
