"""Rotary position embeddings and their zero-shot length extensions.

Sources: Su et al. 2021 (RoFormer) eq. 34 with the rotate-half layout of GPT-NeoX/Hugging
Face; position interpolation (PI): Chen et al. 2023, eq. 4 (positions divided by the
factor s); YaRN: Peng et al. 2023, §3.2–3.4 ("NTK-by-parts" ramp between γ bounds set by
beta_fast/beta_slow, attention temperature √(1/t) = 0.1·ln(s) + 1), matching Hugging Face
``_compute_yarn_parameters``.
"""

from __future__ import annotations

import math

import torch

from fireviz.encodings.base import PositionEncoding


def rope_inv_freq(head_dim: int, base: float = 10000.0, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """RoPE frequencies θ_k = base^(−2k/head_dim), k = 0..head_dim/2 − 1 (radians per token).

    Returns: ``[head_dim // 2]`` in ``dtype`` (float32 by default; computed in float64).
    Raises: ValueError if head_dim is not a positive even integer or base <= 1.
    """
    if head_dim < 2 or head_dim % 2:
        raise ValueError(f"RoPE needs an even head_dim >= 2 (got {head_dim})")
    if not (math.isfinite(base) and base > 1):
        raise ValueError(f"rope_theta (base) must be > 1 (got {base})")
    exponent = torch.arange(0, head_dim, 2, dtype=torch.float64) / head_dim
    return (1.0 / base**exponent).to(dtype)


def _yarn_correction_dim(num_rotations: float, head_dim: int, base: float, max_pos: int) -> float:
    # Index k whose wavelength 2π/θ_k fits num_rotations times into max_pos.
    return head_dim * math.log(max_pos / (num_rotations * 2 * math.pi)) / (2 * math.log(base))


def yarn_attention_factor(factor: float) -> float:
    """YaRN's √(1/t) = 0.1·ln(s) + 1 for s > 1, else 1 (Peng et al. 2023, eq. 22)."""
    return 0.1 * math.log(factor) + 1.0 if factor > 1 else 1.0


def yarn_inv_freq(
    head_dim: int,
    base: float,
    factor: float,
    original_max_position_embeddings: int,
    beta_fast: float = 32,
    beta_slow: float = 1,
    dtype: torch.dtype = torch.float32,
) -> tuple[torch.Tensor, float]:
    """YaRN frequencies and attention factor (Peng et al. 2023, §3.2–3.4; HF reference).

    ``original_max_position_embeddings``: the training context in tokens; ``beta_fast`` /
    ``beta_slow``: numbers of full rotations over that context that bound the ramp
    (dim(β) is the frequency index that turns β times over it).
    Frequencies with index below ``low = floor(dim(beta_fast))`` keep θ_k (extrapolate),
    those above ``high = ceil(dim(beta_slow))`` become θ_k / s (interpolate), with a linear
    ramp in between.

    Returns: ``(inv_freq [head_dim // 2] in dtype (float32 default), attention_factor)``; fireviz multiplies
    both q and k by attention_factor once, so the logits scale by its square (= 1/t).
    Raises: ValueError for factor < 1, beta_fast <= beta_slow, or bad head_dim/base.
    """
    if not (math.isfinite(factor) and factor >= 1):
        raise ValueError(f"rope_scaling factor must be >= 1 (got {factor})")
    if not beta_fast > beta_slow > 0:
        raise ValueError(
            f"YaRN needs beta_fast > beta_slow > 0 rotations (got beta_fast={beta_fast}, "
            f"beta_slow={beta_slow}; the paper uses 32 and 1)"
        )
    theta = rope_inv_freq(head_dim, base, torch.float64)
    low = max(math.floor(_yarn_correction_dim(beta_fast, head_dim, base, original_max_position_embeddings)), 0)
    high: float = min(
        math.ceil(_yarn_correction_dim(beta_slow, head_dim, base, original_max_position_embeddings)), head_dim - 1
    )
    if low == high:
        high += 0.001  # avoid a zero-width ramp (HF does the same)
    ramp = ((torch.arange(head_dim // 2, dtype=torch.float64) - low) / (high - low)).clamp(0, 1)
    extrapolation_weight = 1 - ramp
    inv_freq = theta / factor * (1 - extrapolation_weight) + theta * extrapolation_weight
    return inv_freq.to(dtype), yarn_attention_factor(factor)


class RotaryEmbedding(PositionEncoding):
    """RoPE (``rope``), RoPE with position interpolation (``rope_pi``) or YaRN (``yarn``).

    ``rotate(x, positions)`` returns x rotated pair-wise (rotate-half layout) by angles
    ``positions · inv_freq``. The frequencies are a float64 buffer that keeps its dtype
    when the module is cast (``model.to(torch.bfloat16)`` moves it, never rounds it: in
    bf16 the angle at position 8191 would be off by radians); angles, cos and sin are
    computed in float64, the rotation in float32 with autocast off, and the result is cast
    back to ``x.dtype``. For ``yarn`` the result is also scaled
    by the attention factor (applied once per tensor, i.e. to q and to k).

    Args:
      num_heads, head_dim: attention shape; head_dim even.
      rope_theta: base (10000 in RoFormer).
      rope_scaling: ``None`` | ``{"type": "pi"|"yarn", "factor": s,
        "original_max_position_embeddings": L_train, "beta_fast": 32, "beta_slow": 1}``.
    Raises: ValueError for a bad head_dim, theta or scaling.
    """

    kind = "rotary"

    def __init__(self, num_heads: int, head_dim: int, rope_theta: float = 10000.0, rope_scaling: dict | None = None):
        super().__init__(num_heads)
        self.head_dim = head_dim
        self.rope_theta = float(rope_theta)
        self.rope_scaling = dict(rope_scaling) if rope_scaling else None
        self.attention_factor = 1.0
        inv_freq = rope_inv_freq(head_dim, self.rope_theta, torch.float64)
        if self.rope_scaling:
            kind = self.rope_scaling.get("type")
            factor = float(self.rope_scaling.get("factor", 1.0))
            if kind == "pi":
                if not (math.isfinite(factor) and factor >= 1):
                    raise ValueError(f"rope_scaling factor must be >= 1 (got {factor})")
                inv_freq = inv_freq / factor  # identical to dividing positions by s
            elif kind == "yarn":
                orig = self.rope_scaling.get("original_max_position_embeddings")
                if not orig and factor == 1.0:
                    orig = 1  # s = 1: YaRN is plain RoPE whatever the training length
                if not orig:
                    raise ValueError("yarn rope_scaling needs original_max_position_embeddings (the training length)")
                inv_freq, self.attention_factor = yarn_inv_freq(
                    head_dim,
                    self.rope_theta,
                    factor,
                    int(orig),
                    self.rope_scaling.get("beta_fast", 32),
                    self.rope_scaling.get("beta_slow", 1),
                    torch.float64,
                )
            else:
                raise ValueError(f"rope_scaling type must be 'pi' or 'yarn' (got {kind!r})")
        self.register_buffer("inv_freq", inv_freq, persistent=False)

    def _apply(self, fn, recurse=True):
        # .to(dtype) / .half() / .bfloat16() would round the frequencies; keep them float64
        # and follow only the device change.
        inv_freq = self.inv_freq
        super()._apply(fn, recurse)
        self.inv_freq = inv_freq.to(self.inv_freq.device)
        return self

    def cos_sin(self, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """float32 ``cos, sin`` of shape ``[T, head_dim]`` for int positions ``[T]`` (tokens);
        angles and their cos/sin computed in float64 whatever the module's dtype."""
        with torch.autocast(device_type=positions.device.type, enabled=False):
            angles = positions.to(torch.float64)[:, None] * self.inv_freq.to(positions.device)[None, :]
            angles = torch.cat([angles, angles], dim=-1)
            return ((angles.cos() * self.attention_factor).float(), (angles.sin() * self.attention_factor).float())

    def rotate(self, x: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        """Rotate ``x [..., T, head_dim]`` at absolute ``positions [T]``; same dtype as x."""
        cos, sin = self.cos_sin(positions)
        xf = x.float()
        half = self.head_dim // 2
        rotated_half = torch.cat([-xf[..., half:], xf[..., :half]], dim=-1)
        return (xf * cos + rotated_half * sin).to(x.dtype)
