"""Numbers and rows as people read them: no Streamlit here (the app's ``fireviz.ui`` re-exports these).

Human counts (``12.3M``), a fit's parameters as text, file stems, lengths typed by a user,
locality and perplexity tables from library results, CSV/JSON of rows, job error text.
"""

from __future__ import annotations

import csv
import io
import json
import math
from pathlib import Path
from typing import Any, Iterable, Sequence

from fireviz.checkpoints import catalog as ck
from fireviz.model import CheckpointError


def fit_file_stem(target: str, params: dict, max_len: int) -> str:
    """File name stem of a fit's downloads, naming what was fitted: ``fire_fit_alibi_L128``,
    ``fire_fit_checkpoint_t5_layer2_L256`` (a checkpoint's folder or model name included)."""
    parts = ["fire_fit", target]
    if target == "checkpoint":
        parts += [
            Path(str(params.get("path", ""))).name or str(params.get("path", "")),
            f"layer{params.get('layer', 0)}",
        ]
        if params.get("stack"):
            parts.append(str(params["stack"]))
    parts.append(f"L{int(max_len)}")
    return "_".join("".join(c if c.isalnum() or c in "-._" else "-" for c in p) for p in parts if p)


def int_values(raw: Iterable[str], lo: int, hi: int) -> list[int]:
    """The whole numbers in ``raw`` (URL values; comma-separated ones split) within [lo, hi];
    anything else is dropped."""
    out = []
    for r in raw:
        for part in str(r).split(","):
            try:
                v = int(part.strip().replace("_", ""))
            except ValueError:
                continue
            if lo <= v <= hi:
                out.append(v)
    return out


def parse_lengths(picked: Iterable, lo: int, hi: int) -> tuple[list[int], list]:
    """Lengths from a multiselect that accepts typed entries: ``(sorted unique ints in [lo, hi],
    the entries that are not such a length)``. Typed text may hold thousands separators
    (``3,000``, ``3 000``, ``3_000``)."""
    good, bad = set(), []
    for v in picked:
        if isinstance(v, int) and not isinstance(v, bool):
            n = v
        else:
            try:
                n = int(str(v).strip().replace(",", "").replace("_", "").replace(" ", ""))
            except ValueError:
                bad.append(v)
                continue
        if lo <= n <= hi:
            good.add(n)
        else:
            bad.append(v)
    return sorted(good), bad


def format_params(params: dict) -> str:
    """A target's parameters as readable text: ``"slopes 0.25, 0.0625 · seed 0"``; None
    values are left out, a ``path`` is shown as its folder name ("checkpoint alibi"),
    numbers with 3 significant digits."""

    def fmt(v: Any) -> str:
        if isinstance(v, float):
            return f"{v:.3g}"
        if isinstance(v, (list, tuple)):
            return ", ".join(fmt(x) for x in v)
        if isinstance(v, dict):
            return ", ".join(f"{k} {fmt(x)}" for k, x in v.items())
        return str(v)

    parts = []
    for k, v in params.items():
        if v is None:
            continue
        parts.append(f"checkpoint {Path(str(v)).name}" if k == "path" else f"{k.replace('_', ' ')} {fmt(v)}")
    return " · ".join(parts)


def percent(x: float | None) -> str:
    """A fraction as a short percentage: 0.0123 → "1.23%", 0.8034 → "80.3%", below 0.01 % →
    "< 0.01%"; None/NaN → "—"."""
    if x is None or not math.isfinite(x):
        return "—"
    v = 100 * x
    if abs(v) < 0.01:
        return "0%" if v == 0 else "< 0.01%"
    return f"{v:.3g}%"


def locality_rules_text(rules: dict) -> str:
    """``fireviz.analysis.biases.LOCALITY_RULES`` as one readable sentence."""
    rho, peak, flat = rules.get("rank_correlation"), rules.get("peak_fraction"), rules.get("flat_range")
    return (
        f"local = ρ ≤ −{rho:g} and peak_fraction ≤ {peak:g}; anti-local = ρ ≥ +{rho:g} and peak_fraction ≥ "
        f"{peak:g}; mixed = anything else, or a curve flatter than {flat:g} logits; "
        f"ρ over {rules.get('log_samples')} log-spaced distances"
    )


def locality_summary_rows(summary: Sequence[dict]) -> list[dict]:
    """The rows of ``fireviz.analysis.biases.locality_summary`` for display: shares as percentages,
    and for rotary/NoPE checkpoints (no additive bias) "—" in the text columns and empty counts,
    with a note saying what they have instead."""
    out = []
    for r in summary:
        additive = r.get("kind") == "additive"
        row = {k: v for k, v in r.items()}
        for k in ("share_local", "share_anti_local"):
            row[k] = percent(r.get(k)) if additive else "—"
        row["classify_at"] = str(r.get("classify_at")) if additive and r.get("classify_at") is not None else "—"
        if not additive:  # None, not "—": these columns hold integers (a text cell breaks the table's types)
            for k in ("heads", "n_local", "n_anti_local", "n_mixed"):
                row[k] = None
        row["note"] = (
            ""
            if additive
            else (
                "rotary: a position kernel, not a bias"
                if r.get("kind") == "rotary"
                else "no position encoding: no bias to classify"
            )
        )
        out.append(row)
    return out


