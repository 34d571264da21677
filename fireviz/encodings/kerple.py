"""KERPLE: kernelized relative positional embeddings. Source: Chi et al. 2022 (NeurIPS),
§4.2 (logarithmic and power variants) and the reference code (chijames/KERPLE), whose
constraints r1, r2 >= 0.01 and, for the power variant, r2 <= 2 are kept as the reference
keeps them: the parameters are projected back onto the constraint set (``project_``, called
by the trainer after each optimizer step), not clamped inside the graph. A clamp in the
graph has zero gradient below its bound, so a parameter that crossed it froze for good.
In the forward pass the bound is applied with a straight-through estimator: the value is
clamped (so an unprojected parameter still gives the constrained bias), the gradient
passes as if unclamped."""

from __future__ import annotations

import torch
from torch import nn

from fireviz.encodings.base import ToeplitzBias

KERPLE_MIN = 0.01
KERPLE_POWER_MAX = 2.0


class _Kerple(ToeplitzBias):
    """Shared parameters of the two KERPLE variants (Chi et al. 2022, NeurIPS, §4.2).

    Args: ``init_r1``, ``init_r2``: a number (every head) or ``num_heads`` numbers; None
    draws the reference init per head from torch's global RNG (the model's seed): r1 ~ U(0,
    ``init_r1_max``), r2 ~ U(0, ``init_r2_max``) — KerpleLog r1 ~ U(0, 2), r2 ~ U(0, 1);
    KerplePower r1 (the scale) ~ U(0, 1), r2 (the exponent) ~ U(0, 2). In the reference
    code (chijames/KERPLE) ``bias_p`` ~ U(0, 2) is the log variant's multiplier and the power
    variant's exponent, ``bias_a`` ~ U(0, 1) the log variant's inner scale and the power
    variant's multiplier. (fireviz 0.1's KerplePower drew them the other way round: r1 ~ U(0, 2),
    r2 ~ U(0, 1); the kerple_power checkpoints trained before 2026-12-04 were initialised so.) Raises: ValueError for a given value <= 0 or a list whose length
    is not ``num_heads``.
    """

    def __init__(
        self, num_heads: int, init_r1: float | list[float] | None = None, init_r2: float | list[float] | None = None
    ):
        super().__init__(num_heads)
        for name, v in (("init_r1", init_r1), ("init_r2", init_r2)):
            if v is not None and torch.as_tensor(v).numel() not in (1, num_heads):
                raise ValueError(
                    f"Kerple {name} needs one number or {num_heads} (one per head); got {torch.as_tensor(v).numel()}"
                )
        r1 = (
            torch.rand(num_heads) * self.init_r1_max
            if init_r1 is None
            else torch.as_tensor(init_r1, dtype=torch.float32).expand(num_heads).clone()
        )
        r2 = (
            torch.rand(num_heads) * self.init_r2_max
            if init_r2 is None
            else torch.as_tensor(init_r2, dtype=torch.float32).expand(num_heads).clone()
        )
        if (
            init_r1 is not None
            and not (r1.isfinite() & (r1 > 0)).all()
            or init_r2 is not None
            and not (r2.isfinite() & (r2 > 0)).all()
        ):
            raise ValueError(f"Kerple needs r1 > 0 and r2 > 0 (got r1={r1.tolist()}, r2={r2.tolist()})")
        self.r1 = nn.Parameter(r1.float())
        self.r2 = nn.Parameter(r2.float())

    #: upper bound of r2 (None: unbounded); the power variant sets 2.
    r2_max: float | None = None
    #: the reference init's ranges: r1 ~ U(0, init_r1_max), r2 ~ U(0, init_r2_max)
    init_r1_max: float = 2.0
    init_r2_max: float = 1.0

    def constrained(self) -> tuple[torch.Tensor, torch.Tensor]:
        """``(r1, r2)`` after the reference constraints, float32 ``[num_heads]`` each.

        Values are clamped to r1 >= 0.01, 0.01 <= r2 (<= 2 for the power variant); the
        gradient is the identity (straight-through), so it never vanishes at a bound.
        """
        return (
            _straight_through_clamp(self.r1, KERPLE_MIN, None),
            _straight_through_clamp(self.r2, KERPLE_MIN, self.r2_max),
        )

    @torch.no_grad()
    def project_(self) -> None:
        """Clamp the raw r1, r2 in place onto the constraint set (the reference's projection)."""
        self.r1.clamp_(min=KERPLE_MIN)
        self.r2.clamp_(min=KERPLE_MIN, max=self.r2_max)

    def position_parameters(self) -> dict[str, list[float]]:
        """``{"r1": [...], "r2": [...]}``: the constrained values per head (floats)."""
        r1, r2 = self.constrained()
        return {"r1": r1.detach().cpu().tolist(), "r2": r2.detach().cpu().tolist()}


