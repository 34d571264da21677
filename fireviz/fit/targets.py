"""Fit targets: the biases FIRE is fitted to (Theorem 3.1 of the FIRE paper, Li et al. 2024).

Every registered encoding whose spec has a ``fit_target`` (T5's buckets, ALiBi, Kerple,
Sandwich, or one registered by a user: ``fireviz.encodings.register_encoding``) is a target
built from its parameters (``make_target``), and so is the learned bias of one layer of a
trained or published model (``target_from_checkpoint``). A target is Toeplitz: a function of
the distance d = i − j only.

A target's parameters are checked by its spec's ``FitParam``s (``EncodingSpec.fit_params``;
the ``checkpoint`` target's are ``CHECKPOINT_FIT_PARAMS``, here): types, finiteness and ranges,
each refused with one ValueError naming the parameter — before a checkpoint is read. The
encodings then check their own domains (e.g. T5's ``max_distance`` against its buckets, a
slope > 0, Kerple's r1, r2 >= 0.01, an even dbar).
"""

from __future__ import annotations

import hashlib
import os
from dataclasses import dataclass, field
from pathlib import Path

import torch

from fireviz.checkpoints import CheckpointNotFoundError, hub, load_model_or_published
from fireviz.core import as_int
from fireviz.encodings import FitParam, encoding_spec, fit_target_names
from fireviz.encodings import parse_numbers as parse_numbers  # re-exported: fireviz.fit.parse_numbers
from fireviz.encodings.base import ToeplitzBias

# the bounds of the built-in targets' parameters, with their specs; re-exported for callers of this module
from fireviz.encodings.specs import MAX_DBAR as MAX_DBAR
from fireviz.encodings.specs import MAX_T5_BUCKETS as MAX_T5_BUCKETS
from fireviz.encodings.specs import MAX_T5_DISTANCE as MAX_T5_DISTANCE
from fireviz.encodings.specs import MAX_TARGET_SCALE as MAX_TARGET_SCALE

#: Most heads one fit takes: the closed-form start costs ~0.07 s per head at max_len 512 (one
#: core), so 1024 heads is a ~1-minute start; published models have at most 128 heads a layer.
MAX_FIT_HEADS = 1024


def _path(value):
    if isinstance(value, os.PathLike):
        value = os.fspath(value)
    if not isinstance(value, str) or not value.strip():
        raise ValueError(
            f"path must be a checkpoint folder or a Hugging Face repo id (got {value!r}); e.g. checkpoints/alibi"
        )
    return value


#: Parameters of the ``checkpoint`` target (the others' are their ``EncodingSpec.fit_params``).
CHECKPOINT_FIT_PARAMS = (
    FitParam("path", "a checkpoint folder or Hub id", "text", cli_flag="checkpoint", validate=_path),
    FitParam("layer", "layer, counted from 0", "int", 0, lo=0, hint="layers count from 0"),
    FitParam(
        "stack",
        "a published encoder-decoder model's stack (default: decoder)",
        "choice",
        choices=("decoder", "encoder"),
        hint="it applies to encoder–decoder models",
    ),
)
CHECKPOINT_PARAMS = frozenset(p.name for p in CHECKPOINT_FIT_PARAMS)
_CHECKPOINT = {p.name: p for p in CHECKPOINT_FIT_PARAMS}


def target_names() -> tuple[str, ...]:
    """Every fit target: each registered encoding with a ``fit_target`` spec, then ``checkpoint``."""
    return fit_target_names() + ("checkpoint",)


def fittable_encodings() -> tuple[str, ...]:
    """Registered encodings whose checkpoints can be fit targets (their spec has a fit target)."""
    return fit_target_names()


def target_fit_params(name: str) -> tuple[FitParam, ...]:
    """The parameters of target ``name``, each a ``FitParam`` (its spec's ``fit_params``; for
    ``checkpoint`` ``CHECKPOINT_FIT_PARAMS``). Raises ValueError for an unknown target."""
    if name == "checkpoint":
        return CHECKPOINT_FIT_PARAMS
    if name not in fit_target_names():
        raise ValueError(f"unknown fit target {name!r}; choose one of {', '.join(target_names())}")
    fit_params = encoding_spec(name).fit_params
    assert isinstance(fit_params, tuple)  # a fit target; EncodingSpec made it a tuple of FitParam
    return fit_params


