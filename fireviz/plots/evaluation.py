"""Figures of evaluations: perplexity and answer accuracy vs length, paired differences, loss by position."""

from __future__ import annotations

import json
import math
from collections import OrderedDict
from typing import Mapping, Sequence

import numpy as np
import plotly.graph_objects as go

from fireviz.eval import bootstrap_ci95, paired_difference
from fireviz.plots.base import _DASHES, _arr, _as_dict, _color, _mark_length


# -- perplexity --------------------------------------------------------------------------------
def _group_name(res: Mapping, group_key: str | None) -> str:
    if group_key is not None:
        if group_key not in res:
            raise ValueError(f"result for {res.get('checkpoint')!r} has no key {group_key!r}")
        return str(res[group_key])
    for k in ("label", "group", "checkpoint"):
        if res.get(k) is not None:
            return str(res[k])
    raise ValueError("a perplexity result needs a 'label', 'group' or 'checkpoint' key")


def group_perplexity(results: Sequence[Mapping], group_key: str | None = None) -> list[dict]:
    """Mean ± std over each group's members (e.g. training seeds) per evaluation length: the
    numbers behind ``perplexity_figure``.

    Accepts a list of evaluation results (``fireviz.eval.evaluation``: keys ``checkpoint``,
    ``train_seq_len``, ``settings``, ``per_length`` = [{length, perplexity, nats_per_token,
    bits_per_byte, tokens_scored, windows, …}], optional ``label``/``group``). Results are
    grouped by ``group_key`` when given, else by ``label``, else ``group``, else
    ``checkpoint`` — several seeds of one encoding share a label.
    Returns: rows {group, length (tokens), bits_per_byte (mean), bits_per_byte_std,
      ci95_low, ci95_high (bits per byte: a single run's ``ci95``; for pooled members scored
      on the same documents, the bootstrap interval of their per-document mean loss, i.e.
      over text only; None without per-document losses), perplexity = exp(mean nats/token)
      (the perplexity of the mean loss, so it agrees with the mean bits per byte),
      perplexity_std, nats_per_token (mean), n (members), documents, windows,
      tokens_scored (of the first member), train_seq_len}, in first-seen group order and
      increasing length. The stds are sample
      standard deviations over members (ddof = 1; None for one member). Bits per byte =
      nats/token / ln 2 (tokens are bytes) where an entry has no ``bits_per_byte``. An entry of a
      checkpoint with a tokenizer of its own (``bytes_scored``: a published model) counts per
      byte — perplexity 2^bpb, nats per byte — so every curve is per byte (for fireviz's byte
      tokens per token and per byte are one).
    Raises: ValueError for a result without a group name or per_length entries without
      ``length``/``perplexity``.
    """
    out = []
    for name, g in _grouped_rows(results, group_key).items():
        for length in sorted(g["lengths"]):
            members = g["lengths"][length]
            vals = np.array([m[:3] for m in members])
            n = len(vals)
            std = lambda c, vals=vals, n=n: float(vals[:, c].std(ddof=1)) if n > 1 else None  # noqa: E731
            pooled = _pooled_documents([m[3] for m in members])
            ci = None
            if n == 1 and isinstance(members[0][3].get("ci95"), list):
                ci = members[0][3]["ci95"]
            elif pooled is not None:
                ci = bootstrap_ci95(pooled["nats"], pooled["tokens"])
            first = members[0][3]
            out.append(
                {
                    "group": name,
                    "length": length,
                    "bits_per_byte": float(vals[:, 2].mean()),
                    "bits_per_byte_std": std(2),
                    "ci95_low": None if ci is None else float(ci[0]),
                    "ci95_high": None if ci is None else float(ci[1]),
                    "perplexity": float(math.exp(vals[:, 1].mean())),
                    "perplexity_std": std(0),
                    "nats_per_token": float(vals[:, 1].mean()),
                    "n": n,
                    "documents": first.get("documents"),
                    "windows": first.get("windows"),
                    "tokens_scored": first.get("tokens_scored"),
                    "train_seq_len": g["train"],
                }
            )
    return out


