"""Figures of position biases: the layer × head grid, one head, FIRE's input, heatmaps, dilution."""

from __future__ import annotations

import math
import numbers
from collections import OrderedDict
from typing import Sequence

import numpy as np
import plotly.graph_objects as go
from plotly.subplots import make_subplots

from fireviz.encodings import has_normalizer
from fireviz.plots.base import TRAIN_MARK, _arr, _as_dict, _color, _mark_length, _panel_refs, _subsample, _subsample_log


# -- biases ------------------------------------------------------------------------------------
def bias_grid_figure(
    report, query_positions: Sequence[int] | None = None, max_points: int | None = 1024, x_axis: str = "distance"
) -> go.Figure:
    """Layer × head grid of bias curves: bias (logits) vs distance i − j (tokens), one line per
    query position i.

    Args:
      report: ``fireviz.analysis.biases.BiasReport`` or its ``to_dict()``.
      query_positions: subset of the report's query positions to draw (default all).
      max_points: cap on points per line (the first 64 distances plus evenly spaced ones);
        None draws every distance. The full curves stay in the report.
      x_axis: ``"distance"`` or ``"log_distance"`` (a log axis from distance 1: T5's buckets, which
        change only within ``max_distance`` = 128 tokens and are flat to the largest query position,
        fill the panel instead of a sliver beside the y axis). Additive reports only.
    Returns: a Figure with ``n_layer`` rows × ``n_head`` columns and a dashed
      ``"training length"`` line at distance = train_seq_len in every panel. Rotary reports
      get one panel with the RoPE kernel (Su et al. 2021 §3.4.3) labelled as such; NoPE an
      empty figure whose title says there is no position bias.
    Trace meta: ``{"layer", "head", "query_position"}`` (or ``{"kernel": True}``).
    Raises: ValueError if a requested query position is not in the report, or for an ``x_axis``
      other than ``"distance"`` and ``"log_distance"``.
    """
    if x_axis not in ("distance", "log_distance"):
        raise ValueError(f"a bias grid's x_axis is 'distance' or 'log_distance' (got {x_axis!r})")
    r = _as_dict(report)
    L = r.get("train_seq_len")
    if r.get("kind") == "rotary":
        return _kernel_figure(r, max_points)
    if r.get("kind") != "additive":
        fig = go.Figure()
        fig.update_layout(
            title=f"{r.get('checkpoint') or r.get('encoding')}: {r.get('note') or 'no position bias'}",
            meta={"train_seq_len": L, "kind": r.get("kind")},
        )
        return fig
    wanted = list(r["query_positions"]) if query_positions is None else [int(q) for q in query_positions]
    missing = set(wanted) - set(r["query_positions"])
    if missing:
        raise ValueError(f"query positions {sorted(missing)} are not in the report (has {r['query_positions']})")
    n_layer, n_head = r["n_layer"], r["n_head"]
    # four or more panels side by side: the class on its own line (at 1024 px one line ran into the next title)
    sep = "<br>" if n_head >= 4 else " · "
    fig = make_subplots(
        rows=n_layer,
        cols=n_head,
        subplot_titles=_grid_titles(r, sep),
        shared_xaxes=True,
        horizontal_spacing=min(0.04, 0.5 / max(1, n_head - 1)),
        vertical_spacing=min(0.09 if sep == "<br>" else 0.06, 0.5 / max(1, n_layer - 1)),
    )
    refs = {(ly, h): _panel_refs(fig, ly + 1, h + 1) for ly in range(n_layer) for h in range(n_head)}
    fig.add_traces(_grid_traces(r, wanted, refs, max_points, log=x_axis == "log_distance"))
    # one dashed line per panel, built directly (add_vline per subplot is quadratic in panels)
    fig.layout.shapes = _grid_marks(refs, L) if L is not None else []
    _grid_layout(fig, r, sep, log=x_axis == "log_distance")
    return fig


def _grid_titles(r: dict, sep: str) -> list[str]:
    """``"L<layer> H<head>"`` per panel, row by row, with the head's locality class after ``sep``."""
    heads_loc = {(lay["layer"], h["head"]): h.get("locality") for lay in r["layers"] for h in lay.get("heads", [])}
    return [
        f"L{ly} H{h}" + (f"{sep}{heads_loc[(ly, h)]}" if heads_loc.get((ly, h)) else "")
        for ly in range(r["n_layer"])
        for h in range(r["n_head"])
    ]


