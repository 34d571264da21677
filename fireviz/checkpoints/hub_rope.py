"""RoPE frequencies of a published (transformers) config, as Hugging Face's ``ROPE_INIT_FUNCTIONS``.

``rope_frequencies(cfg)`` reads ``rope_theta``, the rotary dimension (``head_dim`` ×
``partial_rotary_factor``) and ``rope_scaling`` / ``rope_parameters`` and returns the inverse
frequencies of each rope_type: default, linear (position interpolation, Chen et al. 2023),
dynamic (NTK-aware, shown at factor × max_position_embeddings), yarn (Peng et al. 2023),
llama3 (Meta's smoothed interpolation) and longrope (Ding et al. 2024).
"""

from __future__ import annotations

import math

import torch

from fireviz.checkpoints.hub_config import MAX_HEADS, HubModelError, config_int, config_number
from fireviz.encodings.rope import rope_inv_freq, yarn_inv_freq


def _rotary_shape(cfg: dict, scaling: dict) -> tuple[float, int, int]:
    """``(rope_theta, rotary_dim, head_dim)`` of a config. Raises: HubModelError."""
    base_cfg = {**cfg, **{k: scaling[k] for k in ("rope_theta",) if k in scaling}}
    theta = config_number(
        base_cfg, "rope_theta" if base_cfg.get("rope_theta") is not None else "rotary_emb_base", 10000.0, lo=1.0
    )
    heads = config_int(cfg, "num_attention_heads", "n_head", "num_heads", hi=MAX_HEADS)
    hidden = config_int(cfg, "hidden_size", "n_embd", "d_model")
    head_dim = config_int(cfg, "head_dim", hi=1 << 16) if cfg.get("head_dim") is not None else hidden // heads
    pkey = "partial_rotary_factor" if scaling.get("partial_rotary_factor") is not None else None
    partial = (
        config_number(scaling, "partial_rotary_factor", 1.0, where="rope_scaling")
        if pkey
        else config_number(
            cfg, "partial_rotary_factor" if cfg.get("partial_rotary_factor") is not None else "rotary_pct", 1.0
        )
    )
    if partial > 1:
        raise HubModelError(f"partial_rotary_factor {partial} must be in (0, 1]")
    dim = int(head_dim * partial)
    dim -= dim % 2
    if dim < 2:
        raise HubModelError(
            f"the rotary part of a head is {dim} channels (head_dim {head_dim} × {partial}); it needs >= 2"
        )
    return theta, dim, head_dim


def _llama3(inv: torch.Tensor, scaling: dict, factor: float, orig: int) -> torch.Tensor:
    low = config_number(scaling, "low_freq_factor", 1.0, where="rope_scaling")
    high = config_number(scaling, "high_freq_factor", 4.0, where="rope_scaling")
    if not high > low:
        raise HubModelError(f"llama3 rope_scaling needs high_freq_factor > low_freq_factor (got {high}, {low})")
    wavelen = 2 * math.pi / inv
    low_wl, high_wl = orig / low, orig / high
    llama = torch.where(wavelen > low_wl, inv / factor, inv)
    smooth = (orig / wavelen - low) / (high - low)
    smoothed = (1 - smooth) * llama / factor + smooth * llama
    medium = ~(wavelen < high_wl) & ~(wavelen > low_wl)
    return torch.where(medium, smoothed, llama)


def _longrope(inv: torch.Tensor, scaling: dict, dim: int, max_pos: int, orig: int) -> tuple[torch.Tensor, float]:
    ext = scaling.get("long_factor")
    if not (
        isinstance(ext, list)
        and len(ext) == dim // 2
        and all(isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x) and x > 0 for x in ext)
    ):
        raise HubModelError(f"longrope rope_scaling needs long_factor: {dim // 2} finite numbers > 0")
    f = max_pos / orig
    if scaling.get("attention_factor") is not None:
        att = config_number(scaling, "attention_factor", 1.0, where="rope_scaling")
    else:
        att = math.sqrt(1 + math.log(f) / math.log(orig)) if f > 1 and orig > 1 else 1.0
    return inv / torch.tensor(ext, dtype=torch.float64), att