def _grouped_rows(results: Sequence[Mapping], group_key: str | None) -> "OrderedDict[str, dict]":
    # group → {"lengths": {length: [(perplexity, nats, bpb, entry)]}, "train": training length}
    groups: "OrderedDict[str, dict]" = OrderedDict()
    for res in results:
        res = _as_dict(res)
        name = _group_name(res, group_key)
        g = groups.setdefault(name, {"lengths": {}, "train": res.get("train_seq_len")})
        for row in res.get("per_length", []):
            if "error" in row and "perplexity" not in row:
                continue  # a length that could not be evaluated (fireviz.evaluate reports why)
            if "length" not in row or "perplexity" not in row:
                raise ValueError(f"per_length entries need 'length' and 'perplexity' (got keys {sorted(row)})")
            nats = (
                float(row["nats_per_token"]) if row.get("nats_per_token") is not None else math.log(row["perplexity"])
            )
            bpb = float(row.get("bits_per_byte", nats / math.log(2)))
            ppl = float(row["perplexity"])
            if "bytes_scored" in row:  # a tokenizer of its own: per byte (= per token for fireviz's bytes)
                nats, ppl = bpb * math.log(2), 2.0**bpb
            g["lengths"].setdefault(int(row["length"]), []).append((ppl, nats, bpb, row))
    return groups


def _seed_std(members: Sequence[tuple]) -> float | None:
    """Sample standard deviation (ddof = 1) of the members' bits per byte; None for one member."""
    return float(np.std([m[2] for m in members], ddof=1)) if len(members) > 1 else None


def _pooled_documents(entries: Sequence[Mapping]) -> dict | None:
    """Per-document nats averaged over members scored on the same documents and tokens
    (``{"doc", "nats", "tokens"}``, and ``bytes`` for a tokenizer of its own), or None when any
    member lacks them or they differ (or the members read different shared texts)."""
    docs: list = [e.get("per_document") for e in entries]
    if not docs or not all(isinstance(d, Mapping) and d.get("doc") for d in docs):
        return None
    if any(d["doc"] != docs[0]["doc"] or d["tokens"] != docs[0]["tokens"] for d in docs):
        return None
    if any(d.get("bytes") != docs[0].get("bytes") for d in docs) or len({e.get("text") for e in entries}) > 1:
        return None
    nats = np.mean(np.array([d["nats"] for d in docs], dtype=np.float64), axis=0)
    out = {"doc": list(docs[0]["doc"]), "nats": nats.tolist(), "tokens": list(docs[0]["tokens"])}
    if docs[0].get("bytes") is not None:  # a tokenizer of its own: the bytes its targets cover, on one text
        out["bytes"] = list(docs[0]["bytes"])
    return out


def paired_difference_rows(
    results: Sequence[Mapping], reference: str | None = None, group_key: str | None = None
) -> list[dict]:
    """Bits-per-byte differences against a reference group on the same documents, per length.

    Groups as in ``group_perplexity`` (seeds of one encoding pooled: their per-document
    losses are averaged before differencing). For every group but the reference and every
    length both scored on the same documents and tokens (``per_document``; see
    ``fireviz.eval.stats.paired_difference``): ``paired_delta_bpb`` = group − reference and
    its 95 % paired bootstrap interval over documents.
    Args: ``reference``: a group name (default: the first group).
    Returns: rows {group, reference, length (tokens), paired_delta_bpb, ci95_low, ci95_high
      (bits per byte; the interval is over documents: text noise only), n (members),
      seed_std (sample standard deviation of the group's members' bits per byte, i.e. of each
      seed's difference against the pooled reference; None for one member), reference_n,
      reference_seed_std (the same for the reference's members), documents}; lengths without
      per-document losses on both sides are left out. A difference smaller than the seed spreads
      is not a property of the encoding (issue #35).
    Raises: ValueError for a reference that is not a group, and as ``group_perplexity``.
    """
    groups = _grouped_rows(results, group_key)
    if not groups:
        return []
    ref = next(iter(groups)) if reference is None else str(reference)
    if ref not in groups:
        raise ValueError(f"reference {ref!r} is not one of the groups ({', '.join(groups)})")
    out = []
    for name, g in groups.items():
        if name == ref:
            continue
        for length in sorted(g["lengths"]):
            if length not in groups[ref]["lengths"]:
                continue
            mine = _pooled_documents([m[3] for m in g["lengths"][length]])
            theirs = _pooled_documents([m[3] for m in groups[ref]["lengths"][length]])
            if mine is None or theirs is None:
                continue
            text = (g["lengths"][length][0][3].get("text"), groups[ref]["lengths"][length][0][3].get("text"))
            diff = paired_difference({"per_document": mine, "text": text[0]}, {"per_document": theirs, "text": text[1]})
            if diff is None:
                continue
            ci = diff["paired_ci95"] or (None, None)  # one document: no interval
            out.append(
                {
                    "group": name,
                    "reference": ref,
                    "length": length,
                    "paired_delta_bpb": diff["paired_delta_bpb"],
                    "ci95_low": ci[0],
                    "ci95_high": ci[1],
                    "n": len(g["lengths"][length]),
                    "seed_std": _seed_std(g["lengths"][length]),
                    "reference_n": len(groups[ref]["lengths"][length]),
                    "reference_seed_std": _seed_std(groups[ref]["lengths"][length]),
                    "documents": len(mine["doc"]),
                }
            )
    return out


