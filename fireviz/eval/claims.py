"""Claims as data: each comparison the docs make, computed from the checkpoints' own results.

A *claim* compares two arms — lists of checkpoint folders, the training seeds of one recipe — on
one domain, protocol (``mode``: ``same_text`` or ``context``) and length, in bits per byte:
``difference`` = mean over a's seeds − mean over b's seeds (a change along a row when ``a`` and
``b`` are the same arm at two lengths). Its interval and verdict follow one rule, sized to the
seeds (docs/protocol.md, *Claims and their verdicts*):

- **≥ 2 seeds in each arm**: a test over seed means — Welch's unequal-variance t-test (Welch
  1947) for two arms, a paired t-test over the seeds for one arm at two lengths; its 95 %
  interval of the difference; ``resolved`` for p < 0.05, ``suggestive`` for p < 0.2, else
  ``unresolved``.
- **one seed on either side**: the 95 % paired bootstrap interval over documents of the arms'
  difference (an arm's per-document losses averaged over its seeds; ``stats.paired_difference``),
  which measures the text's noise, not the seeds': ``resolved`` only for |difference| ≥ the
  domain's threshold — ``SINGLE_SEED_RESOLVED_BPB`` (0.1 bpb), or 3 × the largest seed standard
  deviation measured in that domain and protocol where that is larger (out of domain, where
  seeds spread more; :func:`seed_spread`) — with an interval that excludes 0; ``suggestive``
  for an interval that excludes 0; else ``unresolved``.

The t distribution is computed here (its CDF through the regularized incomplete beta function,
Numerical Recipes 3rd ed. §6.4 and §6.14; its quantile by bisection) rather than pulling in
SciPy for two functions; ``tests/eval/test_claims.py`` checks them against tabulated values.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import tomllib

from fireviz.checkpoints import seed_groups
from fireviz.eval.stats import paired_difference

#: p below which a test over seed means resolves a claim, and below which it is suggestive
P_RESOLVED = 0.05
P_SUGGESTIVE = 0.2
#: |difference| (bits per byte) a single-seed claim needs to be resolved: far beyond the seed
#: spreads measured on the bundled checkpoints (standard deviations 0.004–0.016 on prose)
SINGLE_SEED_RESOLVED_BPB = 0.1
VERDICTS = ("resolved", "suggestive", "unresolved")
MODES = ("same_text", "context")
#: the single-seed threshold in units of the largest seed standard deviation measured
SINGLE_SEED_SPREADS = 3.0
#: a variant's settings (a row of the same checkpoint evaluated differently)
VARIANT_KEYS = ("normalizer_cap", "rope_scaling")


class ClaimError(ValueError):
    """A claim that cannot be computed: a malformed spec, or a checkpoint, row or length the
    results do not hold (the message names which and how to fix it)."""


# -- the t distribution ------------------------------------------------------------------------


def _betacf(a: float, b: float, x: float) -> float:
    """The continued fraction of the incomplete beta function (modified Lentz; Numerical Recipes §6.4)."""
    tiny, eps = 1e-300, 1e-15
    qab, qap, qam = a + b, a + 1.0, a - 1.0
    c, d = 1.0, 1.0 - qab * x / qap
    d = 1.0 / (d if abs(d) > tiny else tiny)
    h = d
    for m in range(1, 10_000):
        m2 = 2 * m
        aa = m * (b - m) * x / ((qam + m2) * (a + m2))
        d = 1.0 + aa * d
        d = 1.0 / (d if abs(d) > tiny else tiny)
        c = 1.0 + aa / c
        c = c if abs(c) > tiny else tiny
        h *= d * c
        aa = -(a + m) * (qab + m) * x / ((a + m2) * (qap + m2))
        d = 1.0 + aa * d
        d = 1.0 / (d if abs(d) > tiny else tiny)
        c = 1.0 + aa / c
        c = c if abs(c) > tiny else tiny
        delta = d * c
        h *= delta
        if abs(delta - 1.0) < eps:
            return h
    raise ArithmeticError(f"incomplete beta: no convergence for a={a}, b={b}, x={x}")


def regularized_incomplete_beta(a: float, b: float, x: float) -> float:
    """I_x(a, b) for a, b > 0 and 0 ≤ x ≤ 1 (Numerical Recipes 3rd ed. §6.4).

    Raises: ValueError for a or b ≤ 0 or x outside [0, 1]."""
    if not (a > 0 and b > 0) or not 0.0 <= x <= 1.0:
        raise ValueError(f"incomplete beta needs a, b > 0 and 0 <= x <= 1 (got a={a}, b={b}, x={x})")
    if x in (0.0, 1.0):
        return x
    log_front = math.lgamma(a + b) - math.lgamma(a) - math.lgamma(b) + a * math.log(x) + b * math.log1p(-x)
    front = math.exp(log_front)
    if x < (a + 1.0) / (a + b + 2.0):
        return front * _betacf(a, b, x) / a
    return 1.0 - front * _betacf(b, a, 1.0 - x) / b


def student_t_cdf(t: float, df: float) -> float:
    """P(T ≤ t) for Student's t with ``df`` > 0 degrees of freedom (real df: Welch's).

    Raises: ValueError for df ≤ 0 or a NaN t."""
    if not df > 0 or math.isnan(t):
        raise ValueError(f"the t distribution needs df > 0 and a number t (got t={t}, df={df})")
    if math.isinf(t):
        return 1.0 if t > 0 else 0.0
    tail = 0.5 * regularized_incomplete_beta(df / 2.0, 0.5, df / (df + t * t))
    return 1.0 - tail if t > 0 else tail


def student_t_ppf(q: float, df: float) -> float:
    """The ``q`` quantile of Student's t with ``df`` degrees of freedom (bisection on the CDF to
    1e-12). Raises: ValueError for q outside (0, 1) or df ≤ 0."""
    if not 0.0 < q < 1.0:
        raise ValueError(f"a quantile needs 0 < q < 1 (got {q})")
    if q == 0.5:
        return 0.0
    if q < 0.5:
        return -student_t_ppf(1.0 - q, df)
    lo, hi = 0.0, 1.0
    while student_t_cdf(hi, df) < q:
        hi *= 2.0
    for _ in range(200):
        mid = 0.5 * (lo + hi)
        if student_t_cdf(mid, df) < q:
            lo = mid
        else:
            hi = mid
        if hi - lo < 1e-12 * max(1.0, hi):
            break
    return 0.5 * (lo + hi)


@dataclass(frozen=True)
class TTest:
    """A t-test's result: ``difference`` (mean a − mean b, or the mean paired difference),
    ``interval`` (its 95 % confidence interval), ``t``, ``df`` and the two-sided ``p``."""

    difference: float
    interval: tuple[float, float]
    t: float
    df: float
    p: float


def _t_result(diff: float, se: float, df: float) -> TTest:
    if se == 0.0:  # identical values within each arm: no spread to test against
        p = 1.0 if diff == 0.0 else 0.0
        t = 0.0 if diff == 0.0 else math.copysign(math.inf, diff)
        return TTest(diff, (diff, diff), t, df, p)
    t = diff / se
    p = 2.0 * student_t_cdf(-abs(t), df)
    half = student_t_ppf(0.975, df) * se
    return TTest(diff, (diff - half, diff + half), t, df, min(1.0, p))


def welch_t_test(a: Sequence[float], b: Sequence[float]) -> TTest:
    """Welch's unequal-variance t-test of mean(a) − mean(b) (Welch 1947; df by Welch–Satterthwaite).

    Raises: ValueError when either sample has fewer than 2 values."""
    x, y = np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64)
    if len(x) < 2 or len(y) < 2:
        raise ValueError(f"Welch's test needs >= 2 values per sample (got {len(x)} and {len(y)})")
    va, vb = x.var(ddof=1) / len(x), y.var(ddof=1) / len(y)
    diff, se = float(x.mean() - y.mean()), math.sqrt(va + vb)
    df = (va + vb) ** 2 / (va**2 / (len(x) - 1) + vb**2 / (len(y) - 1)) if va + vb > 0 else float(len(x) + len(y) - 2)
    return _t_result(diff, se, float(df))


def paired_t_test(differences: Sequence[float]) -> TTest:
    """The one-sample t-test of paired differences against 0 (df = n − 1).

    Raises: ValueError for fewer than 2 differences."""
    d = np.asarray(differences, dtype=np.float64)
    if len(d) < 2:
        raise ValueError(f"a paired t-test needs >= 2 differences (got {len(d)})")
    return _t_result(float(d.mean()), float(d.std(ddof=1) / math.sqrt(len(d))), float(len(d) - 1))


# -- claim specs -------------------------------------------------------------------------------


@dataclass(frozen=True)
class ClaimSpec:
    """One comparison the docs make (docs/claims.toml).

    ``id``: a unique slug; ``statement``: the sentence the docs use (without its numbers);
    ``domain``: ``prose``, ``latex`` or ``code``; ``mode``: ``same_text`` or ``context``;
    ``length``: tokens (``same_text``: the window length; ``context``: the context length c, or
    ``"full"``); ``a``, ``b``: checkpoint folder names, the seeds of each arm; ``length_b``: b's
    length when it differs from a's (a change along a row: then usually ``a == b``);
    ``variant_a``, ``variant_b``: the row of each arm evaluated as a variant
    (``{"normalizer_cap": 512}``, ``{"rope_scaling": "yarn"}``), none for the plain row."""

    id: str
    statement: str
    domain: str
    mode: str
    length: int | str
    a: tuple[str, ...]
    b: tuple[str, ...]
    length_b: int | str | None = None
    variant_a: Mapping[str, Any] = field(default_factory=dict)
    variant_b: Mapping[str, Any] = field(default_factory=dict)

    def checkpoints(self) -> set[str]:
        """Every checkpoint folder the claim reads."""
        return set(self.a) | set(self.b)


def _spec(raw: Mapping[str, Any], where: str) -> ClaimSpec:
    known = {f for f in ClaimSpec.__dataclass_fields__}
    if unknown := set(raw) - known:
        raise ClaimError(f"{where}: unknown field(s) {sorted(unknown)}; a claim has {sorted(known)}")
    missing = [k for k in ("id", "statement", "domain", "mode", "length", "a", "b") if k not in raw]
    if missing:
        raise ClaimError(f"{where}: missing {missing}")
    if raw["mode"] not in MODES:
        raise ClaimError(f"{where}: mode {raw['mode']!r} is not one of {MODES}")
    for k in ("a", "b"):
        v = raw[k]
        if not (isinstance(v, list) and v and all(isinstance(n, str) and n for n in v)) or len(set(v)) != len(v):
            raise ClaimError(f"{where}: {k} must be a non-empty list of distinct checkpoint folder names")
    for k in ("length", "length_b"):
        v = raw.get(k)
        if v is not None and not (isinstance(v, int) and v > 0 or v == "full"):
            raise ClaimError(f"{where}: {k} must be a positive number of tokens or 'full' (got {v!r})")
    for k in ("variant_a", "variant_b"):
        if set(raw.get(k) or {}) - set(VARIANT_KEYS):
            raise ClaimError(f"{where}: {k} may set only {VARIANT_KEYS}")
    return ClaimSpec(
        id=str(raw["id"]),
        statement=str(raw["statement"]),
        domain=str(raw["domain"]),
        mode=str(raw["mode"]),
        length=raw["length"],
        a=tuple(raw["a"]),
        b=tuple(raw["b"]),
        length_b=raw.get("length_b"),
        variant_a=dict(raw.get("variant_a") or {}),
        variant_b=dict(raw.get("variant_b") or {}),
    )


def read_claim_specs(path: str | Path) -> list[ClaimSpec]:
    """The claims of a TOML file: ``[[claim]]`` tables with :class:`ClaimSpec`'s fields.

    Raises: ClaimError for an unreadable file, a malformed or duplicate claim (naming it)."""
    try:
        raw = tomllib.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, tomllib.TOMLDecodeError) as e:
        raise ClaimError(f"cannot read the claims {path}: {e}") from e
    specs = [_spec(c, f"{path}: claim {k + 1} ({c.get('id', '?')})") for k, c in enumerate(raw.get("claim", []))]
    ids = [s.id for s in specs]
    if dup := sorted({i for i in ids if ids.count(i) > 1}):
        raise ClaimError(f"{path}: duplicate claim ids {dup}")
    return specs


# -- computing a claim ------------------------------------------------------------------------


def _row(results: Mapping[str, Sequence[Mapping]], name: str, spec: ClaimSpec, variant: Mapping) -> Mapping:
    rows = results.get(name)
    if rows is None:
        raise ClaimError(f"claim {spec.id}: no results for checkpoint {name!r} (publish it first)")
    for r in rows:
        s = r.get("settings", {})
        if (
            s.get("data") == spec.domain
            and s.get("mode") == spec.mode
            and all(s.get(k) == variant.get(k) for k in VARIANT_KEYS)
        ):
            return r
    what = f"{spec.domain} {spec.mode}" + (f" {dict(variant)}" if variant else "")
    raise ClaimError(f"claim {spec.id}: {name}'s results.json has no {what} row (publish it first)")


def _entry(row: Mapping, length: int | str, spec: ClaimSpec) -> Mapping:
    n = row["settings"].get("full_context") if length == "full" else length
    for e in row["per_length"]:
        if e.get("length") == n and "error" not in e:
            return e
    raise ClaimError(
        f"claim {spec.id}: {row.get('checkpoint')}'s {spec.domain} {spec.mode} row has no length {length} "
        "(publish it with that length first)"
    )


def _arm_entry(entries: Sequence[Mapping]) -> dict:
    """One entry whose per-document nats are the mean over an arm's seeds (the same documents and
    tokens in each), so its bits per byte is the arm's mean bits per byte."""
    docs: list[dict] = [e["per_document"] for e in entries if isinstance(e.get("per_document"), dict)]
    if len(docs) != len(entries) or any(d["doc"] != docs[0]["doc"] or d["tokens"] != docs[0]["tokens"] for d in docs):
        raise ClaimError("the seeds of an arm did not score the same documents and tokens")
    nats = np.mean([np.asarray(d["nats"], dtype=np.float64) for d in docs], axis=0)
    return {"per_document": {"doc": docs[0]["doc"], "tokens": docs[0]["tokens"], "nats": nats.tolist()}}