def _scaled(
    kind: str, inv: torch.Tensor, scaling: dict, theta: float, dim: int, factor: float, orig: int, max_pos: int
) -> tuple[torch.Tensor, float]:
    """The inverse frequencies and attention factor of ``kind`` scaling. Raises: HubModelError."""
    if kind == "default":
        return inv, 1.0
    if kind == "linear":
        return inv / factor, 1.0
    if kind == "dynamic":  # NTK-aware base, at the length factor · max_position_embeddings
        length = factor * max_pos
        base = theta * ((factor * length / max_pos) - (factor - 1)) ** (dim / (dim - 2))
        return rope_inv_freq(dim, base, torch.float64), 1.0
    if kind == "yarn":
        try:
            inv, att = yarn_inv_freq(
                dim,
                theta,
                factor,
                orig,
                config_number(scaling, "beta_fast", 32, where="rope_scaling"),
                config_number(scaling, "beta_slow", 1, where="rope_scaling"),
                torch.float64,
            )
        except ValueError as e:
            raise HubModelError(f"yarn rope_scaling: {e}") from None
        if scaling.get("attention_factor") is not None:
            att = config_number(scaling, "attention_factor", 1.0, where="rope_scaling")
        return inv, att
    if kind == "llama3":
        return _llama3(inv, scaling, factor, orig), 1.0
    if kind == "longrope":
        return _longrope(inv, scaling, dim, max_pos, orig)
    raise HubModelError(
        f"rope_type {kind!r} is not one fireviz knows (default, linear, dynamic, yarn, llama3, longrope)"
    )


def rope_frequencies(cfg: dict) -> tuple[torch.Tensor, float, dict]:
    """RoPE frequencies of a transformers config, as Hugging Face's ``ROPE_INIT_FUNCTIONS``.

    Returns: ``(inv_freq float64 [rotary_dim // 2] in radians per token, attention_factor,
      settings)`` with settings naming rope_type, rope_theta, rotary_dim and the scaling used.
    Raises: HubModelError for an unknown rope_type or missing fields.
    """
    for k in ("rope_parameters", "rope_scaling"):
        if cfg.get(k) is not None and not isinstance(cfg[k], dict):
            raise HubModelError(f"config.json field {k} must be an object or null (got {type(cfg[k]).__name__})")
    scaling = dict(cfg.get("rope_parameters") or cfg.get("rope_scaling") or {})
    theta, dim, head_dim = _rotary_shape(cfg, scaling)
    kind = scaling.get("rope_type", scaling.get("type", "default"))
    if not isinstance(kind, str):
        raise HubModelError(f"rope_type must be a name (got {str(kind)[:40]!r})")
    max_pos = config_int(cfg, "max_position_embeddings", "n_positions", "max_seq_len", default=2048)
    factor = config_number(scaling, "factor", 1.0, where="rope_scaling")
    if kind not in ("default", "longrope") and factor < 1:
        raise HubModelError(f"rope_scaling factor {factor} must be >= 1 for {kind} scaling (it stretches the context)")
    if scaling.get("original_max_position_embeddings") is not None:
        orig = config_int(scaling, "original_max_position_embeddings")
    else:
        orig = config_int(cfg, "original_max_position_embeddings", default=max_pos)
    inv, att = _scaled(kind, rope_inv_freq(dim, theta, torch.float64), scaling, theta, dim, factor, orig, max_pos)
    if not (torch.isfinite(inv).all() and (inv > 0).all() and math.isfinite(att) and att > 0):
        raise HubModelError(f"the {kind} RoPE settings give non-finite or non-positive frequencies; check rope_scaling")
    settings = {
        "rope_type": kind,
        "rope_theta": theta,
        "rotary_dim": dim,
        "head_dim": head_dim,
        "factor": factor,
        "original_max_position_embeddings": orig,
        "attention_factor": att,
    }
    return inv, att, settings
