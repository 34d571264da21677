"""What every fireviz figure shares: colours, the training-length mark, panel references,
subsampling, and plain arrays from plotly's typed ones (``fireviz.plots`` is the door)."""

from __future__ import annotations

import re
from typing import Any

import numpy as np
import plotly.graph_objects as go
from plotly.colors import qualitative

TRAIN_MARK = "training length"
FIT_RANGE_MARK = "fitted range"
# Plotly's ten, then dark hues unlike them (from Dark24), so the 13 rows of a results figure
# (nine encodings, two seed runs, RoPE-PI, YaRN) get 13 colours told apart at a glance; D3 only
# after that, since it repeats Plotly's hues (orange, blue, green) in other shades.
_COLORS = (
    qualitative.Plotly + ["#222A2A", "#B68100", "#862A16", "#778AAE", "#6C7C32", "#1616A7", "#750D86"] + qualitative.D3
)


_DASHES = ("solid", "dash", "dot", "dashdot", "longdash")


def _color(i: int) -> str:
    return _COLORS[i % len(_COLORS)]


def _as_dict(obj) -> dict:
    return obj.to_dict() if hasattr(obj, "to_dict") else obj


def _mark_length(
    fig: go.Figure,
    x: float | None,
    row: int | None = None,
    col: int | None = None,
    axis: str = "x",
    text: str | None = None,
    name: str = TRAIN_MARK,
    at: str = "end",
) -> None:
    """Dashed line at a length (tokens) on the x (``axis="x"``) or y axis of one subplot,
    labelled at its ``at`` end ("end": top / right, "start": bottom / left)."""
    if x is None:
        return
    kw: dict[str, Any] = dict(
        line_dash="dash", line_color="gray", line_width=1, name=name, exclude_empty_subplots=False
    )
    if row is not None:
        kw.update(row=row, col=col)
    label = dict(text=text if text is not None else f"{name} {x:g}", font=dict(size=9, color="gray"))
    if axis == "x":
        # drawn inside the plot area (it ran up into the title and subtitle)
        fig.add_vline(
            x=x, label=dict(label, textposition=at, textangle=0, xanchor="left", yanchor="top", padding=4), **kw
        )
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
    return np.unique(
        np.concatenate([np.arange(min(n, keep_first)), np.linspace(0, n - 1, max_points).round().astype(np.int64)])
    )


def _subsample_log(n: int, max_points: int | None, keep_first: int = 64) -> np.ndarray:
    """Indices 1 … n − 1 for a log distance axis: all if n <= max_points, else the first
    ``keep_first`` plus ``max_points`` log-spaced ones (even steps on the axis as drawn)."""
    if max_points is None or n <= max_points:
        return np.arange(1, n)
    spaced = np.geomspace(1, n - 1, max_points).round().astype(np.int64)
    return np.unique(np.concatenate([np.arange(1, min(n, keep_first)), spaced]))


def _arr(x) -> np.ndarray:
    """Nested lists with None → float64 array with NaN."""
    return np.array(x, dtype=np.float64) if x is not None else np.array([], dtype=np.float64)


_LONE_AMPERSAND = re.compile(r"&(?!(?:[A-Za-z]+|#[0-9]+|#x[0-9A-Fa-f]+);)")


def _plain_label(text):
    """``text`` with ``<``, ``>`` and ``&`` as entities (plotly draws them as the characters), except
    the ``<br>`` line breaks fireviz's own titles use; anything else returned as it is."""
    if not isinstance(text, str) or not any(c in text for c in "<>&"):
        return text
    text = _LONE_AMPERSAND.sub("&amp;", text)  # an entity already there stays: a second pass changes nothing
    return text.replace("<", "&lt;").replace(">", "&gt;").replace("&lt;br&gt;", "<br>")


def plain_labels(fig: go.Figure) -> go.Figure:
    """Draw every label of ``fig`` as plain text, in place (and return it): trace names, texts and
    hover texts, titles, subtitles, axis titles and annotations (subplot titles). Plotly renders a
    subset of HTML in labels (``<a href>``, ``<b>``, ``<span style>``), so a checkpoint, run or
    file name holding one (issue #38) would become a link or markup; fireviz's own ``<br>`` line
    breaks are kept. A second pass changes nothing."""
    for t in fig.data:
        for attr in ("name", "text", "hovertext", "legendgrouptitle"):
            value = getattr(t, attr, None)
            if attr == "legendgrouptitle":
                if value is not None and value.text:
                    value.text = _plain_label(value.text)
            elif isinstance(value, str):
                setattr(t, attr, _plain_label(value))
            elif isinstance(value, (tuple, list)) and any(isinstance(v, str) for v in value):
                setattr(t, attr, [_plain_label(v) for v in value])
    lay = fig.layout
    if lay.title and lay.title.text:
        lay.title.text = _plain_label(lay.title.text)
    if lay.title and lay.title.subtitle and lay.title.subtitle.text:
        lay.title.subtitle.text = _plain_label(lay.title.subtitle.text)

    def axis_title(axis) -> None:
        if axis.title is not None and axis.title.text:
            axis.title.text = _plain_label(axis.title.text)

    fig.for_each_xaxis(axis_title)
    fig.for_each_yaxis(axis_title)
    if lay.annotations:
        for a in lay.annotations:
            if a.text:
                a.text = _plain_label(a.text)
    return fig
