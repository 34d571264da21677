"""Attention on a text, per head: where each head looks, and how much of it is position.

Thin over ``fireviz.analysis.text_attention.attention_pattern`` (one layer's probabilities per head and
the bias's share of its logits, run in this process: one forward pass) and
``fireviz.plots.attention``. State in the URL: group, ckpt, atext, adoc, astart, alen, aseed, layer, cap, alog.
"""

import streamlit as st
import torch

from fireviz import plots, ui
from fireviz.analysis import text_attention
from fireviz.data import DOMAINS, DataError, DocumentTokens, synthetic
from fireviz.encodings import encoding_spec
from fireviz.plots import attention as attention_plots

P = "attention"
ui.setup_page("Attention on a text")
st.markdown(
    "Each head's attention probabilities on real text, queries down and keys across, as BertViz and "
    "CircuitsVis draw them — and the **bias's share** of each head's logits: the variance over keys of the "
    "position bias, against that of the content logits q·k/√d (0: the head looks by content alone; 1: by "
    "position alone). For FIRE, the normalizer cap shows what changes past the training length."
)

chosen = ui.checkpoint_picker(P, multi=False, label="Checkpoint", allow_causal_lm=True)
if not chosen:
    st.stop()
info = chosen[0]
published = info.is_causal_lm  # a published causal LM: its own tokenizer, its own attention
if info.is_published and not published:
    st.info(
        "A published model is read for its position encoding only; attention needs the whole model. Pick a "
        "fireviz checkpoint, or add a causal LM saved in a folder with transformers."
    )
    st.stop()
sb = st.sidebar
seq = int(info.config.get("seq_len", 512))
n_layer = int(info.config.get("n_layer", 1))
layer = int(
    sb.selectbox("Layer", list(range(n_layer)), key=ui.url_state(P, "layer", 0, int, options=list(range(n_layer))))
)
fires, cap = ui.normalizer_cap_input(
    P,
    chosen,
    "FIRE normalizer cap (tokens; 0 = off)",
    help="ψ(min(max(L, i), N)): drawn beside the plain pattern; it changes queries "
    "past N only, so choose a text longer than N.",
)
try:
    tokenizer = ui.text_tokenizer(info)  # bytes, a BPE tokenizer it was trained with, a published model's own
except ui.CheckpointError as e:
    ui.error(f"Cannot read {info.name}'s tokenizer: {e}")
    st.stop()
own_tokens = tokenizer.key != "byte"
TASKS = [synthetic.PREFIX + t for t in synthetic.TASKS] if not own_tokens else []  # tasks are byte sequences
sources = list(DOMAINS) + TASKS + ["upload"]
atext = sb.selectbox(
    "Text",
    sources,
    key=ui.url_state(P, "atext", info.data if info.data in sources else "prose", options=sources),
    format_func=lambda d: (
        "your own file" if d == "upload" else (f"{d} sequence (a task)" if d in TASKS else f"{d} validation document")
    ),
)
if atext in TASKS:  # a fresh task sequence from its seed: the natural input of a model trained on the task
    length = int(
        sb.number_input(
            f"Sequence length (tokens; trained at {seq})",
            4,
            text_attention.MAX_PATTERN_TOKENS,
            key=ui.url_state(P, "alen", seq, int, lo=4, hi=text_attention.MAX_PATTERN_TOKENS),
        )
    )
    tseed = int(sb.number_input("Sequence seed", 0, 10**9, key=ui.url_state(P, "aseed", 0, int, lo=0, hi=10**9)))
    ui.sync_url(P, ["ckpt", "layer", "cap", "atext", "alen", "aseed"])
    tokens = synthetic.load_task(atext).sequence(length, tseed)
    where = f"a {atext} sequence of {length} tokens (seed {tseed})"