def _verdict_from_p(p: float) -> str:
    return "resolved" if p < P_RESOLVED else "suggestive" if p < P_SUGGESTIVE else "unresolved"


def single_seed_verdict(
    difference: float, interval: Sequence[float] | None, threshold: float = SINGLE_SEED_RESOLVED_BPB
) -> str:
    """The verdict of a claim with one seed on either side (see the module docstring):
    ``threshold`` is the |difference| (bits per byte) it needs to be resolved."""
    if interval is None or interval[0] <= 0.0 <= interval[1]:
        return "unresolved"
    return "resolved" if abs(difference) >= threshold else "suggestive"


def seed_spread(results: Mapping[str, Sequence[Mapping]], domain: str, mode: str) -> float:
    """The largest sample standard deviation over training seeds (bits per byte) of any seed
    group among ``results`` (``checkpoints.seed_groups``: ``fire``, ``fire_seed1``, …) at any
    length of its plain rows in ``domain`` and ``mode``; 0.0 without a group of ≥ 2 seeds there."""
    worst = 0.0
    for members in seed_groups(list(results)).values():
        by_length: dict[int, list[float]] = {}
        for name in members:
            for r in results[name]:
                s = r.get("settings", {})
                if s.get("data") != domain or s.get("mode") != mode or any(s.get(k) for k in VARIANT_KEYS):
                    continue
                for e in r.get("per_length", []):
                    if "error" not in e and "bits_per_byte" in e:
                        by_length.setdefault(e["length"], []).append(float(e["bits_per_byte"]))
        for values in by_length.values():
            if len(values) >= 2:
                worst = max(worst, float(np.std(values, ddof=1)))
    return worst


