"""Plotly figures for fireviz results: pure functions from plain dicts/lists to figures.

Every builder takes JSON-like data (what ``fireviz.analysis.biases``, ``fireviz.eval.evaluation``,
``fireviz.fit.fitting`` and the trainer write), returns a ``plotly.graph_objects.Figure`` and
never imports Streamlit. Conventions, the same in every figure: bias vs distance per head; the
training length marked on every length axis (a dashed shape named ``"training length"``);
perplexity on a log axis; units in every axis title. Each trace carries ``meta`` (layer,
head, query position, checkpoint …) so ``figure_data`` / ``figure_to_csv`` /
``figure_to_json`` export exactly the plotted numbers with their labels.

Builders: ``bias_grid_figure``, ``head_bias_figure``, ``bias_heatmap_figure``,
``dilution_figure``, ``perplexity_figure`` (+ ``group_perplexity``),
``loss_by_position_figure``, ``fit_figure``, ``training_curves_figure``,
``validation_curves_figure``.

The builders live by subject (``bias_plots``, ``eval_plots``, ``run_plots``, the export in
``figure_export``, shared pieces in ``figure_base``); this module is the one door to them.
"""

from __future__ import annotations

from fireviz.plots.base import *  # noqa: F403
from fireviz.plots.base import FIT_RANGE_MARK, TRAIN_MARK, _arr, _as_dict, _color, _mark_length
from fireviz.plots.biases import *  # noqa: F403
from fireviz.plots.biases import X_AXES, _heatmap_note, _kernel_figure, _layer
from fireviz.plots.evaluation import *  # noqa: F403
from fireviz.plots.evaluation import (
    UNIFORM_BYTE_PERPLEXITY,
    UNIFORM_MARK,
    _group_name,
    _grouped_rows,
    _log_ticks,
    _pooled_documents,
    _settings_caption,
)
from fireviz.plots.export import *  # noqa: F403
from fireviz.plots.export import EXPORT_FORMATS, PAPER_FONT, PAPER_WIDTHS, FigureExportError, _plain
from fireviz.plots.runs import *  # noqa: F403
from fireviz.plots.runs import _trailing_mean
