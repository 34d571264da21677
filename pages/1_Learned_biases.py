"""Learned biases: what each head of a checkpoint learned, at several query positions.

Thin over ``fireviz.analysis.biases.run_bias_report`` (curves, heatmap matrix, locality; one
``analysis.BiasSettings`` built from the sidebar is the call, the cache key and the caption) and
``fireviz.plots`` (figures); the dilution panel runs ``fireviz.ui.jobs.submit_dilution`` in the
background (cached on disk by ``text_attention.cached_attention_dilution``). State in the URL: ckpt,
view, layer, head, pos, x, clip, cap, dtext, ddoc, dnear, dscale.
"""

import streamlit as st

from fireviz import plots, ui
from fireviz.analysis import biases as analysis
from fireviz.analysis import text_attention
from fireviz.data import DOMAINS, DataError, DocumentTokens
from fireviz.encodings import has_normalizer
from fireviz.ui import jobs

P = "biases"
ui.setup_page("Learned biases")
st.markdown(
    "Bias b(i, j) in logits (added to q·k/√d) against the distance i − j in tokens, one line per query "
    "position i. FIRE depends on i through its normalizer ψ(max(L, i)), so the curves stretch as i "
    "grows; T5, ALiBi, Kerple and Sandwich do not. A head is **local** when its bias falls with distance, "
    "**anti-local** when it rises."
)

chosen = ui.checkpoint_picker(
    P, multi=True, max_selections=2, label="Checkpoints (one, or two to compare)", allow_published=True, lead="fire"
)
if not chosen:
    st.stop()
published = [i for i in chosen if i.is_published]
stack = None
if any(i.config.get("stack") for i in published):  # an encoder–decoder (T5-family) model
    stack = st.sidebar.radio(
        "Stack (encoder–decoder models)",
        ["decoder", "encoder"],
        key=ui.url_state(P, "stack", "decoder", options=["decoder", "encoder"]),
        horizontal=True,
        help="The decoder's bias is causal; the encoder's is bidirectional, so its heatmap "
        "has keys after the query too.",
    )

first = chosen[0]
sb = st.sidebar
sb.text_input(
    "Query positions i (tokens, comma-separated; empty = m·L − 1 for m = 1, 2, 4, 8)", key=ui.url_state(P, "pos", "")
)
view = sb.radio(
    "View",
    ["grid", "head"],
    key=ui.url_state(P, "view", "grid", options=["grid", "head"]),
    format_func={"grid": "All layers × heads", "head": "One head: curves + heatmap"}.get,
    horizontal=True,
)
n_layer = max(int(i.config.get("n_layer", 1)) for i in chosen)
n_head = max(int(i.config.get("n_head", 1)) for i in chosen)
layer = sb.selectbox(
    "Layer",
    list(range(n_layer)),
    key=ui.url_state(P, "layer", 0, int, options=list(range(n_layer))),
    disabled=view != "head",
)
head = sb.selectbox(
    "Head",
    list(range(n_head)),
    key=ui.url_state(P, "head", 0, int, options=list(range(n_head))),
    disabled=view != "head",
)
# T5's buckets change only within 128 tokens and are flat to the largest query position: on a linear
# axis its curves hug the y axis, so a T5 checkpoint opens on the log axis
x_default = "log_distance" if any(i.position_encoding == "t5" for i in chosen) else "distance"
x_axis = sb.radio(
    "x axis",
    list(plots.X_AXES),
    key=ui.url_state(P, "x", x_default, options=list(plots.X_AXES)),
    format_func={
        "distance": "distance i − j",
        "log_distance": "distance, log scale",
        "normalized": "FIRE input ψ(i−j)/ψ(max(L,i)) (one-head view)",
    }.get,
    help="On a log distance axis the learned FIRE and Kerple-log curves are nearly straight, and T5's "
    "bucketed bias (which changes only within 128 tokens) fills the panel. FIRE's input axis is drawn in the "
    "one-head view only; the grid then uses the distance axis.",
)
grid_x = x_axis if x_axis in ("distance", "log_distance") else "distance"
fire_chosen, cap = ui.normalizer_cap_input(
    P,
    chosen,
    "FIRE normalizer cap (tokens; 0 = off)",
    help="Overlay FIRE's curves with the normalizer ψ(min(max(L, i), N)): past N a query is normalized as at N, so "
    "each distance keeps the input f_θ saw in training (N = the training length). Dashed in the one-head "
    "view, the f_θ-input figure and the dilution panel.",
)
clip_options = [0, 5, 20, 100]
clip = sb.selectbox(
    "Heatmap colours (one-head view)",
    clip_options,
    key=ui.url_state(P, "clip", 0, int, options=clip_options),
    disabled=view != "head",
    format_func=lambda v: f"saturate at |bias| ≥ {v} logits" if v else "full range",
    help="A learned Kerple-power bias falls to −10⁴…−10⁵ logits far from the diagonal; on the full "
    "range the keys a query can still attend to are all one colour. Saturating at 20 logits "
    "(e⁻²⁰ ≈ 2·10⁻⁹ of the weight) shows them, if the grid is fine enough: it has ~128 "
    "points up to the largest query position, so enter small query positions (e.g. 127 for "
    "a 1-token grid) to see a band a few tokens wide. Only the colours change, not the numbers.",
)
ui.sync_url(P, ["ckpt", "pos", "view", "layer", "head", "x", "clip", "cap", "stack"])

