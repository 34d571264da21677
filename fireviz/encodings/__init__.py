"""Every position encoding the FIRE paper compares, behind one registry.

``build_encoding(name, num_heads, head_dim, **options)`` with ``name`` in
``ENCODING_NAMES``. See ``base.PositionEncoding`` for the interface.
"""
from __future__ import annotations

from .alibi import ALiBi, alibi_slopes
from .base import BIAS_QUERY_BLOCK, PositionEncoding, ToeplitzBias, relative_distance
from .fire import FIRE, MAX_NORMALIZER_CAP, check_normalizer_cap, fire_modules
from .kerple import KerpleLog, KerplePower
from .nope import NoPE
from .rope import RotaryEmbedding, rope_inv_freq, yarn_attention_factor, yarn_inv_freq
from .sandwich import Sandwich, sandwich_kernel
from .t5 import T5RelativeBias, relative_position_bucket

ENCODING_NAMES: tuple[str, ...] = (
    "nope", "rope", "rope_pi", "yarn", "t5", "alibi",
    "kerple_log", "kerple_power", "sandwich", "fire", "fire_s",
)

#: Names whose encoding has learnable parameters shared by all layers (one module per model).
SHARED_ACROSS_LAYERS = frozenset({"fire_s"})

_OPTIONS = {
    "nope": set(),
    "rope": {"rope_theta"},
    "rope_pi": {"rope_theta", "rope_scaling_factor"},
    "yarn": {"rope_theta", "rope_scaling_factor", "original_max_position_embeddings", "beta_fast", "beta_slow"},
    "t5": {"num_buckets", "max_distance", "bidirectional", "init_std"},
    "alibi": {"slope"},
    "kerple_log": {"init_r1", "init_r2"},
    "kerple_power": {"init_r1", "init_r2"},
    "sandwich": {"dbar"},
    "fire": {"mlp_width", "init_c", "init_L", "eps", "progressive_interpolation", "log_transform",
             "learn_threshold", "mlp_depth", "normalizer_cap"},
}
_OPTIONS["fire_s"] = _OPTIONS["fire"]


def encoding_options(name: str) -> frozenset[str]:
    """The keyword options ``build_encoding(name, …)`` accepts. Raises ValueError for an unknown name."""
    _check_name(name)
    return frozenset(_OPTIONS[name])


def _check_name(name: str) -> None:
    if name not in ENCODING_NAMES:
        raise ValueError(f"unknown position encoding {name!r}; choose one of {', '.join(ENCODING_NAMES)}")


def build_encoding(name: str, num_heads: int, head_dim: int, **options) -> PositionEncoding:
    """Build one position-encoding module.

    Args:
      name: one of ``ENCODING_NAMES``.
      num_heads, head_dim: the attention shape it serves (head_dim matters to rotary kinds).
      options: per-encoding keywords (``encoding_options(name)`` lists them), e.g.
        ``rope_theta``; ``rope_scaling_factor`` and ``original_max_position_embeddings``
        for rope_pi/yarn; ``num_buckets``/``max_distance`` for t5; FIRE's ``mlp_width``,
        ``init_L``, ``normalizer_cap`` ….
    Returns: a ``PositionEncoding`` (``kind`` = additive | rotary | none).
    Raises: ValueError for an unknown name or an option the encoding does not take, and the
      encodings' own ValueErrors for bad values: num_heads < 1; an odd head_dim or
      rope_theta <= 1 (rotary kinds); a rope_scaling_factor < 1; T5 bucketing that
      ``relative_position_bucket`` rejects; Kerple r1/r2 <= 0; an odd Sandwich dbar; a FIRE
      mlp_depth other than 1 or 2 (each message names the value).
    """
    _check_name(name)
    unknown = set(options) - _OPTIONS[name]
    if unknown:
        allowed = ", ".join(sorted(_OPTIONS[name])) or "none"
        raise ValueError(f"encoding {name!r} does not take option(s) {sorted(unknown)}; allowed: {allowed}")
    if name == "nope":
        return NoPE(num_heads)
    if name in ("rope", "rope_pi", "yarn"):
        theta = options.get("rope_theta", 10000.0)
        scaling = None
        if name != "rope":
            scaling = {"type": "pi" if name == "rope_pi" else "yarn",
                       "factor": float(options.get("rope_scaling_factor", 1.0))}
            if name == "yarn":
                scaling["original_max_position_embeddings"] = options.get("original_max_position_embeddings")
                scaling["beta_fast"] = options.get("beta_fast", 32)
                scaling["beta_slow"] = options.get("beta_slow", 1)
        return RotaryEmbedding(num_heads, head_dim, rope_theta=theta, rope_scaling=scaling)
    if name == "t5":
        return T5RelativeBias(num_heads, **options)
    if name == "alibi":
        return ALiBi(num_heads, **options)
    if name == "kerple_log":
        return KerpleLog(num_heads, **options)
    if name == "kerple_power":
        return KerplePower(num_heads, **options)
    if name == "sandwich":
        return Sandwich(num_heads, **options)
    return FIRE(num_heads, **options)


__all__ = [
    "ENCODING_NAMES", "SHARED_ACROSS_LAYERS", "BIAS_QUERY_BLOCK", "build_encoding", "encoding_options",
    "PositionEncoding", "ToeplitzBias", "NoPE", "RotaryEmbedding", "T5RelativeBias", "ALiBi",
    "KerpleLog", "KerplePower", "Sandwich", "FIRE", "fire_modules", "check_normalizer_cap", "MAX_NORMALIZER_CAP", "alibi_slopes", "relative_position_bucket",
    "rope_inv_freq", "yarn_inv_freq", "yarn_attention_factor", "sandwich_kernel", "relative_distance",
]
