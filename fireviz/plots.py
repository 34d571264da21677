"""Plotly figures for fireviz results: pure functions from plain dicts/lists to figures.

Every builder takes JSON-like data (what ``fireviz.analysis``, ``fireviz.evaluate``,
``fireviz.fit`` and the trainer write), returns a ``plotly.graph_objects.Figure`` and
never imports Streamlit. Conventions, the same in every figure: bias vs distance per head; the
training length marked on every length axis (a dashed shape named ``"training length"``);
perplexity on a log axis; units in every axis title. Each trace carries ``meta`` (layer,
head, query position, checkpoint …) so ``figure_data`` / ``figure_to_csv`` /
``figure_to_json`` export exactly the plotted numbers with their labels.

Builders: ``bias_grid_figure``, ``head_bias_figure``, ``bias_heatmap_figure``,
``dilution_figure``, ``perplexity_figure`` (+ ``group_perplexity``),
``loss_by_position_figure``, ``fit_figure``, ``training_curves_figure``,
``validation_curves_figure``.
"""
from __future__ import annotations

import csv
import io
import json
import math
import numbers
import os
from pathlib import Path
from collections import OrderedDict
from typing import Any, Mapping, Sequence

import numpy as np
import plotly.graph_objects as go
from plotly.colors import qualitative
from plotly.subplots import make_subplots

from .stats import bootstrap_ci95, paired_difference

TRAIN_MARK = "training length"
FIT_RANGE_MARK = "fitted range"
# Plotly's ten, then dark hues unlike them (from Dark24), so the 13 rows of a results figure
# (nine encodings, two seed runs, RoPE-PI, YaRN) get 13 colours told apart at a glance; D3 only
# after that, since it repeats Plotly's hues (orange, blue, green) in other shades.
_COLORS = qualitative.Plotly + ["#222A2A", "#B68100", "#862A16", "#778AAE", "#6C7C32", "#1616A7",
                                "#750D86"] + qualitative.D3


_DASHES = ("solid", "dash", "dot", "dashdot", "longdash")


def _color(i: int) -> str:
    return _COLORS[i % len(_COLORS)]


def _as_dict(obj) -> dict:
    return obj.to_dict() if hasattr(obj, "to_dict") else obj


def _mark_length(fig: go.Figure, x: float | None, row: int | None = None, col: int | None = None,
                 axis: str = "x", text: str | None = None, name: str = TRAIN_MARK, at: str = "end") -> None:
    """Dashed line at a length (tokens) on the x (``axis="x"``) or y axis of one subplot,
    labelled at its ``at`` end ("end": top / right, "start": bottom / left)."""
    if x is None:
        return
    kw: dict[str, Any] = dict(line_dash="dash", line_color="gray", line_width=1, name=name,
                              exclude_empty_subplots=False)
    if row is not None:
        kw.update(row=row, col=col)
    label = dict(text=text if text is not None else f"{name} {x:g}", font=dict(size=9, color="gray"))
    if axis == "x":
        # drawn inside the plot area (it ran up into the title and subtitle)
        fig.add_vline(x=x, label=dict(label, textposition=at, textangle=-90, xanchor="right", yanchor="top",
                                      padding=4), **kw)
    else:
        fig.add_hline(y=x, label=dict(label, textposition=at), **kw)


def _panel_refs(fig: go.Figure, row: int, col: int) -> tuple[str, str]:
    """Axis ids (``"x3"``, ``"y3"``) of one ``make_subplots`` panel."""
    sp = fig.get_subplot(row, col)
    return sp.xaxis.plotly_name.replace("axis", ""), sp.yaxis.plotly_name.replace("axis", "")


def _subsample(n: int, max_points: int | None, keep_first: int = 64) -> np.ndarray:
    """Indices into a length-n curve: all if n <= max_points, else the first ``keep_first``
    plus ``max_points`` evenly spaced ones (so short distances stay exact)."""
    if max_points is None or n <= max_points:
        return np.arange(n)
    return np.unique(np.concatenate([np.arange(min(n, keep_first)),
                                     np.linspace(0, n - 1, max_points).round().astype(np.int64)]))


def _arr(x) -> np.ndarray:
    """Nested lists with None → float64 array with NaN."""
    return np.array(x, dtype=np.float64) if x is not None else np.array([], dtype=np.float64)


# -- biases ------------------------------------------------------------------------------------
def bias_grid_figure(report, query_positions: Sequence[int] | None = None, max_points: int | None = 1024) -> go.Figure:
    """Layer × head grid of bias curves: bias (logits) vs distance i − j (tokens), one line per
    query position i.

    Args:
      report: ``fireviz.analysis.BiasReport`` or its ``to_dict()``.
      query_positions: subset of the report's query positions to draw (default all).
      max_points: cap on points per line (the first 64 distances plus evenly spaced ones);
        None draws every distance. The full curves stay in the report.
    Returns: a Figure with ``n_layer`` rows × ``n_head`` columns and a dashed
      ``"training length"`` line at distance = train_seq_len in every panel. Rotary reports
      get one panel with the RoPE kernel (Su et al. 2021 §3.4.3) labelled as such; NoPE an
      empty figure whose title says there is no position bias.
    Trace meta: ``{"layer", "head", "query_position"}`` (or ``{"kernel": True}``).
    Raises: ValueError if a requested query position is not in the report.
    """
    r = _as_dict(report)
    L = r.get("train_seq_len")
    title = f"{r.get('checkpoint') or r.get('encoding')}: position bias by layer and head"
    if r.get("kind") == "rotary":
        return _kernel_figure(r, max_points)
    if r.get("kind") != "additive":
        fig = go.Figure()
        fig.update_layout(title=f"{r.get('checkpoint') or r.get('encoding')}: {r.get('note') or 'no position bias'}",
                          meta={"train_seq_len": L, "kind": r.get("kind")})
        return fig
    wanted = list(r["query_positions"]) if query_positions is None else [int(q) for q in query_positions]
    missing = set(wanted) - set(r["query_positions"])
    if missing:
        raise ValueError(f"query positions {sorted(missing)} are not in the report (has {r['query_positions']})")
    n_layer, n_head = r["n_layer"], r["n_head"]
    heads_loc = {(lay["layer"], h["head"]): h.get("locality") for lay in r["layers"] for h in lay.get("heads", [])}
    # four or more panels side by side: the class on its own line (at 1024 px one line ran into the next title)
    sep = "<br>" if n_head >= 4 else " · "
    titles = [f"L{ly} H{h}" + (f"{sep}{heads_loc[(ly, h)]}" if heads_loc.get((ly, h)) else "")
              for ly in range(n_layer) for h in range(n_head)]
    fig = make_subplots(rows=n_layer, cols=n_head, subplot_titles=titles, shared_xaxes=True,
                        horizontal_spacing=min(0.04, 0.5 / max(1, n_head - 1)),
                        vertical_spacing=min(0.09 if sep == "<br>" else 0.06, 0.5 / max(1, n_layer - 1)))
    refs = {(ly, h): _panel_refs(fig, ly + 1, h + 1) for ly in range(n_layer) for h in range(n_head)}
    new_traces = []
    for lay in r["layers"]:
        ly = lay["layer"]
        for c in lay["curves"]:
            i = c["query_position"]
            if i not in wanted:
                continue
            k = wanted.index(i)
            bias = _arr(c["bias"])  # [heads, i + 1]
            idx = _subsample(bias.shape[1], max_points)
            dist = np.asarray(c.get("distance", range(bias.shape[1])), dtype=np.int64)[idx]
            for h in range(bias.shape[0]):
                xr, yr = refs[(ly, h)]
                new_traces.append(go.Scatter(x=dist, y=bias[h, idx], mode="lines", name=f"i = {i}",
                                             legendgroup=f"i{i}", showlegend=(ly == 0 and h == 0),
                                             line=dict(color=_color(k), width=1.2), xaxis=xr, yaxis=yr,
                                             meta={"layer": ly, "head": h, "query_position": i}))
    fig.add_traces(new_traces)
    # one dashed line per panel, built directly (add_vline per subplot is quadratic in panels)
    fig.layout.shapes = [go.layout.Shape(
        type="line", x0=L, x1=L, xref=xr, y0=0, y1=1, yref=f"{yr} domain", name=TRAIN_MARK,
        line=dict(dash="dash", color="gray", width=1),
        label=dict(text="train" if (ly, h) == (0, 0) else "", textposition="end", textangle=-90,
                   font=dict(size=9, color="gray")))
        for (ly, h), (xr, yr) in refs.items()] if L is not None else []
    for ly in range(n_layer):
        fig.update_yaxes(title_text="bias (logits)", row=ly + 1, col=1)
    # one x title under the first column (one per column overlapped in narrow windows)
    fig.update_xaxes(title_text="distance i − j (tokens)", row=n_layer, col=1)
    fig.update_annotations(font_size=11)  # the panel titles
    fig.update_layout(title=dict(text=title, subtitle=dict(
        text=f"{r.get('encoding')} · training length {L} tokens · one line per query position i")),
        legend_title_text="query position", height=220 * n_layer + 120 + (20 if sep == "<br>" else 0),
        margin=dict(t=130 if sep == "<br>" else 100),
        meta={"train_seq_len": L, "encoding": r.get("encoding"), "checkpoint": r.get("checkpoint"),
              "units": {"x": "tokens", "y": "logits"}})
    return fig


