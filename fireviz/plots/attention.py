"""Figures of attention measured on a text (``fireviz.analysis.text_attention``): per-head patterns.

Every function takes an ``AttentionPattern`` or its ``to_dict()`` and returns a plotly
Figure whose traces carry the numbers shown (``fireviz.plots.figure_data`` exports them).
Positions are in tokens (bytes: the tokenizer is byte-level), probabilities in [0, 1].
"""

from __future__ import annotations

from typing import Sequence

import numpy as np
import plotly.graph_objects as go
from plotly.subplots import make_subplots

from fireviz.plots.base import _color, _mark_length
from fireviz.plots.runs import _trailing_mean

#: the largest heatmap side drawn; longer texts are averaged over square blocks of positions
MAX_HEATMAP_CELLS = 256


def _as_dict(p) -> dict:
    return p.to_dict() if hasattr(p, "to_dict") else p


def block_mean(m: np.ndarray, max_cells: int = MAX_HEATMAP_CELLS) -> tuple[np.ndarray, int]:
    """``m [T, T]`` averaged over ``s × s`` blocks, ``s = ceil(T / max_cells)`` (the last block
    may be smaller), so a side holds at most ``max_cells`` cells. Returns ``(blocks, s)``;
    ``s = 1`` returns ``m`` itself. Each block is the mean probability over its query rows
    and key columns (zeros above the diagonal count: a block on the diagonal is diluted)."""
    T = m.shape[-1]
    s = max(1, -(-T // max_cells))
    if s == 1:
        return m, 1
    n = -(-T // s)
    pad = np.zeros((n * s, n * s), dtype=np.float64)
    pad[:T, :T] = m
    sums = pad.reshape(n, s, n, s).sum(axis=(1, 3))
    rows = np.minimum(s, T - np.arange(n) * s)
    return sums / (rows[:, None] * rows[None, :]), s


#: smallest probability the log colour scale shows apart (below it: the darkest colour)
LOG_FLOOR = 1e-4


def _probability_colors(log_color: bool) -> dict:
    """The heatmaps' shared colour axis: probability, or log10 of it from ``LOG_FLOOR`` to 1."""
    if not log_color:
        return dict(colorscale="Viridis", colorbar=dict(title=dict(text="probability")))
    decades = list(range(int(np.log10(LOG_FLOOR)), 1))
    return dict(
        colorscale="Viridis",
        colorbar=dict(
            title=dict(text="probability (log)"),
            tickvals=decades,
            ticktext=[f"1e{k}" if k else "1" for k in decades],
        ),
        cmin=float(np.log10(LOG_FLOOR)),
        cmax=0.0,
    )


def attention_pattern_figure(
    pattern, heads: Sequence[int] | None = None, max_cells: int = MAX_HEATMAP_CELLS, log_color: bool = False
) -> go.Figure:
    """Each head's attention probabilities on the text, queries down and keys across.

    Args: ``pattern`` (``AttentionPattern`` or dict); ``heads`` to draw (default all);
      ``max_cells``: texts longer than this are drawn as block means (``block_mean``);
      ``log_color``: colour by log10 of the probability (floored at ``LOG_FLOOR``), so the spread
      over far keys shows (on a linear scale a few near keys take the whole range; issue #40).
    Returns: Figure with one Heatmap per head (z = probabilities ``[query, key]``, NaN above the
      diagonal; x, y the first position of each block), subplot titles naming the head and its
      bias share; meta ``{"layer", "heads", "block"}`` (``block`` = positions per cell).
    Raises: ValueError for a head out of range.
    """
    p = _as_dict(pattern)
    probs = np.asarray(p["probs"], dtype=np.float64)
    H, T = probs.shape[0], probs.shape[-1]
    heads = list(range(H)) if heads is None else [int(h) for h in heads]
    if not heads or any(not 0 <= h < H for h in heads):
        raise ValueError(f"heads must be in 0..{H - 1} (got {heads})")
    share = p.get("bias_share")
    cols = min(4, len(heads))
    sep = "<br>" if cols >= 3 else " · "  # side by side, one line ran into the next panel's title at 1024 px
    titles = [
        f"head {h}" + (f"{sep}bias share {share[h]:.2f}" if share is not None and share[h] is not None else "")
        for h in heads
    ]
    rows = -(-len(heads) // cols)
    fig = make_subplots(
        rows=rows,
        cols=cols,
        subplot_titles=titles,
        # room for a panel's last x tick label ("250" ran into the next panel at 1024 px, issue #48)
        horizontal_spacing=0.09 if cols >= 3 else 0.06,
        vertical_spacing=0.12 if rows > 1 else 0.1,
    )
    fig.update_annotations(font_size=11)
    block = 1
    for n, h in enumerate(heads):
        z, block = block_mean(probs[h], max_cells)
        pos = np.arange(z.shape[0]) * block
        z = np.where(pos[:, None] >= pos[None, :], z, np.nan)  # future keys blank
        shown = np.log10(np.maximum(z, LOG_FLOOR)) if log_color else z
        fig.add_trace(
            go.Heatmap(
                x=pos,
                y=pos,
                z=shown,
                customdata=z,  # the probability itself, on hover whatever the colour scale
                coloraxis="coloraxis",
                name=f"head {h}",
                meta={"head": h},
                hovertemplate="query %{y}, key %{x}: %{customdata:.3g}<extra>head " + str(h) + "</extra>",
            ),
            row=n // cols + 1,
            col=n % cols + 1,
        )
        fig.update_yaxes(autorange="reversed", row=n // cols + 1, col=n % cols + 1)
    L = p.get("train_seq_len")
    if L and L < T:
        for n in range(len(heads)):
            _mark_length(fig, L, row=n // cols + 1, col=n % cols + 1, axis="x")
    cap = f", normalizer capped at {p['normalizer_cap']}" if p.get("normalizer_cap") else ""
    fig.update_layout(
        title=dict(
            text=f"{p.get('checkpoint') or p.get('encoding')}: attention on the text, layer {p['layer']}{cap}",
            subtitle=dict(
                text=f"{T} tokens; queries down, keys across"
                + (f"; each cell averages {block}×{block} positions" if block > 1 else "")
            ),
        ),
        coloraxis=_probability_colors(log_color),
        height=260 * rows + 140,
        margin=dict(t=130),
        meta={"layer": p["layer"], "heads": heads, "block": block, "log_color": log_color},
    )
    fig.update_xaxes(title_text="key position j", row=rows, col=1)
    fig.update_yaxes(title_text="query position i", row=1, col=1)
    return fig


def bias_share_figure(patterns: Sequence) -> go.Figure:
    """The bias's share of each head's logit spread against the query position.

    Args: one or more patterns of the same layer (e.g. FIRE plain and with its normalizer
      capped: drawn dashed). Lines are smoothed over 16 queries (a trailing mean).
    Returns: Figure, one line per (pattern, head): x = query position (tokens), y = share in
      [0, 1] (``bias_share_by_query``); trace meta ``{"head", "normalizer_cap"}``; a dashed
      training-length line.
    Raises: ValueError when no pattern has an additive bias.
    """
    fig = go.Figure()
    L = None
    for p in map(_as_dict, patterns):
        by = p.get("bias_share_by_query")
        if by is None:
            continue
        by = np.asarray(by, dtype=np.float64)
        L = p.get("train_seq_len")
        cap = p.get("normalizer_cap")
        for h in range(by.shape[0]):
            y = by[h]
            fig.add_trace(
                go.Scatter(
                    x=np.arange(len(y)),
                    y=_trailing_mean(y, 16),
                    mode="lines",
                    line=dict(color=_color(h), dash="dash" if cap else "solid"),
                    name=f"head {h}" + (f" (cap {cap})" if cap else ""),
                    meta={"head": h, "normalizer_cap": cap},
                )
            )
    if not fig.data:
        raise ValueError("no pattern has an additive bias: the bias share needs one (RoPE and NoPE have none)")
    if L:
        _mark_length(fig, L, text=f"train {L}")
    fig.update_yaxes(range=[0, 1.02])
    fig.update_layout(
        title=dict(
            text="The bias's share of the attention logits, by query position",
            subtitle=dict(
                text="Var_j(bias) / (Var_j(bias) + Var_j(q·k/√d)) over the keys a query sees; mean over 16 queries"
            ),
        ),
        xaxis_title="query position i (tokens)",
        yaxis_title="bias share (mean over 16 queries)",
    )
    return fig
