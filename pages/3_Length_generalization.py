"""Length generalization: perplexity of checkpoints at evaluation lengths beyond training.

Thin over ``fireviz.eval.evaluate.evaluate_many``, run in the background by
``fireviz.ui.jobs.submit_evaluation`` through ``ui.evaluation_jobs`` (one job at a time, FIFO,
never the same job twice; results cached on disk by evaluate; what is already cached shows
without a run, ``fireviz.eval.evaluate.cached_results``), and ``fireviz.plots`` (perplexity vs
length, loss by position). Protocol "context use" (mode ``context``) draws bits per byte of fixed
targets against the context length c beside the same-text curve (``context_use_view``).
State in the URL: group, ckpt, domain, len, mode, stride, budget, docs, seqs, seed, scaling, cap, ref, pool, device
(with a GPU); in context use also ctx (context lengths), ctxm (M), ctxk (K), cstride (s).
"""

import streamlit as st

from fireviz import plots, ui
from fireviz.checkpoints import catalog, seed_base, seed_groups
from fireviz.data import DOMAINS, DataError, synthetic
from fireviz.eval import (
    DEFAULT_CONTEXT_LENGTHS,
    DEFAULT_CONTEXT_PREFIX,
    DEFAULT_CONTEXT_STRIDE,
    DEFAULT_CONTEXT_TARGETS,
    FULL_CONTEXT,
    evaluate,
)

P = "lengen"
#: what each protocol answers: one sentence under its curve
SAME_TEXT_ANSWERS = "Same text: how the score of a text changes when it is cut into windows of n tokens."
CONTEXT_ANSWERS = "Context use: how the score of fixed targets changes with c tokens of context before them."


def context_inputs() -> tuple[dict, list]:
    """The sidebar's context-use settings (URL ctxm, ctxk, cstride, ctx): ``(evaluate settings of mode
    context, context lengths c)``, ``"full"`` standing for M − K. Lengths that do not fit M are
    refused by the settings with their reason (shown by ``ui.evaluation_jobs``)."""
    sb = st.sidebar
    big = 1 << 20
    M = sb.number_input(
        "Prefix M (tokens): the targets are the last K of each document's first M",
        3,
        big,
        key=ui.url_state(P, "ctxm", DEFAULT_CONTEXT_PREFIX, int, lo=3, hi=big),
        help="Only documents holding M tokens are scored; full context = M − K.",
    )
    K = sb.number_input(
        "Targets per document K", 1, big, key=ui.url_state(P, "ctxk", DEFAULT_CONTEXT_TARGETS, int, lo=1, hi=big)
    )
    s = sb.number_input(
        "Targets per window s",
        1,
        1 << 16,
        key=ui.url_state(P, "cstride", DEFAULT_CONTEXT_STRIDE, int, lo=1, hi=1 << 16),
        help="Each window of c + s tokens scores only its last s positions: every target sees c … c + s − 1 "
        "tokens before it.",
    )
    options = [str(2**k) for k in range(2, 21)] + [FULL_CONTEXT]
    default = [str(n) for n in DEFAULT_CONTEXT_LENGTHS] + [FULL_CONTEXT]
    picked = sb.multiselect(
        "Context lengths c (tokens before each target; full = M − K, the whole prefix)",
        options,
        key=ui.url_state(P, "ctx", default, options=options, multi=True),
    )
    settings = {"mode": "context", "stride": int(s), "prefix_tokens": int(M), "context_targets": int(K)}
    return settings, [x if x == FULL_CONTEXT else int(x) for x in picked]


def context_window(settings: dict, c) -> int:
    """Tokens per window at context length ``c`` (M for full, else c + s): what FIRE's cap sees."""
    M, K, s = settings["prefix_tokens"], settings["context_targets"], settings["stride"]
    return M if c in (FULL_CONTEXT, M - K) else c + s