def paired_difference_figure(
    results: Sequence[Mapping], reference: str | None = None, group_key: str | None = None, log_x: bool = True
) -> go.Figure:
    """Paired difference in bits per byte against a reference, vs evaluation length.

    Args: as ``paired_difference_rows``. Returns: Figure; x = evaluation length (tokens),
      y = ``paired_delta_bpb`` (below 0: better than the reference on the same text), error
      bars = the 95 % paired bootstrap interval over documents (``error_y.array`` above,
      ``error_y.arrayminus`` below), a zero line, dashed training length(s); trace meta
      ``{"group", "reference", "n"}``. Raises: ValueError when nothing can be paired.
    """
    rows = paired_difference_rows(results, reference, group_key)
    if not rows:
        raise ValueError(
            "no paired differences: the results need per-document losses on the same documents "
            "(evaluate them together, or in mode same_text) and at least two groups"
        )
    ref = rows[0]["reference"]
    order = list(OrderedDict.fromkeys(_group_name(_as_dict(r), group_key) for r in results))
    fig = go.Figure()
    for name in [g for g in order if any(r["group"] == g for r in rows)]:
        g = [r for r in rows if r["group"] == name]
        y = np.array([r["paired_delta_bpb"] for r in g])
        hi = np.array([np.nan if r["ci95_high"] is None else r["ci95_high"] for r in g], dtype=np.float64)
        lo = np.array([np.nan if r["ci95_low"] is None else r["ci95_low"] for r in g], dtype=np.float64)
        fig.add_trace(
            go.Scatter(
                x=np.array([r["length"] for r in g]),
                y=y,
                mode="lines+markers",
                name=name,
                line=dict(color=_color(order.index(name))),
                error_y=dict(
                    type="data",
                    symmetric=False,
                    array=np.nan_to_num(hi - y),
                    arrayminus=np.nan_to_num(y - lo),
                    visible=True,
                ),
                meta={"group": name, "reference": ref, "n": max(r["n"] for r in g)},
            )
        )
    fig.add_hline(y=0, line=dict(color="black", width=1))
    trains = sorted({g["train"] for g in _grouped_rows(results, group_key).values() if g["train"]})
    for t in trains:
        _mark_length(fig, t, text=f"train {t}")
    if log_x:
        lengths = sorted({r["length"] for r in rows})
        fig.update_xaxes(type="log", tickvals=lengths, ticktext=[str(n) for n in lengths])
    fig.update_layout(
        title=dict(
            text=f"Paired difference vs {ref} (same documents, 95 % bootstrap interval)",
            subtitle=dict(text=_settings_caption(results)),
        ),
        xaxis_title="evaluation length (tokens)",
        yaxis_title=f"bits per byte − {ref} (below 0: better)",
        meta={"reference": ref, "train_seq_len": trains},
    )
    return fig


def _settings_caption(results: Sequence[Mapping]) -> str:
    # fireviz.evaluate writes the data source as "data" (older results: "domain")
    keys = ("data", "domain", "split", "mode", "stride", "token_budget", "seed", "bos_mode")
    settings = [(_as_dict(r).get("settings") or {}) for r in results]
    # "seed" here picks the evaluation windows; say so, since checkpoints have training seeds too
    names = {"seed": "window seed", "bos_mode": "BOS"}
    parts = []
    for k in keys:
        if k == "seed" and all(s.get("mode") == "same_text" and s.get("token_budget") is None for s in settings):
            continue  # every qualifying document, nothing drawn: the seed picks nothing
        vals = {json.dumps(s.get(k), sort_keys=True) for s in settings if s.get(k) is not None}
        if len(vals) == 1:
            parts.append(f"{names.get(k, k)} {json.loads(vals.pop())}")
        elif len(vals) > 1:
            parts.append(f"{names.get(k, k)} varies")
    return " · ".join(parts)


