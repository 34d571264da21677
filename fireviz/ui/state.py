"""Page setup, widget keys, page state in the URL, one-line errors."""

from __future__ import annotations

import logging
import math
from typing import Any, Iterable, Sequence, cast

import streamlit as st

from fireviz.encodings import FitParam

#: Streamlit's log messages that say nothing wrong in fireviz, by logger: the job panel's poll that
#: arrives after the page has redrawn without it (its fragment is gone: dropped, by design — see
#: ``fireviz.ui.background.job_panel``), and ``st.cache_data`` decorated in the job worker process,
#: which has no Streamlit runtime. They filled the server log of a new user's `make app` (issue #48).
QUIET_LOG_MESSAGES = {
    "streamlit.runtime.app_session": "does not exist anymore",
    "streamlit.runtime.caching.cache_data_api": "No runtime found",
}


class _DropKnown(logging.Filter):
    def __init__(self, text: str):
        super().__init__()
        self.text = text

    def filter(self, record: logging.LogRecord) -> bool:
        return self.text not in str(record.msg)


for _name, _text in QUIET_LOG_MESSAGES.items():
    if not any(isinstance(f, _DropKnown) for f in logging.getLogger(_name).filters):
        logging.getLogger(_name).addFilter(_DropKnown(_text))

#: session_state key of the checkpoints added by path or Hub id (shared by all pages).
EXTRA_KEY = "fireviz_extra_checkpoints"


#: session-state key of the chosen checkpoint group ("" = the checkpoints root itself)
GROUP_KEY = "fireviz_checkpoint_group"


def setup_page(title: str, icon: str = "🔥") -> None:
    """``st.set_page_config`` (wide layout) and the page title. Call first on every page."""
    st.set_page_config(page_title=f"{title} · fireviz", page_icon=icon, layout="wide")
    st.title(title)


def key(page: str, name: str) -> str:
    """The widget key of ``name`` on ``page``: ``"<page>_<name>"`` (keys never collide across pages)."""
    return f"{page}_{name}"


def follow_default(page: str, name: str, default: Any) -> None:
    """When the default of ``key(page, name)`` changed since the last run (the checkpoints, or the
    group, changed what fits: another training domain, another training length), put the widget
    back to the new default; a value chosen under the old default would no longer fit (issue
    #40: switching to the copy group left Data on prose and lengths at 128…8192). The first run
    keeps what the URL asked for. Call after ``url_state`` and before the widget is made."""
    dk = key(page, f"{name}__default")
    previous = st.session_state.get(dk)
    st.session_state[dk] = default
    if previous is not None and previous != default:
        st.session_state[key(page, name)] = default


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


def url_state(
    page: str,
    name: str,
    default: Any,
    kind: type = str,
    options: Sequence | None = None,
    multi: bool = False,
    lo: float | None = None,
    hi: float | None = None,
) -> str:
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
                cand = _cast(cast(str, raw), kind)  # one value: not multi
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


#: the largest integer a Streamlit number box holds (JavaScript's Number.MAX_SAFE_INTEGER)
_MAX_WIDGET_INT = 2**53 - 1


def fit_param_input(page: str, param: FitParam) -> Any:
    """The widget of one fit-target parameter (``fireviz.encodings.FitParam``), labelled with its
    help, its value in the URL under ``param.key``: a select box for a choice, a number box for an
    int, a seed or a float (``param.unset`` or an empty box: not given), else a text box (numbers:
    one or one per head, comma-separated; untyped: JSON; empty: not given).

    Returns: the value for ``make_target`` (not yet checked: the fit reports bad values), or None
      for "not given" (the target's default). Text that does not parse is shown as an error and
      stops the page."""
    label = param.help or param.name
    if param.kind == "choice":
        options = list(param.choices)
        first = param.default if param.default in options else options[0]
        return st.selectbox(label, options, key=url_state(page, param.key, first, type(first), options=options))
    if param.kind in ("int", "seed", "float"):
        return _number_input(page, param, label)
    empty = "empty: the default" + ("" if param.default is None else f", {param.default}")
    txt = st.text_input(label, key=url_state(page, param.key, ""), placeholder=empty)
    if not txt.strip():
        return None
    try:
        return param.from_text(txt)
    except ValueError as e:
        error(str(e), "Example: 0.5 or 0.5,1,1.5,2" if param.kind == "numbers" else "")
        st.stop()


def _number_input(page: str, param: FitParam, label: str) -> Any:
    whole = param.kind != "float"
    kind: type = int if whole else float
    lo = 0 if param.kind == "seed" else param.lo if param.lo is not None else param.unset
    hi = param.hi if param.kind != "seed" else None
    if whole:  # Streamlit wants the bounds, the value and the step all of one type
        lo = None if lo is None else max(int(lo), -_MAX_WIDGET_INT)
        hi = _MAX_WIDGET_INT if hi is None else min(int(hi), _MAX_WIDGET_INT)
    else:
        lo, hi = (None if lo is None else float(lo)), (None if hi is None else float(hi))
    start = param.default if param.default is not None else param.unset
    start = None if start is None else kind(start)
    if param.unset is not None:
        # "(0 = the default)" beside a box showing 0.0000 read as "the default is 0" (issue #48)
        label += f" ({param.unset:g} leaves the default)"
    step = kind(param.step or (1 if whole else 0.01))
    widget: dict[str, Any] = {"min_value": lo, "max_value": hi, "step": step}
    if not whole:
        widget["format"] = "%.4f"
    if start is None:
        widget["value"] = None  # an empty box: not given
    value = st.number_input(label, key=url_state(page, param.key, start, kind, lo=lo, hi=hi), **widget)
    return None if value is None or value == param.unset else kind(value)


def table_height(n_rows: int, max_rows: int = 16) -> int:
    """Pixel height for an ``st.dataframe`` that shows ``n_rows`` rows without scrolling (up to
    ``max_rows``; Streamlit's default cuts a table of about ten rows)."""
    return 38 + 35 * max(1, min(n_rows, max_rows))


#: the ASCII characters Markdown (CommonMark, Streamlit's ``:color[…]``/``:emoji:`` directives,
#: ``$`` math) or HTML can give a meaning to; ``plain`` escapes each with a backslash
MARKDOWN_SPECIAL = frozenset("\\`*_{}[]()<>#+-.!|~$:&\"'=^%")


def plain(text: object) -> str:
    """``text`` as Markdown that Streamlit shows literally: every character of
    ``MARKDOWN_SPECIAL`` backslash-escaped (CommonMark lets any ASCII punctuation be escaped),
    line breaks made spaces. For anything from a URL, a file name or a file's content (issue #38:
    a shared link must not draw a link, an image or formatting inside the app)."""
    s = " ".join(str(text).splitlines())
    return "".join("\\" + ch if ch in MARKDOWN_SPECIAL else ch for ch in s)


def error(problem: str, fix: str = "", where=None) -> None:
    """``st.error`` with the problem in bold and the fix after it. ``problem`` is shown as plain
    text (it carries names and messages from URLs and files: ``plain``); ``fix`` is the caller's
    own Markdown."""
    (where or st).error(f"**{plain(problem)}**" + (f" {fix}" if fix else ""))
