"""T5 relative position bias: a learned scalar per (bucket, head).

Source: Raffel et al. 2020 (T5), §2.1; bucketing as in Hugging Face
``transformers.models.t5.modeling_t5.T5Attention._relative_position_bucket``.
"""

from __future__ import annotations

import math

import torch
from torch import nn

from fireviz.encodings.base import ToeplitzBias


def relative_position_bucket(
    relative_position: torch.Tensor,
    bidirectional: bool = False,
    num_buckets: int = 32,
    max_distance: int = 128,
) -> torch.Tensor:
    """Map ``relative_position = key − query`` (tokens, int tensor) to a T5 bucket id.

    Causal (``bidirectional=False``): only non-positive relative positions get distinct
    buckets; distance ``n = −min(rel, 0)`` uses bucket n for n < num_buckets/2 and a
    log-spaced bucket up to ``max_distance`` beyond, saturating at ``num_buckets − 1``.
    Bidirectional: half the buckets for each sign.

    Returns: int64 tensor shaped like ``relative_position``, values in [0, num_buckets).
    Raises: ValueError if num_buckets < 2 (4 when bidirectional) or max_distance is not
    larger than the exact range.
    """
    if num_buckets < (4 if bidirectional else 2):
        raise ValueError(f"num_buckets={num_buckets} is too small for T5 bucketing")
    rel = relative_position.long()
    buckets = torch.zeros_like(rel)
    if bidirectional:
        num_buckets //= 2
        buckets = buckets + (rel > 0).long() * num_buckets
        n = rel.abs()
    else:
        n = -torch.clamp(rel, max=0)
    max_exact = num_buckets // 2
    if max_distance <= max_exact:
        raise ValueError(f"max_distance={max_distance} must exceed num_buckets//2={max_exact} (exact range)")
    # Clamp before the log so the unused branch never computes log(0) (HF computes it and
    # discards it; the result is identical).
    n_large = torch.clamp(n, min=max_exact).float()
    large = (
        max_exact
        + (torch.log(n_large / max_exact) / math.log(max_distance / max_exact) * (num_buckets - max_exact)).long()
    )
    large = torch.clamp(large, max=num_buckets - 1)
    return buckets + torch.where(n < max_exact, n, large)


class T5RelativeBias(ToeplitzBias):
    """T5's bucketed bias: ``b_h(i, j) = table[relative_position_bucket(j − i), h]``.

    Parameters: ``relative_attention_bias`` float32 ``[num_buckets, num_heads]`` (logits),
    initialised N(0, 0.02²) — fireviz's choice, the std of GPT-2 / nanoGPT's other weights;
    Hugging Face's T5 draws it with std ``initializer_factor · d_model^−0.5`` (0.088 at
    d_model = 128), ``T5PreTrainedModel._init_weights`` — one table per layer in fireviz's GPT (T5 shares it across
    layers; per-layer tables are the FIRE paper's baseline setup).
    Args: ``num_buckets`` (32), ``max_distance`` (128 tokens: distances beyond it share the
      last bucket), ``bidirectional`` (False: causal LM bucketing, future keys in bucket 0),
      ``init_std`` (0.02, logits).
    Source: Raffel et al. 2020 (JMLR), §2.1; HF transformers ``T5Attention._relative_position_bucket``.
    Raises: ValueError for num_heads < 1, init_std < 0, or bucketing that ``relative_position_bucket``
      rejects (e.g. too few buckets, max_distance not above the exact range).
    """

    def __init__(
        self,
        num_heads: int,
        num_buckets: int = 32,
        max_distance: int = 128,
        bidirectional: bool = False,
        init_std: float = 0.02,
    ):
        super().__init__(num_heads)
        if not (math.isfinite(init_std) and init_std >= 0):
            raise ValueError(f"T5 init_std must be a finite number >= 0 (got {init_std}); fireviz's default is 0.02")
        self.num_buckets = num_buckets
        self.max_distance = max_distance
        self.bidirectional = bidirectional
        relative_position_bucket(torch.zeros(1), bidirectional, num_buckets, max_distance)  # validate
        self.relative_attention_bias = nn.Parameter(torch.randn(num_buckets, num_heads) * init_std)

    def position_parameters(self) -> dict[str, list[float]]:
        """``{"bias_min": [...], "bias_max": [...]}``: per head, the smallest and largest
        logit in the learned bucket table (how far the table has moved from its init)."""
        table = self.relative_attention_bias.detach().float().cpu()
        return {"bias_min": table.min(0).values.tolist(), "bias_max": table.max(0).values.tolist()}

    def bias_by_distance(self, d: torch.Tensor) -> torch.Tensor:
        """``[num_heads, *d.shape]`` logits for distances ``d = i − j`` (tokens)."""
        b = relative_position_bucket(-d, self.bidirectional, self.num_buckets, self.max_distance)
        return self.relative_attention_bias[b].movedim(-1, 0)
