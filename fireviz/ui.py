"""The app's Streamlit helpers — the only module in fireviz that imports Streamlit.

What lives here (and nothing that computes a bias or a loss):
  * page setup and per-page widget keys (``key(page, name)`` → ``"<page>_<name>"``);
  * page state in the URL: ``url_state`` seeds a widget from ``st.query_params`` once per
    session and ``sync_url`` writes the widgets' values back, so a view is a shareable link;
  * checkpoints: the cached list under the checkpoints root (``FIREVIZ_CHECKPOINTS_DIR``),
    a picker that also takes a local folder or a Hugging Face repo id, and cached models
    (``st.cache_resource``, keyed by folder + weights modification time);
  * figures with their captions, and CSV/JSON downloads of the plotted numbers.
Errors from the library are shown with ``st.error`` naming the problem and the fix; the
app keeps running.
"""
from __future__ import annotations

import math
from pathlib import Path
from typing import Any, Callable, Iterable, Sequence

import streamlit as st

from . import checkpoints as ck
from .model import CheckpointError  # noqa: F401  (pages catch ui.CheckpointError)
from .presentation import (fit_file_stem, format_params, human_count, int_values, job_error_text,  # noqa: F401
                           locality_rules_text, locality_summary_rows, parse_lengths, percent, perplexity_table,
                           pool_seeds, rows_to_csv, split_errors, to_json)
from .uploads import MAX_UPLOAD_MB, UPLOAD_TYPES, save_upload  # noqa: F401  (re-exported for the pages)

#: session_state key of the checkpoints added by path or Hub id (shared by all pages).
EXTRA_KEY = "fireviz_extra_checkpoints"
#: session-state key of the chosen checkpoint group ("" = the checkpoints root itself)
GROUP_KEY = "fireviz_checkpoint_group"


# -- pages and keys ---------------------------------------------------------------------------
def setup_page(title: str, icon: str = "🔥") -> None:
    """``st.set_page_config`` (wide layout) and the page title. Call first on every page."""
    st.set_page_config(page_title=f"{title} · fireviz", page_icon=icon, layout="wide")
    st.title(title)


def key(page: str, name: str) -> str:
    """The widget key of ``name`` on ``page``: ``"<page>_<name>"`` (keys never collide across pages)."""
    return f"{page}_{name}"


# -- page state in the URL --------------------------------------------------------------------
def _cast(raw: str, kind: type) -> Any:
    if kind is bool:
        if raw.lower() in ("1", "true", "yes", "on"):
            return True
        if raw.lower() in ("0", "false", "no", "off"):
            return False
        raise ValueError(raw)
    if kind is int:  # "16384" or "16384.0", not "20.9", "inf" or "nan"
        v = float(raw)
        if not (math.isfinite(v) and v.is_integer()):
            raise ValueError(raw)
        return int(v)
    return kind(raw)


def url_state(page: str, name: str, default: Any, kind: type = str, options: Sequence | None = None,
              multi: bool = False, lo: float | None = None, hi: float | None = None) -> str:
    """Seed the widget ``key(page, name)`` from the URL (``?name=...``) once per session.

    The value comes from ``st.query_params`` when present and valid (cast with ``kind``; in
    ``options`` if given; within [lo, hi] if given), else ``default``. ``multi`` reads a
    repeated parameter (``?name=a&name=b``) as a list. Invalid URL values are dropped with
    no error (a stale link still opens). Create the widget with ``key=`` the returned key
    and no default value of its own.
    Returns: the widget key.
    """
    k = key(page, name)
    if k in st.session_state:
        return k
    value = default
    raw = st.query_params.get_all(name) if multi else st.query_params.get(name)
    if raw:
        try:
            if multi:
                cand = [_cast(r, kind) for r in raw for r in (r.split(",") if "," in r else [r])]
                if options is not None:
                    cand = [c for c in cand if c in options]
                value = cand if cand else default
            else:
                cand = _cast(raw, kind)
                ok = (options is None or cand in options) and (lo is None or cand >= lo) and (hi is None or cand <= hi)
                value = cand if ok else default
        except (TypeError, ValueError, OverflowError):
            value = default
    if options is not None and not multi and value not in options:
        value = options[0] if options else None
    st.session_state[k] = value
    return k


