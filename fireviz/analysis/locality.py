"""Is a head local, anti-local or mixed? A rule on its bias curve against distance.

``classify_locality(distance, bias)``: Spearman ρ between distance and bias over log-spaced
distances, where the largest bias sits (``peak_fraction``) and the curve's range decide; the
thresholds are ``LOCALITY_RULES``. Local heads' biases fall with distance (ALiBi, Kerple), anti-local
heads' rise (FIRE can learn them, Li et al. 2024 §5), mixed ones do neither.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Sequence

import numpy as np


def _r(v: float, digits: int = 6) -> float | None:
    v = float(v)
    if not math.isfinite(v):
        return None
    return float(f"{v:.{digits}g}")


def _round_significant(a: np.ndarray, digits: int = 6) -> np.ndarray:
    """``float(f"{v:.{digits}g}")`` of every element of ``a`` (float64, same shape; NaN where
    ``a`` is not finite), vectorized: bit-identical to the per-value formatting, about an order
    of magnitude faster on large arrays (a Bloom bias report holds ~18M values).

    Each value is scaled by an exact power of ten (|exponent| ≤ 22) so that it has ``digits``
    digits before the point, rounded to an integer and divided back (one correctly rounded
    operation on exact operands: the double nearest the decimal, as parsing gives). A value
    whose scaled form is within 1e-6 of a rounding tie, falls outside [10^(digits−1), 10^digits)
    (log10 off by one at a power of ten) or needs a larger power is formatted one by one.
    """
    a = np.asarray(a, dtype=np.float64)
    out = np.full(a.shape, np.nan)
    fin = np.isfinite(a)
    zero = fin & (a == 0)
    out[zero] = a[zero]  # keeps −0.0, as formatting does
    nz = fin & ~zero
    v = a[nz]
    with np.errstate(all="ignore"):
        k = (digits - 1) - np.floor(np.log10(np.abs(v))).astype(np.int64)
        ok = np.abs(k) <= 22
        p = 10.0 ** np.abs(np.where(ok, k, 0))
        scaled = np.where(k >= 0, v * p, v / p)
        tie = np.abs(np.abs(scaled - np.trunc(scaled)) - 0.5) <= 1e-6
        ok &= (np.abs(scaled) >= 10.0 ** (digits - 1)) & (np.abs(scaled) < 10.0**digits) & ~tie
        r = np.rint(scaled)
        res = np.where(k >= 0, r / p, r * p)
    for j in np.flatnonzero(~ok):
        res[j] = float(f"{v[j]:.{digits}g}")
    out[nz] = res
    return out


#: Thresholds of ``classify_locality`` (documented there). ``rank_correlation``: Spearman ρ
#: between distance and bias over log-spaced distances; ``peak_fraction``: where the
#: largest bias sits on a log-distance scale (0 = distance 0, 1 = farthest distance);
#: ``flat_range``: curves whose max − min is below this many logits are ``mixed`` (flat).
LOCALITY_RULES: dict[str, float] = {
    "rank_correlation": 0.5,
    "peak_fraction": 0.5,
    "flat_range": 0.01,
    "log_samples": 64,
}
LOCALITY_CLASSES: tuple[str, ...] = ("local", "anti-local", "mixed")


def _average_ranks(x: np.ndarray) -> np.ndarray:
    order = np.argsort(x, kind="mergesort")
    ranks = np.empty(len(x), dtype=np.float64)
    sx = x[order]
    start = 0
    for stop in range(1, len(x) + 1):
        if stop == len(x) or sx[stop] != sx[start]:
            ranks[order[start:stop]] = 0.5 * (start + stop - 1)
            start = stop
    return ranks


def spearman(x: np.ndarray, y: np.ndarray) -> float:
    """Spearman rank correlation with average ranks for ties; 0.0 if either side is constant.

    Returns: float in [−1, 1]. Raises: ValueError for arrays of different length or < 2 items.
    """
    x, y = np.asarray(x, dtype=np.float64), np.asarray(y, dtype=np.float64)
    if x.shape != y.shape or x.ndim != 1 or x.size < 2:
        raise ValueError(f"spearman needs two 1-D arrays of equal length >= 2 (got {x.shape}, {y.shape})")
    rx, ry = _average_ranks(x), _average_ranks(y)
    rx, ry = rx - rx.mean(), ry - ry.mean()
    den = math.sqrt(float((rx * rx).sum() * (ry * ry).sum()))
    return 0.0 if den == 0 else float((rx * ry).sum() / den)


@dataclass
class LocalityScore:
    """One head's locality at one query position (see ``classify_locality``).

    Attributes: ``locality`` in LOCALITY_CLASSES; ``rank_correlation`` Spearman ρ of bias vs
    distance over log-spaced distances; ``peak_distance`` (tokens) of the largest bias;
    ``peak_fraction`` = log(1 + peak_distance)/log(1 + max distance); ``bias_range`` max − min
    logits; ``query_position`` i (tokens) or None; ``reason`` a short human explanation.
    """

    locality: str
    rank_correlation: float
    peak_distance: int
    peak_fraction: float
    bias_range: float
    query_position: int | None = None
    reason: str = ""

    def to_dict(self) -> dict:
        """JSON-ready dict of every attribute (floats rounded to 6 significant digits)."""
        return {
            "locality": self.locality,
            "rank_correlation": _r(self.rank_correlation),
            "peak_distance": int(self.peak_distance),
            "peak_fraction": _r(self.peak_fraction),
            "bias_range": _r(self.bias_range),
            "query_position": self.query_position,
            "reason": self.reason,
        }


def classify_locality(
    distance: Sequence[int] | np.ndarray,
    bias: Sequence[float] | np.ndarray,
    query_position: int | None = None,
    rules: dict | None = None,
) -> LocalityScore:
    """Classify one head's bias curve as ``local``, ``anti-local`` or ``mixed``.

    The FIRE paper (Li et al. 2024, §4.4 and its figures of learned biases) finds heads whose
    bias falls with distance (local) and heads whose bias rises (anti-local). Scores:

    * ρ = Spearman rank correlation between distance and bias over ``log_samples``
      log-spaced distances (0 and geometric steps up to the largest distance). Log spacing
      gives each octave of distance equal weight, so a head that falls steeply over the
      first 16 tokens and stays flat for 500 more counts as falling (on a linear grid the
      flat tail would dominate).
    * peak_fraction = log(1 + d*)/log(1 + d_max), d* the distance of the largest bias
      (nearest one on ties): 0 means the head likes the nearest key, 1 the farthest.
    * bias_range = max − min of the curve (logits).

    Rules (``LOCALITY_RULES``, overridable with ``rules``): range < flat_range (0.01 logits)
    → mixed (flat); ρ ≤ −0.5 and peak_fraction ≤ 0.5 → local; ρ ≥ +0.5 and
    peak_fraction ≥ 0.5 → anti-local; otherwise mixed (e.g. U/∩-shaped or noisy).

    Args: ``distance`` d >= 0 in tokens, strictly increasing, ``[D]``; ``bias`` logits ``[D]``.
    Returns: ``LocalityScore``.
    Raises: ValueError for mismatched/too-short inputs, negative or unsorted distances, or
      non-finite biases.
    """
    r = dict(LOCALITY_RULES, **(rules or {}))
    d = np.asarray(distance, dtype=np.float64)
    b = np.asarray(bias, dtype=np.float64)
    if d.ndim != 1 or d.shape != b.shape or d.size < 2:
        raise ValueError(f"distance and bias must be 1-D of equal length >= 2 (got {d.shape}, {b.shape})")
    if d[0] < 0 or np.any(np.diff(d) <= 0):
        raise ValueError("distances must be >= 0 and strictly increasing (tokens)")
    if not np.all(np.isfinite(b)):
        raise ValueError("bias curve has non-finite values")
    d_max = d[-1]
    # log-spaced sample of the available distances (nearest available one to each target)
    targets = np.unique(np.concatenate([[d[0]], np.geomspace(max(d[0], 1.0), max(d_max, 1.0), int(r["log_samples"]))]))
    idx = np.unique(np.clip(np.searchsorted(d, targets), 0, d.size - 1))
    rho = spearman(d[idx], b[idx]) if idx.size >= 2 else 0.0
    peak = int(np.argmax(b))
    peak_d = float(d[peak])
    frac = math.log1p(peak_d) / math.log1p(d_max) if d_max > 0 else 0.0
    rng = float(b.max() - b.min())
    t, p = float(r["rank_correlation"]), float(r["peak_fraction"])
    if rng < float(r["flat_range"]):
        loc, why = "mixed", f"flat: range {rng:.3g} < {r['flat_range']} logits"
    elif rho <= -t and frac <= p:
        loc, why = "local", f"falls with distance (rho={rho:.2f} <= -{t}, peak at {peak_d:g} tokens)"
    elif rho >= t and frac >= p:
        loc, why = "anti-local", f"rises with distance (rho={rho:.2f} >= {t}, peak at {peak_d:g} tokens)"
    else:
        loc, why = "mixed", f"no monotone trend (rho={rho:.2f}, peak at {peak_d:g} tokens)"
    return LocalityScore(loc, rho, int(peak_d), frac, rng, query_position, why)


# -- the report --------------------------------------------------------------------------------