def target_params(name: str) -> frozenset[str]:
    """Keyword parameters target ``name`` takes (see ``make_target``). Raises ValueError for an unknown target."""
    return frozenset(p.name for p in target_fit_params(name))


def check_num_heads(num_heads) -> int:
    """``num_heads`` as an int in 1 … ``MAX_FIT_HEADS``. Raises: ValueError naming it."""
    return as_int(
        num_heads,
        "num_heads",
        1,
        MAX_FIT_HEADS,
        "published models have at most 128 heads per layer; fit fewer heads, e.g. --heads 8",
    )


def _checked_params(name: str, params: dict) -> dict:
    """``params`` through the checks of target ``name``'s ``FitParam``s (untyped ones pass as given)."""
    checks = {p.name: p for p in target_fit_params(name)}
    return {k: checks[k].check(v) if k in checks else v for k, v in params.items()}


# --------------------------------------------------------------------------------------------
# Targets
# --------------------------------------------------------------------------------------------
@dataclass
class FitTarget:
    """A Toeplitz bias to fit: ``g_h(d)`` logits for distances ``d = i − j`` (tokens).

    Attributes:
      name: one of ``target_names()``.
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
      name: one of ``target_names()``.
      num_heads: heads (1 … ``MAX_FIT_HEADS``); not needed for ``checkpoint`` (taken from the
        checkpoint; when given it must match).
      params by target:
        * ``t5``: ``num_buckets`` (32), ``max_distance`` (128 tokens), ``values``
          ("random" (default) | "decay" | numbers, see ``t5_bucket_values``), ``seed`` (0).
          Causal bucketing (``relative_position_bucket``, Raffel et al. 2020 §2.1).
        * ``alibi``: ``slope`` (None → ``alibi_slopes(num_heads)``, Press et al. 2022 §3;
          a number → that slope for every head). Bias ``−m_h·d``.
        * ``kerple_log`` / ``kerple_power``: ``r1``, ``r2`` (a number or ``num_heads``
          numbers; None → a seeded draw from the KERPLE reference init's ranges, clamped to
          >= 0.01: log r1 ~ U(0, 2), r2 ~ U(0, 1); power r1 (the scale) ~ U(0, 1), r2 (the
          exponent) ~ U(0, 2) — as training draws them), ``seed`` (0). Bias ``−r1·log(1 + r2·d)`` resp. ``−r1·d^r2``
          (Chi et al. 2022, §4.2).
        * ``sandwich``: ``dbar`` (128, even). Bias ``(S(d) − dbar/2)/r_h``, ``r_h = 8h/H``
          (Chi et al. 2023, §5).
        * ``checkpoint``: ``path`` (a checkpoint folder or Hub id), ``layer`` (0), ``stack``;
          see ``target_from_checkpoint``.
      Numbers are ints / floats (numpy's too), never bools or strings: the specs' ``FitParam.check``.
    Returns: a ``FitTarget``.
    Raises: ValueError naming the parameter for an unknown target or parameter, num_heads not an
      integer in 1 … MAX_FIT_HEADS, an ALiBi slope or Kerple r1/r2 that is not a finite number
      <= MAX_TARGET_SCALE (then the encoding's own range: a slope > 0, Kerple's >= 0.01 and
      r2 <= 2 for the power variant), bad T5 bucketing/values, a dbar that is not an even
      integer in 2 … MAX_DBAR, a seed outside 0 … 2⁶⁴ − 1, a checkpoint path/layer/stack of the
      wrong type (all before anything is read) or a checkpoint whose heads differ from
      ``num_heads``; CheckpointError/ValueError from ``target_from_checkpoint``.
    """
    allowed = target_params(name)  # raises for an unknown target
    unknown = set(params) - allowed
    if unknown:
        raise ValueError(
            f"target {name!r} does not take parameter(s) {sorted(unknown)}; allowed: "
            f"{', '.join(sorted(allowed)) or 'none'}"
        )
    params = _checked_params(name, params)
    if name == "checkpoint":
        if "path" not in params:
            raise ValueError("target 'checkpoint' needs path=<checkpoint folder> (CLI: --checkpoint PATH)")
        heads = None if num_heads is None else check_num_heads(num_heads)
        target = target_from_checkpoint(params["path"], params.get("layer", 0), params.get("stack"))
        if heads is not None and heads != target.num_heads:
            raise ValueError(
                f"checkpoint {params['path']} has {target.num_heads} heads, not {heads}; "
                "omit num_heads (CLI: --heads) to use the checkpoint's"
            )
        return target
    heads = check_num_heads(num_heads)
    fit_target = encoding_spec(name).fit_target
    assert fit_target is not None  # target_params refused names that are not fit targets
    enc, shown = fit_target(heads, **params)  # the encoding's own spec builds it
    return FitTarget(name, enc, shown)