def sync_url(page: str, names: Iterable[str]) -> None:
    """Write the current values of the page's widgets ``names`` into ``st.query_params``.

    Lists become repeated parameters; floats are written with up to 6 significant digits.
    Parameters not named are left alone; names with no value are removed.
    """
    for name in names:
        v = st.session_state.get(key(page, name))
        if v is None or v == [] or v == "":
            if name in st.query_params:
                del st.query_params[name]
            continue
        if isinstance(v, (list, tuple)):
            new = [_fmt(x) for x in v]
            if st.query_params.get_all(name) != new:
                st.query_params[name] = new
        elif st.query_params.get(name) != _fmt(v):
            st.query_params[name] = _fmt(v)


def _fmt(v: Any) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, float):
        return f"{v:.6g}"
    return str(v)


# -- checkpoints ------------------------------------------------------------------------------
@st.cache_resource(ttl=5, show_spinner=False)
def _scan(root: str) -> tuple[list[ck.CheckpointInfo], dict[str, str]]:
    return ck.scan_checkpoints(root)


def checkpoints_root() -> Path:
    """The checkpoints root folder (``FIREVIZ_CHECKPOINTS_DIR`` or ``<repo>/checkpoints``)."""
    return ck.checkpoints_root()


@st.cache_resource(ttl=5, show_spinner=False)
def _groups(root: str) -> dict[str, Path]:
    return ck.checkpoint_groups(root)


def checkpoint_groups() -> dict[str, Path]:
    """``{group: folder}`` under the root (``ck.checkpoint_groups``; re-scanned every 5 s)."""
    return _groups(str(checkpoints_root()))


def current_group() -> str:
    """The checkpoint group chosen in this session ("" = the root's own checkpoints)."""
    group = st.session_state.get(GROUP_KEY, "")
    return group if group in checkpoint_groups() else ""


def group_root(group: str | None = None) -> Path:
    """The folder of ``group`` (default :func:`current_group`); the root for an unknown name."""
    groups = checkpoint_groups()
    return groups.get(current_group() if group is None else group, checkpoints_root())


def list_checkpoints(group: str | None = None) -> tuple[list[ck.CheckpointInfo], dict[str, str]]:
    """Checkpoints of ``group`` (default: the one chosen in the sidebar; "" = the root's own),
    re-scanned at most every 5 s, and ``{folder: problem}`` for folders that could not be read.
    Returns ([], {}) if there are none."""
    return _scan(str(group_root(group)))


def group_label(group: str) -> str:
    """``"bundled (13, trained on prose)"`` / ``"copy (7, trained on synthetic:copy)"``."""
    found, _ = list_checkpoints(group)
    data = sorted({i.data for i in found if i.data})
    return f"{group or 'bundled'} ({len(found)}" + (f", trained on {', '.join(data)})" if data else ")")


def group_picker(page: str, where=None) -> str:
    """Sidebar choice of the checkpoint group (URL parameter ``group``), shown only when the
    root has sub-groups. Changing it clears the page's checkpoint choice (names belong to a
    group). Returns: the chosen group ("" = the root's own checkpoints)."""
    groups = list(checkpoint_groups())
    if len(groups) < 2:
        st.session_state[GROUP_KEY] = ""
        return ""
    where = where or st.sidebar
    k = url_state(page, "group", current_group(), options=groups)

    def changed() -> None:
        st.session_state.pop(key(page, "ckpt"), None)
        if "ckpt" in st.query_params:
            del st.query_params["ckpt"]

    group = where.selectbox("Checkpoint group", groups, key=k, format_func=group_label, on_change=changed,
                            help="The bundled prose models, or a group of models trained on another task "
                                 "(e.g. copy: the synthetic copy task). Groups are never mixed in one table.")
    st.session_state[GROUP_KEY] = group
    if group:
        st.query_params["group"] = group
    elif "group" in st.query_params:
        del st.query_params["group"]
    return group


