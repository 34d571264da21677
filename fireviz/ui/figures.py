"""Figures with captions and downloads (CSV, JSON, figures for a paper), and cached library results."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any, Callable, Sequence

import streamlit as st

from fireviz import plots
from fireviz.analysis import biases as analysis
from fireviz.analysis import text_attention
from fireviz.checkpoints import catalog as ck
from fireviz.checkpoints import hub
from fireviz.core import file_state
from fireviz.data import DATA_DIR, DOMAINS, load_documents, split_documents
from fireviz.encodings import has_normalizer
from fireviz.plots.presentation import to_json
from fireviz.ui.picker import _load_causal_lm, _load_model, causal_lm, checkpoint_sha256
from fireviz.ui.state import key, plain, url_state


def show_figure(fig, caption: str | None = None, page: str | None = None, name: str | None = None) -> None:
    """Draw a plotly figure full width, with ``caption`` (evaluation settings etc.) under it and,
    for a named figure, its paper-ready downloads (SVG, PDF, PNG; see ``figure_downloads``).
    Every label is drawn as plain text (``plots.plain_labels``: names are not markup)."""
    plots.plain_labels(fig)
    st.plotly_chart(fig, width="stretch", key=key(page, name) if page and name else None, config={"displaylogo": False})
    if caption:
        st.caption(caption)
    if page and name:
        figure_downloads(fig, page, name)


def figure_downloads(fig, page: str, name: str) -> None:
    """Download buttons for ``fig`` as SVG, PDF and PNG in a two-column paper's style
    (``plots.paper_figure``: 6.9 in wide, serif 8 pt). Each file is drawn only when its
    button is clicked (kaleido + Chromium take a few seconds); if that fails, the file holds
    the reason instead."""

    def render(fmt: str):
        def make() -> bytes:
            try:
                return plots.export_figure(fig, fmt)
            except (plots.FigureExportError, ValueError) as e:
                return f"fireviz could not export this figure: {e}\n".encode()

        return make

    stem = "".join(c if c.isalnum() or c in "-_." else "_" for c in name)
    with st.popover("⬇ Figure for a paper", help="SVG, PDF or PNG, a two-column page wide (6.9 in), serif 8 pt"):
        for fmt, mime in zip(plots.EXPORT_FORMATS, ("image/svg+xml", "application/pdf", "image/png"), strict=True):
            st.download_button(
                f"{fmt.upper()}",
                render(fmt),
                file_name=f"{stem}.{fmt}",
                mime=mime,
                key=key(page, f"export_{name}_{fmt}"),
                on_click="ignore",
                help=plain(f"{stem}.{fmt}"),
            )


def downloads(
    page: str,
    name: str,
    csv_text: str | Callable[[], str] | None = None,
    json_obj: Any = None,
    extra: dict[str, tuple[bytes, str]] | None = None,
    where=None,
) -> None:
    """Download buttons in one row: ``<name>.csv`` (``csv_text``), ``<name>.json`` (``json_obj``),
    and ``extra`` files ``{file name: (bytes, mime)}``.

    ``csv_text`` and ``json_obj`` may be zero-argument callables returning the text or the object:
    they run only when the button is clicked (Streamlit's deferred download), so a page does not
    serialize what nobody downloads (issue #48: a bias grid's CSV and JSON cost 9.5 of a page's 17 s).
    A callable must only read what it closes over."""
    where = where or st
    items: list[tuple[str, Any, str]] = []
    if csv_text is not None:
        make_csv = csv_text if callable(csv_text) else (lambda text=csv_text: text)
        items.append((f"{name}.csv", lambda: make_csv().encode("utf-8"), "text/csv"))
    if json_obj is not None:
        make_obj = json_obj if callable(json_obj) else (lambda obj=json_obj: obj)
        items.append((f"{name}.json", lambda: to_json(make_obj()).encode("utf-8"), "application/json"))
    for fname, (data, mime) in (extra or {}).items():
        items.append((fname, data, mime))
    if not items:
        return
    cols = where.columns(max(len(items), 4))  # short labels (the file name is the tooltip): they fit at 1024 px
    for col, (fname, data, mime) in zip(cols, items, strict=False):
        kind = fname.rsplit(".", 1)[-1].upper() if "." in fname else fname
        kind = {"SAFETENSORS": "weights"}.get(kind, kind)
        col.download_button(
            f"⬇ {kind}",
            data,
            file_name=fname,
            mime=mime,
            help=plain(fname),
            key=key(page, f"dl_{name}_{fname}"),
            on_click="ignore",
        )


def figure_table_downloads(page: str, name: str, fig) -> None:
    """:func:`downloads` of a figure's numbers: ``<name>.csv`` (``plots.figure_to_csv``) and
    ``<name>.json`` (``plots.figure_data``), both made only when clicked."""
    downloads(page, name, lambda: plots.figure_to_csv(fig), lambda: plots.figure_data(fig))


def normalizer_cap_input(
    page: str, chosen: Sequence[ck.CheckpointInfo], label: str, help: str
) -> tuple[list[ck.CheckpointInfo], int]:
    """The sidebar's FIRE normalizer cap (tokens; 0 = off, URL ``cap``), shown only when a
    FIRE / FIRE-S checkpoint is chosen. Returns: ``(the chosen FIRE checkpoints, cap)``."""

    fires = [i for i in chosen if has_normalizer(i.position_encoding)]
    if not fires:
        return fires, 0
    return fires, int(
        st.sidebar.number_input(label, 0, 1 << 20, key=url_state(page, "cap", 0, int, lo=0, hi=1 << 20), help=help)
    )


@st.cache_resource(max_entries=8, show_spinner="Reading the text…")
def _documents(source: str, split: str | None, state: tuple) -> list:
    # state: the file's (or folder's) fireviz.core.file_state, so an edited or replaced file is read again
    docs = load_documents(source)
    return split_documents(docs, split) if split else docs


def documents(source: str | os.PathLike, split: str | None = None) -> list:
    """``load_documents(source)`` (then ``split_documents(…, split)`` when ``split`` is given), read
    once per process and file state and shared by every session: a bundled domain's validation
    text costs ~1–2 s to decompress, which every rerun of the dilution and attention pages paid
    (issue #48). The list is shared: do not modify it. Raises: DataError as ``load_documents``."""
    path = DATA_DIR / f"{source}.jsonl.xz" if isinstance(source, str) and source in DOMAINS else Path(source)
    # a missing file: load_documents says what is wrong with it
    return _documents(str(source), split, file_state(path) or ())


#: Largest query position the biases page accepts (tokens): a curve has i + 1 points per head.
MAX_QUERY_POSITION = 1 << 17


@st.cache_data(max_entries=32, show_spinner="Computing biases…")
def _bias_report(path: str, sha256: str, settings_key: str, name: str, _settings) -> dict:
    # cached by settings_key (the settings' JSON); _settings (not hashed) is the same settings

    model = _load_model(path, sha256, "cpu")
    return analysis.run_bias_report(model, _settings, checkpoint=name).to_dict()


@st.cache_data(max_entries=16, show_spinner="Running the model on the text…")
def _attention_pattern(
    path: str, sha256: str, tokens: tuple[int, ...], layer: int, name: str, normalizer_cap: int | None
) -> dict:
    import torch

    model = _load_model(path, sha256, "cpu")  # shared with other sessions: attention_probs is thread-safe
    return text_attention.attention_pattern(
        model, torch.tensor(tokens, dtype=torch.long), layer, checkpoint=name, normalizer_cap=normalizer_cap
    ).to_dict()


def attention_pattern(info: ck.CheckpointInfo, tokens, layer: int, normalizer_cap: int | None = None) -> dict:
    """``text_attention.attention_pattern(...).to_dict()`` of a checkpoint on ``tokens``
    (LongTensor ``[T]``), cached per checkpoint (``checkpoint_sha256``: weights and config),
    text, layer and cap; a published causal LM (``info.is_causal_lm``) on tokens of its own
    tokenizer, per its identity (no cap). Raises: ValueError, CheckpointError."""
    if info.is_causal_lm:
        ckpt = causal_lm(info)
        return _causal_lm_pattern(ckpt.path, ckpt.sha256, tuple(int(t) for t in tokens.tolist()), int(layer), info.name)
    return _attention_pattern(
        info.path,
        checkpoint_sha256(info),
        tuple(int(t) for t in tokens.tolist()),
        int(layer),
        info.name,
        int(normalizer_cap) if normalizer_cap else None,
    )


@st.cache_data(max_entries=16, show_spinner="Running the published model on the text…")
def _causal_lm_pattern(path: str, sha256: str, tokens: tuple[int, ...], layer: int, name: str) -> dict:
    import torch

    model = _load_causal_lm(path, sha256)  # attention_probs switches its attention under a lock
    return text_attention.attention_pattern(
        model, torch.tensor(tokens, dtype=torch.long), layer, checkpoint=name
    ).to_dict()


@st.cache_data(max_entries=32, show_spinner="Reading the published model's position encoding…")
def _published_bias_report(ref: str, revision: str | None, stack: str, settings_key: str, name: str, _settings) -> dict:

    model = hub.load_published(ref, stack=stack, revision=revision)
    out = analysis.run_bias_report(model, _settings, checkpoint=name).to_dict()
    out["published"] = {
        "source": model.config.source,
        "family": model.config.family,
        "revision": model.config.revision,
        "stack": model.config.stack,
        "model_type": model.config.model_type,
    }
    return out


def bias_report(
    info: ck.CheckpointInfo,
    settings=None,
    normalizer_cap: int | None = None,
    stack: str | None = None,
) -> dict:
    """``fireviz.analysis.biases.run_bias_report(model, settings).to_dict()`` for a checkpoint, cached
    (``st.cache_data``) by folder, ``checkpoint_sha256`` (weights and config) and the settings' description
    (``BiasSettings.describe``: query positions in tokens, FIRE normalizer cap in tokens …;
    a cap is computed on a copy of the shared model).

    ``settings``: an ``analysis.BiasSettings``, or query positions (tokens; None = the
    defaults) made into one with ``normalizer_cap``. A published model (``info.is_published``)
    is read through ``fireviz.checkpoints.hub`` for ``stack`` (T5-family encoder or decoder; default
    decoder), cached by source, revision, stack and settings.
    Raises: ValueError for bad/too large positions; CheckpointError for a bad folder.
    """

    if not isinstance(settings, analysis.BiasSettings):
        settings = analysis.BiasSettings.make(settings, normalizer_cap=normalizer_cap)
    elif normalizer_cap is not None:
        settings = settings.replace(normalizer_cap=normalizer_cap)
    positions = settings.query_positions
    if positions and max(positions) > MAX_QUERY_POSITION:
        raise ValueError(
            f"query position {max(positions)} is larger than {MAX_QUERY_POSITION} tokens; pick smaller positions"
        )
    key_ = json.dumps(settings.describe(), sort_keys=True)
    if info.is_published:
        return _published_bias_report(
            info.path, info.config.get("revision"), stack or "decoder", key_, info.name, settings
        )
    return _bias_report(info.path, checkpoint_sha256(info), key_, info.name, settings)