def context_rows(ctx: list[dict]) -> list[dict]:
    """The context-use table: per checkpoint and context length, bits per byte, minus full context and
    minus the reference checkpoint, each with its 95 % interval over documents."""
    rows = []
    for r in ctx:
        full = r["settings"].get("full_context")
        for e in r["per_length"]:
            ci, fci, pci = (e.get(k) or [None, None] for k in ("ci95", "full_ci95", "paired_ci95"))
            rows.append(
                {
                    "checkpoint": r.get("label") or r["checkpoint"],
                    "context": f"{FULL_CONTEXT} ({full})" if e["length"] == full else str(e["length"]),
                    "bits_per_byte": e["bits_per_byte"],
                    "ci95_low": ci[0],
                    "ci95_high": ci[1],
                    "minus_full": e.get("full_delta_bpb"),
                    "minus_full_low": fci[0],
                    "minus_full_high": fci[1],
                    "minus_reference": e.get("paired_delta_bpb"),
                    "minus_reference_low": pci[0],
                    "minus_reference_high": pci[1],
                    "documents": e.get("documents"),
                    "tokens_scored": e.get("tokens_scored"),
                }
            )
    return rows


def context_table(ctx: list[dict]) -> None:
    """The context-use table with its downloads."""
    rows = context_rows(ctx)
    ref = next((e["paired_reference"] for r in ctx for e in r["per_length"] if e.get("paired_reference")), "reference")
    bpb = {"format": "%.4f"}
    delta = {"format": "%+.4f"}
    st.dataframe(
        rows,
        hide_index=True,
        key=ui.key(P, "context_table"),
        height=ui.table_height(len(rows)),
        column_config={
            "context": st.column_config.TextColumn("context c (tokens)"),
            "bits_per_byte": st.column_config.NumberColumn("bits per byte", **bpb),
            "ci95_low": st.column_config.NumberColumn("95 % low", **bpb),
            "ci95_high": st.column_config.NumberColumn("95 % high", **bpb),
            "minus_full": st.column_config.NumberColumn(
                "− full",
                help="bits per byte at c minus at full context, same targets (above 0: more context helps)",
                **delta,
            ),
            "minus_full_low": st.column_config.NumberColumn("− full 95 % low", **delta),
            "minus_full_high": st.column_config.NumberColumn("− full 95 % high", **delta),
            "minus_reference": st.column_config.NumberColumn(f"− {ref}", help="paired, same targets", **delta),
            "minus_reference_low": st.column_config.NumberColumn(f"− {ref} 95 % low", **delta),
            "minus_reference_high": st.column_config.NumberColumn(f"− {ref} 95 % high", **delta),
            "tokens_scored": st.column_config.NumberColumn("targets scored"),
        },
    )
    ui.downloads(P, "context_use", ui.rows_to_csv(rows), rows)


def curve_or_note(results: list[dict], figure, sentence: str, name: str) -> None:
    """One protocol's curve with the one sentence saying what it answers, or a note to press Run."""
    if results:
        ui.show_figure(figure(results), sentence, P, name)
    else:
        st.info(f"{sentence} Not computed yet for these settings: press **Run**.")


def paired_section(shown: list[dict], caption: str) -> None:
    """Paired differences against a chosen reference (URL ref) on the same windows: figure and table."""
    st.subheader("Paired differences (every checkpoint on the same windows)")
    labels = list(dict.fromkeys(r.get("label") or r["checkpoint"] for r in shown))
    if len(labels) < 2:
        st.caption("Choose two or more checkpoints to compare them on the same documents.")
    else:
        ref = st.selectbox(
            "Reference",
            labels,
            key=ui.url_state(P, "ref", labels[0], options=labels),
            help="Every other checkpoint's bits per byte minus this one's, on the same documents.",
        )
        ui.sync_url(P, ["ref"])  # after its widget: the first sync would drop a ?ref= it cannot see yet
        paired = plots.paired_difference_rows(shown, reference=ref)
        if not paired:
            st.caption(
                "These results carry no per-document losses (computed by an older fireviz, or on other "
                "windows): press Run to compute them."
            )
        else:
            pfig = plots.paired_difference_figure(shown, reference=ref)
            ui.show_figure(
                pfig,
                caption + f" Bits per byte minus {ref}'s on the same documents and tokens; error bars: "
                "95 % paired bootstrap interval over documents (documents resampled for both at once, so the "
                "text's difficulty cancels). An interval that excludes 0 is a difference this text resolves.",
                P,
                "paired",
            )
            ui.downloads(P, "paired_differences", plots.figure_to_csv(pfig), paired)
            st.dataframe(
                paired,
                hide_index=True,
                key=ui.key(P, "paired_table"),
                height=ui.table_height(len(paired)),
                column_config={
                    "group": "checkpoint",
                    "length": st.column_config.NumberColumn("length (tokens)"),
                    "paired_delta_bpb": st.column_config.NumberColumn("Δ bits per byte", format="%+.4f"),
                    "ci95_low": st.column_config.NumberColumn("95 % low", format="%+.4f"),
                    "ci95_high": st.column_config.NumberColumn("95 % high", format="%+.4f"),
                },
            )