def checkpoint_warnings(found: list[ck.CheckpointInfo], problems: dict[str, str], where=None) -> None:
    """One warning per skipped checkpoint folder and per refused file of a listed checkpoint
    (a broken results JSON or train log: left out and untouched, the rest of it shown)."""
    where = where or st
    for folder, problem in problems.items():
        where.warning(f"Skipped `{Path(folder).name}`: {problem}")
    for info in found:
        for name, problem in info.problems.items():
            where.warning(f"`{info.name}`: left out `{name}`: {problem}")


@st.cache_resource(ttl=600, show_spinner="Fetching checkpoint…")
def _resolve(ref: str, root: str) -> ck.CheckpointInfo:
    return ck.resolve_checkpoint(ref, root)


def resolve(ref: str) -> ck.CheckpointInfo:
    """A checkpoint by name, folder path or Hub repo id (cached). Raises CheckpointError."""
    return _resolve(ref.strip(), str(group_root()))


@st.cache_resource(max_entries=8, show_spinner="Loading model…")
def _load_model(path: str, mtime_ns: int, device: str):
    return ck.load_model(path, device)


def load_model(info_or_path: ck.CheckpointInfo | str, device: str = "cpu"):
    """The GPT of a checkpoint, loaded once per process (``st.cache_resource``) and reused.

    Reloaded when model.safetensors changes. Raises CheckpointError for a bad folder.
    """
    if isinstance(info_or_path, ck.CheckpointInfo) and info_or_path.is_published:
        return info_or_path.published  # position encodings only (fireviz.hub.PublishedModel)
    path = info_or_path.path if isinstance(info_or_path, ck.CheckpointInfo) else str(info_or_path)
    w = Path(path) / ck.WEIGHTS_FILE
    try:
        mtime = w.stat().st_mtime_ns
    except OSError as e:
        raise CheckpointError(f"cannot read {w}: {e}") from e
    return _load_model(path, mtime, device)


def no_checkpoints_message() -> None:
    """An ``st.info`` box: no checkpoints found under the root, and the command that makes one."""
    st.info(f"No checkpoints found in `{checkpoints_root()}`.\n\nCreate one with\n\n"
            f"```\n{ck.TRAIN_HINT}\n```\n\nor add one from a local folder or a Hugging Face repo id "
            "with the sidebar box of the other pages, or set `FIREVIZ_CHECKPOINTS_DIR` to a folder of checkpoints.")


def _add_extra(ref: str) -> ck.CheckpointInfo | None:
    try:
        info = resolve(ref)
    except ck.CheckpointNotFoundError:  # one message: the app does not tell which server paths exist
        st.error(f"**Cannot use checkpoint `{ref}`.** There is no readable fireviz checkpoint there: give a folder "
                 "holding config.json and model.safetensors, or a Hugging Face repo id (owner/name).")
        return None
    except CheckpointError as e:
        st.error(f"**Cannot use checkpoint `{ref}`.** {e}")
        return None
    st.session_state.setdefault(EXTRA_KEY, {})[ref] = info
    return info


