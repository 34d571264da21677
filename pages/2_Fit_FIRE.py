"""Fit FIRE: Theorem 3.1 made numerical — FIRE imitating T5, ALiBi, Kerple, Sandwich or a checkpoint.

Thin over ``fireviz.fit.fitting`` (the sidebar is the arguments of ``fit.FitSettings.make``; the fit
runs through ``fireviz.ui.jobs.submit_fit``) and ``fireviz.plots.fit_figure``. State in the URL:
target, heads, width, max_len, steps, seed and the target's parameters.
"""

import json
import tempfile
import time
from pathlib import Path

import streamlit as st

from fireviz import plots, ui
from fireviz.encodings import encoding_spec
from fireviz.fit import fitting as fit
from fireviz.fit import targets as fit_targets
from fireviz.ui import jobs

P = "fit"
ui.setup_page("Fit FIRE")
st.markdown(
    "Theorem 3.1 of the FIRE paper: with the threshold L at least the fitted range, every query in the range "
    "shares FIRE's normalizer, so FIRE is a function of the distance alone there and can match T5, ALiBi, "
    "Kerple or Sandwich. Beyond the range FIRE's normalizer grows with the query position (progressive "
    "interpolation) while the target keeps its own formula: the plot shows both."
)

TARGETS = list(fit_targets.target_names())
#: the URL keys of every target's parameters (each spec's FitParam.key), kept in step with the widgets
PARAM_KEYS = list(dict.fromkeys(p.key for t in TARGETS if t != "checkpoint" for p in fit_targets.target_fit_params(t)))


def label(name: str) -> str:
    """A target's name in words: its spec's summary (the checkpoint target is no encoding)."""
    return "a checkpoint's own bias" if name == "checkpoint" else encoding_spec(name).summary or name


left, right = st.columns([1, 2])
with left:
    target = st.selectbox(
        "Target",
        TARGETS,
        key=ui.url_state(P, "target", "alibi", options=TARGETS),
        format_func=label,
    )
    params: dict = {}
    num_heads = None
    if target != "checkpoint":
        num_heads = st.number_input("Heads", 1, 16, key=ui.url_state(P, "heads", 4, int, lo=1, hi=16))
        for param in fit_targets.target_fit_params(target):  # one widget per parameter of the target's spec
            value = ui.fit_param_input(P, param)
            if value is not None:
                params[param.name] = value
    else:
        found, _ = ui.list_checkpoints()
        toeplitz = [i for i in found if i.position_encoding in fit_targets.fittable_encodings()]
        pub = st.text_input(
            "…or a published model: Hugging Face repo id or folder (T5 family, ALiBi)",
            key=ui.url_state(P, "pub", ""),
            placeholder="google-t5/t5-small",
            help="Its bias table is read from the Hub (only those bytes) or the folder.",
        ).strip()
        info = None
        if pub:
            try:
                info = ui.resolve(pub)
            except ui.CheckpointError as e:
                ui.error(f"Cannot use {pub}: {e}")
                st.stop()
            if info.position_encoding not in fit_targets.fittable_encodings():
                ui.error(
                    f"{pub} has a {info.position_encoding} position encoding, not an additive bias that depends "
                    "on the distance only.",
                    "Pick a T5-family or ALiBi model.",
                )
                st.stop()
            st.caption(ui.checkpoint_caption(info))
        elif not toeplitz:
            ui.error(
                "No checkpoint with a T5, ALiBi, Kerple or Sandwich bias was found.",
                f"Train one ({ui.ck.TRAIN_HINT}), give a published model above, or pick another target.",
            )
            st.stop()
        else:
            names = [i.name for i in toeplitz]
            name = st.selectbox("Checkpoint", names, key=ui.url_state(P, "ckpt", names[0], options=names))
            info = toeplitz[names.index(name)]
        n_layer = int(info.config.get("n_layer", 1))
        lay = st.selectbox(
            "Layer", list(range(n_layer)), key=ui.url_state(P, "layer", 0, int, options=list(range(n_layer)))
        )
        params = {"path": info.path, "layer": int(lay)}
        if info.config.get("stack"):
            params["stack"] = st.radio(
                "Stack",
                ["decoder", "encoder"],
                horizontal=True,
                key=ui.url_state(P, "stack", "decoder", options=["decoder", "encoder"]),
                help="The encoder's bias is bidirectional: FIRE is fitted to its keys before the query.",
            )
    width = st.number_input("FIRE MLP width", 2, 256, key=ui.url_state(P, "width", 32, int, lo=2, hi=256))
    max_len = st.number_input(
        "Fitted range max_len (tokens)", 2, 4096, key=ui.url_state(P, "max_len", 128, int, lo=2, hi=4096)
    )
    steps = st.number_input("Optimisation steps", 0, 5000, key=ui.url_state(P, "steps", 200, int, lo=0, hi=5000))
    seed = st.number_input("Seed", 0, 10**6, key=ui.url_state(P, "seed", 0, int, lo=0))
    ui.sync_url(
        P,
        [
            "target",
            "heads",
            *PARAM_KEYS,
            "ckpt",
            "pub",
            "stack",
            "layer",
            "width",
            "max_len",
            "steps",
            "seed",
        ],
    )
    go = st.button("Fit", type="primary", key=ui.key(P, "go"))