def _log_ticks(lo: float, hi: float, max_ticks: int = 10) -> list[float]:
    """Tick values for a log axis over the data range [lo, hi] (> 0): the finest of steps of
    0.05 / 0.1 / 0.2 / 0.5 of a digit, every digit, 1-2-3-5-7, 1-2-5 or powers of ten that
    gives at most ``max_ticks`` labels within the range (padded by 2 %), so a short range
    (perplexity 3.6–4.0, where most curves sit) is labelled inside, not only at one end; plus
    the range's top to two digits where the last label sits well below it (one more label)."""
    if not (math.isfinite(lo) and math.isfinite(hi)) or lo <= 0 or hi <= 0:
        return []
    lo, hi = min(lo, hi) / 1.02, max(lo, hi) * 1.02
    sets = (
        tuple(k / 20 for k in range(20, 200)),
        tuple(k / 10 for k in range(10, 100)),
        tuple(k / 5 for k in range(5, 50)),
        tuple(k / 2 for k in range(2, 20)),
        tuple(range(1, 10)),
        (1, 2, 3, 5, 7),
        (1, 2, 5),
        (1,),
    )
    ticks: list[float] = []
    for mantissas in sets:
        ticks = sorted(
            {
                float(f"{m * 10.0**e:.6g}")
                for e in range(math.floor(math.log10(lo)) - 1, math.floor(math.log10(hi)) + 1)
                for m in mantissas
                if lo <= m * 10.0**e <= hi
            }
        )
        if len(ticks) <= max_ticks:
            break
    # the top of the range labelled too: on 1.9–25 every digit to 10 and then 20 left the curves'
    # highest values unlabelled (issue #48); the data's top, cut to two digits, closes the axis
    top = float(f"{hi / 1.02:.2g}")
    if ticks and top >= ticks[-1] * 1.4 and top <= hi:
        ticks.append(top if top != int(top) else float(int(top)))
    return ticks if len(ticks) >= 2 else []


def _label_log_y(fig: go.Figure, ys: Sequence[float]) -> None:
    """Label a log y axis over the values ``ys`` with ``_log_ticks`` only (plotly's own log ticks
    label every minor digit on a short range), and draw the range they were chosen for: plotly's
    padding is narrower, and on a short range (4.409–4.443) every tick fell outside it."""
    y_lo = min(y for y in ys if y > 0) if any(y > 0 for y in ys) else 0.0
    yticks = _log_ticks(y_lo, max(ys))
    if yticks:
        span = [math.log10(min(y_lo, yticks[0]) / 1.01), math.log10(max(max(ys), yticks[-1]) * 1.01)]
        fig.update_yaxes(tickvals=yticks, ticktext=[f"{v:g}" for v in yticks], range=span)


#: Perplexity of a uniform guess over the 256 byte values: 8 bits per byte, the chance level.
UNIFORM_BYTE_PERPLEXITY = 256.0
UNIFORM_MARK = "uniform bytes"


def _line_style(k: int, name: str, n: int, published: bool) -> dict:
    """A curve's line, markers, name and meta: a published model's dotted, with diamonds."""
    return {
        "line": dict(color=_color(k), dash="dot" if published else None),
        "marker": dict(symbol="diamond", size=9) if published else None,
        "name": name + (" (published)" if published else "") + (f" (mean ± std, {n} seeds)" if n > 1 else ""),
        "meta": {"group": name, "n": n, **({"published": True} if published else {})},
    }


def _published_groups(results: Sequence[Mapping], group_key: str | None) -> tuple[set[str], bool]:
    """(the groups of published models — ``checkpoint_kind`` set —, whether any entry reads its own
    tokens and so the curves are per byte)."""
    plain = [_as_dict(r) for r in results]
    published = {_group_name(r, group_key) for r in plain if r.get("checkpoint_kind")}
    per_byte = any("bytes_scored" in e for r in plain for e in r.get("per_length", []) if "error" not in e)
    return published, per_byte