def checkpoint_picker(page: str, multi: bool = True, max_selections: int | None = None,
                      label: str = "Checkpoints", default_count: int = 1,
                      filter_fn: Callable[[ck.CheckpointInfo], bool] | None = None,
                      where=None, allow_published: bool = False) -> list[ck.CheckpointInfo]:
    """Checkpoint selection (URL parameter ``ckpt``) plus a box to add one by path or Hub id.

    Options are the checkpoints under the root and any added in this session (by local
    folder or Hugging Face repo id; a bad one gives an ``st.error`` and is not added).
    ``filter_fn`` hides checkpoints it rejects. The default selection (no ``ckpt`` in the
    URL) is the first ``default_count`` names, seed-0 runs before extra-seed runs
    (``fire_seed1``…), so extra seeds do not push other encodings out of the default view.
    Shows the "no checkpoints" message if there is nothing to pick.
    Returns: the chosen checkpoints, in selection order ([] if none).
    """
    where = where or st.sidebar
    group_picker(page, where)
    found, problems = list_checkpoints()
    checkpoint_warnings(found, problems, where)
    with where.expander("Add a checkpoint (folder or Hub repo id)"):
        ref = st.text_input("Local folder path or Hugging Face repo id (owner/name)", key=key(page, "add_ref"),
                            placeholder="checkpoints/fire  or  owner/fireviz-fire")
        if st.button("Add", key=key(page, "add_btn")) and ref.strip():
            info = _add_extra(ref.strip())
            if info is not None:
                st.success(f"Added {info.label}")
    extra: dict[str, ck.CheckpointInfo] = st.session_state.get(EXTRA_KEY, {})
    by_name = {i.name: i for i in found}
    for ref, info in extra.items():
        by_name.setdefault(ref, info)
    # URL values that are paths or Hub ids: resolve them once (a shared link may name one).
    for ref in st.query_params.get_all("ckpt"):
        if ref not in by_name and key(page, "ckpt") not in st.session_state:
            info = _add_extra(ref)
            if info is not None:
                by_name[ref] = info
    if not allow_published:  # published models have position encodings only: no evaluation, no logs
        for n in [n for n, i in by_name.items() if i.is_published]:
            del by_name[n]
            where.info(f"`{n}` is a published model: its position bias is on the Learned biases and Fit FIRE pages.")
    if filter_fn is not None:
        by_name = {n: i for n, i in by_name.items() if filter_fn(i)}
    names = list(by_name)
    if not names:
        no_checkpoints_message()
        return []
    fmt = lambda n: by_name[n].label if n in by_name else n  # noqa: E731
    if multi:
        k = url_state(page, "ckpt", ck.seed0_first(names)[:default_count], options=names, multi=True)
        if max_selections:
            st.session_state[k] = [n for n in st.session_state[k] if n in names][:max_selections]
        chosen = where.multiselect(label, names, key=k, format_func=fmt, max_selections=max_selections)
    else:
        k = url_state(page, "ckpt", names[0], options=names)
        chosen = [where.selectbox(label, names, key=k, format_func=fmt)]
    picked = [by_name[n] for n in chosen if n in by_name]
    if not picked:  # everything cleared: say so, and drop the stale ckpt= from the URL
        if "ckpt" in st.query_params:
            del st.query_params["ckpt"]
        st.info(f"No checkpoint chosen: pick one or more in the sidebar ({label}).")
    return picked


def checkpoint_caption(info: ck.CheckpointInfo) -> str:
    """One line about a checkpoint: encoding, shape, parameters, training length and tokens, data
    (for a published model: source, family, revision, stack and what was read)."""
    c = info.config
    if info.is_published:
        rev = f" @ `{c.get('revision')[:12]}`" if c.get("revision") else ""
        stack = f", {c.get('stack')} stack" if c.get("stack") else ""
        return (f"**{info.name}**{rev}: published {c.get('family')} ({c.get('model_type')}), {c.get('n_layer')} layers "
                f"× {c.get('n_head')} heads{stack}; position encoding {info.position_encoding} read from config.json"
                + (" and the bias tables' bytes" if info.position_encoding == "t5" else "") + " only")
    parts = [f"**{info.name}**: {info.position_encoding}",
             f"{c.get('n_layer')} layers × {c.get('n_head')} heads, d_model {c.get('d_model')}",
             f"{info.num_parameters:,} parameters", f"trained at {info.seq_len} tokens"]
    if info.training_tokens:
        parts.append(f"on {human_count(info.training_tokens)} tokens")
    if info.data:
        parts.append(f"of {info.data}")
    return " · ".join(parts)


#: Home-table details that, when every checkpoint shares them, are said once in a caption
HOME_DETAIL_COLUMNS = ("parameters", "training tokens", "progress", "training length", "data", "numbers from")


