"""Sandwich: the inner product of sinusoidal position embeddings used as a bias.
Source: Chi et al. 2023 (ACL), "Dissecting Transformer Length Extrapolation via the Lens of
Receptive Field Analysis", §5; per-head compression as in its reference code."""

from __future__ import annotations

import torch

from fireviz.encodings.base import ToeplitzBias

#: largest d̄: a model dimension (Sandwich's reference uses the model's, 128–1024); S(d) costs
#: [len(d), d̄/2] numbers per call, so a config.json's 1e8 would cost gigabytes per scan (issue #38)
MAX_DBAR = 1 << 16


def sandwich_kernel(d: torch.Tensor, dbar: int = 128) -> torch.Tensor:
    """``S(d) = Σ_{k=0}^{dbar/2−1} cos(d / 10000^(2k/dbar))`` (float32, shaped like d).

    ``S(0) = dbar/2``; S decays (non-monotonically) with |d|. d in tokens.
    Raises: ValueError if dbar is not an even integer in 2 … ``MAX_DBAR``.
    """
    if dbar < 2 or dbar % 2 or dbar > MAX_DBAR:
        raise ValueError(f"dbar must be an even integer in 2 … {MAX_DBAR} (got {dbar})")
    k = torch.arange(dbar // 2, device=d.device, dtype=torch.float64)
    inv_freq = 10000.0 ** (-2.0 * k / dbar)
    angles = d.double().unsqueeze(-1) * inv_freq
    return torch.cos(angles).sum(-1).float()


class Sandwich(ToeplitzBias):
    """Sandwich bias with per-head compression (fixed, no parameters).

    ``b_h(d) = (S(d) − dbar/2) / r_h`` with ``r_h = 8h/H`` for h = 1..H (the ALiBi-style
    ratios of the reference code), so b_h(0) = 0 and every head penalises distance, the
    first heads most. Masked future keys use |d|.
    Args: ``dbar`` (128): the sinusoid dimension d̄ of S(d) = Σ_k cos(d / 10000^(2k/d̄)).
    Source: Chi et al. 2023 (ACL), "Dissecting Transformer Length Extrapolation via the Lens
      of Receptive Field Analysis", §5.
    Raises: ValueError for num_heads < 1 or an odd dbar or one below 2.
    """

    compression: torch.Tensor  # [num_heads] buffer

    def __init__(self, num_heads: int, dbar: int = 128):
        super().__init__(num_heads)
        self.dbar = dbar
        sandwich_kernel(torch.zeros(1), dbar)  # validate
        ratios = 8.0 * torch.arange(1, num_heads + 1, dtype=torch.float32) / num_heads
        self.register_buffer("compression", ratios, persistent=False)

    def bias_by_distance(self, d: torch.Tensor) -> torch.Tensor:
        """``[num_heads, *d.shape]`` logits for distances ``d = i − j`` (tokens)."""
        s = sandwich_kernel(d.abs(), self.dbar) - self.dbar / 2
        return s.unsqueeze(0) / self.compression.view(-1, *([1] * d.dim()))