class _StraightThroughClamp(torch.autograd.Function):
    """``x.clamp(lo, hi)`` exactly in value; the incoming gradient passes unchanged."""

    @staticmethod
    def forward(ctx, x, lo, hi):
        return x.clamp(min=lo, max=hi)

    @staticmethod
    def backward(ctx, g):
        return g, None, None


def _straight_through_clamp(x: torch.Tensor, lo: float | None, hi: float | None) -> torch.Tensor:
    """``x.clamp(lo, hi)`` in value (bit-exact), identity in gradient."""
    return _StraightThroughClamp.apply(x, lo, hi)


class KerpleLog(_Kerple):
    """Logarithmic KERPLE: ``b_h(d) = −r1_h · log(1 + r2_h · |d|)`` logits, d = i − j tokens.

    Parameters r1, r2: float32 ``[num_heads]``, learnable, constrained to >= 0.01 (see the module docstring).
    Raises: ValueError for a given r1 or r2 <= 0.
    """

    def bias_by_distance(self, d: torch.Tensor) -> torch.Tensor:
        """``[num_heads, *d.shape]`` float32 logits for distances ``d = i − j`` (tokens)."""
        r1, r2 = (p.view(-1, *([1] * d.dim())) for p in self.constrained())
        return -r1 * torch.log1p(r2 * d.abs().float())


class KerplePower(_Kerple):
    """Power KERPLE: ``b_h(d) = −r1_h · |d|^r2_h`` logits, d = i − j tokens, 0 < r2 <= 2.

    ``|d|^r2`` is evaluated as ``exp(r2·log|d|)`` only where d ≠ 0 so the gradient with
    respect to r2 stays finite at d = 0 (where the bias is exactly 0).
    Raises: ValueError for a given r1 or r2 <= 0.
    """

    r2_max = KERPLE_POWER_MAX
    #: the reference init's ranges (KERPLE's code: bias_a ~ U(0, 1), bias_p ~ U(0, 2)); an instance
    #: with ``reference_init=False`` draws fireviz 0.1's reversed ranges instead
    init_r1_max = 1.0
    init_r2_max = 2.0

    def __init__(
        self,
        num_heads: int,
        init_r1: float | list[float] | None = None,
        init_r2: float | list[float] | None = None,
        reference_init: bool = True,
    ):
        """``reference_init``: draw the scale r1 ~ U(0, 1) and the exponent r2 ~ U(0, 2) as the
        KERPLE reference code does (True, the default); False draws r1 ~ U(0, 2), r2 ~ U(0, 1),
        fireviz 0.1's init, to reproduce the kerple_power checkpoints trained before 2026-12-04
        (their config.json does not name this option). Only the draw of an unset init_r1 /
        init_r2 depends on it. Raises: ValueError as ``_Kerple``, or for a non-bool."""
        if not isinstance(reference_init, bool):
            raise ValueError(f"Kerple-power reference_init must be true or false (got {reference_init!r})")
        self.reference_init = reference_init
        # the scale (the reference's bias_a ~ U(0, 1)), the exponent (its bias_p ~ U(0, 2))
        self.init_r1_max, self.init_r2_max = (1.0, 2.0) if reference_init else (2.0, 1.0)
        super().__init__(num_heads, init_r1, init_r2)

    def bias_by_distance(self, d: torch.Tensor) -> torch.Tensor:
        """``[num_heads, *d.shape]`` float32 logits for distances ``d = i − j`` (tokens)."""
        r1, r2 = (p.view(-1, *([1] * d.dim())) for p in self.constrained())
        dist = d.abs().float()
        nonzero = dist > 0
        safe_log = torch.log(torch.where(nonzero, dist, torch.ones_like(dist)))
        powered = torch.where(nonzero, torch.exp(r2 * safe_log), torch.zeros_like(dist))
        return -r1 * powered