def _grid_traces(r: dict, wanted: list[int], refs: dict, max_points: int | None, log: bool = False) -> list[go.Scatter]:
    """One line per (layer, head, wanted query position), on that panel's axes ``refs[(layer, head)]``
    (from distance 1 with ``log``: distance 0 has no place on a log axis)."""
    traces = []
    for lay in r["layers"]:
        ly = lay["layer"]
        for c in lay["curves"]:
            i = c["query_position"]
            if i not in wanted:
                continue
            k = wanted.index(i)
            bias = _arr(c["bias"])  # [heads, i + 1]
            dist = np.asarray(c.get("distance", range(bias.shape[1])), dtype=np.int64)
            idx = (_subsample_log if log else _subsample)(bias.shape[1], max_points)
            idx = idx[dist[idx] >= 1] if log else idx
            dist = dist[idx]
            for h in range(bias.shape[0]):
                xr, yr = refs[(ly, h)]
                traces.append(
                    go.Scatter(
                        x=dist,
                        y=bias[h, idx],
                        mode="lines",
                        name=f"i = {i}",
                        legendgroup=f"i{i}",
                        showlegend=(ly == 0 and h == 0),
                        line=dict(color=_color(k), width=1.2),
                        xaxis=xr,
                        yaxis=yr,
                        meta={"layer": ly, "head": h, "query_position": i},
                    )
                )
    return traces


def _grid_marks(refs: dict, L: float) -> list[go.layout.Shape]:
    """The dashed training-length line of every panel (labelled "train" in the first)."""
    return [
        go.layout.Shape(
            type="line",
            x0=L,
            x1=L,
            xref=xr,
            y0=0,
            y1=1,
            yref=f"{yr} domain",
            name=TRAIN_MARK,
            line=dict(dash="dash", color="gray", width=1),
            label=dict(
                text="train" if (ly, h) == (0, 0) else "",
                textposition="end",
                textangle=-90,
                font=dict(size=9, color="gray"),
            ),
        )
        for (ly, h), (xr, yr) in refs.items()
    ]


def _grid_layout(fig: go.Figure, r: dict, sep: str, log: bool = False) -> None:
    """Axis titles (y per row, x under the first column), panel-title font, title, height and meta."""
    n_layer, L = r["n_layer"], r.get("train_seq_len")
    for ly in range(n_layer):
        fig.update_yaxes(title_text="bias (logits)", row=ly + 1, col=1)
    if log:
        fig.update_xaxes(type="log")
    # one x title under the first column (one per column overlapped in narrow windows)
    fig.update_xaxes(title_text="distance i − j (tokens" + (", log scale)" if log else ")"), row=n_layer, col=1)
    fig.update_annotations(font_size=11)  # the panel titles
    fig.update_layout(
        title=dict(
            text=f"{r.get('checkpoint') or r.get('encoding')}: position bias by layer and head",
            subtitle=dict(text=f"{r.get('encoding')} · training length {L} tokens · one line per query position i"),
        ),
        legend_title_text="query position",
        height=220 * n_layer + 120 + (20 if sep == "<br>" else 0),
        margin=dict(t=130 if sep == "<br>" else 100),
        meta={
            "train_seq_len": L,
            "encoding": r.get("encoding"),
            "checkpoint": r.get("checkpoint"),
            "units": {"x": "tokens", "y": "logits"},
            "x_axis": "log_distance" if log else "distance",
        },
    )


def _kernel_figure(r: dict, max_points: int | None) -> go.Figure:
    k = r["kernel"]
    d = np.asarray(k["distance"], dtype=np.int64)
    v = _arr(k["value"])
    idx = _subsample(d.size, max_points)
    fig = go.Figure(
        go.Scatter(
            x=d[idx],
            y=v[idx],
            mode="lines",
            name="RoPE kernel",
            meta={"kernel": True, "attention_factor": k.get("attention_factor")},
        )
    )
    _mark_length(fig, r.get("train_seq_len"))
    fig.update_layout(
        title=dict(
            text=f"{r.get('checkpoint') or r.get('encoding')}: RoPE position kernel (not a bias)",
            subtitle=dict(text=k.get("label", "")),
        ),
        xaxis_title="distance m − n (tokens)",
        yaxis_title="mean_k cos(d·θ_k) (dimensionless)",
        meta={
            "train_seq_len": r.get("train_seq_len"),
            "encoding": r.get("encoding"),
            "units": {"x": "tokens", "y": "dimensionless"},
        },
    )
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
        fig.add_traces(_head_curves(r, lay_k, cap, layer, head, x_axis))
    xt = _head_x_axis(fig, r, lay, layer, head, x_axis)
    loc = next((h for h in lay.get("heads", []) if h["head"] == head), None)
    sub = (
        f"locality {loc['locality']} (ρ = {loc['rank_correlation']:.2f}, peak at {loc['peak_distance']} tokens)"
        if loc
        else ""
    )
    fig.update_layout(
        title=dict(
            text=f"{r.get('checkpoint') or r.get('encoding')}: layer {layer}, head {head}", subtitle=dict(text=sub)
        ),
        xaxis_title=xt,
        yaxis_title="bias (logits)",
        legend_title_text="query position",
        meta={"train_seq_len": r.get("train_seq_len"), "layer": layer, "head": head, "x_axis": x_axis},
    )
    return fig


