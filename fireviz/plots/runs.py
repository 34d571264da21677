"""Figures of fits and training runs: FIRE vs its target, loss curves, position parameters."""

from __future__ import annotations

import math
import numbers
from collections import OrderedDict
from typing import Mapping, Sequence

import numpy as np
import plotly.graph_objects as go
from plotly.subplots import make_subplots

from fireviz.plots.base import FIT_RANGE_MARK, _arr, _as_dict, _color


# -- fit ---------------------------------------------------------------------------------------
def fit_figure(fit: Mapping, head: int = 0) -> go.Figure:
    """Target bias, FIRE's fit to it and the residual, with the fitted range marked.

    Accepts (``fireviz.fit.fitting.FitResult.to_dict()`` or any dict with): ``distance`` [D] (tokens),
    ``target`` and ``fitted`` as [D] (one head) or [heads, D] (logits), ``max_len`` (tokens;
    distances 0 … max_len − 1 were fitted, beyond is extrapolation), optional ``residual``
    (same shape; default target − fitted), optional ``name``/``target_name``.
    Returns: two-row Figure: top target (solid) and fitted (dashed) vs distance, bottom
      residual; a shaded shape named ``"fitted range"`` over [0, max_len] in both rows.
      Trace meta ``{"head", "series"}`` with series target | fitted | residual.
    Raises: ValueError for missing keys, mismatched shapes or a head out of range.
    """
    d, t, f, res = _fit_arrays(fit, head)
    fit = _as_dict(fit)
    max_len = float(fit["max_len"])
    fig = make_subplots(rows=2, cols=1, shared_xaxes=True, row_heights=[0.7, 0.3], vertical_spacing=0.06)
    for y, name, line, series, row in (
        (t[head], str(fit.get("target_name", "target")), dict(color="black"), "target", 1),
        (f[head], "FIRE fit", dict(color=_color(1), dash="dash"), "fitted", 1),
        (res[head], "residual (target − fitted)", dict(color=_color(3)), "residual", 2),
    ):
        fig.add_trace(
            go.Scatter(x=d, y=y, mode="lines", name=name, line=line, meta={"head": head, "series": series}),
            row=row,
            col=1,
        )
    for row in (1, 2):
        fig.add_vrect(
            x0=0,
            x1=max_len,
            fillcolor="gray",
            opacity=0.12,
            line_width=0,
            name=FIT_RANGE_MARK,
            row=row,
            col=1,
            exclude_empty_subplots=False,
            label=dict(
                text=f"fitted 0–{max_len - 1:g}" if row == 1 else "", textposition="top left", font=dict(size=9)
            ),
        )
    fig.update_xaxes(title_text="distance i − j (tokens)", row=2, col=1)
    fig.update_yaxes(title_text="bias (logits)", row=1, col=1)
    fig.update_yaxes(title_text="residual (logits)", row=2, col=1)
    # the title names the head and the range; the long target description is the subtitle (wraps
    # nowhere in plotly, so a narrow column must not need it in the title); the legend goes below
    # the plot: on top it wrapped into the subtitle at 1024 px (issue #48)
    fig.update_layout(
        title=dict(
            text=f"head {head} · fitted on 0–{max_len - 1:g} tokens",
            subtitle=dict(text=f"{fit.get('name', 'fit')}<br>beyond the range is extrapolation"),
        ),
        legend=dict(orientation="h", yanchor="top", y=-0.16, x=0),
        margin=dict(t=105, b=110),
        meta={"max_len": max_len, "head": head},
    )
    return fig


def _fit_arrays(fit: Mapping, head: int) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """``(distance [D], target, fitted, residual [heads, D])`` of a fit dict, checked (see ``fit_figure``)."""
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
    return d, t, f, res


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
    x_end = max((row[xkey] for rows in runs.values() for row in rows if xkey in row), default=0)
    zoom = _LossZoom(x_end)
    for k, (run, rows) in enumerate(runs.items()):
        _add_run(fig, run, rows, _color(k), xkey, smooth, zoom)
    fig.update_xaxes(title_text="tokens seen" if use_tokens else "step", row=2, col=1)
    fig.update_yaxes(title_text="loss (nats/token)", row=1, col=1)
    y_range = zoom.y_range()
    if y_range is not None:
        fig.update_yaxes(range=y_range, row=1, col=1)
    fig.update_yaxes(title_text="learning rate", row=2, col=1)
    fig.update_layout(title="Training curves", meta={"x": xkey}, height=650)
    return fig