def target_from_checkpoint(path: str, layer: int = 0, stack: str | None = None) -> FitTarget:
    """The learned (or fixed) bias of one layer of a trained fireviz GPT checkpoint, or of a
    published model (a transformers folder or Hub id read through ``fireviz.checkpoints.hub``: T5-family
    tables of ``stack`` — decoder by default; for the bidirectional encoder its keys before
    the query, i.e. d = i − j >= 0 — or ALiBi slopes).

    Loads through ``fireviz.checkpoints.load_model_or_published(path)`` (safetensors only) and
    takes ``model.encoding(layer)``; for T5, ALiBi, Kerple and Sandwich that bias depends on
    ``d = i − j`` only, so its ``bias_by_distance`` is the target (and its extrapolation).
    Returns: ``FitTarget(name="checkpoint", ...)`` with params ``path`` (as given), ``layer``,
      ``encoding`` (the checkpoint's encoding name), ``seq_len`` (its training length) and its
      identity: ``checkpoint_sha256`` (``fireviz.checkpoints.catalog.checkpoint_sha256`` of exactly the
      bytes loaded, one read) for a fireviz checkpoint; ``published``, ``revision``, ``stack`` and ``bias_sha256``
      (of the layer's bias tensors) for a published model.
    Raises: ValueError for a path that is not a non-empty string, a layer that is not an integer
      >= 0 or a stack not decoder/encoder (before anything is read); CheckpointError
      (CheckpointNotFoundError for a path with nothing there; not a checkpoint folder, corrupt
      files); ValueError if the layer is out of range or the encoding is not one of
      ``fittable_encodings()``.
    """

    path, layer, stack = (
        _CHECKPOINT["path"].check(path),
        _CHECKPOINT["layer"].check(layer),
        _CHECKPOINT["stack"].check(stack),
    )
    local = Path(path).expanduser()
    if (local.is_absolute() or str(path).startswith((".", "~")) or local.exists()) and not local.is_dir():
        raise CheckpointNotFoundError(
            f"checkpoint {path} not found: give a folder holding config.json and "
            "model.safetensors (e.g. checkpoints/<name>) or a Hugging Face repo id"
        )
    model, sha256 = load_model_or_published(
        str(local) if local.is_dir() else str(path), stack=stack or "decoder", with_identity=True
    )
    if stack is not None and not isinstance(model, hub.PublishedModel):
        raise ValueError("stack applies to published encoder–decoder models only; drop it for a fireviz checkpoint")
    cfg = model.config
    if not layer < cfg.n_layer:
        raise ValueError(f"layer {layer} is out of range: checkpoint {path} has layers 0..{cfg.n_layer - 1}")
    allowed = fittable_encodings()
    enc = model.encoding(layer)
    if cfg.position_encoding not in allowed or not isinstance(enc, ToeplitzBias):
        raise ValueError(
            f"checkpoint {path} uses position encoding {cfg.position_encoding!r}; fitting FIRE "
            f"needs a Toeplitz bias: one of {', '.join(allowed)}"
        )
    enc.requires_grad_(False)
    params = {"path": path, "layer": layer, "encoding": cfg.position_encoding, "seq_len": cfg.seq_len}
    if isinstance(model, hub.PublishedModel):
        params.update(published=model.config.family, revision=model.config.revision, stack=model.config.stack)
        params["bias_sha256"] = tensors_sha256(enc)
    else:
        params["checkpoint_sha256"] = sha256  # of exactly the bytes loaded
    return FitTarget("checkpoint", enc, params)


def tensors_sha256(module: torch.nn.Module) -> str:
    """sha256 (hex) of a module's parameters and buffers (names, dtypes, shapes and bytes, by name):
    the identity of a published model's bias, whose weights file is never read whole."""
    h = hashlib.sha256()
    for name, t in sorted([*module.named_parameters(), *module.named_buffers()], key=lambda item: item[0]):
        t = t.detach().cpu().contiguous().flatten()
        h.update(f"{name}:{t.dtype}:{tuple(t.shape)}:".encode() + t.view(torch.uint8).numpy().tobytes())
    return h.hexdigest()