else:
    try:
        if atext == "upload":
            up = sb.file_uploader("Text or JSONL file", type=ui.UPLOAD_TYPES, key=ui.key(P, "upload"))
            docs = ui.documents(ui.save_upload(up.name, up.getvalue())) if up is not None else []
        else:
            docs = ui.documents(atext, "validation")
    except DataError as e:
        ui.error(f"Cannot read the text: {e}", "Upload UTF-8 text (.txt) or JSONL with a string 'text' field per line.")
        st.stop()
    if not docs:
        st.info("Upload a .txt or .jsonl file in the sidebar.")
        st.stop()
    ids = [d.id for d in docs]
    doc_id = sb.selectbox(f"Document ({len(ids)})", ids, key=ui.url_state(P, "adoc", ids[0], options=ids))
    doc = docs[ids.index(doc_id)]
    own = None
    if own_tokens:  # the document in the model's own tokens (its BOS convention)
        try:
            own = tokenizer.encode(doc).ids
        except DataError as e:
            ui.error(f"Cannot read {info.name}'s tokenizer: {e}")
            st.stop()
    doc_tokens = len(own) if own is not None else doc.num_tokens
    max_len = min(text_attention.MAX_PATTERN_TOKENS, doc_tokens)
    if published and info.config.get("position_encoding") == "learned":
        max_len = min(max_len, seq)  # learned absolute positions end at the model's length
    length = int(
        sb.number_input(
            f"Tokens (2–{max_len}; the pattern is length × length)",
            2,
            max_len,
            key=ui.url_state(P, "alen", min(seq, max_len), int, lo=2, hi=max_len),
        )
    )
    start = int(
        sb.number_input(
            "Start at token (0 = the document's start)",
            0,
            max(0, doc_tokens - length),
            key=ui.url_state(P, "astart", 0, int, lo=0, hi=max(0, doc_tokens - length)),
        )
    )
    ui.sync_url(P, ["ckpt", "layer", "cap", "atext", "adoc", "alen", "astart"])
    if own is not None:
        tokens = torch.from_numpy(own[start : start + length].copy())
        where = (
            f"{doc_id}, tokens {start}…{start + length - 1} of {doc_tokens:,} in {info.name}'s own tokenizer, "
            "scored as one window from position 0"
        )
    else:
        tokens = DocumentTokens(doc)[
            start : start + length
        ]  # only these bytes are read (a long document stays on disk)
        where = (
            f"{doc_id}, tokens {start}…{start + length - 1} of {doc.num_tokens:,} ([BOS] + bytes), scored as one "
            "window from position 0"
        )
try:
    plain = ui.attention_pattern(info, tokens, layer)
    capped = ui.attention_pattern(info, tokens, layer, normalizer_cap=cap) if (cap and fires) else None
except (ValueError, ui.CheckpointError) as e:
    ui.error(f"Cannot compute the attention pattern: {e}")
    st.stop()
caption = f"{ui.checkpoint_caption(info)}. Text: {where}."
st.markdown(caption)
show = (
    capped
    if capped is not None
    and st.radio(
        "Pattern",
        ["plain", "capped"],
        horizontal=True,
        key=ui.key(P, "show"),
        format_func={"plain": "as trained", "capped": f"normalizer capped at {cap}"}.get,
    )
    == "capped"
    else plain
)
log_color = st.toggle(
    "Log colour scale",
    key=ui.url_state(P, "alog", False, bool),
    help="Colour by log10 of the probability (down to 1e-4): on a linear scale a few near keys take the "
    "whole range and the spread over far keys is dark.",
)
ui.sync_url(P, ["alog"])
fig = attention_plots.attention_pattern_figure(show, log_color=log_color)
ui.show_figure(
    fig,
    "Rows: query positions; columns: the keys they attend to (future keys blank). Texts longer than "
    f"{attention_plots.MAX_HEATMAP_CELLS} tokens are drawn as block means.",
    P,
    "pattern",
)
ui.downloads(P, "attention_pattern", lambda fig=fig: plots.figure_to_csv(fig), show)
if plain.get("bias_share") is None and published:
    st.caption(
        "A published model's attention logits are not split into content and position parts here, so there is "
        "no bias share to show."
    )
    st.stop()
if plain.get("bias_share") is None:
    st.caption(
        f"{info.position_encoding} has no additive bias: its position information enters through "
        + (
            "rotated queries and keys (RoPE), so there is no bias share to show."
            if encoding_spec(info.position_encoding).kind == "rotary"
            else "the causal mask alone (NoPE)."
        )
    )
    st.stop()
sfig = attention_plots.bias_share_figure([plain] + ([capped] if capped is not None else []))
ui.show_figure(
    sfig,
    "Per head, how much of the logits' spread over keys comes from the position bias, as the query "
    "moves along the text" + (f"; dashed: the normalizer capped at {cap}." if capped else "."),
    P,
    "share",
)
rows = [
    {
        "head": h,
        "bias share": plain["bias_share"][h],
        **({f"bias share, cap {cap}": capped["bias_share"][h]} if capped is not None else {}),
    }
    for h in range(len(plain["bias_share"]))
]
st.caption("Bias share per head: the mean over query positions 1… of the curve above (unsmoothed).")
st.dataframe(
    rows,
    hide_index=True,
    key=ui.key(P, "share_table"),
    column_config={k: st.column_config.NumberColumn(format="%.3f") for k in rows[0] if k != "head"},
)
ui.downloads(P, "bias_share", lambda rows=rows: ui.rows_to_csv(rows), rows)
