"""Figures out: their numbers as CSV / JSON, and files for a paper (SVG, PDF, PNG via kaleido)."""

from __future__ import annotations

import atexit
import contextlib
import csv
import io
import json
import os
import threading
import warnings
from pathlib import Path

import numpy as np
import plotly.graph_objects as go

from fireviz.core import atomic_write, output_path_problem
from fireviz.plots.base import plain_labels


# -- export ------------------------------------------------------------------------------------
def _plain(v):
    if v is None:
        return None
    a = np.asarray(v)
    if a.dtype.kind in "fc":
        return (
            [[None if not np.isfinite(x) else float(x) for x in r] for r in a]
            if a.ndim == 2
            else [None if not np.isfinite(x) else float(x) for x in a.ravel()]
        )
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
    markers = [
        {"name": s.name, "x0": s.x0, "x1": s.x1, "y0": s.y0, "y1": s.y1, "xref": s.xref, "yref": s.yref}
        for s in fig.layout.shapes
        if s.name
    ]
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
        for x, y, e in zip(xs, ys, errs, strict=False):
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
    out.update_layout(
        font=PAPER_FONT,
        width=w,
        height=height,
        paper_bgcolor="white",
        plot_bgcolor="white",
        margin=dict(l=50, r=10, t=40, b=40),
        title_font=dict(size=9),
        legend=dict(font=dict(size=7)),
    )
    if out.layout.title and out.layout.title.subtitle and out.layout.title.subtitle.text:
        out.update_layout(title_subtitle_font=dict(size=6))
    out.update_annotations(font_size=7)
    axis = dict(
        title_font_size=8,
        tickfont_size=7,
        gridcolor="#e5e5e5",
        zerolinecolor="#cccccc",
        linecolor="#444",
        showline=True,
        automargin=True,
    )
    out.update_xaxes(**axis)
    out.update_yaxes(**axis)
    for ax in list(out.select_xaxes()) + list(out.select_yaxes()):  # explicit ticks stay explicit (as text)
        if ax.tickvals is not None:
            ax.update(
                tickmode="array",
                ticktext=[
                    f"{v:g}" if isinstance(v, (int, float)) else str(v)
                    for v in (ax.ticktext if ax.ticktext is not None else ax.tickvals)
                ],
            )
    return out


#: tries of one export (each after starting a fresh browser): a loaded 2-core machine sometimes
#: loses a browser start
EXPORT_ATTEMPTS = 3
#: seconds kaleido waits for one image (its default is 90; a loaded machine needs more)
EXPORT_TIMEOUT_S = 300
_BROWSER_LOCK = threading.Lock()
_browser_started = False


def _warm_browser(restart: bool = False) -> None:
    """Start kaleido's browser once per process and keep it for every later export (plotly's
    ``to_image`` uses a running kaleido server), so a batch of exports pays one browser start.
    MathJax is off: it would be fetched from a CDN, and figures here use no LaTeX. ``restart``
    replaces a browser that failed. No-op where kaleido is missing (``to_image`` says so)."""
    global _browser_started
    try:
        import kaleido  # optional dependency: only figure export needs it
    except ImportError:
        return
    with _BROWSER_LOCK:
        if _browser_started and not restart:
            return
        if _browser_started:
            with contextlib.suppress(Exception):
                kaleido.stop_sync_server(silence_warnings=True)
            _browser_started = False
        kaleido.start_sync_server(n=1, timeout=EXPORT_TIMEOUT_S, mathjax=False, silence_warnings=True)
        if not _browser_started:
            atexit.register(_stop_browser)
        _browser_started = True


def _stop_browser() -> None:
    global _browser_started
    with contextlib.suppress(Exception):
        import kaleido  # optional dependency

        kaleido.stop_sync_server(silence_warnings=True)
    _browser_started = False


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
    f = plain_labels(paper_figure(fig, paper) if paper else go.Figure(fig))  # names are text, not markup
    try:
        for attempt in range(EXPORT_ATTEMPTS):
            try:
                _warm_browser(restart=attempt > 0)
                with warnings.catch_warnings():  # plotly's per-call browser options: the warm browser has ours
                    warnings.filterwarnings("ignore", message="The kopts argument is ignored")
                    return f.to_image(format=fmt, scale=3 if fmt == "png" else 1)
            except ImportError:
                raise
            except Exception:  # a browser start lost under load: start a fresh one and try again
                if attempt == EXPORT_ATTEMPTS - 1:
                    raise
        raise AssertionError("unreachable")
    except Exception as e:  # kaleido missing, no browser, a browser that failed to start
        raise FigureExportError(
            f"cannot write the figure as {fmt.upper()} ({type(e).__name__}: "
            f"{(str(e).splitlines() or [''])[0][:200]}); it needs the kaleido package and a "
            "Chromium browser (apt install chromium, or set BROWSER_PATH)"
        ) from e


def figure_path_problem(path: str | os.PathLike, flag: str = "--figure") -> str | None:
    """Why a figure cannot be written to ``path`` — a format ``write_figure`` does not write
    (.svg, .pdf, .png or .html), a folder, a path under a file — or None. Checked before any work."""

    formats = (*EXPORT_FORMATS, "html")
    if problem := output_path_problem(path, flag, "figure.png"):
        return problem
    if Path(path).suffix.lstrip(".").lower() not in formats:
        return f"{flag} {path}: the file name must end in {', '.join('.' + f for f in formats)}"
    return None


def write_figure(fig: go.Figure, path: str | os.PathLike, fmt: str | None = None, paper: str | None = "page") -> Path:
    """Write ``fig`` to ``path`` as ``fmt`` (default: the file's suffix: .svg, .pdf, .png, or
    .html for the interactive figure), atomically. Returns the path. Raises: ValueError for an
    unknown format; FigureExportError (see ``export_figure``)."""

    path = Path(path)
    fmt = (fmt or path.suffix.lstrip(".")).lower()
    if fmt == "html":
        plain = plain_labels(go.Figure(fig))  # names are text, not markup (a link in a legend, issue #38)
        atomic_write(path, lambda p: plain.write_html(p, include_plotlyjs="cdn"))
        return path
    data = export_figure(fig, fmt, paper)
    atomic_write(path, lambda p: Path(p).write_bytes(data))
    return path