def perplexity_figure(results: Sequence[Mapping], group_key: str | None = None, log_x: bool = True) -> go.Figure:
    """Perplexity vs evaluation length: log y, one line per checkpoint (or group of seeds).

    Args: ``results`` as in ``group_perplexity`` (same grouping rules); groups with several
      members get mean ± std error bars. ``log_x``: lengths on a log axis (they usually double).
    Returns: Figure; x = evaluation length (tokens), y = perplexity = exp(mean nats/token over
      a group's members), error bars ± the sample std of the members' perplexities (a
      single run with ``ci95``: its 95 % bootstrap interval over documents, 2^bpb),
      a dashed ``"training length"`` line at each distinct ``train_seq_len``, the shared
      evaluation settings (data, split, mode, stride, token budget, seed) in the subtitle;
      on a log x-axis the ticks are the evaluated lengths; the log y-axis is labelled at the
      finest of half digits / every digit / 1-2-3-5-7 / 1-2-5 / powers of ten that fits ten
      labels. When a curve comes within 2 bits per byte of chance (perplexity ≥ 64), a dotted
      line (shape name ``UNIFORM_MARK``) marks the uniform-byte perplexity 256 = 8 bits per
      byte, so near-chance rankings are read as such. Lengths reported as errors are skipped. Trace
      meta ``{"group", "n"}``; error bars in ``error_y.array``.
    Raises: ValueError as ``group_perplexity``, or for an empty list.
    """
    if not results:
        raise ValueError("no perplexity results to plot")
    rows = group_perplexity(results, group_key)
    fig = go.Figure()
    names = list(OrderedDict.fromkeys(r["group"] for r in rows))
    # published models (a tokenizer of their own): a distinct marker and a dotted line, per byte
    published, per_byte = _published_groups(results, group_key)
    for k, name in enumerate(names):
        g = [r for r in rows if r["group"] == name]
        n = max(r["n"] for r in g)
        err = None
        if n > 1:
            err = dict(type="data", array=np.array([r["perplexity_std"] or 0.0 for r in g]), visible=True)
        elif all(r["ci95_low"] is not None for r in g):  # one run: its 95 % interval over documents
            ppl = np.array([r["perplexity"] for r in g])
            err = dict(
                type="data",
                symmetric=False,
                visible=True,
                array=np.exp2(np.array([r["ci95_high"] for r in g])) - ppl,
                arrayminus=ppl - np.exp2(np.array([r["ci95_low"] for r in g])),
            )
        fig.add_trace(
            go.Scatter(
                x=np.array([r["length"] for r in g]),
                y=np.array([r["perplexity"] for r in g]),
                error_y=err,
                mode="lines+markers",
                **_line_style(k, name, n, name in published),
            )
        )
    trains = sorted({r["train_seq_len"] for r in rows if r["train_seq_len"]})
    for t in trains:
        _mark_length(fig, t, text=f"train {t}")
    fig.update_yaxes(type="log")
    ys = [r["perplexity"] + sign * (r["perplexity_std"] or 0.0) for r in rows for sign in (-1, 1)]
    ys += [2.0 ** r[k] for r in rows for k in ("ci95_low", "ci95_high") if r[k] is not None]
    if max(ys) >= UNIFORM_BYTE_PERPLEXITY / 4:  # near chance (≥ 6 bits per byte): show what chance is
        fig.add_hline(
            y=UNIFORM_BYTE_PERPLEXITY,
            line=dict(dash="dot", color="gray", width=1),
            name=UNIFORM_MARK,
            annotation_text="uniform over 256 bytes (8 bits per byte)",
            annotation_position="bottom left",
        )
        ys.append(UNIFORM_BYTE_PERPLEXITY)
    _label_log_y(fig, ys)
    if log_x:
        lengths = sorted({r["length"] for r in rows})
        fig.update_xaxes(type="log", tickvals=lengths, ticktext=[str(n) for n in lengths])
    fig.update_layout(
        title=dict(text="Perplexity vs evaluation length", subtitle=dict(text=_settings_caption(results))),
        xaxis_title="evaluation length (tokens)",
        yaxis_title="perplexity per byte (2^bits per byte, log scale)"
        if per_byte
        else "perplexity (exp nats/token, log scale)",
        meta={"train_seq_len": trains, "settings_caption": _settings_caption(results)},
    )
    return fig