def _kernel_figure(r: dict, max_points: int | None) -> go.Figure:
    k = r["kernel"]
    d = np.asarray(k["distance"], dtype=np.int64)
    v = _arr(k["value"])
    idx = _subsample(d.size, max_points)
    fig = go.Figure(go.Scatter(x=d[idx], y=v[idx], mode="lines", name="RoPE kernel",
                               meta={"kernel": True, "attention_factor": k.get("attention_factor")}))
    _mark_length(fig, r.get("train_seq_len"))
    fig.update_layout(title=dict(text=f"{r.get('checkpoint') or r.get('encoding')}: RoPE position kernel (not a bias)",
                                 subtitle=dict(text=k.get("label", ""))),
                      xaxis_title="distance m − n (tokens)", yaxis_title="mean_k cos(d·θ_k) (dimensionless)",
                      meta={"train_seq_len": r.get("train_seq_len"), "encoding": r.get("encoding"),
                            "units": {"x": "tokens", "y": "dimensionless"}})
    return fig


def _layer(r: dict, layer: int) -> dict:
    for lay in r["layers"]:
        if lay["layer"] == layer:
            return lay
    raise ValueError(f"layer {layer} is not in the report (layers 0..{r.get('n_layer', 0) - 1})")


X_AXES = ("distance", "log_distance", "normalized")


def head_bias_figure(report, layer: int, head: int, x_axis: str = "distance", capped=None) -> go.Figure:
    """One head's bias curves at every query position of the report.

    Args:
      report: ``BiasReport`` or its ``to_dict()`` (additive encodings).
      x_axis: ``"distance"`` (i − j, tokens; curves stretch as i grows under FIRE's
        progressive interpolation), ``"log_distance"`` (the same on a log axis from distance
        1: learned FIRE and Kerple-log curves are nearly straight there) or ``"normalized"``
        (FIRE only: the MLP input ψ(i − j)/ψ(max(L, i)) of Li et al. 2024 eq. 3–4; all curves
        lie on f_θ, drawn dashed).
      capped: optional second report of the same checkpoint computed with a normalizer cap
        (``bias_report(..., normalizer_cap=N)``): its curves are overlaid dashed, named
        ``"i = …, cap N"``, meta ``capped: N``.
    Returns: Figure; trace meta ``{"layer", "head", "query_position", "capped"}`` (f_θ:
      ``{"mlp": True}``). On the distance axes the training length is marked.
    Raises: ValueError for a non-additive report, a missing layer/head, a bad ``x_axis``,
      or ``"normalized"`` on a non-FIRE report.
    """
    r = _as_dict(report)
    if r.get("kind") != "additive":
        raise ValueError(f"{r.get('encoding')} has no additive bias (kind {r.get('kind')}); use bias_grid_figure")
    if x_axis not in X_AXES:
        raise ValueError(f"x_axis must be one of {', '.join(X_AXES)} (got {x_axis!r})")
    lay = _layer(r, layer)
    if not 0 <= head < r["n_head"]:
        raise ValueError(f"head {head} out of range 0..{r['n_head'] - 1}")
    fig = go.Figure()
    sets = [(lay, None)]
    if capped is not None:
        c_r = _as_dict(capped)
        sets.append((_layer(c_r, layer), c_r.get("normalizer_cap")))
    for lay_k, cap in sets:
        for k, c in enumerate(lay_k["curves"]):
            i = c["query_position"]
            y = _arr(c["bias"])[head]
            if x_axis == "normalized":
                if "normalized_input" not in c:
                    raise ValueError(f"{r.get('encoding')} is not FIRE: no normalized input to plot against")
                x = _arr(c["normalized_input"])
            else:
                x = np.asarray(c.get("distance", range(y.size)), dtype=np.int64)
                if x_axis == "log_distance":  # distance 0 has no place on a log axis
                    keep = x >= 1
                    x, y = x[keep], y[keep]
            fig.add_trace(go.Scatter(x=x, y=y, mode="lines", name=f"i = {i}" + (f", cap {cap}" if cap else ""),
                                     line=dict(color=_color(k), dash="dash" if cap else None),
                                     meta={"layer": layer, "head": head, "query_position": i, "capped": cap}))
    if x_axis == "normalized" and lay.get("fire"):
        f = lay["fire"]
        fig.add_trace(go.Scatter(x=_arr(f["mlp_x"]), y=_arr(f["mlp_bias"])[head], mode="lines", name="f_θ(x)",
                                 line=dict(color="black", dash="dot"), meta={"layer": layer, "head": head, "mlp": True}))
        xt = "normalized distance ψ(i − j)/ψ(max(L, i)) (dimensionless)"
    else:
        xt = "distance i − j (tokens" + (", log scale)" if x_axis == "log_distance" else ")")
        _mark_length(fig, r.get("train_seq_len"))
        if x_axis == "log_distance":
            fig.update_xaxes(type="log")
    loc = next((h for h in lay.get("heads", []) if h["head"] == head), None)
    sub = f"locality {loc['locality']} (ρ = {loc['rank_correlation']:.2f}, peak at {loc['peak_distance']} tokens)" if loc else ""
    fig.update_layout(title=dict(text=f"{r.get('checkpoint') or r.get('encoding')}: layer {layer}, head {head}",
                                 subtitle=dict(text=sub)),
                      xaxis_title=xt, yaxis_title="bias (logits)", legend_title_text="query position",
                      meta={"train_seq_len": r.get("train_seq_len"), "layer": layer, "head": head, "x_axis": x_axis})
    return fig


