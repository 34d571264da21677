"""Training runs: the curves of each checkpoint's train_log.jsonl.

Thin over ``fireviz.checkpoints.catalog.read_train_log``/``training_summary_row`` and ``fireviz.plots.training_curves_figure``.
State in the URL: ckpt, smooth.
"""

import streamlit as st

from fireviz import plots, ui
from fireviz.checkpoints import catalog as checkpoints
from fireviz.checkpoints import records as run_records

P = "train"
ui.setup_page("Training runs")
st.markdown(
    "Training loss (nats per token) against tokens seen, validation loss at the training length and at 4× it "
    "(a first look at length generalization during training), and the learning-rate schedule."
)

chosen = ui.checkpoint_picker(P, multi=True, label="Checkpoints", default_count=9)
smooth_options = [1, 10, 50, 200]
smooth = st.sidebar.selectbox(
    "Training loss: mean over the last … steps",
    smooth_options,
    key=ui.url_state(P, "smooth", run_records.SUMMARY_STEPS, int, options=smooth_options),
    format_func=lambda v: "raw (each batch)" if v == 1 else f"{v} steps",
    help="One batch's loss swings by ±0.1 nats at the end of a reference run, more than "
    "the runs differ; a trailing mean shows the trend. Validation is never smoothed.",
)
ui.sync_url(P, ["ckpt", "smooth"])
if not chosen:
    st.stop()

logs, summary = {}, []
for info in chosen:
    try:
        rows = checkpoints.read_train_log(info.path)
    except ui.CheckpointError as e:
        ui.error(
            f"Cannot read the training log of {info.name}: {e}",
            "Fix or remove the bad line of its train_log.jsonl (or train_log.jsonl.gz).",
        )
        continue
    if not rows:
        st.warning(
            f"{ui.plain(info.name)} has no train_log.jsonl or train_log.jsonl.gz (it was not trained by "
            "`python -m fireviz train`)."
        )
        continue
    logs[info.name] = rows
    summary.append(run_records.training_summary_row(info, rows, last_steps=smooth))

if logs:
    fig = plots.training_curves_figure(logs, smooth=smooth)
    ui.show_figure(
        fig,
        "Loss in nats per token: train (line"
        + (f", trailing mean over {smooth} steps" if smooth > 1 else ", each batch")
        + "), validation at the training length (filled markers) "
        "and at 4× it (open). The loss axis starts zoomed past the first steps; double-click the "
        "plot to see all of it.",
        P,
        "curves",
    )
    ui.figure_table_downloads(P, "training_curves", fig)
    VAL_HELP = (
        "validation during training: the first windows of the validation documents (each document's "
        "start, BOS first, then the next window of each), a fixed set; a document's start has the least "
        "context, so this reads higher than random windows or the training loss — it is not overfitting"
    )
    st.caption(
        "Validation loss here is the trainer's fixed set: document starts first (see the column help), so it "
        "sits above the training loss and above the Length generalization page's numbers at the same "
        "length; compare it between runs, not with those. Runs trained with this fireviz also log the loss "
        "on windows drawn at random positions (the last column), which reads like the evaluation."
    )
    span = "last step" if smooth == 1 else f"last {smooth} steps"
    filled = [c for c in dict.fromkeys(k for r in summary for k in r) if any(r.get(c) is not None for r in summary)]
    st.dataframe(
        summary,
        hide_index=True,
        key=ui.key(P, "table"),
        height=ui.table_height(len(summary)),
        column_order=filled,
        column_config={
            f"train loss ({span})": st.column_config.NumberColumn(
                format="%.4f",
                help="mean training loss over the same steps as the figure's "
                "trailing mean: one batch's loss is too noisy to compare runs",
            ),
            "last val loss": st.column_config.NumberColumn(format="%.4f", help=VAL_HELP),
            "last val loss @ 4×": st.column_config.NumberColumn(format="%.4f", help=VAL_HELP),
            "last val loss (random windows)": st.column_config.NumberColumn(
                format="%.4f",
                help="the same model on windows drawn at random positions of the "
                "validation documents, like the evaluation's (runs trained "
                "with this fireviz log it as val_loss_random)",
            ),
            "tokens": st.column_config.NumberColumn(format="localized"),
            f"tokens/s (median, {span})": st.column_config.NumberColumn(
                format="%.0f", help="throughput of the machine the run last ran on"
            ),
        },
    )
    st.subheader("Learned position parameters")
    try:
        pfig = plots.position_parameters_figure(logs)
    except ValueError:
        st.caption(
            "None of these runs logged position parameters: FIRE's c and L and Kerple's r1, r2 are "
            "recorded at every validation point by runs trained with this version of fireviz."
        )
    else:
        ui.show_figure(
            pfig,
            "The values the forward pass uses (Kerple's after its constraints r ≥ 0.01, "
            "r2 ≤ 2 for the power variant), per layer and head, at every validation point.",
            P,
            "position_parameters",
        )
        ui.figure_table_downloads(P, "position_parameters", pfig)
    for info in chosen:
        with st.expander(f"{ui.plain(info.name)}: training settings and data provenance"):
            st.json(info.training or {"note": "config.json has no 'training' section"}, expanded=False)