def accuracy_figure(results: Sequence[Mapping], chance: float | None = None, log_x: bool = True) -> go.Figure:
    """Answer accuracy vs evaluation length for results on a synthetic task (``fireviz.data.synthetic``).

    Args: ``results``: evaluate results whose ``per_length`` entries carry ``accuracy`` (the
      share of answer positions whose argmax prediction is right) and ``accuracy_ci95``;
      entries without them (errors, other data) are skipped. ``chance``: accuracy of a uniform
      guess, drawn as a dotted line (e.g. 1/64 for the copy task); None for none.
    Returns: Figure; x = evaluation length (tokens), y = answer accuracy in [0, 1], error bars
      its 95 % interval over sequences, one line per result (``label`` or ``checkpoint``; trace
      meta ``{"group", "sequence_accuracy": [...]}``), a dashed training-length line per distinct
      ``train_seq_len``.
    Raises: ValueError when no result carries an accuracy.
    """
    fig = go.Figure()
    trains, lengths = set(), set()
    k = 0
    for r in results:
        es = [e for e in r.get("per_length", []) if isinstance(e.get("accuracy"), (int, float))]
        if not es:
            continue
        x = np.array([e["length"] for e in es])
        y = np.array([e["accuracy"] for e in es], dtype=float)
        ci = [e.get("accuracy_ci95") for e in es]
        err = None
        if all(isinstance(c, (list, tuple)) and len(c) == 2 for c in ci):
            err = dict(
                type="data",
                symmetric=False,
                visible=True,
                array=np.array([c[1] for c in ci]) - y,
                arrayminus=y - np.array([c[0] for c in ci]),
            )
        name = r.get("label") or r.get("checkpoint", "?")
        fig.add_trace(
            go.Scatter(
                x=x,
                y=y,
                error_y=err,
                mode="lines+markers",
                name=name,
                line=dict(color=_color(k)),
                meta={"group": name, "sequence_accuracy": [e.get("sequence_accuracy") for e in es]},
            )
        )
        k += 1
        lengths |= set(x.tolist())
        if r.get("train_seq_len"):
            trains.add(int(r["train_seq_len"]))
    if not k:
        raise ValueError("no result carries an answer accuracy (evaluate on a synthetic task: --data synthetic:copy)")
    for t in sorted(trains):
        _mark_length(fig, t, text=f"train {t}")
    if chance:
        fig.add_hline(
            y=chance,
            line=dict(dash="dot", color="gray", width=1),
            annotation_text=f"chance ({chance:.3g})",
            annotation_position="bottom left",
        )
    if log_x:
        fig.update_xaxes(type="log", tickvals=sorted(lengths), ticktext=[str(n) for n in sorted(lengths)])
    fig.update_yaxes(range=[0, 1.02])
    fig.update_layout(
        title=dict(text="Answer accuracy vs evaluation length", subtitle=dict(text=_settings_caption(results))),
        xaxis_title="evaluation length (tokens)",
        yaxis_title="answer accuracy (argmax right)",
        meta={"train_seq_len": sorted(trains)},
    )
    return fig


def loss_by_position_figure(
    results: Sequence[Mapping] | Mapping,
    lengths: Sequence[int] | None = None,
    group_key: str | None = None,
    color_groups: Mapping[str, str] | None = None,
) -> go.Figure:
    """Loss by position in the evaluation window: one line per (result, evaluation length).

    Args: one result or a list (``fireviz.eval.evaluation`` layout: ``per_length[*].loss_by_position
      = {bucket_starts [B] (tokens), nats [B] (nats/token)}``); ``lengths`` restricts the
      evaluation lengths drawn; names come from the same keys as ``group_perplexity``.
      Colours go by name in first-seen order, as in ``perplexity_figure`` (so one page's two
      figures agree), the evaluation length by dash; ``color_groups`` maps a name to the
      name whose colour it takes (pooled seeds: ``{"fire_seed1": "fire"}``).
    Returns: Figure; x = position in window (bucket start, tokens), y = loss (nats/token),
      training length(s) marked; trace meta ``{"group", "length"}``.
    Raises: ValueError if no result has loss-by-position data for the chosen lengths.
    """
    if isinstance(results, Mapping) or hasattr(results, "to_dict"):
        results = [results]  # type: ignore[list-item]  # a result object (to_dict) as well as a dict
    fig = go.Figure()
    trains = set()
    color_index: dict[str, int] = {}
    drawn = sorted(
        {
            int(row["length"])
            for res in results
            for row in _as_dict(res).get("per_length", [])
            if lengths is None or int(row["length"]) in set(int(x) for x in lengths)
        }
    )
    for res in results:
        res = _as_dict(res)
        name = _group_name(res, group_key)
        if res.get("train_seq_len"):
            trains.add(int(res["train_seq_len"]))
        for row in res.get("per_length", []):
            if lengths is not None and int(row["length"]) not in set(int(x) for x in lengths):
                continue
            lbp = row.get("loss_by_position")
            if not lbp:
                continue
            k = color_index.setdefault((color_groups or {}).get(name, name), len(color_index))
            dash = _DASHES[drawn.index(int(row["length"])) % len(_DASHES)]
            fig.add_trace(
                go.Scatter(
                    x=np.asarray(lbp["bucket_starts"], dtype=np.int64),
                    y=_arr(lbp["nats"]),
                    mode="lines",
                    name=f"{name} @ {row['length']}",
                    line=dict(color=_color(k), dash=dash),
                    meta={"group": name, "length": int(row["length"])},
                )
            )
    if not fig.data:
        raise ValueError("no loss_by_position data for the chosen results/lengths")
    for t in sorted(trains):
        _mark_length(fig, t, text=f"train {t}")
    fig.update_layout(
        title=dict(text="Loss by position in the window", subtitle=dict(text=_settings_caption(results))),
        xaxis_title="position in window (tokens, bucket start)",
        yaxis_title="loss (nats/token)",
        meta={"train_seq_len": sorted(trains)},
    )
    return fig


