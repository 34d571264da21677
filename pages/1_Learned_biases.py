"""Learned biases: what each head of a checkpoint learned, at several query positions.

Thin over ``fireviz.analysis.bias_report`` (curves, heatmap matrix, locality) and
``fireviz.plots`` (figures). State in the URL: ckpt, view, layer, head, pos, x, clip.
"""
import streamlit as st

from fireviz import analysis, plots, ui

P = "biases"
ui.setup_page("Learned biases")
st.markdown("Bias b(i, j) in logits (added to q·k/√d) against the distance i − j in tokens, one line per query "
            "position i. FIRE depends on i through its normalizer ψ(max(L, i)), so the curves stretch as i "
            "grows; T5, ALiBi, Kerple and Sandwich do not. A head is **local** when its bias falls with distance, "
            "**anti-local** when it rises.")

chosen = ui.checkpoint_picker(P, multi=True, max_selections=2, label="Checkpoints (one, or two to compare)")
if not chosen:
    st.stop()

first = chosen[0]
sb = st.sidebar
sb.text_input("Query positions i (tokens, comma-separated; empty = m·L − 1 for m = 1, 2, 4, 8)",
              key=ui.url_state(P, "pos", ""))
view = sb.radio("View", ["grid", "head"], key=ui.url_state(P, "view", "grid", options=["grid", "head"]),
                format_func={"grid": "All layers × heads", "head": "One head: curves + heatmap"}.get,
                horizontal=True)
n_layer = max(int(i.config.get("n_layer", 1)) for i in chosen)
n_head = max(int(i.config.get("n_head", 1)) for i in chosen)
layer = sb.selectbox("Layer", list(range(n_layer)), key=ui.url_state(P, "layer", 0, int, options=list(range(n_layer))),
                     disabled=view != "head")
head = sb.selectbox("Head", list(range(n_head)), key=ui.url_state(P, "head", 0, int, options=list(range(n_head))),
                    disabled=view != "head")
x_axis = sb.radio("x axis (one-head view)", ["distance", "normalized"],
                  key=ui.url_state(P, "x", "distance", options=["distance", "normalized"]),
                  format_func={"distance": "distance i − j", "normalized": "FIRE input ψ(i−j)/ψ(max(L,i))"}.get,
                  disabled=view != "head")
clip_options = [0, 5, 20, 100]
clip = sb.selectbox("Heatmap colours (one-head view)", clip_options,
                    key=ui.url_state(P, "clip", 0, int, options=clip_options), disabled=view != "head",
                    format_func=lambda v: f"saturate at |bias| ≥ {v} logits" if v else "full range",
                    help="A learned Kerple-power bias falls to −10⁴…−10⁵ logits far from the diagonal; on the full "
                         "range the keys a query can still attend to are all one colour. Saturating at 20 logits "
                         "(e⁻²⁰ ≈ 2·10⁻⁹ of the weight) shows them, if the grid is fine enough: it has ~128 "
                         "points up to the largest query position, so enter small query positions (e.g. 127 for "
                         "a 1-token grid) to see a band a few tokens wide. Only the colours change, not the numbers.")
ui.sync_url(P, ["ckpt", "pos", "view", "layer", "head", "x", "clip"])

positions = None
text = st.session_state[ui.key(P, "pos")].strip()
if text:
    try:
        positions = analysis.parse_positions(text)
    except ValueError as e:
        ui.error(f"Bad query positions: {e}", "Use comma-separated integers such as 511,4095, or leave it empty.")
        st.stop()

reports = []
# one-head plots side by side; layer × head grids need the full width, so they are stacked
cols = st.columns(len(chosen)) if view == "head" else [st.container() for _ in chosen]
for col, info in zip(cols, chosen):
    with col:
        st.markdown(ui.checkpoint_caption(info))
        try:
            rep = ui.bias_report(info, positions)
        except ui.CheckpointError as e:  # its message names the problem and the fix
            ui.error(f"Cannot compute the biases of {info.name}: {e}")
            continue
        except ValueError as e:
            ui.error(f"Cannot compute the biases of {info.name}: {e}", "Pick other query positions.")
            continue
        reports.append(rep)
        caption = (f"Query positions i = {', '.join(map(str, rep['query_positions']))} tokens; training length "
                   f"{rep['train_seq_len']} tokens (dashed). Bias in logits.")
        if rep["kind"] != "additive":
            fig = plots.bias_grid_figure(rep)
            ui.show_figure(fig, rep.get("note") or caption, P, f"grid_{info.name}")
            ui.downloads(P, f"{info.name}_kernel", plots.figure_to_csv(fig), plots.figure_data(fig))
            continue
        if view == "grid":
            fig = plots.bias_grid_figure(rep)
            ui.show_figure(fig, caption, P, f"grid_{info.name}")
            ui.downloads(P, f"{info.name}_bias_grid", plots.figure_to_csv(fig), plots.figure_data(fig))
            continue
        if layer >= rep["n_layer"] or head >= rep["n_head"]:
            ui.error(f"{info.name} has {rep['n_layer']} layers × {rep['n_head']} heads; layer {layer}, head {head} "
                     "does not exist.", "Pick a smaller layer or head.")
            continue
        use_x = x_axis if (x_axis == "distance" or info.position_encoding in ("fire", "fire_s")) else "distance"
        if use_x != x_axis:
            st.caption(f"{info.position_encoding} is not FIRE: drawn against the distance instead.")
        fig = plots.head_bias_figure(rep, layer, head, x_axis=use_x)
        if use_x == "normalized":
            caption = (f"Query positions i = {', '.join(map(str, rep['query_positions']))} tokens, against FIRE's MLP "
                       "input ψ(i−j)/ψ(max(L, i)): every query's curve lies on f_θ (dotted), squeezed into [0, 1].")
        ui.show_figure(fig, caption, P, f"head_{info.name}")
        ui.downloads(P, f"{info.name}_L{layer}H{head}_curves", plots.figure_to_csv(fig), plots.figure_data(fig))
        hm = plots.bias_heatmap_figure(rep, layer, head, color_limit=clip or None)
        ui.show_figure(hm, "Query × key grid (tokens); blank above the diagonal = future keys (masked).",
                       P, f"heatmap_{info.name}")
        ui.downloads(P, f"{info.name}_L{layer}H{head}_heatmap", plots.figure_to_csv(hm), plots.figure_data(hm))

if reports:
    st.subheader("Locality per head")
    summary = analysis.locality_summary(reports)
    table = analysis.locality_table(reports)
    st.dataframe(ui.locality_summary_rows(summary), hide_index=True, key=ui.key(P, "summary"))
    additive = [r for r in reports if r.get("kind") == "additive"]
    if len(additive) < len(reports):
        st.caption("Rotary (RoPE) checkpoints have a position kernel, not an additive bias, and NoPE has neither: "
                   "their rows show —.")
    if table:
        st.caption(f"Classified at query position i = {additive[0].get('classify_at')} tokens (the smallest query "
                   "position: by default the training length's last query). "
                   f"Rules: {ui.locality_rules_text(analysis.LOCALITY_RULES)}. "
                   "ρ = Spearman correlation of bias with distance; peak_fraction 0 = prefers the nearest key, "
                   "1 = the farthest.")
        st.dataframe(table, hide_index=True, key=ui.key(P, "table"))
        ui.downloads(P, "locality", ui.rows_to_csv(table), {"summary": summary, "heads": table})
    else:
        st.caption("No additive bias in the chosen checkpoint(s), so no locality to classify.")
    with st.expander("Full bias report (JSON)"):
        ui.downloads(P, "bias_report", None, reports)