def pool_seeds(results: Sequence[dict]) -> list[dict]:
    """Evaluation results relabelled so that extra-seed runs share their seed-0 run's label
    (``fire_seed1`` and ``fire`` → ``"fire"``; ``"rope + pi"`` stays apart from ``"rope"``),
    for ``plots.group_perplexity`` / ``perplexity_figure`` to give mean ± std over seeds.

    Args: results from ``fireviz.eval.evaluation`` (keys ``checkpoint``, optional ``label`` that
      starts with the checkpoint name and may add a suffix such as ``" + yarn"``).
    Returns: shallow copies with ``label`` replaced; the input is not changed.
    """
    out = []
    for r in results:
        name = str(r.get("checkpoint", ""))
        label = str(r.get("label") or name)
        suffix = label[len(name) :] if label.startswith(name) else ""
        out.append({**r, "label": ck.seed_base(name) + suffix})
    return out


def perplexity_table(rows: Sequence[dict]) -> list[dict]:
    """``fireviz.plots.group_perplexity`` rows for the results table: bits per byte (mean and
    sample std over pooled seeds) first, then perplexity, nats/token, n, training length."""
    order = [
        "group",
        "length",
        "bits_per_byte",
        "bits_per_byte_std",
        "perplexity",
        "perplexity_std",
        "nats_per_token",
        "n",
        "train_seq_len",
    ]
    return [{**{k: r[k] for k in order if k in r}, **{k: v for k, v in r.items() if k not in order}} for r in rows]


def job_error_text(error: str | None) -> tuple[str, bool]:
    """A background job's error text without the ``"CheckpointError: "`` prefix, and whether
    it was a CheckpointError (whose message already names the problem and the fix)."""
    text = str(error or "")
    prefix = f"{CheckpointError.__name__}: "
    return (text[len(prefix) :], True) if text.startswith(prefix) else (text, False)


def human_count(n: float | int | None) -> str:
    """12_300_000 → "12.3M" (k, M, B); None → "—"."""
    if n is None:
        return "—"
    n = float(n)
    for unit, div in (("B", 1e9), ("M", 1e6), ("k", 1e3)):
        if abs(n) >= div:
            return f"{n / div:.3g}{unit}"
    return f"{n:.0f}"


def rows_to_csv(rows: Sequence[dict]) -> str:
    """CSV text of a list of flat dicts (columns = union of keys, in first-seen order)."""
    cols: list[str] = []
    for r in rows:
        for c in r:
            if c not in cols:
                cols.append(c)
    buf = io.StringIO()
    w = csv.DictWriter(buf, fieldnames=cols, extrasaction="ignore", lineterminator="\n")
    w.writeheader()
    for r in rows:
        w.writerow({c: _csv_value(r.get(c)) for c in cols})
    return buf.getvalue()


def _csv_value(v: Any) -> Any:
    if isinstance(v, float) and not math.isfinite(v):
        return str(v)
    if isinstance(v, (list, dict)):
        return json.dumps(v)
    return v


def to_json(obj: Any) -> str:
    """Indented JSON text (NaN/inf written as null; numpy and tensors as lists)."""
    return json.dumps(_jsonable(obj), indent=2)


def _jsonable(obj: Any) -> Any:
    if isinstance(obj, dict):
        return {str(k): _jsonable(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_jsonable(v) for v in obj]
    if isinstance(obj, float):
        return obj if math.isfinite(obj) else None
    if hasattr(obj, "tolist"):
        return _jsonable(obj.tolist())
    if hasattr(obj, "to_dict") and callable(obj.to_dict):
        return _jsonable(obj.to_dict())
    return obj


def split_errors(results: Sequence[dict]) -> tuple[list[dict], list[str]]:
    """Separate the per-length error entries of evaluation results from the numbers.

    Returns: (results whose ``per_length`` holds only scored lengths — results with none
      are dropped, messages ``"<label> @ <length>: <error>"``).
    """
    clean, errors = [], []
    for r in results:
        ok = [e for e in r.get("per_length", []) if "error" not in e]
        errors += [
            f"{r.get('label', r.get('checkpoint'))} @ {e['length']}: {e['error']}"
            for e in r.get("per_length", [])
            if "error" in e and not e.get("not_computed")
        ]
        if ok:
            clean.append({**r, "per_length": ok})
    return clean, errors