class _LossZoom:
    """The loss panel's y range, from every loss-panel series drawn (``add``): zoomed to where runs
    differ — the first few % of steps (≈ ln 257 nats) would squash the end. Every series' last
    value stays in view, and so does every validation point past 10% of ``x_end`` (the last x)."""

    def __init__(self, x_end: float):
        self.x_end = x_end
        self.train_losses: list[float] = []
        self.last_values: list[float] = []
        self.late_val: list[float] = []
        self.lowest = math.inf

    def add(self, key: str, x: np.ndarray, y: np.ndarray) -> None:
        finite = y[np.isfinite(y)]
        if not finite.size:
            return
        self.lowest = min(self.lowest, float(finite.min()))
        self.last_values.append(float(finite[-1]))
        if key == "loss":
            self.train_losses.extend(finite.tolist())
        else:
            late = y[np.isfinite(y) & (x >= 0.1 * self.x_end)]
            self.late_val.extend(late.tolist())

    def y_range(self) -> list[float] | None:
        """``[low, high]`` (nats/token), or None without a train loss (a double-click shows everything)."""
        if not (self.train_losses and self.last_values):
            return None
        lowest = self.lowest
        top = max(
            float(np.percentile(self.train_losses, 95)), max(self.last_values), max(self.late_val, default=-math.inf)
        )
        return [lowest - 0.03 * (top - lowest), top + 0.05 * (top - lowest)]


def _run_styles(run: str, col: str) -> tuple:
    """``(log key, trace name, style, panel)`` of each series of one run, in drawing order."""
    return (
        ("loss", f"{run} train", dict(mode="lines", line=dict(color=col)), 1),
        (
            "val_loss",
            f"{run} val",
            dict(mode="markers+lines", marker=dict(color=col, size=7), line=dict(color=col, dash="dot")),
            1,
        ),
        (
            "val_loss_4x",
            f"{run} val @ 4× length",
            dict(
                mode="markers+lines",
                marker=dict(color=col, size=7, symbol="circle-open"),
                line=dict(color=col, dash="dash"),
            ),
            1,
        ),
        ("lr", f"{run} lr", dict(mode="lines", line=dict(color=col)), 2),
    )


def _add_run(fig: go.Figure, run: str, rows: Sequence[Mapping], col: str, xkey: str, smooth: int, zoom) -> None:
    """One run's train loss (smoothed), val losses and learning rate; loss-panel series go to ``zoom``."""

    def series(key):
        pts = [(row[xkey], row[key]) for row in rows if row.get(key) is not None and xkey in row]
        return (np.array([p[0] for p in pts], dtype=np.float64), np.array([p[1] for p in pts], dtype=np.float64))

    # one legend entry per run (its train line, else its val line); the rest share its group
    legend_key = "loss" if series("loss")[0].size else "val_loss"
    for key, name, style, panel in _run_styles(run, col):
        x, y = series(key)
        if not x.size:
            continue
        meta = {"run": run, "series": key}
        if key == "loss" and smooth > 1:
            y, meta = _trailing_mean(y, smooth), {**meta, "smooth": smooth}
        first = key == legend_key
        fig.add_trace(
            go.Scatter(x=x, y=y, name=run if first else name, legendgroup=run, showlegend=first, meta=meta, **style),
            row=panel,
            col=1,
        )
        if panel == 1:
            zoom.add(key, x, y)