settings = analysis.BiasSettings.make()  # the default query positions m·L − 1
text = st.session_state[ui.key(P, "pos")].strip()
if text:
    try:
        settings = analysis.BiasSettings.make(analysis.parse_positions(text))
    except ValueError as e:
        ui.error(f"Bad query positions: {e}", "Use comma-separated integers such as 511,4095, or leave it empty.")
        st.stop()

reports = []
# one-head plots side by side; layer × head grids need the full width, so they are stacked
cols = st.columns(len(chosen)) if view == "head" else [st.container() for _ in chosen]
for col, info in zip(cols, chosen, strict=True):
    with col:
        st.markdown(ui.checkpoint_caption(info))
        try:
            rep = ui.bias_report(info, settings, stack=stack)
        except ui.CheckpointError as e:  # its message names the problem and the fix
            ui.error(f"Cannot compute the biases of {info.name}: {e}")
            continue
        except ValueError as e:
            ui.error(f"Cannot compute the biases of {info.name}: {e}", "Pick other query positions.")
            continue
        reports.append(rep)
        shown = settings.resolve(rep["train_seq_len"])  # the positions the report has
        caption = f"{shown.caption()}; training length {rep['train_seq_len']} tokens (dashed). Bias in logits."
        if rep["kind"] != "additive":
            fig = plots.bias_grid_figure(rep)
            ui.show_figure(fig, rep.get("note") or caption, P, f"grid_{info.name}")
            ui.figure_table_downloads(P, f"{info.name}_kernel", fig)
            continue
        if view == "grid":
            fig = plots.bias_grid_figure(rep, x_axis=grid_x)
            ui.show_figure(fig, caption, P, f"grid_{info.name}")
            ui.figure_table_downloads(P, f"{info.name}_bias_grid", fig)
            continue
        if layer >= rep["n_layer"] or head >= rep["n_head"]:
            ui.error(
                f"{info.name} has {rep['n_layer']} layers × {rep['n_head']} heads; layer {layer}, head {head} "
                "does not exist.",
                "Pick a smaller layer or head.",
            )
            continue
        is_fire = has_normalizer(info.position_encoding)
        use_x = x_axis if (x_axis != "normalized" or is_fire) else "distance"
        if use_x != x_axis:
            st.caption(f"{info.position_encoding} is not FIRE: drawn against the distance instead.")
        capped = ui.bias_report(info, settings.replace(normalizer_cap=cap)) if (cap and is_fire) else None
        fig = plots.head_bias_figure(rep, layer, head, x_axis=use_x, capped=capped)
        if use_x == "normalized":
            caption = (
                f"{shown.caption()}, against FIRE's MLP input ψ(i−j)/ψ(max(L, i)): every query's curve lies on "
                "f_θ (dotted), squeezed into [0, 1]."
            )
        if capped is not None:
            caption += (
                f" Dashed: the same with the normalizer capped at {cap} tokens — a query past {cap} then "
                f"sees the curve of query {cap} for distances below {cap}."
            )
        ui.show_figure(fig, caption, P, f"{info.name}_L{layer}H{head}_bias")
        ui.figure_table_downloads(P, f"{info.name}_L{layer}H{head}_curves", fig)
        if is_fire:
            fi = plots.fire_input_figure(rep, layer, capped=capped)
            L = (next((lay for lay in rep["layers"] if lay.get("layer") == layer), {}).get("fire") or {}).get(
                "threshold_L"
            )
            ui.show_figure(
                fi,
                "f_θ's input for fixed distances as the query moves. Up to the learned threshold "
                + (f"L ≈ {L:.0f} tokens " if L else "L ")
                + "the normalizer is ψ(L) and each distance keeps its input; past L it falls — "
                "inside the shaded training positions too, where f_θ learned it — and past the "
                "training length it goes on falling to inputs f_θ never saw for such far keys, "
                "so they look near: attention spreads thin (the dilution panel below)."
                + (f" Dashed: capped at {cap} — flat past the cap." if capped else ""),
                P,
                f"fire_input_{info.name}",
            )
            ui.figure_table_downloads(P, f"{info.name}_L{layer}_fire_input", fi)
        hm = plots.bias_heatmap_figure(rep, layer, head, color_limit=clip or None)
        two_sided = (rep.get("published") or {}).get("stack") == "encoder"
        ui.show_figure(
            hm,
            "Query × key grid (tokens); "
            + (
                "a bidirectional encoder: keys after the query have a bias too."
                if two_sided
                else "blank above the diagonal = future keys (masked)."
            ),
            P,
            f"heatmap_{info.name}",
        )
        ui.figure_table_downloads(P, f"{info.name}_L{layer}H{head}_heatmap", hm)