def fire_input_figure(report, layer: int, capped=None) -> go.Figure:
    """FIRE's MLP input ψ(d)/ψ(max(L, i)) for fixed distances d against the query position i.

    Args: a FIRE ``BiasReport`` (or ``to_dict()``) whose layer carries
      ``fire["input_vs_query"]``; ``capped``: the same from a report with a normalizer cap,
      drawn dashed. Returns: Figure; x = query position i (tokens, log), y = the input in
      [0, 1]; one line per distance (meta ``{"layer", "distance", "capped"}``); the training
      range 0 … train_seq_len shaded (the positions f_θ saw). Past it, an uncapped line
      keeps falling: a fixed distance looks ever nearer to f_θ.
    Raises: ValueError for a report without FIRE input data.
    """
    r = _as_dict(report)
    sets = [(r, None)] + ([(_as_dict(capped), _as_dict(capped).get("normalizer_cap"))] if capped is not None else [])
    fig = go.Figure()
    for rep, cap in sets:
        fire = (_layer(rep, layer).get("fire") or {}).get("input_vs_query")
        if not fire:
            raise ValueError(f"{rep.get('encoding')} layer {layer} has no FIRE input data (not a FIRE report)")
        q = np.asarray(fire["query_positions"], dtype=np.int64)
        for k, (d, row) in enumerate(zip(fire["distances"], fire["input"])):
            y = np.array([np.nan if v is None else v for v in row], dtype=np.float64)
            fig.add_trace(go.Scatter(x=q, y=y, mode="lines", name=f"d = {d}" + (f", cap {cap}" if cap else ""),
                                     line=dict(color=_color(k), dash="dash" if cap else None),
                                     meta={"layer": layer, "distance": int(d), "capped": cap}))
    train = r.get("train_seq_len")
    if train:
        fig.add_vrect(x0=1, x1=train, fillcolor="gray", opacity=0.12, line_width=0,
                      annotation_text="training positions", annotation_position="top left")
    fig.update_xaxes(type="log")
    fig.update_layout(title=dict(text=f"{r.get('checkpoint') or r.get('encoding')}: f_θ's input for fixed distances, "
                                      f"layer {layer}",
                                 subtitle=dict(text="ψ(d)/ψ(max(L, i)): past the training positions the normalizer "
                                                    "grows on, so far keys look near")),
                      xaxis_title="query position i (tokens, log scale)",
                      yaxis_title="normalized distance (f_θ's input)", yaxis_range=[0, 1.02],
                      meta={"train_seq_len": train, "layer": layer})
    return fig


def dilution_compare_figure(results: Sequence) -> go.Figure:
    """Attention share on the nearest keys vs query position, one panel per layer, one line
    per checkpoint (mean over heads); capped-normalizer results dashed.

    Args: ``fireviz.text_attention.DilutionResult``s or their ``to_dict()`` (same ``near``).
    Returns: Figure with one row per layer; trace meta ``{"checkpoint", "layer",
      "normalizer_cap"}``, y = mean share over heads (probability), x = query position
      (tokens, log), training length marked. Raises: ValueError for no results.
    """
    rs = [_as_dict(r) for r in results]
    if not rs:
        raise ValueError("no dilution results to plot")
    n_layer = max(_arr(r["share"]).shape[0] for r in rs)
    fig = make_subplots(rows=n_layer, cols=1, shared_xaxes=True, vertical_spacing=0.06,
                        subplot_titles=[f"layer {ly}" for ly in range(n_layer)])
    names = list(OrderedDict.fromkeys(r.get("checkpoint") or r.get("encoding") for r in rs))
    for r in rs:
        share = _arr(r["share"])
        name = r.get("checkpoint") or r.get("encoding")
        cap = r.get("normalizer_cap")
        for ly in range(share.shape[0]):
            fig.add_trace(go.Scatter(x=np.asarray(r["query_positions"]), y=share[ly].mean(0), mode="lines+markers",
                                     name=name + (f" (cap {cap})" if cap else ""), legendgroup=name + str(cap),
                                     showlegend=ly == 0, line=dict(color=_color(names.index(name)),
                                                                 dash="dash" if cap else None),
                                     meta={"checkpoint": name, "layer": ly, "normalizer_cap": cap}), row=ly + 1, col=1)
    for ly in range(n_layer):
        _mark_length(fig, rs[0].get("train_seq_len"), row=ly + 1, col=1)
        fig.update_yaxes(range=[0, 1.02], row=ly + 1, col=1)
    fig.update_xaxes(type="log")
    fig.update_xaxes(title_text="query position i (tokens)", row=n_layer, col=1)
    near = rs[0].get("near")
    fig.update_layout(title=dict(text=f"Attention on the nearest {near} keys (mean over heads)",
                                 subtitle=dict(text=f"mean over {rs[0].get('rows')} query rows per position; "
                                                    "a falling line is attention spreading thin")),
                      height=220 * n_layer + 140, meta={"near": near, "train_seq_len": rs[0].get("train_seq_len")})
    return fig


def _heatmap_note(encoding) -> str:
    # FIRE divides by ψ(max(L, i)), so its bias changes along a diagonal; the fixed-form biases
    # (T5 buckets, ALiBi, Kerple, Sandwich) are functions of i − j alone.
    from .encodings import has_normalizer
    if has_normalizer(encoding):
        return "FIRE depends on the query position i, not only on i − j"
    return f"{encoding} depends on i − j only: constant along each diagonal"


def bias_heatmap_figure(report, layer: int, head: int, color_limit: float | None = None) -> go.Figure:
    """One head's bias on the report's query × key grid (logits; blank above the diagonal,
    i.e. future keys). Queries run down, keys across; the training length is marked on both.

    Args: ``color_limit`` (logits, > 0) saturates the colours at |bias| ≥ it — a learned
      Kerple-power bias reaches −10⁴…−10⁵ logits far from the diagonal, which on a full-range scale
      leaves the few keys a query can still attend to (bias within ~20 logits of its best key)
      one colour; None (default) spans the bias's whole range. The plotted ``z`` is never clipped.
    Returns: Figure with one Heatmap trace (x = key positions, y = query positions, tokens;
      z ``[q, k]`` with NaN at future keys; colours diverging around 0 when the bias has both
      signs, else sequential over its range, either clipped to ``color_limit``); meta
      ``{"layer", "head"}``.
    Raises: ValueError for a non-additive report, a missing layer/head or matrix, or a
      ``color_limit`` that is not a positive number.
    """
    if color_limit is not None and not (isinstance(color_limit, numbers.Real) and not isinstance(color_limit, bool)
                                        and 0 < color_limit < math.inf):
        raise ValueError(f"color_limit must be a positive number of logits such as 20 (got {color_limit!r}); "
                         "None spans the full range")
    r = _as_dict(report)
    if r.get("kind") != "additive":
        raise ValueError(f"{r.get('encoding')} has no additive bias (kind {r.get('kind')})")
    lay = _layer(r, layer)
    m = lay.get("matrix")
    if not m:
        raise ValueError(f"layer {layer} has no bias matrix in the report")
    z = _arr(m["bias"])
    if not 0 <= head < z.shape[0]:
        raise ValueError(f"head {head} out of range 0..{z.shape[0] - 1}")
    zh = z[head]
    finite = zh[np.isfinite(zh)]
    # a diverging scale centred on 0 only when the bias takes both signs; an all-negative bias
    # (ALiBi, Kerple) on it would be one dark red, so it gets a sequential scale over its range
    both = finite.size and finite.min() < 0 < finite.max()
    scale = dict(colorscale="RdBu", zmid=0.0) if both else dict(colorscale="Viridis")
    bar_title = "bias (logits)"
    lo, hi = (max(finite.min(), -color_limit), min(finite.max(), color_limit)) if color_limit and finite.size else (0, 0)
    # clip only where the limit cuts into the range (a bias entirely beyond it keeps its own range)
    if color_limit is not None and lo < hi and (finite.min() < lo or finite.max() > hi):
        scale = dict(colorscale="RdBu", zmin=-color_limit, zmax=color_limit) if both else \
            dict(colorscale="Viridis", zmin=float(lo) + 0.0, zmax=float(hi) + 0.0)  # + 0.0: no "-0"
        bar_title = f"bias (logits),<br>saturated at |b| ≥ {color_limit:g}"
    fig = go.Figure(go.Heatmap(x=np.asarray(m["key_positions"]), y=np.asarray(m["query_positions"]), z=zh,
                               **scale, colorbar=dict(title=dict(text=bar_title)),
                               meta={"layer": layer, "head": head}, name=f"L{layer} H{head}"))
    L = r.get("train_seq_len")
    _mark_length(fig, L, axis="x", at="start")  # at the top it would run into the subtitle
    _mark_length(fig, L, axis="y")
    fig.update_yaxes(autorange="reversed")
    fig.update_layout(title=dict(text=f"{r.get('checkpoint') or r.get('encoding')}: bias b(i, j), layer {layer}, head {head}",
                                 subtitle=dict(text=_heatmap_note(r.get("encoding")))),
                      xaxis_title="key position j (tokens)", yaxis_title="query position i (tokens)",
                      meta={"train_seq_len": L, "layer": layer, "head": head})
    return fig