def single_seed_threshold(results: Mapping[str, Sequence[Mapping]], domain: str, mode: str) -> float:
    """|difference| (bits per byte) a single-seed claim in ``domain`` and ``mode`` needs to be
    resolved: ``SINGLE_SEED_RESOLVED_BPB``, or ``SINGLE_SEED_SPREADS`` × :func:`seed_spread`
    where that is larger."""
    return max(SINGLE_SEED_RESOLVED_BPB, SINGLE_SEED_SPREADS * seed_spread(results, domain, mode))


def compute_claim(spec: ClaimSpec, results: Mapping[str, Sequence[Mapping]], threshold: float | None = None) -> dict:
    """One claim computed from ``results`` (checkpoint folder name → its results.json rows).

    Returns: the claim's record — ``id``, ``statement``, ``domain``, ``mode``, ``length``
    (``length_b`` when set), ``a``, ``b`` (variants when set), ``values_a``, ``values_b``
    (bits per byte of each seed), ``difference`` (bits per byte, mean a − mean b),
    ``interval`` (95 %), ``seeds`` ([n_a, n_b]), ``test`` (what made the interval and verdict;
    ``t``, ``df``, ``p`` for a t-test; ``threshold`` for a single-seed claim) and ``verdict``.
    ``threshold``: a single-seed claim's |difference| to be resolved (None:
    :func:`single_seed_threshold` of the claim's domain and mode over ``results``).
    Raises: ClaimError naming a missing checkpoint, row or length, or unpaired documents."""
    len_b = spec.length if spec.length_b is None else spec.length_b
    ea = [_entry(_row(results, n, spec, spec.variant_a), spec.length, spec) for n in spec.a]
    eb = [_entry(_row(results, n, spec, spec.variant_b), len_b, spec) for n in spec.b]
    va, vb = [float(e["bits_per_byte"]) for e in ea], [float(e["bits_per_byte"]) for e in eb]
    diff = float(np.mean(va) - np.mean(vb))
    same_arm = spec.a == spec.b and dict(spec.variant_a) == dict(spec.variant_b)
    out: dict[str, Any] = {
        "id": spec.id,
        "statement": spec.statement,
        "domain": spec.domain,
        "mode": spec.mode,
        "length": spec.length,
    }
    if spec.length_b is not None:
        out["length_b"] = spec.length_b
    out.update(a=list(spec.a), b=list(spec.b))
    for k in ("variant_a", "variant_b"):
        if getattr(spec, k):
            out[k] = dict(getattr(spec, k))
    out.update(values_a=va, values_b=vb, difference=diff, seeds=[len(va), len(vb)])
    if len(va) >= 2 and len(vb) >= 2:
        if same_arm:
            res = paired_t_test([x - y for x, y in zip(va, vb, strict=True)])
            test = f"paired t-test over {len(va)} seeds (the same runs at both lengths)"
        else:
            res = welch_t_test(va, vb)
            test = f"Welch t-test over seed means ({len(va)} vs {len(vb)} seeds)"
        out.update(
            interval=[res.interval[0], res.interval[1]],
            test=test + f"; resolved for p < {P_RESOLVED}, suggestive for p < {P_SUGGESTIVE}",
            t=res.t,
            df=res.df,
            p=res.p,
            verdict=_verdict_from_p(res.p),
        )
        return out
    pd = paired_difference(_arm_entry(ea), _arm_entry(eb))
    if pd is None:
        raise ClaimError(
            f"claim {spec.id}: its arms did not score the same documents and tokens; they cannot be paired"
        )
    ci = pd["paired_ci95"]
    if threshold is None:
        threshold = single_seed_threshold(results, spec.domain, spec.mode)
    out.update(
        interval=None if ci is None else [ci[0], ci[1]],
        test=(
            "paired bootstrap over documents (95 %; text noise only: one seed on "
            f"{'both sides' if len(va) == len(vb) == 1 else 'one side'}); resolved only for |difference| >= "
            f"{threshold:.3f} bpb with an interval excluding 0, suggestive for an interval excluding 0"
        ),
        threshold=threshold,
        verdict=single_seed_verdict(diff, ci, threshold),
    )
    return out


