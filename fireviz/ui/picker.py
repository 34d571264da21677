"""Checkpoints in the app: groups, the cached scan, the sidebar picker, cached models, captions."""

from __future__ import annotations

from pathlib import Path
from typing import Callable, Sequence

import streamlit as st

from fireviz.checkpoints import CausalLMCheckpoint, Checkpoint, overview_first
from fireviz.checkpoints import catalog as ck
from fireviz.encodings import encoding_names
from fireviz.model import CheckpointError
from fireviz.plots.presentation import human_count
from fireviz.ui.state import EXTRA_KEY, GROUP_KEY, key, plain, url_state


def checkpoints_root() -> Path:
    """The checkpoints root folder (``FIREVIZ_CHECKPOINTS_DIR`` or ``<repo>/checkpoints``)."""
    return ck.checkpoints_root()


def checkpoint_groups() -> dict[str, Path]:
    """``{group: folder}`` under the root (``ck.checkpoint_groups``: one listing of the root, a
    few milliseconds, so a new group shows on the next rerun)."""
    return ck.checkpoint_groups(checkpoints_root())


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
    and ``{folder: problem}`` for folders that could not be read. ``ck.scan_checkpoints`` reads a
    folder once per process and file state (one ``stat`` per file on a rerun), so a trainer's new
    checkpoint or a new results file shows on the next rerun with no timer (issue #48).
    Returns ([], {}) if there are none."""
    return ck.scan_checkpoints(group_root(group))


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

    group = where.selectbox(
        "Checkpoint group",
        groups,
        key=k,
        format_func=group_label,
        on_change=changed,
        help="The bundled prose models, or a group of models trained on another task "
        "(e.g. copy: the synthetic copy task). Groups are never mixed in one table.",
    )
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
        where.warning(f"Skipped {plain(Path(folder).name)}: {plain(problem)}")
    for info in found:
        for name, problem in info.problems.items():
            if name == ck.WEIGHTS_FILE:  # the weights themselves (NaN/inf): the checkpoint is listed, without numbers
                where.warning(f"{plain(info.name)}: {plain(problem)}")
            else:
                where.warning(f"{plain(info.name)}: left out {plain(name)}: {plain(problem)}")


@st.cache_resource(ttl=600, show_spinner="Fetching checkpoint…")
def _resolve(ref: str, root: str) -> ck.CheckpointInfo:
    return ck.resolve_checkpoint(ref, root)


def resolve(ref: str) -> ck.CheckpointInfo:
    """A checkpoint by name, folder path or Hub repo id (cached). Raises CheckpointError."""
    return _resolve(ref.strip(), str(group_root()))


def checkpoint_sha256(info_or_path: ck.CheckpointInfo | str) -> str:
    """What the app caches a checkpoint's model and results by (the one place it is computed):
    ``checkpoints.checkpoint_sha256``, the sha256 of model.safetensors and config.json that the
    evaluation keys on too, memoized per file state (a rerun pays two ``stat`` calls). Editing
    either file (e.g. config.json's encoding_options) gives a new identity: the model is reloaded
    and its figures recomputed. Raises: CheckpointError for missing or unreadable files."""
    path = info_or_path.path if isinstance(info_or_path, ck.CheckpointInfo) else str(info_or_path)
    return ck.checkpoint_sha256(path)


@st.cache_resource(max_entries=8, show_spinner="Loading model…")
def _load_model(path: str, sha256: str, device: str):
    # sha256: checkpoint_sha256(path) when asked; a model whose files changed since (a trainer's
    # next checkpoint) is refused rather than cached under the old identity — Checkpoint.load
    # hashes exactly the bytes it loads
    ckpt = Checkpoint.resolve(path)
    if ckpt.sha256 != sha256:
        raise CheckpointError(f"checkpoint {path} changed while it was loading; reload the page")
    return ckpt.load(device)


@st.cache_resource(max_entries=2, show_spinner="Loading the published model…")
def _load_causal_lm(path: str, sha256: str):
    ckpt = CausalLMCheckpoint.resolve(path)
    if ckpt.sha256 != sha256:
        raise CheckpointError(f"{path} changed while it was loading; reload the page")
    return ckpt.load("cpu")


def causal_lm(info: ck.CheckpointInfo) -> CausalLMCheckpoint:
    """The :class:`CausalLMCheckpoint` of a published causal LM in a transformers folder
    (``info.is_causal_lm``). Raises: CheckpointError."""
    return CausalLMCheckpoint.resolve(info.path)  # read once per process and file state


def text_tokenizer(info: ck.CheckpointInfo):
    """The tokenizer a checkpoint reads text with: a published causal LM's own, a fireviz
    checkpoint's stored one (``Checkpoint.tokenizer``: the byte tokenizer, or the BPE tokenizer
    it was trained with). Raises: CheckpointError."""
    if info.is_causal_lm:
        return causal_lm(info).tokenizer
    return Checkpoint.resolve(info.path).tokenizer  # memoized per file state


def reads_bytes(info: ck.CheckpointInfo) -> bool:
    """Whether a checkpoint reads text as fireviz's bytes (``[BOS] + bytes``): a fireviz checkpoint
    trained on bytes. False for a published causal LM and for one trained on a BPE tokenizer's
    shards (each reads its own tokens). One that cannot be read counts as bytes here (the page
    that resolves it says why)."""
    if info.is_published:
        return False
    try:
        return text_tokenizer(info).key == "byte"
    except CheckpointError:
        return True


def load_causal_lm(info: ck.CheckpointInfo):
    """The model (``CausalLMModule``, float32 on CPU) of a published causal LM, loaded once per
    process and identity (shared by every session). Raises: CheckpointError."""
    ckpt = causal_lm(info)
    return _load_causal_lm(ckpt.path, ckpt.sha256)


def load_model(info_or_path: ck.CheckpointInfo | str, device: str = "cpu"):
    """The GPT of a checkpoint, loaded once per process (``st.cache_resource``) and shared by
    every session (``GPT.attention_probs`` is safe to call from several at once).

    Reloaded when model.safetensors or config.json changes (``checkpoint_sha256``).
    Raises CheckpointError for a bad folder.
    """
    if isinstance(info_or_path, ck.CheckpointInfo) and info_or_path.is_published:
        return info_or_path.published  # position encodings only (fireviz.checkpoints.hub.PublishedModel)
    path = info_or_path.path if isinstance(info_or_path, ck.CheckpointInfo) else str(info_or_path)
    return _load_model(path, checkpoint_sha256(path), device)


def no_checkpoints_message() -> None:
    """An ``st.info`` box: no checkpoints found under the root, and the command that makes one."""
    st.info(
        f"No checkpoints found in `{checkpoints_root()}`.\n\nCreate one with\n\n"
        f"```\n{ck.TRAIN_HINT}\n```\n\nor add one from a local folder or a Hugging Face repo id "
        "with the sidebar box of the other pages, or set `FIREVIZ_CHECKPOINTS_DIR` to a folder of checkpoints."
    )


def _add_extra(ref: str) -> ck.CheckpointInfo | None:
    try:
        info = resolve(ref)
    except ck.CheckpointNotFoundError:  # one message: the app does not tell which server paths exist
        st.error(
            f"**Cannot use checkpoint {plain(ref)}.** There is no readable checkpoint there: give a fireviz folder "
            "holding config.json and model.safetensors, a folder transformers wrote (with its tokenizer), a GGUF "
            "file, or a Hugging Face repo id (owner/name)."
        )
        return None
    except CheckpointError as e:
        st.error(f"**Cannot use checkpoint {plain(ref)}.** {plain(e)}")
        return None
    st.session_state.setdefault(EXTRA_KEY, {})[ref] = info
    return info


def _drop_what_cannot_run(by_name: dict, allow_published: bool, allow_causal_lm: bool, where) -> None:
    """Leave out of ``by_name`` (and say why) the published models a page cannot use: position
    encodings only where whole models run, a model with no bias to read on the bias pages."""
    if not allow_published:  # published models have position encodings only: no evaluation, no logs
        for n in [n for n, i in by_name.items() if i.is_published and not (allow_causal_lm and i.is_causal_lm)]:
            del by_name[n]
            where.info(
                f"`{plain(n)}` is a published model: its position bias is on the Learned biases and Fit FIRE pages"
                + (
                    "; a causal LM (a transformers folder, a GGUF file or a Hub id) is also evaluated on the "
                    "Length generalization and Attention pages."
                    if not allow_causal_lm
                    else "; only a causal LM (a transformers folder, a GGUF file or a Hub id) runs here."
                )
            )
    if allow_published and not allow_causal_lm:  # a bias page: a model with no bias to read is said, not listed
        for n in [n for n, i in by_name.items() if i.causal_lm_only]:
            del by_name[n]
            where.info(
                f"`{plain(n)}` has learned absolute positions: no bias or rotary kernel to show here; it is "
                "evaluated on the Length generalization page and its attention drawn on the Attention page."
            )


def checkpoint_picker(
    page: str,
    multi: bool = True,
    max_selections: int | None = None,
    label: str = "Checkpoints",
    default_count: int = 1,
    filter_fn: Callable[[ck.CheckpointInfo], bool] | None = None,
    where=None,
    allow_published: bool = False,
    lead: str | None = None,
    allow_causal_lm: bool = False,
) -> list[ck.CheckpointInfo]:
    """Checkpoint selection (URL parameter ``ckpt``) plus a box to add one by path or Hub id.

    Options are the checkpoints under the root and any added in this session (by local
    folder or Hugging Face repo id; a bad one gives an ``st.error`` and is not added).
    ``filter_fn`` hides checkpoints it rejects. The default selection (no ``ckpt`` in the
    URL) is the first ``default_count`` names of ``overview_first``: the plain run of each
    encoding in the paper's order (NoPE last), then variants, then extra seeds — what a first
    look compares, not the alphabet's first names (issue #40); ``lead`` (an encoding name) puts that
    encoding's plain run first (the Learned biases page opens on FIRE, not on RoPE's absent bias).
    Shows the "no checkpoints" message if there is nothing to pick.
    Returns: the chosen checkpoints, in selection order ([] if none).
    """
    where = where or st.sidebar
    group_picker(page, where)
    found, problems = list_checkpoints()
    checkpoint_warnings(found, problems, where)
    with where.expander("Add a checkpoint (folder or Hub repo id)"):
        ref = st.text_input(
            "Local folder path or Hugging Face repo id (owner/name)",
            key=key(page, "add_ref"),
            placeholder="checkpoints/fire  or  owner/fireviz-fire",
        )
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
    _drop_what_cannot_run(by_name, allow_published, allow_causal_lm, where)
    if filter_fn is not None:
        by_name = {n: i for n, i in by_name.items() if filter_fn(i)}
    names = list(by_name)
    if not names:
        no_checkpoints_message()
        return []
    fmt = lambda n: by_name[n].label if n in by_name else n  # noqa: E731
    if multi:
        order = list(encoding_names())
        if lead in order:
            order.remove(lead)
            order.insert(0, lead)
        first = overview_first({n: by_name[n].position_encoding for n in names}, order)
        k = url_state(page, "ckpt", first[:default_count], options=names, multi=True)
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
    if info.is_causal_lm:
        return (
            f"**{plain(info.name)}**: published causal LM ({plain(c.get('model_type'))}, transformers folder), "
            f"{plain(c.get('n_layer'))} layers × {plain(c.get('n_head'))} heads; position encoding "
            f"{plain(info.position_encoding)}; original length {info.seq_len} tokens of its own tokenizer"
        )
    if info.is_published:
        rev = f" @ {plain(str(c['revision'])[:12])}" if c.get("revision") else ""
        stack = f", {plain(c.get('stack'))} stack" if c.get("stack") else ""
        return (
            f"**{plain(info.name)}**{rev}: published {plain(c.get('family'))} ({plain(c.get('model_type'))}), "
            f"{plain(c.get('n_layer'))} layers × {plain(c.get('n_head'))} heads{stack}; position encoding "
            f"{plain(info.position_encoding)} read from config.json"
            + (" and the bias tables' bytes" if info.position_encoding == "t5" else "")
            + " only"
        )
    parts = [  # names and values from the folder and its config.json: plain text (issue #38)
        f"**{plain(info.name)}**: {plain(info.position_encoding)}",
        f"{plain(c.get('n_layer'))} layers × {plain(c.get('n_head'))} heads, d_model {plain(c.get('d_model'))}",
        f"{info.num_parameters:,} parameters",
        f"trained at {info.seq_len} tokens",
    ]
    if info.training_tokens:
        parts.append(f"on {human_count(info.training_tokens)} tokens")
    if info.data:
        parts.append(f"of {plain(info.data)}")
    return " · ".join(parts)


#: Home-table details that, when every checkpoint shares them, are said once in a caption
HOME_DETAIL_COLUMNS = ("parameters", "training tokens", "progress", "training length", "data", "numbers from")


def checkpoint_table_config(rows: Sequence[dict]) -> dict:
    """``st.dataframe`` column_config for the Home table of ``CheckpointInfo.summary_row()``s:
    headline columns labelled short (``"bpb @512"``, ``"val @2048"``; the data in their help)
    with pixel widths that fit a 1024 px window; the underlying column names stay as in the rows."""
    # pixel widths: the headline columns of 13 checkpoints fit the ~560 px a 1024 px window leaves
    cfg: dict = {
        "checkpoint": st.column_config.TextColumn(width=140),
        "encoding": st.column_config.TextColumn(width=95),
        "training seed": st.column_config.NumberColumn(
            "seed", width=50, help="train.seed: initialization and the order of training windows"
        ),
        "parameters": st.column_config.NumberColumn(format="localized", width=80),
        "training tokens": st.column_config.NumberColumn(format="compact"),
        "progress": st.column_config.TextColumn(
            help="optimizer steps done / planned (training.steps / training.settings.max_steps); "
            "interim = a checkpoint of a run that has not finished"
        ),
    }
    cols = list(dict.fromkeys(c for r in rows for c in r))

    def common(col: str, field: str):
        vals = {r.get(field) for r in rows if r.get(col) is not None}
        return vals.pop() if len(vals) == 1 else None

    for col in cols:
        if col.startswith("bpb @ "):
            n = col.removeprefix("bpb @ ")
            prose = all("prose" in str(r.get("numbers from", "")) for r in rows if r.get(col) is not None)
            cfg[col] = st.column_config.NumberColumn(
                f"bpb @{n}",
                format="%.3f",
                width=68,
                help=f"bits per byte at {n}-token windows"
                + (" on prose" if prose else "")
                + ", from the checkpoint's results JSON",
            )
        elif col.startswith("val loss"):
            L, data = common(col, "training length"), common(col, "data")
            four = "4L" in col
            at = f" @{4 * L if four else L}" if L else (" @4L" if four else " @L")
            cfg[col] = st.column_config.NumberColumn(
                f"val{at}",
                format="%.3f",
                width=68,
                help="last validation loss in the training log (train_log.jsonl[.gz]), nats per token (÷ ln 2 = bits per byte)"
                + (f", on {data}" if data else "")
                + (" at 4× the training length" if "4L" in col else " at the training length"),
            )
    return cfg