def checkpoint_table_config(rows: Sequence[dict]) -> dict:
    """``st.dataframe`` column_config for the Home table of ``CheckpointInfo.summary_row()``s:
    headline columns labelled short (``"bpb @512"``, ``"val @2048"``; the data in their help)
    with pixel widths that fit a 1024 px window; the underlying column names stay as in the rows."""
    # pixel widths: the headline columns of 13 checkpoints fit the ~560 px a 1024 px window leaves
    cfg: dict = {"checkpoint": st.column_config.TextColumn(width=140),
                 "encoding": st.column_config.TextColumn(width=95),
                 "training seed": st.column_config.NumberColumn("seed", width=50, help="train.seed: initialization "
                                                                                   "and the order of training windows"),
                 "parameters": st.column_config.NumberColumn(format="localized", width=80),
                 "training tokens": st.column_config.NumberColumn(format="compact"),
                 "progress": st.column_config.TextColumn(
                     help="optimizer steps done / planned (training.steps / training.settings.max_steps); "
                          "interim = a checkpoint of a run that has not finished")}
    cols = list(dict.fromkeys(c for r in rows for c in r))

    def common(col: str, field: str):
        vals = {r.get(field) for r in rows if r.get(col) is not None}
        return vals.pop() if len(vals) == 1 else None

    for col in cols:
        if col.startswith("bpb @ "):
            n = col.removeprefix("bpb @ ")
            prose = all("prose" in str(r.get("numbers from", "")) for r in rows if r.get(col) is not None)
            cfg[col] = st.column_config.NumberColumn(
                f"bpb @{n}", format="%.3f", width=68,
                help=f"bits per byte at {n}-token windows" + (" on prose" if prose else "")
                     + ", from the checkpoint's results JSON")
        elif col.startswith("val loss"):
            L, data = common(col, "training length"), common(col, "data")
            four = "4L" in col
            at = f" @{4 * L if four else L}" if L else (" @4L" if four else " @L")
            cfg[col] = st.column_config.NumberColumn(
                f"val{at}", format="%.3f", width=68,
                help="last validation loss in train_log.jsonl, nats per token (÷ ln 2 = bits per byte)"
                     + (f", on {data}" if data else "")
                     + (" at 4× the training length" if "4L" in col else " at the training length"))
    return cfg


def table_height(n_rows: int, max_rows: int = 16) -> int:
    """Pixel height for an ``st.dataframe`` that shows ``n_rows`` rows without scrolling (up to
    ``max_rows``; Streamlit's default cuts a table of about ten rows)."""
    return 38 + 35 * max(1, min(n_rows, max_rows))


# -- figures and downloads --------------------------------------------------------------------
def show_figure(fig, caption: str | None = None, page: str | None = None, name: str | None = None) -> None:
    """Draw a plotly figure full width, with ``caption`` (evaluation settings etc.) under it and,
    for a named figure, its paper-ready downloads (SVG, PDF, PNG; see ``figure_downloads``)."""
    st.plotly_chart(fig, width="stretch", key=key(page, name) if page and name else None,
                    config={"displaylogo": False})
    if caption:
        st.caption(caption)
    if page and name:
        figure_downloads(fig, page, name)


def figure_downloads(fig, page: str, name: str) -> None:
    """Download buttons for ``fig`` as SVG, PDF and PNG in a two-column paper's style
    (``plots.paper_figure``: 6.9 in wide, serif 8 pt). Each file is drawn only when its
    button is clicked (kaleido + Chromium take a few seconds); if that fails, the file holds
    the reason instead."""
    from . import plots

    def render(fmt: str):
        def make() -> bytes:
            try:
                return plots.export_figure(fig, fmt)
            except (plots.FigureExportError, ValueError) as e:
                return f"fireviz could not export this figure: {e}\n".encode()
        return make

    stem = "".join(c if c.isalnum() or c in "-_." else "_" for c in name)
    with st.popover("⬇ Figure for a paper", help="SVG, PDF or PNG, a two-column page wide (6.9 in), serif 8 pt"):
        for fmt, mime in zip(plots.EXPORT_FORMATS, ("image/svg+xml", "application/pdf", "image/png")):
            st.download_button(f"{fmt.upper()}", render(fmt), file_name=f"{stem}.{fmt}", mime=mime,
                               key=key(page, f"export_{name}_{fmt}"), on_click="ignore", help=f"{stem}.{fmt}")


def downloads(page: str, name: str, csv_text: str | None = None, json_obj: Any = None,
              extra: dict[str, tuple[bytes, str]] | None = None, where=None) -> None:
    """Download buttons in one row: ``<name>.csv`` (``csv_text``), ``<name>.json`` (``json_obj``),
    and ``extra`` files ``{file name: (bytes, mime)}``."""
    where = where or st
    items = []
    if csv_text is not None:
        items.append((f"{name}.csv", csv_text.encode("utf-8"), "text/csv"))
    if json_obj is not None:
        items.append((f"{name}.json", to_json(json_obj).encode("utf-8"), "application/json"))
    for fname, (data, mime) in (extra or {}).items():
        items.append((fname, data, mime))
    if not items:
        return
    cols = where.columns(max(len(items), 4))  # short labels (the file name is the tooltip): they fit at 1024 px
    for col, (fname, data, mime) in zip(cols, items):
        kind = fname.rsplit(".", 1)[-1].upper() if "." in fname else fname
        kind = {"SAFETENSORS": "weights"}.get(kind, kind)
        col.download_button(f"⬇ {kind}", data, file_name=fname, mime=mime, help=fname,
                            key=key(page, f"dl_{name}_{fname}"), on_click="ignore")


