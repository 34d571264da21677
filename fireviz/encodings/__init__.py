"""Every position encoding the FIRE paper compares, behind one registry.

``build_encoding(name, num_heads, head_dim, **options)`` with ``name`` in
``encoding_names()``; each encoding is one ``EncodingSpec`` (specs.py for the built-ins,
``register_encoding`` for new ones). See ``base.PositionEncoding`` for the interface.
"""

from __future__ import annotations

from fireviz.encodings.alibi import ALiBi, alibi_slopes
from fireviz.encodings.base import BIAS_QUERY_BLOCK, PositionEncoding, ToeplitzBias, relative_distance
from fireviz.encodings.fire import FIRE, MAX_NORMALIZER_CAP, check_normalizer_cap, fire_modules
from fireviz.encodings.kerple import KerpleLog, KerplePower
from fireviz.encodings.nope import NoPE
from fireviz.encodings.registry import (
    FIT_PARAM_KINDS,
    KINDS,
    EncodingSpec,
    FitParam,
    encoding_names,
    encoding_spec,
    fit_target_names,
    has_normalizer,
    parse_numbers,
    register_encoding,
    unregister_encoding,
)
from fireviz.encodings.rope import RotaryEmbedding, rope_inv_freq, yarn_attention_factor, yarn_inv_freq
from fireviz.encodings.sandwich import Sandwich, sandwich_kernel
from fireviz.encodings.specs import BUILTIN_SPECS
from fireviz.encodings.t5 import T5RelativeBias, relative_position_bucket

#: The built-in encodings (``encoding_names()`` lists these plus any registered later).
ENCODING_NAMES: tuple[str, ...] = tuple(s.name for s in BUILTIN_SPECS)

#: Built-in names whose encoding has learnable parameters shared by all layers (one module per
#: model); ``encoding_spec(name).sharing`` says it for every encoding.
SHARED_ACROSS_LAYERS = frozenset(s.name for s in BUILTIN_SPECS if s.sharing == "shared")


def encoding_options(name: str) -> frozenset[str]:
    """The keyword options ``build_encoding(name, …)`` accepts. Raises ValueError for an unknown name."""
    return frozenset(encoding_spec(name).options)


def build_encoding(name: str, num_heads: int, head_dim: int, **options) -> PositionEncoding:
    """Build one position-encoding module from its registered spec (``encoding_spec(name)``).

    Args:
      name: a registered encoding (``encoding_names()``; the built-ins are ``ENCODING_NAMES``).
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
    spec = encoding_spec(name)
    unknown = set(options) - spec.options
    if unknown:
        allowed = ", ".join(sorted(spec.options)) or "none"
        raise ValueError(f"encoding {name!r} does not take option(s) {sorted(unknown)}; allowed: {allowed}")
    return spec.build(num_heads, head_dim, **options)


__all__ = [
    "KINDS",
    "ENCODING_NAMES",
    "SHARED_ACROSS_LAYERS",
    "EncodingSpec",
    "FitParam",
    "FIT_PARAM_KINDS",
    "parse_numbers",
    "encoding_names",
    "encoding_spec",
    "fit_target_names",
    "register_encoding",
    "unregister_encoding",
    "has_normalizer",
    "BIAS_QUERY_BLOCK",
    "build_encoding",
    "encoding_options",
    "PositionEncoding",
    "ToeplitzBias",
    "NoPE",
    "RotaryEmbedding",
    "T5RelativeBias",
    "ALiBi",
    "KerpleLog",
    "KerplePower",
    "Sandwich",
    "FIRE",
    "fire_modules",
    "check_normalizer_cap",
    "MAX_NORMALIZER_CAP",
    "alibi_slopes",
    "relative_position_bucket",
    "rope_inv_freq",
    "yarn_inv_freq",
    "yarn_attention_factor",
    "sandwich_kernel",
    "relative_distance",
]