def context_use_view(clean: list[dict]) -> None:
    """Protocol "context use": its curve beside the same-text curve (one sentence under each), the
    settings of both, the context-use table and the paired differences on the context-use targets."""
    same = [r for r in clean if r["settings"].get("mode") == "same_text"]
    ctx = [r for r in clean if r["settings"].get("mode") == "context"]
    left, right = st.columns(2)
    with left:
        curve_or_note(same, plots.perplexity_figure, SAME_TEXT_ANSWERS, "ppl")
    with right:
        curve_or_note(ctx, plots.context_use_figure, CONTEXT_ANSWERS, "context")
    for group in (same, ctx):
        if group:
            st.caption(ui.eval_caption(group))
    if ctx:
        st.subheader("Context use: the same targets at every context length")
        context_table(ctx)
        paired_section(ctx, ui.eval_caption(ctx))


ui.setup_page("Length generalization")
st.markdown(
    "Perplexity at evaluation lengths up to many times the training length. By default every length scores "
    "**the same text** — the first M tokens (M = the largest length) of every document that long, cut into "
    "windows of each length — so a change along a line is the effect of the window length alone (more "
    "context, but also fewer targets near a window start; Protocol → *context use* separates the two). Every checkpoint "
    "sees the same windows, so differences between checkpoints are paired (with their own, much narrower "
    "intervals below). Runs go on in the background: reload the page or open a second tab and you find "
    "the run there, never started twice."
)

chosen = ui.checkpoint_picker(P, multi=True, label="Checkpoints", default_count=9)
if not chosen:
    st.stop()

sb = st.sidebar
TASKS = [synthetic.PREFIX + t for t in synthetic.TASKS]
DATA_OPTIONS = list(DOMAINS) + TASKS + ["upload"]
trained_on = {i.data for i in chosen}  # default: the chosen checkpoints' own training data, when they share it
default_domain = next(iter(trained_on)) if len(trained_on) == 1 and next(iter(trained_on)) in DATA_OPTIONS else "prose"
domain = sb.selectbox(
    "Data",
    DATA_OPTIONS,
    key=ui.url_state(P, "domain", default_domain, options=DATA_OPTIONS),
    format_func=lambda d: (
        "your own file (.txt / .jsonl)"
        if d == "upload"
        else (f"{d} (synthetic task: answer accuracy)" if d in TASKS else d)
    ),
)
data, split = domain, "validation"
is_task = domain in TASKS
if domain == "upload":
    up = sb.file_uploader(
        'Text or JSONL file (one {"text": …} object per line)', type=ui.UPLOAD_TYPES, key=ui.key(P, "upload")
    )
    if up is None:
        st.info("Upload a .txt or .jsonl file in the sidebar to evaluate on it (all of it is used: split 'all').")
        st.stop()
    try:
        data = str(ui.save_upload(up.name, up.getvalue()))
    except DataError as e:
        ui.error(
            f"Cannot use the uploaded file {up.name}: {e}",
            "Upload UTF-8 text (.txt), or JSONL with one object per line holding a string 'text' field.",
        )
        st.stop()
    split = "all"

train_lens = sorted({i.seq_len for i in chosen})
MAX_LENGTH = 1 << 20
# any length the URL or the user asks for (1536, 3000 …), besides powers of two and the training lengths
from_url = ui.int_values(st.query_params.get_all("len"), 2, MAX_LENGTH)
if st.query_params.get_all("len") and st.query_params.get_all("len") != [str(n) for n in from_url]:
    st.query_params["len"] = [str(n) for n in from_url]  # a stale or hand-edited link: keep its good lengths