def error(problem: str, fix: str = "", where=None) -> None:
    """``st.error`` with the problem in bold and the fix after it."""
    (where or st).error(f"**{problem}**" + (f" {fix}" if fix else ""))


def normalizer_cap_input(page: str, chosen: Sequence[ck.CheckpointInfo], label: str,
                         help: str) -> tuple[list[ck.CheckpointInfo], int]:
    """The sidebar's FIRE normalizer cap (tokens; 0 = off, URL ``cap``), shown only when a
    FIRE / FIRE-S checkpoint is chosen. Returns: ``(the chosen FIRE checkpoints, cap)``."""
    from .encodings import has_normalizer
    fires = [i for i in chosen if has_normalizer(i.position_encoding)]
    if not fires:
        return fires, 0
    return fires, int(st.sidebar.number_input(label, 0, 1 << 20, key=url_state(page, "cap", 0, int, lo=0, hi=1 << 20),
                                              help=help))


# -- cached library results -------------------------------------------------------------------
#: Largest query position the biases page accepts (tokens): a curve has i + 1 points per head.
MAX_QUERY_POSITION = 1 << 17


@st.cache_data(max_entries=32, show_spinner="Computing biases…")
def _bias_report(path: str, mtime_ns: int, positions: tuple[int, ...] | None, name: str,
                 normalizer_cap: int | None = None) -> dict:
    from . import analysis

    model = _load_model(path, mtime_ns, "cpu")
    return analysis.bias_report(model, list(positions) if positions else None, checkpoint=name,
                                normalizer_cap=normalizer_cap).to_dict()


@st.cache_data(max_entries=16, show_spinner="Running the model on the text…")
def _attention_pattern(path: str, mtime_ns: int, tokens: tuple[int, ...], layer: int, name: str,
                       normalizer_cap: int | None) -> dict:
    import torch

    from . import text_attention
    model = _load_model(path, mtime_ns, "cpu")
    return text_attention.attention_pattern(model, torch.tensor(tokens, dtype=torch.long), layer, checkpoint=name,
                                            normalizer_cap=normalizer_cap).to_dict()


def attention_pattern(info: ck.CheckpointInfo, tokens, layer: int, normalizer_cap: int | None = None) -> dict:
    """``text_attention.attention_pattern(...).to_dict()`` of a checkpoint on ``tokens``
    (LongTensor ``[T]``), cached per weights, text, layer and cap. Raises: ValueError, CheckpointError."""
    w = Path(info.path) / ck.WEIGHTS_FILE
    try:
        mtime = w.stat().st_mtime_ns
    except OSError as e:
        raise CheckpointError(f"cannot read {w}: {e}") from e
    return _attention_pattern(info.path, mtime, tuple(int(t) for t in tokens.tolist()), int(layer), info.name,
                              int(normalizer_cap) if normalizer_cap else None)


@st.cache_data(max_entries=32, show_spinner="Reading the published model's position encoding…")
def _published_bias_report(ref: str, revision: str | None, stack: str, positions: tuple[int, ...] | None,
                           name: str) -> dict:
    from . import analysis, hub
    model = hub.load_published(ref, stack=stack, revision=revision)
    out = analysis.bias_report(model, list(positions) if positions else None, checkpoint=name).to_dict()
    out["published"] = {"source": model.config.source, "family": model.config.family, "revision": model.config.revision,
                        "stack": model.config.stack, "model_type": model.config.model_type}
    return out


