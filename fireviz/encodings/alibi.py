"""ALiBi: a fixed linear penalty per head. Source: Press et al. 2022 (ICLR), §3 and the
reference code (ofirpress/attention_with_linear_biases, ``get_slopes``)."""

from __future__ import annotations

import math

import torch

from fireviz.encodings.base import ToeplitzBias


def alibi_slopes(num_heads: int) -> torch.Tensor:
    """Per-head ALiBi slopes m_h, as in Press et al. 2022 and their reference code.

    For a power of two H: m_h = 2^(-8h/H), h = 1..H. Otherwise the slopes of the nearest
    lower power of two, followed by every other slope of the next power of two.

    Returns: float32 tensor of shape [num_heads]; the bias is -m_h * (i - j) logits.
    Raises: ValueError if num_heads < 1.
    """
    if num_heads < 1:
        raise ValueError(f"num_heads must be >= 1 (got {num_heads})")

    def power_of_two(n: int) -> list[float]:
        start = 2.0 ** (-8.0 / n)
        return [start ** (h + 1) for h in range(n)]

    if math.log2(num_heads).is_integer():
        slopes = power_of_two(num_heads)
    else:
        closest = 2 ** math.floor(math.log2(num_heads))
        slopes = power_of_two(closest) + power_of_two(2 * closest)[0::2][: num_heads - closest]
    return torch.tensor(slopes, dtype=torch.float32)


class ALiBi(ToeplitzBias):
    """``b_h(i, j) = −m_h · (i − j)`` logits with fixed slopes ``alibi_slopes(num_heads)``.

    Masked future keys (j > i) get ``−m_h·|i − j|`` so every entry stays finite.
    ``slope`` overrides the per-head slopes with one value for every head.
    Source: Press et al. 2022 (ICLR), "Train Short, Test Long", §3.
    Raises: ValueError for num_heads < 1 or a slope that is not a finite number > 0 (a zero
    or negative slope is no recency bias at all).
    """

    slopes: torch.Tensor  # [num_heads] buffer

    def __init__(self, num_heads: int, slope: float | None = None):
        super().__init__(num_heads)
        if slope is not None and not (math.isfinite(float(slope)) and float(slope) > 0):
            raise ValueError(
                f"ALiBi slope must be a finite number > 0 (got {slope}); omit it for the "
                "standard per-head slopes alibi_slopes(num_heads)"
            )
        slopes = alibi_slopes(num_heads) if slope is None else torch.full((num_heads,), float(slope))
        self.register_buffer("slopes", slopes, persistent=False)

    def bias_by_distance(self, d: torch.Tensor) -> torch.Tensor:
        """``[num_heads, *d.shape]`` logits for distances ``d = i − j`` (tokens)."""
        return -self.slopes.view(-1, *([1] * d.dim())) * d.abs().float()