def position_parameters_figure(logs: Mapping[str, Sequence[Mapping]]) -> go.Figure:
    """Trajectories of the learned position parameters during training.

    Args: run name → ``train_log.jsonl`` rows; rows logged at validation carry
      ``position_parameters`` = ``{parameter: {layer: [value per head]}}`` (FIRE's ``c`` and
      ``L`` in tokens, Kerple's ``r1``, ``r2``; ``fireviz.train.loop.position_parameters``).
    Returns: Figure with one panel per parameter name (shared x = tokens seen), one line per
      run × layer × head (legend: one entry per run; hover text ``"run <parameter> · layer <l> · head <h>"``, head omitted for a scalar);
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
                                (row.get("tokens", row.get("step")), float(v))
                            )
    if not series:
        raise ValueError(
            "no run logged its position parameters (train_log.jsonl rows without "
            "'position_parameters': trained before fireviz logged them, or an encoding without any)"
        )
    names = list(series)
    fig = make_subplots(rows=len(names), cols=1, shared_xaxes=True, subplot_titles=names, vertical_spacing=0.08)
    runs = list(logs)
    in_legend: set[str] = set()
    for r, name in enumerate(names, start=1):
        for (run, layer, head), pts in series[name].items():
            # the parameter in every name: c and L panels of one run were "fire L0" twice (and "L0" read as L)
            label = f"{run} {name} · layer {layer}" + (f" · head {head}" if head is not None else "")
            fig.add_trace(
                go.Scatter(
                    x=[p[0] for p in pts],
                    y=[p[1] for p in pts],
                    mode="lines+markers",
                    # one legend entry per run (a line per layer × head × parameter overflowed the
                    # legend: Kerple's were cut off); each line says what it is on hover
                    name=run,
                    showlegend=run not in in_legend,
                    hovertext=[label] * len(pts),
                    hoverinfo="text+x+y",
                    legendgroup=run,
                    marker=dict(size=4),
                    line=dict(color=_color(runs.index(run)), width=1),
                    meta={"run": run, "parameter": name, "layer": int(layer), "head": head},
                ),
                row=r,
                col=1,
            )
            in_legend.add(run)
        if name == "L":
            fig.update_yaxes(type="log", row=r, col=1, title_text="L (tokens)")
        else:
            fig.update_yaxes(title_text=name, row=r, col=1)
    fig.update_xaxes(title_text="tokens seen", row=len(names), col=1)
    fig.update_layout(
        title="Learned position parameters during training (at each validation)", height=260 * len(names) + 120
    )
    return fig


def validation_curves_figure(
    logs: Mapping[str, Sequence[Mapping]], seq_len: int | None = None, skip_initial: bool = True
) -> go.Figure:
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
    runs = {
        k: [r for r in rows if r.get("val_loss") is not None and not (skip_initial and r.get("step") == 0)]
        for k, rows in logs.items()
    }
    if not any(runs.values()):
        raise ValueError("no validation rows (val_loss) in the training logs to plot")
    use_tokens = all("tokens" in r for rows in runs.values() for r in rows)
    xkey = "tokens" if use_tokens else "step"
    titles = (
        (f"validation @ {seq_len} tokens", f"validation @ {4 * seq_len} tokens (4×)")
        if seq_len
        else ("validation @ training length", "validation @ 4× training length")
    )
    fig = make_subplots(rows=1, cols=2, shared_yaxes=True, subplot_titles=titles, horizontal_spacing=0.04)
    for k, (run, rows) in enumerate(runs.items()):
        col = _color(k)
        for c, key in enumerate(("val_loss", "val_loss_4x"), start=1):
            pts = [(r[xkey], r[key]) for r in rows if r.get(key) is not None]
            if not pts:
                continue
            fig.add_trace(
                go.Scatter(
                    x=[p[0] for p in pts],
                    y=[p[1] for p in pts],
                    mode="markers+lines",
                    name=run,
                    legendgroup=run,
                    showlegend=c == 1,
                    line=dict(color=col, dash="solid" if c == 1 else "dash"),
                    marker=dict(color=col, size=6),
                    meta={"run": run, "series": key},
                ),
                row=1,
                col=c,
            )
    for c in (1, 2):
        fig.update_xaxes(title_text="tokens seen" if use_tokens else "step", row=1, col=c)
    fig.update_yaxes(title_text="validation loss (nats/token)", row=1, col=1)
    fig.update_layout(title="Validation loss during training", meta={"x": xkey})
    return fig