def bias_report(info: ck.CheckpointInfo, positions: Sequence[int] | None = None,
                normalizer_cap: int | None = None, stack: str | None = None) -> dict:
    """``fireviz.analysis.bias_report(model, positions, normalizer_cap=…).to_dict()`` for a
    checkpoint, cached (``st.cache_data``) by folder, weights modification time, positions
    (tokens) and FIRE normalizer cap (tokens; computed on a copy of the shared model).

    A published model (``info.is_published``) is read through ``fireviz.hub`` for ``stack``
    (T5-family encoder or decoder; default decoder), cached by source, revision and stack.
    Raises: ValueError for bad/too large positions; CheckpointError for a bad folder.
    """
    if positions and max(positions) > MAX_QUERY_POSITION:
        raise ValueError(f"query position {max(positions)} is larger than {MAX_QUERY_POSITION} tokens; "
                         "pick smaller positions")
    if info.is_published:
        return _published_bias_report(info.path, info.config.get("revision"), stack or "decoder",
                                      tuple(sorted(set(int(p) for p in positions))) if positions else None, info.name)
    mtime = (Path(info.path) / ck.WEIGHTS_FILE).stat().st_mtime_ns
    return _bias_report(info.path, mtime, tuple(sorted(set(int(p) for p in positions))) if positions else None,
                        info.name, normalizer_cap)


# -- background jobs --------------------------------------------------------------------------
def job_panel(job_key: str, queue_name: str, page: str, cancel_label: str | None = "Stop",
              poll_s: float = 0.5) -> None:
    """Live status of a background job: a progress bar, its message, a cancel button
    (none if ``cancel_label`` is None).

    Runs as an ``st.fragment`` re-run every ``poll_s`` seconds while the job is queued or
    running; when it finishes it reruns the whole page, which then draws the result. Call
    it only for an unfinished job.
    """
    from . import jobs

    q = jobs.default_queue(queue_name)

    @st.fragment(run_every=poll_s)
    def _panel():
        job = q.get(job_key)
        if job is None:
            return
        snap = job.snapshot()
        if snap["status"] in jobs.FINISHED:
            st.rerun(scope="app")  # the page draws finished jobs itself (and shows no panel)
        if snap["status"] == jobs.QUEUED:
            ahead = q.position(job_key)
            st.info(f"{snap['label']}: queued ({ahead} job(s) ahead). It runs in the background: reloading "
                    "the page or opening it in another tab finds it here.")
        text = f"{snap['label']}: {snap['message']} · {snap['elapsed_s']:.0f} s"
        st.progress(snap["fraction"], text=text)
        if cancel_label and st.button(cancel_label, key=key(page, f"cancel_{job_key}")):
            q.cancel(job_key)
            st.rerun(scope="app")

    _panel()


def _cancelled_at(paths, data, lengths, settings) -> float:
    """When the (non-probe) evaluation with these arguments ended, or 0."""
    from . import jobs
    job = jobs.find_evaluation(paths, data, lengths, settings)
    return (job.finished or 0.0) if job is not None else 0.0