def compute_claims(
    specs: Sequence[ClaimSpec], results: Mapping[str, Sequence[Mapping]], skip_missing: bool = False
) -> tuple[list[dict], list[str]]:
    """Every claim of ``specs`` computed from ``results`` (:func:`compute_claim`).

    ``skip_missing``: a claim naming a checkpoint that ``results`` lacks is left out (its id is
    returned) instead of raising — e.g. the arms of a run still training.
    Returns: ``(claims in the specs' order, ids left out)``.
    Raises: ClaimError as :func:`compute_claim` does."""
    done, left = [], []
    thresholds: dict[tuple[str, str], float] = {}
    for s in specs:
        if skip_missing and not s.checkpoints() <= set(results):
            left.append(s.id)
            continue
        key = (s.domain, s.mode)
        if key not in thresholds:
            thresholds[key] = single_seed_threshold(results, s.domain, s.mode)
        done.append(compute_claim(s, results, thresholds[key]))
    return done, left


def format_claim(claim: Mapping[str, Any]) -> str:
    """The numbers of a claim as the docs quote them: ``"−0.043 [−0.070, −0.016] bpb (3 vs 3
    seeds, Welch p = 0.0236: resolved)"`` (4 decimals below 0.01 bpb; p to 3 significant digits)."""

    def num(x: float, places: int) -> str:
        return f"{x:+.{places}f}".replace("-", "−")

    d, ci = claim["difference"], claim.get("interval")
    places = 4 if abs(d) < 0.01 else 3
    text = num(d, places) + (f" [{num(ci[0], places)}, {num(ci[1], places)}]" if ci else "") + " bpb"
    na, nb = claim["seeds"]
    if claim["a"] == claim["b"]:
        seeds = f"{na} seed{'s' if na > 1 else ''}"
    else:
        seeds = f"{na} vs {nb} seed{'s' if max(na, nb) > 1 else ''}"
    if "p" in claim:
        kind = "paired t" if claim["a"] == claim["b"] else "Welch"
        how = f"{kind} p < 0.001" if claim["p"] < 0.001 else f"{kind} p = {claim['p']:.3g}"
    else:
        how = "interval over documents"
    return f"{text} ({seeds}, {how}: {claim['verdict']})"


