"""Training runs: the curves of each checkpoint's train_log.jsonl.

Thin over ``fireviz.checkpoints.read_train_log``/``training_summary_row`` and ``fireviz.plots.training_curves_figure``.
State in the URL: ckpt.
"""
import streamlit as st

from fireviz import checkpoints, plots, ui

P = "train"
ui.setup_page("Training runs")
st.markdown("Training loss (nats per token) against tokens seen, validation loss at the training length and at 4× it "
            "(a first look at length generalization during training), and the learning-rate schedule.")

chosen = ui.checkpoint_picker(P, multi=True, label="Checkpoints", default_count=9)
ui.sync_url(P, ["ckpt"])
if not chosen:
    st.stop()

logs, summary = {}, []
for info in chosen:
    try:
        rows = checkpoints.read_train_log(info.path)
    except ui.CheckpointError as e:
        ui.error(f"Cannot read the training log of {info.name}: {e}", "Fix or remove the bad line of train_log.jsonl.")
        continue
    if not rows:
        st.warning(f"{info.name} has no train_log.jsonl (it was not trained by `python -m fireviz train`).")
        continue
    logs[info.name] = rows
    summary.append(checkpoints.training_summary_row(info, rows))

if logs:
    fig = plots.training_curves_figure(logs)
    ui.show_figure(fig, "Loss in nats per token: train (line), validation at the training length (filled markers) "
                        "and at 4× it (open). The loss axis starts zoomed past the first steps; double-click the "
                        "plot to see all of it.", P, "curves")
    ui.downloads(P, "training_curves", plots.figure_to_csv(fig), plots.figure_data(fig))
    loss = st.column_config.NumberColumn(format="%.4f")
    st.dataframe(summary, hide_index=True, key=ui.key(P, "table"), height=ui.table_height(len(summary)),
                 column_config={"last train loss": loss, "last val loss": loss, "last val loss @ 4×": loss,
                                "tokens": st.column_config.NumberColumn(format="localized"),
                                "tokens/s": st.column_config.NumberColumn(format="%.0f")})
    for info in chosen:
        with st.expander(f"{info.name}: training settings and data provenance"):
            st.json(info.training or {"note": "config.json has no 'training' section"}, expanded=False)