q = jobs.default_queue("fit")
job_key = st.session_state.get(ui.key(P, "job"))
# the fit the sidebar asks for: the arguments of fit.FitSettings.make, which jobs.submit_fit and
# find_fit take by the same names (the job validates them and keys itself on the settings)
request = {
    "target": target,
    "target_params": params,
    "max_len": int(max_len),
    "num_heads": None if target == "checkpoint" else int(num_heads),
    "mlp_width": int(width),
    "steps": int(steps),
    "seed": int(seed),
}
asked = json.dumps(request, sort_keys=True, default=str)  # to tell when the fit on show is of other settings
if go:
    clicked = time.time()
    try:
        job = jobs.submit_fit(**request)
    except (ValueError, ui.CheckpointError) as e:
        with right:
            ui.error(f"Cannot fit this target: {e}", "Change the parameter named above.")
        st.stop()
    st.session_state[ui.key(P, "job")] = job_key = job.key
    st.session_state[ui.key(P, "asked")] = asked
    # the same fit finished earlier in this process: its result is reused, not recomputed
    st.session_state[ui.key(P, "cached")] = job.status == jobs.DONE and (job.finished or clicked) < clicked

job = q.get(job_key) if job_key else None
if job is None:  # a shared link or a new tab: the same fit on this server is shown at once, running or finished
    try:
        found = jobs.find_fit(**request)
    except (ValueError, ui.CheckpointError):
        found = None
    if found is not None:
        job = found
        st.session_state[ui.key(P, "job")] = found.key
        st.session_state[ui.key(P, "asked")] = asked
        st.session_state[ui.key(P, "cached")] = found.status in jobs.FINISHED