asked = set(from_url)
asked |= set(st.session_state.get(ui.key(P, "typed_lengths"), []))
options = sorted({2**k for k in range(2, 21)} | set(train_lens) | asked)
pending = st.session_state.pop(ui.key(P, "len_pending"), None)
if pending is not None:  # typed lengths, converted to ints on the previous run
    st.session_state[ui.key(P, "len")] = pending
# a quarter of the shortest to 16× the longest training length, the lengths the bundled results are published
# at (128…8192 for 512): every checkpoint is shown extrapolating, and the same-text prefix (the largest length)
# is the published one, so its numbers appear without a run
default_lens = [
    n
    for n in sorted({2**k for k in range(2, 21)} | set(train_lens))
    if max(2, train_lens[0] // 4) <= n <= 16 * train_lens[-1]
]
picked = sb.multiselect(
    "Evaluation lengths (tokens; type any other length and press Enter)",
    options,
    key=ui.url_state(P, "len", default_lens, int, options=options, multi=True),
    accept_new_options=True,
)
lengths, bad = ui.parse_lengths(picked, 2, MAX_LENGTH)
if bad:
    sb.error(
        f"Not a length: {', '.join(map(str, bad))}. A length is a whole number of tokens from 2 to {MAX_LENGTH:,}."
    )
new_typed = [n for n in lengths if n not in options]
if new_typed:  # typed in: keep it as an option for the rest of the session, in the widget as an int
    st.session_state[ui.key(P, "typed_lengths")] = sorted(
        set(st.session_state.get(ui.key(P, "typed_lengths"), []) + new_typed)
    )
    st.session_state[ui.key(P, "len_pending")] = lengths
    st.rerun()
MODE_NAMES = {
    "same_text": "same text at every length",
    "nonoverlapping": "random windows per length",
    "sliding": "sliding window",
    "context": "context use (fixed targets, more context)",
}
mode = (
    evaluate.DEFAULT_MODE
    if is_task
    else sb.radio(
        "Protocol",
        list(evaluate.MODES),
        format_func=MODE_NAMES.get,
        key=ui.url_state(P, "mode", evaluate.DEFAULT_MODE, options=list(evaluate.MODES)),
        help="Same text: one fixed set of tokens (each qualifying document's first M tokens) at every "
        "length — the published protocol. Random windows: each length draws its own windows under a "
        "token budget, so columns score different text. Sliding: overlapping windows with a stride. "
        "Context use: fixed targets (the last K of each document's first M tokens) scored with c tokens "
        "of context at every context length c, drawn beside the same-text curve.",
    )
)
stride = None
context_settings, context_lengths = context_inputs() if mode == "context" else ({}, [])
if mode == "sliding":
    # default: half the training length, but never more than the smallest chosen length
    stride = int(
        sb.number_input(
            "Stride (tokens; at most the smallest length)",
            1,
            1 << 16,
            key=ui.url_state(P, "stride", max(1, min([train_lens[0] // 2, *lengths])), int, lo=1, hi=1 << 16),
        )
    )
if is_task:  # fresh task sequences of each length, the same for every checkpoint; only answers are scored
    budget = int(
        sb.number_input(
            "Sequences per length",
            1,
            1 << 16,
            key=ui.url_state(P, "seqs", evaluate.SYNTHETIC_SEQUENCES, int, lo=1, hi=1 << 16),
            help=f"{evaluate.SYNTHETIC_SEQUENCES} reproduces the published numbers of the task's checkpoint group.",
        )
    )
elif mode in ("same_text", "context"):
    docs_limit = int(
        sb.number_input(
            "Documents (0 = every document holding the largest length)",
            0,
            10**6,
            key=ui.url_state(P, "docs", 0, int, lo=0, hi=10**6),
            help="A smaller number is quicker: that many documents, drawn with the seed "
            "below, each scored on its first M tokens at every length.",
        )
    )
    budget = None if docs_limit == 0 else docs_limit * (max(lengths, default=2) - 1)
else:
    budget = int(
        sb.number_input(
            "Token budget per length (targets scored)",
            256,
            1 << 22,
            step=4096,
            key=ui.url_state(P, "budget", 16384, int, lo=256, hi=1 << 22),
        )
    )
seed = (
    0
    if is_task
    else int(
        sb.number_input(
            "Seed (windows drawn; in same-text mode the documents, when fewer than all)",
            0,
            10**6,
            key=ui.url_state(P, "seed", 0, int, lo=0),
        )
    )
)
if mode in ("same_text", "context") and budget is None:
    seed = 0  # every qualifying document is scored: nothing is drawn (the library refuses another seed)
rope = [i for i in chosen if i.position_encoding == "rope"]
scalings = []
if rope:
    scalings = sb.multiselect(
        "Also RoPE checkpoints with zero-shot scaling",
        list(evaluate.ROPE_SCALINGS),
        key=ui.url_state(P, "scaling", [], options=list(evaluate.ROPE_SCALINGS), multi=True),
        format_func={"pi": "position interpolation (PI)", "yarn": "YaRN"}.get,
    )
fires, cap = ui.normalizer_cap_input(
    P,
    chosen,
    "Also FIRE with its normalizer capped at (tokens; 0 = off)",
    help="ψ(min(max(L, i), N)): queries beyond N are normalized as if at N, so FIRE's input for a distance stays "
    "what it was in training. Drawn beside the plain rows; N = the training length is the natural choice.",
)
pool = False
bases = [seed_base(i.name) for i in chosen]
if any(bases.count(b) > 1 for b in bases):  # two or more training seeds of one encoding chosen
    pool = sb.checkbox(
        "Pool training seeds (mean ± std)",
        key=ui.url_state(P, "pool", False, bool),
        help="Draw fire and fire_seed1, fire_seed2 … as one line: the mean over seeds, with "
        "± one sample standard deviation as error bars.",
    )
elif extra := seed_groups(i.name for i in ui.list_checkpoints()[0]):
    sb.caption(
        "Also trained with other seeds: "
        + "; ".join(", ".join(g) for g in extra.values())
        + ". Choose two or more runs of one encoding to pool them (mean ± std)."
    )
devices = ["cuda", "cpu"] if catalog.default_device() == "cuda" else ["cpu"]  # looked up now (tests patch it)
device = devices[0]
if len(devices) > 1:  # the bundled numbers are float32 on CPU; bf16 on a GPU gives (slightly) other ones
    device = sb.radio(
        "Device",
        devices,
        key=ui.url_state(P, "device", devices[0], options=devices),
        horizontal=True,
        format_func={"cuda": "GPU (bf16 autocast)", "cpu": "CPU (float32)"}.get,
        help="The bundled checkpoints' published numbers were computed on CPU in float32: choose "
        "CPU to see them without running anything. Precision is part of every cached result.",
    )
ui.sync_url(
    P,
    ["ckpt", "domain", "len", "mode", "stride", "budget", "docs", "seqs", "seed", "scaling", "cap", "pool", "device"]
    + ["ctx", "ctxm", "ctxk", "cstride"],
)
if not lengths:
    st.info("Pick at least one evaluation length in the sidebar.")
    st.stop()


def protocol_specs(settings: dict, lens: list, window=lambda n: n) -> list[tuple]:
    """The evaluations of one protocol: the chosen checkpoints, the RoPE ones per zero-shot scaling, and
    the FIRE ones capped at the lengths whose windows (``window(n)`` tokens) pass the cap (at or below
    it FIRE is the plain FIRE, and identical rows would hide the plain ones)."""
    out = [([i.path for i in chosen], {**settings, "rope_scaling": None}, "", lens)]
    out += [([i.path for i in rope], {**settings, "rope_scaling": s}, f" + {s}", lens) for s in scalings]
    capped = [n for n in lens if window(n) > cap]
    if cap and capped:
        out.append(
            ([i.path for i in fires], {**settings, "rope_scaling": None, "normalizer_cap": cap}, f" cap {cap}", capped)
        )
    return out


settings = {"mode": mode, "stride": stride, "token_budget": budget, "seed": seed, "split": split, "device": device}
if mode == "context":  # the context-use curve, and beside it the same text at the lengths chosen above
    per_doc = context_settings["context_targets"]
    context_budget = None if budget is None else docs_limit * per_doc  # that many documents here too
    specs = protocol_specs({**settings, "mode": "same_text"}, lengths)
    specs += protocol_specs(
        {**settings, **context_settings, "token_budget": context_budget},
        context_lengths,
        lambda c: context_window(context_settings, c),
    )
else:
    specs = protocol_specs(settings, lengths)
capped_lengths = [n for n in lengths if n > cap]  # at or below the cap FIRE is the plain FIRE
if cap and not capped_lengths:
    sb.caption(f"The cap changes FIRE only at lengths beyond {cap} tokens: choose a longer length to see capped rows.")

c1, c2 = st.columns([1, 5])
run = c1.button("Run", type="primary", key=ui.key(P, "run"))
c2.caption(
    f"{len(chosen)} checkpoint(s) × {len(lengths)} length(s) on {device}"
    + (f", plus {len(rope)} RoPE checkpoint(s) × {', '.join(scalings)}" if scalings else "")
    + (f", plus {len(fires)} FIRE checkpoint(s) with the normalizer capped at {cap}" if cap else "")
    + (f"; context use at {len(context_lengths)} context length(s)" if mode == "context" else "")
    + ". Finished lengths are cached on disk and reused."
)

results, pending = ui.evaluation_jobs(P, specs, data, lengths, run)
missing = sorted({e["length"] for r in results for e in r.get("per_length", []) if e.get("not_computed")})
if missing and not pending and any("error" not in e for r in results for e in r.get("per_length", [])):
    st.info(
        f"Not computed yet at {', '.join(map(str, missing))} tokens: press **Run** to add "
        f"{'it' if len(missing) == 1 else 'them'} (the lengths drawn are cached)."
    )
if not any("error" not in e for r in results for e in r.get("per_length", [])):
    if not pending:
        st.info(
            "These settings have not been evaluated yet. Press **Run**."
            + (
                " (The bundled checkpoints' published numbers are CPU float32 ones: choose Device → CPU in the "
                "sidebar to see them at once.)"
                if device == "cuda"
                else ""
            )
            + (
                " The bundled checkpoints' numbers are published for the same-text protocol with every "
                "document at 128…8192 tokens (prose, LaTeX, code; RoPE also with PI and YaRN, FIRE also with "
                "its normalizer capped at 512), and show at once there; other settings need Run (minutes per "
                "checkpoint on a CPU; fewer Documents in the sidebar make it quicker)."
                if mode == "same_text"
                else " The bundled checkpoints' numbers are published for Protocol → *same text at every length*."
            )
        )
    st.stop()

clean, errors = ui.split_errors(results)
for msg in errors:
    st.warning(f"Not evaluated: {msg}")
if not clean:
    st.stop()
caption = ui.eval_caption(clean)
if mode == "context":  # its curve beside the same-text curve, its table, its paired differences
    context_use_view(clean)
    st.stop()
if is_task:  # a task: answer accuracy, and bits per answer token (perplexity of a 64-symbol task says little)
    afig = plots.accuracy_figure(clean, chance=synthetic.load_task(domain).chance_accuracy)
    ui.show_figure(
        afig,
        caption + " Answer accuracy: the share of answer positions (the copied half) whose most "
        "likely next token is right; error bars: 95 % bootstrap interval over sequences. Length n: the "
        "model reads n tokens, as in training at seq_len n.",
        P,
        "accuracy",
    )
    ui.downloads(P, "accuracy_vs_length", plots.figure_to_csv(afig), plots.figure_data(afig))
    rows = [
        {
            "checkpoint": r.get("label") or r["checkpoint"],
            "length": e["length"],
            "answer accuracy": e["accuracy"],
            "95 % low": (e.get("accuracy_ci95") or [None])[0],
            "95 % high": (e.get("accuracy_ci95") or [None, None])[1],
            "sequences copied without error": e.get("sequence_accuracy"),
            "bits per answer token": e["bits_per_byte"],
            "sequences": e.get("documents"),
        }
        for r in clean
        for e in r["per_length"]
        if "accuracy" in e
    ]
    st.dataframe(
        rows,
        hide_index=True,
        key=ui.key(P, "task_table"),
        height=ui.table_height(len(rows)),
        column_config={
            k: st.column_config.NumberColumn(format="%.3f")
            for k in (
                "answer accuracy",
                "95 % low",
                "95 % high",
                "sequences copied without error",
                "bits per answer token",
            )
        },
    )
    ui.downloads(P, "task_results", ui.rows_to_csv(rows), rows)
    st.stop()
shown = ui.pool_seeds(clean) if pool else clean
fig = plots.perplexity_figure(shown)
ui.show_figure(
    fig,
    (SAME_TEXT_ANSWERS + "\n\n" if mode == "same_text" else "")
    + caption
    + (
        " Seeds pooled: mean ± sample standard deviation over each encoding's training "
        "seeds (n and std in the table; the error bars are often smaller than the markers); "
        "the table's 95 % interval is over documents of the seed-mean loss. The std covers "
        "training seeds only, the interval the text only."
        if pool
        else (
            " Error bars: 95 % bootstrap interval over documents (the text's own spread; "
            "differences between checkpoints are much tighter, see the paired figure)."
            if any(e.get("ci95") for r in clean for e in r["per_length"])
            else " No error bars: these results carry no per-document losses (computed before fireviz "
            "kept them); press Run to recompute them with intervals."
        )
    ),
    P,
    "ppl",
)
ui.downloads(P, "perplexity_vs_length", plots.figure_to_csv(fig), shown)
table = ui.perplexity_table(plots.group_perplexity(shown))
if not any((r.get("n") or 1) > 1 for r in table):  # nothing pooled: no std columns of None
    table = [{k: v for k, v in r.items() if not k.endswith("_std") and k != "n"} for r in table]
st.dataframe(
    table,
    hide_index=True,
    key=ui.key(P, "table"),
    height=ui.table_height(len(table)),
    column_config={
        "group": "encoding (seeds pooled)" if pool else "checkpoint",
        "length": st.column_config.NumberColumn("length (tokens)"),
        "bits_per_byte": st.column_config.NumberColumn("bits per byte", format="%.4f"),
        "bits_per_byte_std": st.column_config.NumberColumn(
            "bits per byte std", format="%.4f", help="sample standard deviation over pooled seeds"
        ),
        "ci95_low": st.column_config.NumberColumn(
            "95 % low", format="%.4f", help="bootstrap interval over documents, bits per byte"
        ),
        "ci95_high": st.column_config.NumberColumn("95 % high", format="%.4f"),
        "tokens_scored": st.column_config.NumberColumn("tokens scored"),
        "nats_per_token": st.column_config.NumberColumn("nats/token", format="%.4f"),
        "perplexity": st.column_config.NumberColumn(
            format="%.3f", help="exp(mean nats/token): the perplexity of the mean loss over pooled seeds"
        ),
        "perplexity_std": st.column_config.NumberColumn(
            "perplexity std", format="%.3f", help="sample standard deviation over pooled seeds"
        ),
        "n": st.column_config.NumberColumn(help="checkpoints averaged (seeds, when pooled)"),
        "train_seq_len": st.column_config.NumberColumn("training length"),
    },
)

paired_section(shown, caption)

st.subheader("Loss by position in the window")
done_lens = sorted({e["length"] for r in clean for e in r["per_length"]})
pick = st.multiselect("Lengths to draw", done_lens, default=done_lens[-1:], key=ui.key(P, "lbp_len"))
if pick:
    # pooled: each run in its encoding's colour from the figure above
    same = {r.get("label") or r["checkpoint"]: p["label"] for r, p in zip(clean, shown, strict=True)} if pool else None
    lbp = plots.loss_by_position_figure(clean, lengths=pick, color_groups=same)
    ui.show_figure(
        lbp,
        caption
        + " Loss averaged over equal-width buckets of window positions"
        + (", one line per checkpoint (not pooled)." if pool else "."),
        P,
        "lbp",
    )
    ui.downloads(P, "loss_by_position", plots.figure_to_csv(lbp), plots.figure_data(lbp))