if reports:
    st.subheader("Locality per head")
    summary = analysis.locality_summary(reports)
    table = analysis.locality_table(reports)
    st.dataframe(ui.locality_summary_rows(summary), hide_index=True, key=ui.key(P, "summary"))
    additive = [r for r in reports if r.get("kind") == "additive"]
    if len(additive) < len(reports):
        st.caption(
            "Rotary (RoPE) checkpoints have a position kernel, not an additive bias, and NoPE has neither: "
            "their rows show —."
        )
    if table:
        st.caption(
            f"Classified at query position i = {additive[0].get('classify_at')} tokens (the smallest query "
            "position: by default the training length's last query). "
            f"Rules: {ui.locality_rules_text(analysis.LOCALITY_RULES)}. "
            "ρ = Spearman correlation of bias with distance; peak_fraction 0 = prefers the nearest key, "
            "1 = the farthest."
        )
        st.dataframe(table, hide_index=True, key=ui.key(P, "table"))
        ui.downloads(P, "locality", lambda table=table: ui.rows_to_csv(table), {"summary": summary, "heads": table})
    else:
        st.caption("No additive bias in the chosen checkpoint(s), so no locality to classify.")
    with st.expander("Full bias report (JSON)"):
        ui.downloads(P, "bias_report", None, reports)


# -- attention dilution: why FIRE's long-context loss rises -------------------------------------
# dilution runs the whole model: fireviz checkpoints, and published causal LMs saved in a folder
chosen = [i for i in chosen if not i.is_published or i.is_causal_lm]
st.subheader("Attention dilution")
if not chosen:
    st.caption(
        "Attention dilution runs the whole model on text; these published models are read for their position "
        "encoding only. Pick a fireviz checkpoint, or add a causal LM saved in a folder with transformers."
    )
    st.stop()
st.caption(
    "Share of attention on the nearest k keys against the query position, per layer (mean over heads), "
    "measured on real text. A line that falls past the training length is attention spreading over far "
    "keys. Runs in the background; results are cached on disk. A published model reads the text in its own "
    "tokens (positions in them, at multiples of its original length)."
)
dc1, dc2, dc3 = st.columns([2, 3, 1])
sources = list(DOMAINS) + ["upload"]
dtext = dc1.selectbox(
    "Text",
    sources,
    key=ui.url_state(P, "dtext", "prose", options=sources),
    format_func=lambda d: "your own file" if d == "upload" else f"{d} validation document",
)
near = int(dc3.number_input("k nearest keys", 1, 4096, key=ui.url_state(P, "dnear", 16, int, lo=1, hi=4096)))
scaling = None
if any(i.is_causal_lm and i.position_encoding == "rope" for i in chosen):  # with and without zero-shot scaling
    options = ["none", "yarn", "dynamic", "linear", "llama3"]
    picked_scaling = st.selectbox(
        "Also the published RoPE model(s) with zero-shot scaling (factor = largest query position / its length)",
        options,
        key=ui.url_state(P, "dscale", "none", options=options),
    )
    scaling = None if picked_scaling == "none" else picked_scaling
own = [i for i in chosen if ui.reads_bytes(i)]  # fireviz byte checkpoints: one measurement on [BOS] + bytes
seq = max((int(i.config.get("seq_len", 512)) for i in own), default=1)
dil_positions = analysis.default_query_positions(seq, analysis.DEFAULT_DILUTION_MULTIPLES)
need = dil_positions[-1] + 1 if own else 2
docs, source = [], None
try:
    if dtext == "upload":
        up = dc2.file_uploader("Text or JSONL file", type=ui.UPLOAD_TYPES, key=ui.key(P, "dupload"))
        if up is not None:
            path = ui.save_upload(up.name, up.getvalue())
            docs, source = ui.documents(path), f"upload:{path.parent.name}"
    else:
        docs, source = ui.documents(dtext, "validation"), f"{dtext}:validation"
except DataError as e:
    ui.error(f"Cannot read the text: {e}", "Upload UTF-8 text (.txt) or JSONL with a string 'text' field per line.")