def evaluation_jobs(page: str, specs: Sequence[tuple[list[str], dict, str]], data: str, lengths: Sequence[int],
                    run: bool) -> tuple[list[dict], list]:
    """The background evaluations behind the Length generalization page, one per spec.

    ``specs``: ``(checkpoint paths, evaluate settings, label suffix)`` or, with lengths of its own
    (instead of ``lengths``), ``(paths, settings, suffix, lengths)``. For each: the job with
    these arguments in this process (``jobs.find_evaluation``), else a cache-only probe that
    computes nothing; with ``run`` (the Run button) a missing, failed or cancelled job is
    submitted. Errors and cancellations are shown (problem and fix); unfinished jobs get a
    live ``job_panel``. Returns ``(results of finished jobs, unfinished jobs)``; stops the
    page (``st.stop``) when a checkpoint cannot be read.
    """
    from . import jobs

    results, pending = [], []
    specs = [(spec[0], spec[1], spec[2], spec[3] if len(spec) > 3 else lengths) for spec in specs]
    try:  # this page's own probes must not cancel one another (RoPE + PI + YaRN + capped FIRE)
        keep = {jobs.evaluation_key(paths, data, lens, s, probe=True) for paths, s, _, lens in specs}
    except CheckpointError as e:  # its message names the problem and the fix
        error(f"Cannot read a checkpoint: {e}")
        st.stop()
    for paths, s, suffix, lengths in specs:
        try:
            job = jobs.find_evaluation(paths, data, lengths, s)
            if run and (job is None or job.status in (jobs.ERROR, jobs.CANCELLED)):
                job = jobs.submit_evaluation(paths, data, lengths, s, label_suffix=suffix)
        except CheckpointError as e:  # its message names the problem and the fix
            error(f"Cannot read a checkpoint: {e}")
            st.stop()
        if job is None or job.status == jobs.CANCELLED:
            # never run in this process, or cancelled: look in the on-disk cache without computing
            # (a cancelled run's finished lengths are there)
            was_cancelled = job is not None
            job = jobs.find_evaluation(paths, data, lengths, s, probe=True)
            if job is None or job.status == jobs.CANCELLED or (was_cancelled and job.status == jobs.DONE
                                                              and job.finished < _cancelled_at(paths, data, lengths, s)):
                # none yet, cancelled before it looked (by a probe of other settings), or older than
                # the cancelled run's last cached length: look now
                job = jobs.submit_evaluation(paths, data, lengths, s, label_suffix=suffix, probe=True, keep=keep)
            if was_cancelled:
                st.warning("The evaluation was cancelled; the lengths it finished are drawn below. Press **Run** "
                           "to go on.")
        if job.status not in jobs.FINISHED:
            pending.append(job)
        if job.status == jobs.ERROR:
            text, bad_checkpoint = job_error_text(job.error)
            if bad_checkpoint:
                error(f"Cannot evaluate: {text}")
            else:
                error(f"The evaluation failed: {text}", "Change the settings (lengths, stride, data) and run again.")
        elif job.status == jobs.DONE:
            results += job.result
    for job in pending:
        queue_name = "probe" if job.description.get("probe") else "evaluate"
        job_panel(job.key, queue_name, page, cancel_label=None if queue_name == "probe" else "Cancel")
    return results, pending


# -- evaluation helpers -----------------------------------------------------------------------


def eval_caption(results: Sequence[dict]) -> str:
    """The evaluation settings and the device that ran them, as one caption line."""
    if not results:
        return ""
    s = results[0].get("settings", {})
    parts = [f"data {Path(str(s.get('data'))).name} ({s.get('split')} split, {s.get('documents')} documents)"]
    if s.get("mode") == "same_text":
        parts.append(f"same text at every length: the first {s.get('prefix_tokens')} tokens of "
                     f"{s.get('documents_scored')} documents ({s.get('documents_skipped')} shorter ones skipped"
                     + (f"; drawn with seed {s.get('seed')}" if s.get("token_budget") else "") + ")")
    else:
        parts += [f"mode {s.get('mode')}" + (f", stride {s.get('stride')}" if s.get("stride") else ""),
                  f"token budget {s.get('token_budget')} per length", f"window seed {s.get('seed')}"]
    parts.append(f"precision {s.get('precision')}")
    first = {e.get("length"): e for e in results[0].get("per_length", []) if "error" not in e}
    if first:
        parts.append("scored per length: " + ", ".join(
            f"{n}: {e.get('documents', '?')} docs / {e.get('windows')} windows / {e.get('tokens_scored'):,} tokens"
            for n, e in sorted(first.items())))
    caps = sorted({r.get("normalizer_cap") for r in results if r.get("normalizer_cap")})
    if caps:
        parts.append("FIRE normalizer capped at " + ", ".join(str(c) for c in caps) + " tokens where labelled")
    devices = sorted({str(r.get("device")) for r in results})
    parts.append("device " + ", ".join(devices))
    entries = [e for r in results for e in r.get("per_length", [])]
    from .evaluate import PUBLISHED_RESULTS

    published = sum(1 for e in entries if e.get("cached") and e.get("source") == PUBLISHED_RESULTS)
    cached = sum(1 for e in entries if e.get("cached")) - published
    parts.append(f"{cached}/{len(entries)} lengths from the cache"
                 + (f", {published} from the checkpoints' shipped results.json (same weights, data and settings)"
                    if published else ""))
    return "Evaluation: " + " · ".join(parts) + ". Lengths in tokens (bytes); dashed = training length."