with right:
    if job is None:
        st.info(
            f"Pick a target and press **Fit**: {int(steps)} optimisation steps on distances 0–{int(max_len) - 1} "
            "tokens, run in the background with a progress bar (you can stop it early)."
        )
        st.stop()
    snap = job.snapshot()
    if snap["status"] not in jobs.FINISHED:
        ui.job_panel(job.key, "fit", P, cancel_label="Stop")
        st.stop()
    if snap["status"] == jobs.ERROR:
        ui.error(f"The fit failed: {snap['error']}", "Change the settings and fit again.")
        st.stop()
    res = snap["result"]
    if res is None:
        st.warning("The fit was stopped before it started. Press **Fit** again.")
        st.stop()
    d = res.to_dict()
    if st.session_state.get(ui.key(P, "asked")) not in (None, asked):
        st.info(
            f"Showing the last fit ({label(res.target.name)}); the settings have changed since. "
            "Press **Fit** to fit them."
        )
    if res.stopped:
        st.warning(f"Stopped after {res.steps_run} of {res.steps} steps: the best parameters so far are shown.")
    # two by two: four metrics in a row cut their values ("1.7…") at 1024 px (issue #48)
    m = [c for _ in range(2) for c in st.columns(2)]
    cached = st.session_state.get(ui.key(P, "cached")) or getattr(res, "cached", False)
    m[0].metric(
        "relative RMSE",
        ui.percent(res.relative_rmse),
        help=f"RMSE / std of the target over all pairs 0 ≤ j ≤ i < {res.max_len} (the fitted range): "
        f"{100 * res.relative_rmse:.3g}%",
    )
    m[1].metric(
        "max |error| (logits)",
        f"{res.max_abs_error:.2g}",
        help=f"largest error over the fitted range: {res.max_abs_error:.3g} logits",
    )
    m[2].metric(
        f"rel. RMSE to {fit.BEYOND_FACTOR}×",
        ui.percent(res.relative_rmse_beyond),
        help=f"relative RMSE over queries {res.max_len} ≤ i < {fit.BEYOND_FACTOR * res.max_len} (extrapolation)",
    )
    m[3].metric(
        "fit time",
        "cached" if cached else f"{res.seconds:.1f} s",
        help="the result of the same fit earlier in this session's server" if cached else None,
    )
    heads = list(range(res.target.num_heads))
    h = st.selectbox("Head", heads, key=ui.url_state(P, "head", 0, int, options=heads))
    ui.sync_url(P, ["head"])
    name = f"{label(res.target.name)} · width {res.mlp_width} · c = {res.c:.3g}"
    inside = {**d["inside"], "max_len": res.max_len, "name": f"{name} · fitted range", "target_name": res.target.name}
    beyond = {
        **d["beyond"],
        "max_len": res.max_len,
        "name": f"{name} · query i = {res.beyond_query}",
        "target_name": res.target.name,
    }
    tab_in, tab_out = st.tabs(["Inside the fitted range", f"Beyond: query at {fit.BEYOND_FACTOR}× the range"])
    shown_params = {k: v for k, v in res.target.params.items() if not k.endswith("_sha256")}  # identity: in the JSON
    caption = (
        f"Target {label(res.target.name)} ({ui.format_params(shown_params)}); fitted on all pairs "
        f"0 ≤ j ≤ i < {res.max_len} tokens (distances 0–{res.max_len - 1}), {res.steps_run} steps, seed "
        f"{res.seed}, learning rate {res.lr:g}. Residual = target − FIRE (logits)."
    )
    with tab_in:
        fig_in = plots.fit_figure(inside, head=h)
        ui.show_figure(fig_in, caption + " Inside the range FIRE depends on i − j only.", P, "fit_inside")
    with tab_out:
        fig_out = plots.fit_figure(beyond, head=h)
        ui.show_figure(
            fig_out,
            caption + f" Here the query sits at i = {res.beyond_query}: FIRE's normalizer is "
            "ψ(i), so its curve is the fitted one stretched over the longer context.",
            P,
            "fit_beyond",
        )
    stem = ui.fit_file_stem(res.target.name, res.target.params, res.max_len)
    with tempfile.TemporaryDirectory() as tmp:
        weights = res.save(Path(tmp) / f"{stem}.safetensors").read_bytes()
    ui.downloads(
        P,
        stem,
        lambda fig_out=fig_out: plots.figure_to_csv(fig_out),
        d,
        extra={f"{stem}.safetensors": (weights, "application/octet-stream")},
    )
    st.caption(
        f"{stem}.safetensors loads with `fireviz.fit.result.load_fitted_fire(path)`; the JSON holds every number "
        "(metrics per head, loss curve, both curves); the CSV the curves of the 'beyond' plot."
    )