def _head_curves(r: dict, lay: dict, cap, layer: int, head: int, x_axis: str) -> list[go.Scatter]:
    """One line per query position of one layer's curves for ``head`` on the ``x_axis``; dashed
    and named ``"…, cap N"`` for a report computed with a normalizer cap ``N``."""
    traces = []
    for k, c in enumerate(lay["curves"]):
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
        traces.append(
            go.Scatter(
                x=x,
                y=y,
                mode="lines",
                name=f"i = {i}" + (f", cap {cap}" if cap else ""),
                line=dict(color=_color(k), dash="dash" if cap else None),
                meta={"layer": layer, "head": head, "query_position": i, "capped": cap},
            )
        )
    return traces


def _head_x_axis(fig: go.Figure, r: dict, lay: dict, layer: int, head: int, x_axis: str) -> str:
    """The x axis of a one-head figure: on FIRE's input, f_θ itself (dotted); on a distance
    axis, the training length marked (and a log scale). Returns: the axis title."""
    if x_axis == "normalized" and lay.get("fire"):
        f = lay["fire"]
        fig.add_trace(
            go.Scatter(
                x=_arr(f["mlp_x"]),
                y=_arr(f["mlp_bias"])[head],
                mode="lines",
                name="f_θ(x)",
                line=dict(color="black", dash="dot"),
                meta={"layer": layer, "head": head, "mlp": True},
            )
        )
        return "normalized distance ψ(i − j)/ψ(max(L, i)) (dimensionless)"
    _mark_length(fig, r.get("train_seq_len"))
    if x_axis == "log_distance":
        fig.update_xaxes(type="log")
    return "distance i − j (tokens" + (", log scale)" if x_axis == "log_distance" else ")")


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
        for k, (d, row) in enumerate(zip(fire["distances"], fire["input"], strict=True)):
            y = np.array([np.nan if v is None else v for v in row], dtype=np.float64)
            fig.add_trace(
                go.Scatter(
                    x=q,
                    y=y,
                    mode="lines",
                    name=f"d = {d}" + (f", cap {cap}" if cap else ""),
                    line=dict(color=_color(k), dash="dash" if cap else None),
                    meta={"layer": layer, "distance": int(d), "capped": cap},
                )
            )
    train = r.get("train_seq_len")
    if train:
        fig.add_vrect(
            x0=1,
            x1=train,
            fillcolor="gray",
            opacity=0.12,
            line_width=0,
            annotation_text="training positions",
            annotation_position="top left",
        )
    fig.update_xaxes(type="log")
    fig.update_layout(
        title=dict(
            text=f"{r.get('checkpoint') or r.get('encoding')}: f_θ's input for fixed distances, layer {layer}",
            subtitle=dict(
                text="ψ(d)/ψ(max(L, i)): past the training positions the normalizer grows on, so far keys look near"
            ),
        ),
        xaxis_title="query position i (tokens, log scale)",
        yaxis_title="normalized distance (f_θ's input)",
        yaxis_range=[0, 1.02],
        meta={"train_seq_len": train, "layer": layer},
    )
    return fig


def dilution_compare_figure(results: Sequence) -> go.Figure:
    """Attention share on the nearest keys vs query position, one panel per layer, one line
    per checkpoint (mean over heads); capped-normalizer results dashed.

    Args: ``fireviz.analysis.text_attention.DilutionResult``s or their ``to_dict()`` (same ``near``).
    Returns: Figure with one row per layer; trace meta ``{"checkpoint", "layer",
      "normalizer_cap"}``, y = mean share over heads (probability), x = query position
      (tokens, log), training length marked. Raises: ValueError for no results.
    """
    rs = [_as_dict(r) for r in results]
    if not rs:
        raise ValueError("no dilution results to plot")
    n_layer = max(_arr(r["share"]).shape[0] for r in rs)
    fig = make_subplots(
        rows=n_layer,
        cols=1,
        shared_xaxes=True,
        vertical_spacing=0.06,
        subplot_titles=[f"layer {ly}" for ly in range(n_layer)],
    )
    names = list(OrderedDict.fromkeys(r.get("checkpoint") or r.get("encoding") for r in rs))
    for r in rs:
        share = _arr(r["share"])
        name = r.get("checkpoint") or r.get("encoding")
        assert name is not None  # a dilution result names its encoding
        cap = r.get("normalizer_cap")
        for ly in range(share.shape[0]):
            fig.add_trace(
                go.Scatter(
                    x=np.asarray(r["query_positions"]),
                    y=share[ly].mean(0),
                    mode="lines+markers",
                    name=name + (f" (cap {cap})" if cap else ""),
                    legendgroup=name + str(cap),
                    showlegend=ly == 0,
                    line=dict(color=_color(names.index(name)), dash="dash" if cap else None),
                    meta={"checkpoint": name, "layer": ly, "normalizer_cap": cap},
                ),
                row=ly + 1,
                col=1,
            )
    for ly in range(n_layer):
        _mark_length(fig, rs[0].get("train_seq_len"), row=ly + 1, col=1)
        fig.update_yaxes(range=[0, 1.02], row=ly + 1, col=1)
    fig.update_xaxes(type="log")
    fig.update_xaxes(title_text="query position i (tokens)", row=n_layer, col=1)
    near = rs[0].get("near")
    fig.update_layout(
        title=dict(
            text=f"Attention on the nearest {near} keys (mean over heads)",
            subtitle=dict(
                text=f"mean over {rs[0].get('rows')} query rows per position; "
                "a falling line is attention spreading thin"
            ),
        ),
        height=220 * n_layer + 140,
        meta={"near": near, "train_seq_len": rs[0].get("train_seq_len")},
    )
    return fig