def context_use_figure(results: Sequence[Mapping], log_x: bool = True) -> go.Figure:
    """Context use (``fireviz.eval`` mode ``context``): bits per byte of fixed targets vs context length.

    Args: evaluate results of mode ``context`` (``per_length[*]``: ``length`` = context length c,
      ``bits_per_byte``, ``ci95``, optionally ``full_delta_bpb``; ``settings.full_context`` = M − K);
      names as in ``group_perplexity`` (no pooling). Every c scores the same targets, so a change
      along a line is the value of more context alone.
    Returns: Figure; x = context length c (tokens; the full context M − K labelled ``full``), y = bits
      per byte, error bars = the 95 % bootstrap interval over documents (``error_y.array`` above,
      ``arrayminus`` below), dashed training length(s); trace meta ``{"group", "full_context"}``.
    Raises: ValueError when no result has a scored context length.
    """
    fig = go.Figure()
    trains, fulls = set(), set()
    xs: set[int] = set()
    for k, res in enumerate(_as_dict(r) for r in results):
        rows = sorted((e for e in res.get("per_length", []) if "error" not in e), key=lambda e: int(e["length"]))
        if not rows:
            continue
        full = (res.get("settings") or {}).get("full_context")
        fulls.add(full)
        if res.get("train_seq_len"):
            trains.add(int(res["train_seq_len"]))
        y = np.array([float(e["bits_per_byte"]) for e in rows])
        ci = [e.get("ci95") or [None, None] for e in rows]
        hi = np.array([np.nan if c[1] is None else c[1] for c in ci], dtype=np.float64)
        lo = np.array([np.nan if c[0] is None else c[0] for c in ci], dtype=np.float64)
        xs.update(int(e["length"]) for e in rows)
        fig.add_trace(
            go.Scatter(
                x=np.array([int(e["length"]) for e in rows]),
                y=y,
                mode="lines+markers",
                name=_group_name(res, None),
                line=dict(color=_color(k)),
                error_y=dict(
                    type="data",
                    symmetric=False,
                    array=np.nan_to_num(hi - y),
                    arrayminus=np.nan_to_num(y - lo),
                    visible=True,
                ),
                meta={"group": _group_name(res, None), "full_context": full},
            )
        )
    if not fig.data:
        raise ValueError("no context-use results to plot (evaluate with mode='context')")
    for t in sorted(trains):
        _mark_length(fig, t, text=f"train {t}")
    if log_x:
        ticks = sorted(xs)
        fig.update_xaxes(type="log", tickvals=ticks, ticktext=[f"full ({n})" if n in fulls else str(n) for n in ticks])
    fig.update_layout(
        title=dict(
            text="Context use: bits per byte of the same targets vs context length",
            subtitle=dict(text=_settings_caption(results)),
        ),
        xaxis_title="context length c (tokens before each target: c … c + s − 1; full = the whole prefix)",
        yaxis_title="bits per byte (same targets at every c)",
        meta={"train_seq_len": sorted(trains), "settings_caption": _settings_caption(results)},
    )
    return fig