def dilution_figure(result, layer: int | None = None) -> go.Figure:
    """Attention share on the nearest keys vs query position (log x), one line per head.

    Args: ``result`` a ``fireviz.text_attention.DilutionResult`` or its ``to_dict()``; ``layer``
      one layer or None for all (line names ``L{layer} H{head}``).
    Returns: Figure; y = share in [0, 1] (probability), x = query position (tokens), training
      length marked; trace meta ``{"layer", "head"}``.
    Raises: ValueError for a layer not in the result.
    """
    r = _as_dict(result)
    share = _arr(r["share"])  # [layers, heads, positions]
    layers = range(share.shape[0]) if layer is None else [layer]
    if layer is not None and not 0 <= layer < share.shape[0]:
        raise ValueError(f"layer {layer} out of range 0..{share.shape[0] - 1}")
    x = np.asarray(r["query_positions"], dtype=np.int64)
    fig = go.Figure()
    for k, ly in enumerate(layers):
        for h in range(share.shape[1]):
            fig.add_trace(go.Scatter(x=x, y=share[ly, h], mode="lines+markers", name=f"L{ly} H{h}",
                                     line=dict(color=_color(ly if layer is None else h)), meta={"layer": ly, "head": h}))
    _mark_length(fig, r.get("train_seq_len"))
    fig.update_xaxes(type="log")
    fig.update_layout(title=dict(text=f"{r.get('checkpoint') or r.get('encoding') or ''}: attention on the nearest "
                                      f"{r.get('near')} keys", subtitle=dict(text=f"mean over {r.get('rows')} query rows per position")),
                      xaxis_title="query position i (tokens)", yaxis_title=f"share of attention on nearest {r.get('near')} keys (probability)",
                      yaxis_range=[0, 1.02], meta={"train_seq_len": r.get("train_seq_len"), "near": r.get("near")})
    return fig


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

    Accepts a list of evaluation results (``fireviz.evaluate``: keys ``checkpoint``,
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
      nats/token / ln 2 (tokens are bytes) where an entry has no ``bits_per_byte``.
    Raises: ValueError for a result without a group name or per_length entries without
      ``length``/``perplexity``.
    """
    out = []
    for name, g in _grouped_rows(results, group_key).items():
        for length in sorted(g["lengths"]):
            members = g["lengths"][length]
            vals = np.array([m[:3] for m in members])
            n = len(vals)
            std = (lambda c: float(vals[:, c].std(ddof=1)) if n > 1 else None)  # noqa: E731
            pooled = _pooled_documents([m[3] for m in members])
            ci = None
            if n == 1 and isinstance(members[0][3].get("ci95"), list):
                ci = members[0][3]["ci95"]
            elif pooled is not None:
                ci = bootstrap_ci95(pooled["nats"], pooled["tokens"])
            first = members[0][3]
            out.append({"group": name, "length": length, "bits_per_byte": float(vals[:, 2].mean()),
                        "bits_per_byte_std": std(2), "ci95_low": None if ci is None else float(ci[0]),
                        "ci95_high": None if ci is None else float(ci[1]),
                        "perplexity": float(math.exp(vals[:, 1].mean())),
                        "perplexity_std": std(0), "nats_per_token": float(vals[:, 1].mean()), "n": n,
                        "documents": first.get("documents"), "windows": first.get("windows"),
                        "tokens_scored": first.get("tokens_scored"), "train_seq_len": g["train"]})
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
            nats = float(row["nats_per_token"]) if row.get("nats_per_token") is not None else math.log(row["perplexity"])
            bpb = float(row.get("bits_per_byte", nats / math.log(2)))
            g["lengths"].setdefault(int(row["length"]), []).append((float(row["perplexity"]), nats, bpb, row))
    return groups


def _pooled_documents(entries: Sequence[Mapping]) -> dict | None:
    """Per-document nats averaged over members scored on the same documents and tokens
    (``{"doc", "nats", "tokens"}``), or None when any member lacks them or they differ."""
    docs = [e.get("per_document") for e in entries]
    if not docs or not all(isinstance(d, Mapping) and d.get("doc") for d in docs):
        return None
    if any(d["doc"] != docs[0]["doc"] or d["tokens"] != docs[0]["tokens"] for d in docs):
        return None
    nats = np.mean(np.array([d["nats"] for d in docs], dtype=np.float64), axis=0)
    return {"doc": list(docs[0]["doc"]), "nats": nats.tolist(), "tokens": list(docs[0]["tokens"])}


def paired_difference_rows(results: Sequence[Mapping], reference: str | None = None,
                           group_key: str | None = None) -> list[dict]:
    """Bits-per-byte differences against a reference group on the same documents, per length.

    Groups as in ``group_perplexity`` (seeds of one encoding pooled: their per-document
    losses are averaged before differencing). For every group but the reference and every
    length both scored on the same documents and tokens (``per_document``; see
    ``fireviz.evaluate.paired_difference``): ``paired_delta_bpb`` = group − reference and
    its 95 % paired bootstrap interval over documents.
    Args: ``reference``: a group name (default: the first group).
    Returns: rows {group, reference, length (tokens), paired_delta_bpb, ci95_low, ci95_high
      (bits per byte), n (members), documents}; lengths without per-document losses on both
      sides are left out.
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
            diff = paired_difference({"per_document": mine}, {"per_document": theirs})
            if diff is None:
                continue
            ci = diff["paired_ci95"] or [None, None]  # one document: no interval
            out.append({"group": name, "reference": ref, "length": length,
                        "paired_delta_bpb": diff["paired_delta_bpb"], "ci95_low": ci[0],
                        "ci95_high": ci[1], "n": len(g["lengths"][length]),
                        "documents": len(mine["doc"])})
    return out


def paired_difference_figure(results: Sequence[Mapping], reference: str | None = None,
                             group_key: str | None = None, log_x: bool = True) -> go.Figure:
    """Paired difference in bits per byte against a reference, vs evaluation length.

    Args: as ``paired_difference_rows``. Returns: Figure; x = evaluation length (tokens),
      y = ``paired_delta_bpb`` (below 0: better than the reference on the same text), error
      bars = the 95 % paired bootstrap interval over documents (``error_y.array`` above,
      ``error_y.arrayminus`` below), a zero line, dashed training length(s); trace meta
      ``{"group", "reference", "n"}``. Raises: ValueError when nothing can be paired.
    """
    rows = paired_difference_rows(results, reference, group_key)
    if not rows:
        raise ValueError("no paired differences: the results need per-document losses on the same documents "
                         "(evaluate them together, or in mode same_text) and at least two groups")
    ref = rows[0]["reference"]
    order = list(OrderedDict.fromkeys(_group_name(_as_dict(r), group_key) for r in results))
    fig = go.Figure()
    for name in [g for g in order if any(r["group"] == g for r in rows)]:
        g = [r for r in rows if r["group"] == name]
        y = np.array([r["paired_delta_bpb"] for r in g])
        hi = np.array([np.nan if r["ci95_high"] is None else r["ci95_high"] for r in g], dtype=np.float64)
        lo = np.array([np.nan if r["ci95_low"] is None else r["ci95_low"] for r in g], dtype=np.float64)
        fig.add_trace(go.Scatter(
            x=np.array([r["length"] for r in g]), y=y, mode="lines+markers", name=name,
            line=dict(color=_color(order.index(name))),
            error_y=dict(type="data", symmetric=False, array=np.nan_to_num(hi - y), arrayminus=np.nan_to_num(y - lo),
                         visible=True),
            meta={"group": name, "reference": ref, "n": max(r["n"] for r in g)}))
    fig.add_hline(y=0, line=dict(color="black", width=1))
    trains = sorted({g["train"] for g in _grouped_rows(results, group_key).values() if g["train"]})
    for t in trains:
        _mark_length(fig, t, text=f"train {t}")
    if log_x:
        lengths = sorted({r["length"] for r in rows})
        fig.update_xaxes(type="log", tickvals=lengths, ticktext=[str(n) for n in lengths])
    fig.update_layout(title=dict(text=f"Paired difference vs {ref} (same documents, 95 % bootstrap interval)",
                                 subtitle=dict(text=_settings_caption(results))),
                      xaxis_title="evaluation length (tokens)",
                      yaxis_title=f"bits per byte − {ref} (below 0: better)",
                      meta={"reference": ref, "train_seq_len": trains})
    return fig


def _settings_caption(results: Sequence[Mapping]) -> str:
    # fireviz.evaluate writes the data source as "data" (older results: "domain")
    keys = ("data", "domain", "split", "mode", "stride", "token_budget", "seed")
    settings = [(_as_dict(r).get("settings") or {}) for r in results]
    # "seed" here picks the evaluation windows; say so, since checkpoints have training seeds too
    names = {"seed": "window seed"}
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
    (perplexity 3.6–4.0, where most curves sit) is labelled inside, not only at one end."""
    if not (math.isfinite(lo) and math.isfinite(hi)) or lo <= 0 or hi <= 0:
        return []
    lo, hi = min(lo, hi) / 1.02, max(lo, hi) * 1.02
    sets = (tuple(k / 20 for k in range(20, 200)), tuple(k / 10 for k in range(10, 100)),
            tuple(k / 5 for k in range(5, 50)), tuple(k / 2 for k in range(2, 20)), tuple(range(1, 10)),
            (1, 2, 3, 5, 7), (1, 2, 5), (1,))
    ticks: list[float] = []
    for mantissas in sets:
        ticks = sorted({float(f"{m * 10.0 ** e:.6g}") for e in range(math.floor(math.log10(lo)) - 1,
                                                                   math.floor(math.log10(hi)) + 1)
                        for m in mantissas if lo <= m * 10.0 ** e <= hi})
        if len(ticks) <= max_ticks:
            break
    return ticks if len(ticks) >= 2 else []


#: Perplexity of a uniform guess over the 256 byte values: 8 bits per byte, the chance level.
UNIFORM_BYTE_PERPLEXITY = 256.0
UNIFORM_MARK = "uniform bytes"


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
    for k, name in enumerate(names):
        g = [r for r in rows if r["group"] == name]
        n = max(r["n"] for r in g)
        err = None
        if n > 1:
            err = dict(type="data", array=np.array([r["perplexity_std"] or 0.0 for r in g]), visible=True)
        elif all(r["ci95_low"] is not None for r in g):  # one run: its 95 % interval over documents
            ppl = np.array([r["perplexity"] for r in g])
            err = dict(type="data", symmetric=False, visible=True,
                       array=np.exp2(np.array([r["ci95_high"] for r in g])) - ppl,
                       arrayminus=ppl - np.exp2(np.array([r["ci95_low"] for r in g])))
        fig.add_trace(go.Scatter(x=np.array([r["length"] for r in g]), y=np.array([r["perplexity"] for r in g]),
                                 error_y=err, mode="lines+markers", line=dict(color=_color(k)),
                                 name=name + (f" (mean ± std, {n} seeds)" if n > 1 else ""),
                                 meta={"group": name, "n": n}))
    trains = sorted({r["train_seq_len"] for r in rows if r["train_seq_len"]})
    for t in trains:
        _mark_length(fig, t, text=f"train {t}")
    fig.update_yaxes(type="log")
    ys = [r["perplexity"] + sign * (r["perplexity_std"] or 0.0) for r in rows for sign in (-1, 1)]
    ys += [2.0 ** r[k] for r in rows for k in ("ci95_low", "ci95_high") if r[k] is not None]
    if max(ys) >= UNIFORM_BYTE_PERPLEXITY / 4:  # near chance (≥ 6 bits per byte): show what chance is
        fig.add_hline(y=UNIFORM_BYTE_PERPLEXITY, line=dict(dash="dot", color="gray", width=1), name=UNIFORM_MARK,
                      annotation_text="uniform over 256 bytes (8 bits per byte)", annotation_position="bottom left")
        ys.append(UNIFORM_BYTE_PERPLEXITY)
    yticks = _log_ticks(min(y for y in ys if y > 0) if any(y > 0 for y in ys) else 0.0, max(ys))
    if yticks:  # label only these (plotly's own log ticks label every minor digit on a short range)
        fig.update_yaxes(tickvals=yticks, ticktext=[f"{v:g}" for v in yticks])
    if log_x:
        lengths = sorted({r["length"] for r in rows})
        fig.update_xaxes(type="log", tickvals=lengths, ticktext=[str(n) for n in lengths])
    fig.update_layout(title=dict(text="Perplexity vs evaluation length", subtitle=dict(text=_settings_caption(results))),
                      xaxis_title="evaluation length (tokens)", yaxis_title="perplexity (exp nats/token, log scale)",
                      meta={"train_seq_len": trains, "settings_caption": _settings_caption(results)})
    return fig


def accuracy_figure(results: Sequence[Mapping], chance: float | None = None, log_x: bool = True) -> go.Figure:
    """Answer accuracy vs evaluation length for results on a synthetic task (``fireviz.synthetic``).

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
            err = dict(type="data", symmetric=False, visible=True, array=np.array([c[1] for c in ci]) - y,
                       arrayminus=y - np.array([c[0] for c in ci]))
        name = r.get("label") or r.get("checkpoint", "?")
        fig.add_trace(go.Scatter(x=x, y=y, error_y=err, mode="lines+markers", name=name, line=dict(color=_color(k)),
                                 meta={"group": name, "sequence_accuracy": [e.get("sequence_accuracy") for e in es]}))
        k += 1
        lengths |= set(x.tolist())
        if r.get("train_seq_len"):
            trains.add(int(r["train_seq_len"]))
    if not k:
        raise ValueError("no result carries an answer accuracy (evaluate on a synthetic task: --data synthetic:copy)")
    for t in sorted(trains):
        _mark_length(fig, t, text=f"train {t}")
    if chance:
        fig.add_hline(y=chance, line=dict(dash="dot", color="gray", width=1),
                      annotation_text=f"chance ({chance:.3g})", annotation_position="bottom left")
    if log_x:
        fig.update_xaxes(type="log", tickvals=sorted(lengths), ticktext=[str(n) for n in sorted(lengths)])
    fig.update_yaxes(range=[0, 1.02])
    fig.update_layout(title=dict(text="Answer accuracy vs evaluation length",
                                 subtitle=dict(text=_settings_caption(results))),
                      xaxis_title="evaluation length (tokens)", yaxis_title="answer accuracy (argmax right)",
                      meta={"train_seq_len": sorted(trains)})
    return fig


def loss_by_position_figure(results: Sequence[Mapping] | Mapping, lengths: Sequence[int] | None = None,
                            group_key: str | None = None, color_groups: Mapping[str, str] | None = None) -> go.Figure:
    """Loss by position in the evaluation window: one line per (result, evaluation length).

    Args: one result or a list (``fireviz.evaluate`` layout: ``per_length[*].loss_by_position
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
        results = [results]
    fig = go.Figure()
    trains = set()
    color_index: dict[str, int] = {}
    drawn = sorted({int(row["length"]) for res in results for row in _as_dict(res).get("per_length", [])
                    if lengths is None or int(row["length"]) in set(int(x) for x in lengths)})
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
            fig.add_trace(go.Scatter(x=np.asarray(lbp["bucket_starts"], dtype=np.int64), y=_arr(lbp["nats"]),
                                     mode="lines", name=f"{name} @ {row['length']}", line=dict(color=_color(k), dash=dash),
                                     meta={"group": name, "length": int(row["length"])}))
    if not fig.data:
        raise ValueError("no loss_by_position data for the chosen results/lengths")
    for t in sorted(trains):
        _mark_length(fig, t, text=f"train {t}")
    fig.update_layout(title=dict(text="Loss by position in the window", subtitle=dict(text=_settings_caption(results))),
                      xaxis_title="position in window (tokens, bucket start)", yaxis_title="loss (nats/token)",
                      meta={"train_seq_len": sorted(trains)})
    return fig


# -- fit ---------------------------------------------------------------------------------------
def fit_figure(fit: Mapping, head: int = 0) -> go.Figure:
    """Target bias, FIRE's fit to it and the residual, with the fitted range marked.

    Accepts (``fireviz.fit.FitResult.to_dict()`` or any dict with): ``distance`` [D] (tokens),
    ``target`` and ``fitted`` as [D] (one head) or [heads, D] (logits), ``max_len`` (tokens;
    distances 0 … max_len − 1 were fitted, beyond is extrapolation), optional ``residual``
    (same shape; default target − fitted), optional ``name``/``target_name``.
    Returns: two-row Figure: top target (solid) and fitted (dashed) vs distance, bottom
      residual; a shaded shape named ``"fitted range"`` over [0, max_len] in both rows.
      Trace meta ``{"head", "series"}`` with series target | fitted | residual.
    Raises: ValueError for missing keys, mismatched shapes or a head out of range.
    """
    fit = _as_dict(fit)
    for key in ("distance", "target", "fitted", "max_len"):
        if key not in fit:
            raise ValueError(f"fit result needs key {key!r} (has {sorted(fit)})")
    d = _arr(fit["distance"])
    t, f = np.atleast_2d(_arr(fit["target"])), np.atleast_2d(_arr(fit["fitted"]))
    res = np.atleast_2d(_arr(fit["residual"])) if fit.get("residual") is not None else t - f
    if not (t.shape == f.shape == res.shape and t.shape[1] == d.size):
        raise ValueError(f"target {t.shape}, fitted {f.shape}, residual {res.shape} and distance [{d.size}] disagree")
    if not 0 <= head < t.shape[0]:
        raise ValueError(f"head {head} out of range 0..{t.shape[0] - 1}")
    max_len = float(fit["max_len"])
    fig = make_subplots(rows=2, cols=1, shared_xaxes=True, row_heights=[0.7, 0.3], vertical_spacing=0.06)
    tname = fit.get("target_name", "target")
    fig.add_trace(go.Scatter(x=d, y=t[head], mode="lines", name=str(tname), line=dict(color="black"),
                             meta={"head": head, "series": "target"}), row=1, col=1)
    fig.add_trace(go.Scatter(x=d, y=f[head], mode="lines", name="FIRE fit", line=dict(color=_color(1), dash="dash"),
                             meta={"head": head, "series": "fitted"}), row=1, col=1)
    fig.add_trace(go.Scatter(x=d, y=res[head], mode="lines", name="residual (target − fitted)",
                             line=dict(color=_color(3)), meta={"head": head, "series": "residual"}), row=2, col=1)
    for row in (1, 2):
        fig.add_vrect(x0=0, x1=max_len, fillcolor="gray", opacity=0.12, line_width=0, name=FIT_RANGE_MARK,
                      row=row, col=1, exclude_empty_subplots=False,
                      label=dict(text=f"fitted 0–{max_len - 1:g}" if row == 1 else "", textposition="top left",
                                 font=dict(size=9)))
    fig.update_xaxes(title_text="distance i − j (tokens)", row=2, col=1)
    fig.update_yaxes(title_text="bias (logits)", row=1, col=1)
    fig.update_yaxes(title_text="residual (logits)", row=2, col=1)
    # the title names the head and the range; the long target description is the subtitle (wraps
    # nowhere in plotly, so a narrow column must not need it in the title), the legend goes on top
    fig.update_layout(title=dict(text=f"head {head} · fitted on 0–{max_len - 1:g} tokens",
                                 subtitle=dict(text=f"{fit.get('name', 'fit')}<br>beyond the range is extrapolation")),
                      legend=dict(orientation="h", yanchor="bottom", y=1.0, x=0),
                      margin=dict(t=125), meta={"max_len": max_len, "head": head})
    return fig


# -- training ----------------------------------------------------------------------------------
def _trailing_mean(y: np.ndarray, window: int) -> np.ndarray:
    # mean of the finite values among the last `window` at each point (fewer at the start);
    # a non-finite value is skipped rather than spread over the rest of the curve
    ok = np.isfinite(y)
    c = np.concatenate([[0.0], np.cumsum(np.where(ok, y, 0.0))])
    k = np.concatenate([[0], np.cumsum(ok)])
    i = np.arange(1, y.size + 1)
    lo = np.maximum(0, i - window)
    n = k[i] - k[lo]
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(n > 0, (c[i] - c[lo]) / np.maximum(n, 1), np.nan)


def training_curves_figure(logs: Mapping[str, Sequence[Mapping]] | Sequence[Mapping], smooth: int = 1) -> go.Figure:
    """Training curves from ``train_log.jsonl`` rows.

    Args: one run's rows (list of dicts) or ``{run name: rows}``. Rows carry ``step``,
      ``tokens``, ``loss`` (nats/token), ``lr``, ``tokens_per_s``; eval rows also ``val_loss``
      and ``val_loss_4x`` (validation loss at 4× the training length, nats/token).
      ``smooth``: the train loss is drawn as the trailing mean over this many logged steps
      (1 = raw; one batch's loss is noisy enough to hide the differences between runs).
    Returns: two-row Figure sharing x = tokens seen (or step when rows lack ``tokens``):
      top train loss (line), val loss (markers), val loss @ 4× (open markers), its y range
      zoomed to the 95th percentile of train loss (or higher, to keep every series' last
      value and every validation point after the first 10% of training in view), so the
      first steps do not squash the end; bottom the learning rate. One legend
      entry per run (legend groups). Trace meta ``{"run", "series"}`` with series loss |
      val_loss | val_loss_4x | lr, plus ``"smooth"`` on the train-loss traces.
    Raises: ValueError for no rows or ``smooth`` < 1.
    """
    if not (isinstance(smooth, int) and smooth >= 1):
        raise ValueError(f"smooth must be an integer >= 1 (logged steps; 1 = raw) (got {smooth!r})")
    runs = dict(logs) if isinstance(logs, Mapping) else {"run": list(logs)}
    if not any(runs.values()):
        raise ValueError("no training-log rows to plot")
    use_tokens = all("tokens" in row for rows in runs.values() for row in rows)
    xkey = "tokens" if use_tokens else "step"
    fig = make_subplots(rows=2, cols=1, shared_xaxes=True, row_heights=[0.7, 0.3], vertical_spacing=0.06)
    train_losses, last_values, lowest = [], [], math.inf
    x_end = max((row[xkey] for rows in runs.values() for row in rows if xkey in row), default=0)
    late_val: list[float] = []  # validation points past the first 10% of training stay in view
    for k, (run, rows) in enumerate(runs.items()):
        col = _color(k)

        def series(key):
            pts = [(row[xkey], row[key]) for row in rows if row.get(key) is not None and xkey in row]
            return (np.array([p[0] for p in pts], dtype=np.float64), np.array([p[1] for p in pts], dtype=np.float64))

        # one legend entry per run (its train line, else its val line); the rest share its group
        legend_key = "loss" if series("loss")[0].size else "val_loss"
        for key, name, style, panel in (
                ("loss", f"{run} train", dict(mode="lines", line=dict(color=col)), 1),
                ("val_loss", f"{run} val", dict(mode="markers+lines", marker=dict(color=col, size=7),
                                                line=dict(color=col, dash="dot")), 1),
                ("val_loss_4x", f"{run} val @ 4× length",
                 dict(mode="markers+lines", marker=dict(color=col, size=7, symbol="circle-open"),
                      line=dict(color=col, dash="dash")), 1),
                ("lr", f"{run} lr", dict(mode="lines", line=dict(color=col)), 2)):
            x, y = series(key)
            if not x.size:
                continue
            meta = {"run": run, "series": key}
            if key == "loss" and smooth > 1:
                y, meta = _trailing_mean(y, smooth), {**meta, "smooth": smooth}
            first = key == legend_key
            fig.add_trace(go.Scatter(x=x, y=y, name=run if first else name, legendgroup=run, showlegend=first,
                                     meta=meta, **style), row=panel, col=1)
            if panel == 1:
                finite = y[np.isfinite(y)]
                if finite.size:
                    lowest = min(lowest, float(finite.min()))
                    last_values.append(float(finite[-1]))
                    if key == "loss":
                        train_losses.extend(finite.tolist())
                    else:
                        late = y[np.isfinite(y) & (x >= 0.1 * x_end)]
                        late_val.extend(late.tolist())
    fig.update_xaxes(title_text="tokens seen" if use_tokens else "step", row=2, col=1)
    fig.update_yaxes(title_text="loss (nats/token)", row=1, col=1)
    if train_losses and last_values:
        # zoom to where runs differ: the first few % of steps (≈ ln 257 nats) would squash the end.
        # Every series' last value stays in view; a double-click on the plot shows everything.
        top = max(float(np.percentile(train_losses, 95)), max(last_values), max(late_val, default=-math.inf))
        fig.update_yaxes(range=[lowest - 0.03 * (top - lowest), top + 0.05 * (top - lowest)], row=1, col=1)
    fig.update_yaxes(title_text="learning rate", row=2, col=1)
    fig.update_layout(title="Training curves", meta={"x": xkey}, height=650)
    return fig


def position_parameters_figure(logs: Mapping[str, Sequence[Mapping]]) -> go.Figure:
    """Trajectories of the learned position parameters during training.

    Args: run name → ``train_log.jsonl`` rows; rows logged at validation carry
      ``position_parameters`` = ``{parameter: {layer: [value per head]}}`` (FIRE's ``c`` and
      ``L`` in tokens, Kerple's ``r1``, ``r2``; ``fireviz.train.position_parameters``).
    Returns: Figure with one panel per parameter name (shared x = tokens seen), one line per
      run × layer × head, named ``"run L<layer> H<head>"`` (``H`` omitted for a scalar);
      ``L`` on a log y-axis. Trace meta ``{"run", "parameter", "layer", "head"}``.
    Raises: ValueError when no row of any run has ``position_parameters``.
    """
    series: "OrderedDict[str, OrderedDict]" = OrderedDict()  # parameter → (run, layer, head) → [(tokens, v)]
    for run, rows in logs.items():
        for row in rows:
            params = row.get("position_parameters")
            if not isinstance(params, Mapping):
                continue
            for name, layers in params.items():
                if not isinstance(layers, Mapping):
                    continue
                for layer, values in layers.items():
                    for head, v in enumerate(values if isinstance(values, (list, tuple)) else [values]):
                        if isinstance(v, numbers.Real) and math.isfinite(v):
                            key = (run, str(layer), head if len(values) > 1 else None)
                            series.setdefault(name, OrderedDict()).setdefault(key, []).append(
                                (row.get("tokens", row.get("step")), float(v)))
    if not series:
        raise ValueError("no run logged its position parameters (train_log.jsonl rows without "
                         "'position_parameters': trained before fireviz logged them, or an encoding without any)")
    names = list(series)
    fig = make_subplots(rows=len(names), cols=1, shared_xaxes=True, subplot_titles=names, vertical_spacing=0.08)
    runs = list(logs)
    for r, name in enumerate(names, start=1):
        for (run, layer, head), pts in series[name].items():
            label = f"{run} L{layer}" + (f" H{head}" if head is not None else "")
            fig.add_trace(go.Scatter(x=[p[0] for p in pts], y=[p[1] for p in pts], mode="lines+markers",
                                     name=label, legendgroup=run, marker=dict(size=4),
                                     line=dict(color=_color(runs.index(run)), width=1),
                                     meta={"run": run, "parameter": name, "layer": int(layer), "head": head}),
                          row=r, col=1)
        if name == "L":
            fig.update_yaxes(type="log", row=r, col=1, title_text="L (tokens)")
        else:
            fig.update_yaxes(title_text=name, row=r, col=1)
    fig.update_xaxes(title_text="tokens seen", row=len(names), col=1)
    fig.update_layout(title="Learned position parameters during training (at each validation)",
                      height=260 * len(names) + 120)
    return fig


def validation_curves_figure(logs: Mapping[str, Sequence[Mapping]], seq_len: int | None = None,
                             skip_initial: bool = True) -> go.Figure:
    """Validation loss of several runs side by side: one colour per run, two panels.

    Args: ``{run name: train_log rows}``; only rows with ``val_loss`` are used, against
      ``tokens`` (tokens seen) or ``step`` when a row lacks it. ``seq_len`` (tokens) only
      labels the panels ("@ 512" / "@ 2048"); without it they read "training length" / "4×".
      ``skip_initial`` drops step-0 rows (the untrained model, ≈ ln 257 nats) whose height
      would flatten the rest of the curve.
    Returns: one-row, two-column Figure: left ``val_loss`` (nats/token at the training
      length), right ``val_loss_4x`` (nats/token at 4× the training length), shared y.
      Trace meta ``{"run", "series"}`` with series val_loss | val_loss_4x. This is the
      "how close to converged" view of issue #8: flat tails mean a run has converged.
    Raises: ValueError when no run has a validation row.
    """
    runs = {k: [r for r in rows if r.get("val_loss") is not None and not (skip_initial and r.get("step") == 0)]
            for k, rows in logs.items()}
    if not any(runs.values()):
        raise ValueError("no validation rows (val_loss) in the training logs to plot")
    use_tokens = all("tokens" in r for rows in runs.values() for r in rows)
    xkey = "tokens" if use_tokens else "step"
    titles = ((f"validation @ {seq_len} tokens", f"validation @ {4 * seq_len} tokens (4×)") if seq_len
              else ("validation @ training length", "validation @ 4× training length"))
    fig = make_subplots(rows=1, cols=2, shared_yaxes=True, subplot_titles=titles, horizontal_spacing=0.04)
    for k, (run, rows) in enumerate(runs.items()):
        col = _color(k)
        for c, key in enumerate(("val_loss", "val_loss_4x"), start=1):
            pts = [(r[xkey], r[key]) for r in rows if r.get(key) is not None]
            if not pts:
                continue
            fig.add_trace(go.Scatter(x=[p[0] for p in pts], y=[p[1] for p in pts], mode="markers+lines", name=run,
                                     legendgroup=run, showlegend=c == 1, line=dict(color=col, dash="solid" if c == 1 else "dash"),
                                     marker=dict(color=col, size=6), meta={"run": run, "series": key}), row=1, col=c)
    for c in (1, 2):
        fig.update_xaxes(title_text="tokens seen" if use_tokens else "step", row=1, col=c)
    fig.update_yaxes(title_text="validation loss (nats/token)", row=1, col=1)
    fig.update_layout(title="Validation loss during training", meta={"x": xkey})
    return fig


# -- export ------------------------------------------------------------------------------------
def _plain(v):
    if v is None:
        return None
    a = np.asarray(v)
    if a.dtype.kind in "fc":
        return [[None if not np.isfinite(x) else float(x) for x in r] for r in a] if a.ndim == 2 else \
               [None if not np.isfinite(x) else float(x) for x in a.ravel()]
    return a.tolist()


def figure_data(fig: go.Figure) -> dict:
    """The plotted numbers of ``fig`` as plain Python: ``{"title", "meta" (layout meta),
    "markers" (named shapes: training length, fitted range, with x0/x1/y0/y1), "traces":
    [{"name", "type", "meta", "x", "y", "z"?, "error_y"?}]}`` (NaN → None)."""
    traces = []
    for tr in fig.data:
        t = {"name": tr.name, "type": tr.type, "meta": tr.meta}
        for key in ("x", "y", "z"):
            v = getattr(tr, key, None)
            if v is not None:
                t[key] = _plain(v)
        err = getattr(tr, "error_y", None)
        if err is not None and err.array is not None:
            t["error_y"] = _plain(err.array)
        traces.append(t)
    markers = [{"name": s.name, "x0": s.x0, "x1": s.x1, "y0": s.y0, "y1": s.y1, "xref": s.xref, "yref": s.yref}
               for s in fig.layout.shapes if s.name]
    title = fig.layout.title.text if fig.layout.title else None
    return {"title": title, "meta": fig.layout.meta, "markers": markers, "traces": traces}


def figure_to_json(fig: go.Figure) -> str:
    """``figure_data(fig)`` as a JSON string (for a download button or a paper script)."""
    return json.dumps(figure_data(fig), default=lambda o: o.tolist() if hasattr(o, "tolist") else str(o))


def figure_to_csv(fig: go.Figure) -> str:
    """The plotted numbers as long-format CSV: one row per point (per cell for heatmaps).

    Columns: ``trace, <meta keys …>, x, y``, then ``z`` if a trace is a heatmap and ``error_y``
    if a trace has error bars (a column no trace fills is left out); empty cells for NaN or
    absent values.
    """
    data = figure_data(fig)
    meta_keys: list[str] = []
    for t in data["traces"]:
        if isinstance(t["meta"], dict):
            meta_keys += [k for k in t["meta"] if k not in meta_keys]
    has_z = any("z" in t for t in data["traces"])
    has_err = any("error_y" in t for t in data["traces"])
    buf = io.StringIO()
    w = csv.writer(buf, lineterminator="\n")
    w.writerow(["trace", *meta_keys, "x", "y", *(["z"] if has_z else []), *(["error_y"] if has_err else [])])
    blank = lambda v: "" if v is None else v  # noqa: E731
    for t in data["traces"]:
        m = t["meta"] if isinstance(t["meta"], dict) else {}
        head = [t["name"], *[m.get(k, "") for k in meta_keys]]
        if "z" in t:
            for r, y in enumerate(t.get("y") or []):
                for c, x in enumerate(t.get("x") or []):
                    w.writerow([*head, x, y, blank(t["z"][r][c]), *([""] if has_err else [])])
            continue
        xs, ys = t.get("x") or [], t.get("y") or []
        errs = t.get("error_y") or [None] * len(xs)
        for x, y, e in zip(xs, ys, errs):
            w.writerow([*head, blank(x), blank(y), *([""] if has_z else []), *([blank(e)] if has_err else [])])
    return buf.getvalue()


# -- figures for a paper ---------------------------------------------------------------------------
#: Widths (points = CSS px at 72 per inch) of a two-column paper: one column (3.3 in), the page (6.9 in).
PAPER_WIDTHS = {"column": 240, "page": 500}
PAPER_FONT = dict(family="Times New Roman, Times, serif", size=8)
EXPORT_FORMATS = ("svg", "pdf", "png")


class FigureExportError(RuntimeError):
    """A figure could not be written as SVG/PDF/PNG (kaleido or a Chromium browser is missing)."""


def paper_figure(fig: go.Figure, width: str = "page") -> go.Figure:
    """A copy of ``fig`` sized and lettered for a two-column paper: ``width`` ``"page"`` (6.9 in,
    a figure* across both columns; the default) or ``"column"`` (3.3 in); height 3/5 of the width
    (more for subplot grids: 1/5 per row); serif text (8 pt, 7 pt ticks and panel titles), white
    background with light grid lines, tight margins. Raises: ValueError for another width."""
    if width not in PAPER_WIDTHS:
        raise ValueError(f"width must be one of {', '.join(PAPER_WIDTHS)} (got {width!r})")
    out = go.Figure(fig)
    w = PAPER_WIDTHS[width]
    grid = getattr(fig, "_grid_ref", None)  # make_subplots: rows × columns of panels
    rows = len(grid) if grid else 1
    height = max(int(w * 0.6), int(w * 0.2 * rows) + 60) if grid else int(w * 0.6)
    out.update_layout(font=PAPER_FONT, width=w, height=height, paper_bgcolor="white", plot_bgcolor="white",
                      margin=dict(l=50, r=10, t=40, b=40), title_font=dict(size=9),
                      legend=dict(font=dict(size=7)))
    if out.layout.title and out.layout.title.subtitle and out.layout.title.subtitle.text:
        out.update_layout(title_subtitle_font=dict(size=6))
    out.update_annotations(font_size=7)
    axis = dict(title_font_size=8, tickfont_size=7, gridcolor="#e5e5e5", zerolinecolor="#cccccc", linecolor="#444",
                showline=True, automargin=True)
    out.update_xaxes(**axis)
    out.update_yaxes(**axis)
    for ax in list(out.select_xaxes()) + list(out.select_yaxes()):  # explicit ticks stay explicit (as text)
        if ax.tickvals is not None:
            ax.update(tickmode="array", ticktext=[f"{v:g}" if isinstance(v, (int, float)) else str(v)
                                                  for v in (ax.ticktext if ax.ticktext is not None else ax.tickvals)])
    return out


def export_figure(fig: go.Figure, fmt: str, paper: str | None = "page") -> bytes:
    """The figure as SVG, PDF or PNG bytes (kaleido, drawing with a headless Chromium).

    Args: ``fmt`` in ``EXPORT_FORMATS``; ``paper``: ``paper_figure`` width (``"column"`` /
      ``"page"``, the default) or None to keep the figure's own size and style.
    Uses Debian's /usr/bin/chromium when ``BROWSER_PATH`` is not set.
    Raises: ValueError for an unknown format; FigureExportError naming what is missing.
    """
    if fmt not in EXPORT_FORMATS:
        raise ValueError(f"format must be one of {', '.join(EXPORT_FORMATS)} (got {fmt!r})")
    import os
    if "BROWSER_PATH" not in os.environ and Path("/usr/bin/chromium").exists():
        os.environ["BROWSER_PATH"] = "/usr/bin/chromium"
    f = paper_figure(fig, paper) if paper else fig
    try:
        try:
            return f.to_image(format=fmt, scale=3 if fmt == "png" else 1)
        except ImportError:
            raise
        except Exception:  # a cold browser start sometimes loses kaleido's page script: once more
            return f.to_image(format=fmt, scale=3 if fmt == "png" else 1)
    except Exception as e:  # kaleido missing, no browser, a browser that failed to start
        raise FigureExportError(f"cannot write the figure as {fmt.upper()} ({type(e).__name__}: "
                                f"{(str(e).splitlines() or [''])[0][:200]}); it needs the kaleido package and a "
                                "Chromium browser (apt install chromium, or set BROWSER_PATH)") from e


def write_figure(fig: go.Figure, path: str | os.PathLike, fmt: str | None = None, paper: str | None = "page") -> Path:
    """Write ``fig`` to ``path`` as ``fmt`` (default: the file's suffix: .svg, .pdf, .png, or
    .html for the interactive figure), atomically. Returns the path. Raises: ValueError for an
    unknown format; FigureExportError (see ``export_figure``)."""
    from .files import atomic_write
    path = Path(path)
    fmt = (fmt or path.suffix.lstrip(".")).lower()
    if fmt == "html":
        atomic_write(path, lambda p: fig.write_html(p, include_plotlyjs="cdn"))
        return path
    data = export_figure(fig, fmt, paper)
    atomic_write(path, lambda p: Path(p).write_bytes(data))
    return path