def _heatmap_note(encoding) -> str:
    # FIRE divides by ψ(max(L, i)), so its bias changes along a diagonal; the fixed-form biases
    # (T5 buckets, ALiBi, Kerple, Sandwich) are functions of i − j alone.

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
    if color_limit is not None and not (
        isinstance(color_limit, numbers.Real) and not isinstance(color_limit, bool) and 0 < color_limit < math.inf
    ):
        raise ValueError(
            f"color_limit must be a positive number of logits such as 20 (got {color_limit!r}); "
            "None spans the full range"
        )
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
    lo, hi = (
        (max(finite.min(), -color_limit), min(finite.max(), color_limit)) if color_limit and finite.size else (0, 0)
    )
    # clip only where the limit cuts into the range (a bias entirely beyond it keeps its own range)
    if color_limit is not None and lo < hi and (finite.min() < lo or finite.max() > hi):
        scale = (
            dict(colorscale="RdBu", zmin=-color_limit, zmax=color_limit)
            if both
            else dict(colorscale="Viridis", zmin=float(lo) + 0.0, zmax=float(hi) + 0.0)
        )  # + 0.0: no "-0"
        bar_title = f"bias (logits),<br>saturated at |b| ≥ {color_limit:g}"
    fig = go.Figure(
        go.Heatmap(
            x=np.asarray(m["key_positions"]),
            y=np.asarray(m["query_positions"]),
            z=zh,
            **scale,
            colorbar=dict(title=dict(text=bar_title)),
            meta={"layer": layer, "head": head},
            name=f"L{layer} H{head}",
        )
    )
    L = r.get("train_seq_len")
    _mark_length(fig, L, axis="x", at="start")  # at the top it would run into the subtitle
    _mark_length(fig, L, axis="y")
    fig.update_yaxes(autorange="reversed")
    fig.update_layout(
        title=dict(
            text=f"{r.get('checkpoint') or r.get('encoding')}: bias b(i, j), layer {layer}, head {head}",
            subtitle=dict(text=_heatmap_note(r.get("encoding"))),
        ),
        xaxis_title="key position j (tokens)",
        yaxis_title="query position i (tokens)",
        meta={"train_seq_len": L, "layer": layer, "head": head},
    )
    return fig


def dilution_figure(result, layer: int | None = None) -> go.Figure:
    """Attention share on the nearest keys vs query position (log x), one line per head.

    Args: ``result`` a ``fireviz.analysis.text_attention.DilutionResult`` or its ``to_dict()``; ``layer``
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
    for ly in layers:
        for h in range(share.shape[1]):
            fig.add_trace(
                go.Scatter(
                    x=x,
                    y=share[ly, h],
                    mode="lines+markers",
                    name=f"L{ly} H{h}",
                    line=dict(color=_color(ly if layer is None else h)),
                    meta={"layer": ly, "head": h},
                )
            )
    _mark_length(fig, r.get("train_seq_len"))
    fig.update_xaxes(type="log")
    fig.update_layout(
        title=dict(
            text=f"{r.get('checkpoint') or r.get('encoding') or ''}: attention on the nearest {r.get('near')} keys",
            subtitle=dict(text=f"mean over {r.get('rows')} query rows per position"),
        ),
        xaxis_title="query position i (tokens)",
        yaxis_title=f"share of attention on nearest {r.get('near')} keys (probability)",
        yaxis_range=[0, 1.02],
        meta={"train_seq_len": r.get("train_seq_len"), "near": r.get("near")},
    )
    return fig