long_docs = [d for d in docs if d.num_tokens >= need]
if docs and not long_docs:
    ui.error(
        f"No document of this text has {need} tokens, the largest query position (16× the training length) plus one.",
        "Upload a longer text.",
    )
elif long_docs:
    ids = [d.id for d in long_docs]
    doc_id = dc2.selectbox(
        f"Document ({len(ids)} hold {need} tokens)", ids, key=ui.url_state(P, "ddoc", ids[0], options=ids)
    )
    ui.sync_url(P, ["dtext", "ddoc", "dnear", "dscale"])
    doc = long_docs[ids.index(doc_id)]
    resolved = ui.resolve_checkpoints(chosen)  # once; one that cannot be read is said and left out
    # one measurement per text: fireviz byte checkpoints share [BOS] + bytes, each other model its own tokens
    runs: list[tuple[list, object, list[int]]] = []
    ckpts = [resolved[i.path] for i in own if i.path in resolved]
    if ckpts:
        tokens = DocumentTokens(doc)[0:need]  # the prefix the dilution positions need, read from disk if it is there
        runs.append((ckpts, tokens, dil_positions))
    for i in chosen:
        if i not in own and i.path in resolved:
            try:
                p_tokens, p_positions, note = text_attention.published_dilution_input(resolved[i.path], doc)
            except ValueError as e:
                ui.error(f"Cannot measure {ui.plain(i.name)}: {e}")
                continue
            if note:
                st.caption(ui.plain(note) + ".")
            runs.append(([resolved[i.path]], p_tokens, p_positions))
    found, waiting = [], []
    for run_ckpts, run_tokens, run_positions in runs:
        fire_ckpts = [
            c for c in run_ckpts if cap and c.kind == "fireviz" and has_normalizer(c.config.position_encoding)
        ]
        scaled = [c for c in run_ckpts if scaling and c.kind != "fireviz" and c.config.rope_scalable]
        plan = [(c, None, None) for c in run_ckpts] + [(c, cap, None) for c in fire_ckpts]
        plan += [(c, None, scaling) for c in scaled]
        got = [
            text_attention.cached_attention_dilution(
                c, run_tokens, run_positions, near=near, normalizer_cap=n, compute=False, rope_scaling=sc
            )
            for c, n, sc in plan
        ]
        found += got
        if any(r is None for r in got):
            waiting.append((run_ckpts, run_tokens, run_positions))
    running = [
        job
        for run_ckpts, _, run_positions in waiting
        for job in [
            jobs.default_queue("evaluate").find(
                jobs.dilution_description(
                    run_ckpts,
                    f"{source}:{doc_id}",
                    run_positions,
                    near,
                    normalizer_cap=cap or None,
                    rope_scaling=scaling,
                )
            )
        ]
        if job is not None
    ]
    if runs and not waiting:
        dfig = plots.dilution_compare_figure(found)
        ui.show_figure(
            dfig,
            f"Document {ui.plain(doc_id)} ({doc.num_tokens - 1:,} bytes), query positions "
            + (f"{', '.join(map(str, dil_positions))} for fireviz checkpoints ([BOS] + bytes)" if own else "")
            + ("; " if own and len(runs) > (1 if ckpts else 0) else "")
            + (
                "for a published model multiples of its own length, in its own tokens"
                if len(runs) > (1 if ckpts else 0)
                else ""
            )
            + "; each point averages 8 query rows."
            + (f" '+ {scaling}': the published RoPE model with that zero-shot scaling." if scaling else "")
            + (f" Dashed: FIRE with its normalizer capped at {cap}." if cap and fire_chosen else ""),
            P,
            "dilution",
        )
        ui.downloads(P, "attention_dilution", lambda dfig=dfig: plots.figure_to_csv(dfig), found)
    elif any(job.status not in jobs.FINISHED for job in running):
        job = next(job for job in running if job.status not in jobs.FINISHED)
        ui.job_panel(job.key, "evaluate", P, cancel_label="Cancel")
    elif runs:
        for job in running:
            if job.status == jobs.ERROR:
                ui.error(f"The dilution measurement failed: {ui.job_error_text(job.error)[0]}")
        if st.button("Measure dilution", key=ui.key(P, "dilution_run")):
            submitted = [
                jobs.submit_dilution(
                    run_ckpts,
                    run_tokens,
                    f"{source}:{doc_id}",
                    run_positions,
                    near,
                    normalizer_cap=cap or None,
                    rope_scaling=scaling,
                )
                for run_ckpts, run_tokens, run_positions in waiting
            ]
            ui.job_panel(submitted[0].key, "evaluate", P, cancel_label="Cancel")
        else:
            st.caption(
                f"Not measured yet for these checkpoints on {ui.plain(doc_id)}: press **Measure dilution** "
                "(seconds per checkpoint on a CPU)."
            )