#: a claim quote in a document: ``<!-- claim:ID -->`` … ``<!-- /claim -->`` (one line)
CLAIM_QUOTE = re.compile(r"<!-- claim:(?P<id>[A-Za-z0-9_.-]+) -->(?P<body>.*?)<!-- /claim -->")


#: what a quote of a claim whose checkpoints are not published yet says
PENDING_TEXT = "not measured yet: its checkpoints are not published"


def quote_claims(
    text: str, claims: Sequence[Mapping[str, Any]], pending: Sequence[str] = (), where: str = "the document"
) -> str:
    """``text`` with every claim quote (``CLAIM_QUOTE``) rewritten to :func:`format_claim` of its
    claim, so the numbers a document quotes are the computed ones; a quote of a ``pending`` claim
    (its checkpoints not published yet) says so (``PENDING_TEXT``).

    Raises: ClaimError naming a quote whose id no claim has (add the claim to docs/claims.toml or
    fix the id)."""
    by_id = {c["id"]: c for c in claims}

    def sub(m: re.Match) -> str:
        claim = by_id.get(m["id"])
        if claim is None and m["id"] in pending:
            return f"<!-- claim:{m['id']} -->{PENDING_TEXT}<!-- /claim -->"
        if claim is None:
            raise ClaimError(f"{where} quotes claim {m['id']!r}, which is not among the computed claims")
        return f"<!-- claim:{m['id']} -->{format_claim(claim)}<!-- /claim -->"

    return CLAIM_QUOTE.sub(sub, text)


def quoted_claim_ids(text: str) -> list[str]:
    """The ids of the claim quotes in ``text``, in order."""
    return [m["id"] for m in CLAIM_QUOTE.finditer(text)]
