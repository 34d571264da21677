"""Length generalization: perplexity of checkpoints at evaluation lengths beyond training.

Small functions: the sidebar returns the choices (``sidebar``), each evaluation is one
``ui.EvalSpec`` — the picked checkpoints resolved once (``Checkpoint``) and one ``EvalSettings``
built once per run (``build_specs``) — run in the background by ``fireviz.ui.jobs`` through
``ui.evaluation_jobs`` (one job at a time, FIFO, never the same job twice; results cached on disk;
what is already cached shows without a run, ``fireviz.eval.lookup``), and the views draw the
results with ``fireviz.plots`` (perplexity vs length, paired differences, loss by position). Protocol "context use" (mode ``context``) draws bits per byte of fixed
targets against the context length c beside the same-text curve (``context_use_view``).
State in the URL: group, ckpt, domain, len, mode, stride, budget, docs, seqs, seed, scaling, cap, ref, pool, device
(with a GPU); in context use also ctx (context lengths), ctxm (M), ctxk (K), cstride (s).
"""

from dataclasses import dataclass, field

import streamlit as st

from fireviz import plots, ui
from fireviz.checkpoints import Checkpoint, catalog, seed_base, seed_groups
from fireviz.checkpoints.causal_lm import HF_ROPE_SCALINGS
from fireviz.data import DOMAINS, DataError, synthetic
from fireviz.eval import (
    DEFAULT_CONTEXT_LENGTHS,
    DEFAULT_CONTEXT_PREFIX,
    DEFAULT_CONTEXT_STRIDE,
    DEFAULT_CONTEXT_TARGETS,
    DEFAULT_MODE,
    FULL_CONTEXT,
    MODES,
    ROPE_SCALINGS,
    SYNTHETIC_SEQUENCES,
    dominant_document_note,
    missing_interval_note,
)

P = "lengen"
#: what each protocol answers: one sentence under its curve
SAME_TEXT_ANSWERS = "Same text: how the score of a text changes when it is cut into windows of n tokens."
CONTEXT_ANSWERS = "Context use: how the score of fixed targets changes with c tokens of context before them."


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
    ui.downloads(P, "context_use", lambda rows=rows: ui.rows_to_csv(rows), rows)


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
            # ALiBi when shown: the reference of every published paired row (checkpoints/RESULTS.md)
            key=ui.url_state(P, "ref", "alibi" if "alibi" in labels else labels[0], options=labels),
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
            note = missing_interval_note(shown)
            ui.show_figure(
                pfig,
                caption + f" Bits per byte minus {ui.plain(ref)}'s on the same documents and tokens; error bars: "
                "95 % paired bootstrap interval over documents (documents resampled for both at once, so the "
                "text's difficulty cancels). An interval that excludes 0 is a difference this text resolves."
                + (f" Missing bars: {note}." if note else ""),
                P,
                "paired",
            )
            ui.downloads(P, "paired_differences", lambda pfig=pfig: plots.figure_to_csv(pfig), paired)
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
                    "n": st.column_config.NumberColumn("seeds", help="checkpoints pooled (training seeds)"),
                    "seed_std": st.column_config.NumberColumn(
                        "seed std", help="sample standard deviation over this row's training seeds", format="%.4f"
                    ),
                    "reference_n": st.column_config.NumberColumn("reference seeds"),
                    "reference_seed_std": st.column_config.NumberColumn(
                        "reference seed std", help="sample standard deviation over the reference's seeds", format="%.4f"
                    ),
                },
            )
            if any(r["seed_std"] is not None or r["reference_seed_std"] is not None for r in paired):
                st.caption(
                    "The 95 % interval is over documents (text noise); the seed std columns are the spread "
                    "over training seeds. A difference smaller than the seed spread is not a property of the encoding."
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


INTRO = (
    "Perplexity at evaluation lengths up to many times the training length. By default every length scores "
    "**the same text** — the first M tokens (M = the largest length) of every document that long, cut into "
    "windows of each length — so a change along a line is the effect of the window length alone (more "
    "context, but also fewer targets near a window start; Protocol → *context use* separates the two). Every checkpoint "
    "sees the same windows, so differences between checkpoints are paired (with their own, much narrower "
    "intervals below). Runs go on in the background: reload the page or open a second tab and you find "
    "the run there, never started twice."
)
TASKS = [synthetic.PREFIX + t for t in synthetic.TASKS]
DATA_OPTIONS = list(DOMAINS) + TASKS + ["upload"]
MAX_LENGTH = 1 << 20
MODE_NAMES = {
    "same_text": "same text at every length",
    "nonoverlapping": "random windows per length",
    "sliding": "sliding window",
    "context": "context use (fixed targets, more context)",
}
URL_KEYS = ["ckpt", "domain", "len", "mode", "stride", "budget", "docs", "seqs", "seed", "scaling", "cap", "pool"]
URL_KEYS += ["device", "ctx", "ctxm", "ctxk", "cstride"]


@dataclass
class Choices:
    """What the sidebar asked for: the data, lengths and protocol, and the extra rows."""

    domain: str
    data: str
    split: str
    lengths: list[int]
    mode: str
    stride: int | None = None
    budget: int | None = None
    docs_limit: int = 0
    seed: int = 0
    context_settings: dict = field(default_factory=dict)
    context_lengths: list = field(default_factory=list)
    scalings: list[str] = field(default_factory=list)
    cap: int = 0
    fires: list = field(default_factory=list)
    pool: bool = False
    device: str = "cpu"

    @property
    def is_task(self) -> bool:
        return self.domain in TASKS

    def settings(self) -> dict:
        """The evaluation settings every spec shares (each spec adds its own)."""
        return {
            "mode": self.mode,
            "stride": self.stride,
            "token_budget": self.budget,
            "seed": self.seed,
            "split": self.split,
            "device": self.device,
        }


def data_input(chosen) -> tuple[str, str, str]:
    """``(domain, data, split)``: a bundled domain, a synthetic task or an uploaded file (split 'all');
    stops the page until an upload is there."""
    sb = st.sidebar
    trained_on = {i.data for i in chosen}  # default: the chosen checkpoints' own training data, when they share it
    only = next(iter(trained_on)) if len(trained_on) == 1 else None
    default = only if only in DATA_OPTIONS else "prose"
    k = ui.url_state(P, "domain", default, options=DATA_OPTIONS)
    ui.follow_default(P, "domain", default)  # another group (the copy task) brings its own data
    domain = sb.selectbox(
        "Data",
        DATA_OPTIONS,
        key=k,
        format_func=lambda d: (
            "your own file (.txt / .jsonl)"
            if d == "upload"
            else (f"{d} (synthetic task: answer accuracy)" if d in TASKS else d)
        ),
    )
    if domain != "upload":
        return domain, domain, "validation"
    up = sb.file_uploader(
        'Text or JSONL file (one {"text": …} object per line)', type=ui.UPLOAD_TYPES, key=ui.key(P, "upload")
    )
    if up is None:
        st.info("Upload a .txt or .jsonl file in the sidebar to evaluate on it (all of it is used: split 'all').")
        st.stop()
    try:
        return domain, str(ui.save_upload(up.name, up.getvalue())), "all"
    except DataError as e:
        ui.error(
            f"Cannot use the uploaded file {up.name}: {e}",
            "Upload UTF-8 text (.txt), or JSONL with one object per line holding a string 'text' field.",
        )
        st.stop()
        raise


def length_input(train_lens: list[int]) -> list[int]:
    """The evaluation lengths: powers of two, the training lengths and any typed or linked length."""
    sb = st.sidebar
    # any length the URL or the user asks for (1536, 3000 …), besides powers of two and the training lengths
    from_url = ui.int_values(st.query_params.get_all("len"), 2, MAX_LENGTH)
    if st.query_params.get_all("len") and st.query_params.get_all("len") != [str(n) for n in from_url]:
        st.query_params["len"] = [str(n) for n in from_url]  # a stale or hand-edited link: keep its good lengths
    asked = set(from_url) | set(st.session_state.get(ui.key(P, "typed_lengths"), []))
    options = sorted({2**k for k in range(2, 21)} | set(train_lens) | asked)
    pending = st.session_state.pop(ui.key(P, "len_pending"), None)
    if pending is not None:  # typed lengths, converted to ints on the previous run
        st.session_state[ui.key(P, "len")] = pending
    # a quarter of the shortest to 16× the longest training length, the lengths the bundled results are
    # published at (128…8192 for 512): every checkpoint is shown extrapolating, and the same-text prefix (the
    # largest length) is the published one, so its numbers appear without a run
    default_lens = [
        n
        for n in sorted({2**k for k in range(2, 21)} | set(train_lens))
        if max(2, train_lens[0] // 4) <= n <= 16 * train_lens[-1]
    ]
    k = ui.url_state(P, "len", default_lens, int, options=options, multi=True)
    ui.follow_default(P, "len", default_lens)  # another training length brings its own lengths
    picked = sb.multiselect(
        "Evaluation lengths (tokens; type any other length and press Enter)",
        options,
        key=k,
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
    return lengths


def protocol_input(is_task: bool) -> str:
    """The protocol (a task is scored on whole task sequences: the default mode)."""
    if is_task:
        return DEFAULT_MODE
    return st.sidebar.radio(
        "Protocol",
        list(MODES),
        format_func=MODE_NAMES.get,
        key=ui.url_state(P, "mode", DEFAULT_MODE, options=list(MODES)),
        help="Same text: one fixed set of tokens (each qualifying document's first M tokens) at every "
        "length — the published protocol. Random windows: each length draws its own windows under a "
        "token budget, so columns score different text. Sliding: overlapping windows with a stride. "
        "Context use: fixed targets (the last K of each document's first M tokens) scored with c tokens "
        "of context at every context length c, drawn beside the same-text curve.",
    )


def stride_input(train_lens: list[int], lengths: list[int]) -> int:
    """The sliding window's stride: default half the training length, at most the smallest length."""
    default = max(1, min([train_lens[0] // 2, *lengths]))
    return int(
        st.sidebar.number_input(
            "Stride (tokens; at most the smallest length)",
            1,
            1 << 16,
            key=ui.url_state(P, "stride", default, int, lo=1, hi=1 << 16),
        )
    )


def budget_input(is_task: bool, mode: str, lengths: list[int]) -> tuple[int | None, int]:
    """``(token budget, documents)``: sequences per length for a task, documents for the same text and
    context use (0 = all), else targets per length."""
    sb = st.sidebar
    if is_task:  # fresh task sequences of each length, the same for every checkpoint; only answers are scored
        seqs = sb.number_input(
            "Sequences per length",
            1,
            1 << 16,
            key=ui.url_state(P, "seqs", SYNTHETIC_SEQUENCES, int, lo=1, hi=1 << 16),
            help=f"{SYNTHETIC_SEQUENCES} reproduces the published numbers of the task's checkpoint group.",
        )
        return int(seqs), 0
    if mode in ("same_text", "context"):
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
        return (None if docs_limit == 0 else docs_limit * (max(lengths, default=2) - 1)), docs_limit
    budget = sb.number_input(
        "Token budget per length (targets scored)",
        256,
        1 << 22,
        step=4096,
        key=ui.url_state(P, "budget", 16384, int, lo=256, hi=1 << 22),
    )
    return int(budget), 0


def seed_input(is_task: bool, mode: str, budget: int | None) -> int:
    """The window (or document) seed; 0 where nothing is drawn (the library refuses another seed)."""
    if is_task:
        return 0
    seed = int(
        st.sidebar.number_input(
            "Seed (windows drawn; in same-text mode the documents, when fewer than all)",
            0,
            10**6,
            key=ui.url_state(P, "seed", 0, int, lo=0),
        )
    )
    return 0 if mode in ("same_text", "context") and budget is None else seed


def context_inputs() -> tuple[dict, list]:
    """The sidebar's context-use settings (URL ctxm, ctxk, cstride, ctx): ``(evaluate settings of mode
    context, context lengths c)``, ``"full"`` standing for M − K. Lengths that do not fit M are
    refused by the settings with their reason (shown by ``ui.eval_spec``)."""
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


def scaling_input(chosen) -> list[str]:
    """Zero-shot RoPE scalings to add for the RoPE checkpoints among ``chosen`` (none without one)."""
    if not any(i.position_encoding == "rope" for i in chosen):
        return []
    # pi and yarn apply to both kinds; dynamic NTK and llama3 to published models (as transformers has them)
    options = list(ROPE_SCALINGS) + (
        [s for s in HF_ROPE_SCALINGS if s not in ROPE_SCALINGS and s not in ("linear", "longrope")]
        if any(i.is_causal_lm and i.position_encoding == "rope" for i in chosen)
        else []
    )
    names = {
        "pi": "position interpolation (PI)",
        "yarn": "YaRN",
        "dynamic": "dynamic NTK (published)",
        "llama3": "llama3 (published)",
    }
    return st.sidebar.multiselect(
        "Also RoPE checkpoints with zero-shot scaling",
        options,
        key=ui.url_state(P, "scaling", [], options=options, multi=True),
        format_func=lambda s: names.get(s, s),
    )


def pool_input(chosen) -> bool:
    """Whether to pool training seeds (offered when two runs of one encoding are chosen)."""
    sb = st.sidebar
    bases = [seed_base(i.name) for i in chosen]
    if any(bases.count(b) > 1 for b in bases):  # two or more training seeds of one encoding chosen
        return sb.checkbox(
            "Pool training seeds (mean ± std)",
            key=ui.url_state(P, "pool", False, bool),
            help="Draw fire and fire_seed1, fire_seed2 … as one line: the mean over seeds, with "
            "± one sample standard deviation as error bars.",
        )
    if extra := seed_groups(i.name for i in ui.list_checkpoints()[0]):
        sb.caption(
            "Also trained with other seeds: "
            + "; ".join(", ".join(g) for g in extra.values())
            + ". Choose two or more runs of one encoding to pool them (mean ± std)."
        )
    return False


def device_input() -> str:
    """CPU, or with a GPU the choice (the published numbers are CPU float32 ones)."""
    devices = ["cuda", "cpu"] if catalog.default_device() == "cuda" else ["cpu"]  # looked up now (tests patch it)
    if len(devices) == 1:
        return devices[0]
    return st.sidebar.radio(
        "Device",
        devices,
        key=ui.url_state(P, "device", devices[0], options=devices),
        horizontal=True,
        format_func={"cuda": "GPU (bf16 autocast)", "cpu": "CPU (float32)"}.get,
        help="The bundled checkpoints' published numbers were computed on CPU in float32: choose "
        "CPU to see them without running anything. Precision is part of every cached result.",
    )


def sidebar(chosen) -> Choices:
    """Every choice of the sidebar, read once per run (and written back to the URL)."""
    domain, data, split = data_input(chosen)
    train_lens = sorted({i.seq_len for i in chosen})
    lengths = length_input(train_lens)
    c = Choices(domain, data, split, lengths, protocol_input(domain in TASKS))
    if c.mode == "context":
        c.context_settings, c.context_lengths = context_inputs()
    if c.mode == "sliding":
        c.stride = stride_input(train_lens, lengths)
    c.budget, c.docs_limit = budget_input(c.is_task, c.mode, lengths)
    c.seed = seed_input(c.is_task, c.mode, c.budget)
    c.scalings = scaling_input(chosen)
    c.fires, c.cap = ui.normalizer_cap_input(
        P,
        chosen,
        "Also FIRE with its normalizer capped at (tokens; 0 = off)",
        help="ψ(min(max(L, i), N)): queries beyond N are normalized as if at N, so FIRE's input for a distance "
        "stays what it was in training. Drawn beside the plain rows; N = the training length is the natural choice.",
    )
    c.pool = pool_input(chosen)
    c.device = device_input()
    ui.sync_url(P, URL_KEYS)
    return c


def protocol_specs(ckpts: dict[str, Checkpoint], chosen, c: Choices, settings: dict, lens: list, window=None):
    """The evaluations of one protocol: the chosen checkpoints, the RoPE ones per zero-shot scaling, and
    the FIRE ones capped at the lengths whose windows (``window(n)`` tokens) pass the cap (at or below
    it FIRE is the plain FIRE, and identical rows would hide the plain ones)."""
    window = window or (lambda n: n)

    def picked(infos) -> list[Checkpoint]:
        return [ckpts[i.path] for i in infos if i.path in ckpts]

    rope = [i for i in chosen if i.position_encoding == "rope"]
    out = [ui.eval_spec(picked(chosen), c.data, lens, "", **{**settings, "rope_scaling": None})]
    out += [
        ui.eval_spec(
            picked([i for i in rope if s in ROPE_SCALINGS or i.is_causal_lm]),  # dynamic, llama3: published only
            c.data,
            lens,
            f" + {s}",
            **{**settings, "rope_scaling": s},
        )
        for s in c.scalings
    ]
    capped = [n for n in lens if window(n) > c.cap]
    if c.cap and capped and picked(c.fires):
        cap_settings = {**settings, "rope_scaling": None, "normalizer_cap": c.cap}
        out.append(ui.eval_spec(picked(c.fires), c.data, capped, f" cap {c.cap}", **cap_settings))
    return [s for s in out if s is not None and s.checkpoints]


def build_specs(ckpts: dict[str, Checkpoint], chosen, c: Choices) -> list:
    """Every evaluation of this run, each with its ``EvalSettings`` built once (mode context: the
    context-use evaluations and, beside them, the same text at the lengths chosen)."""
    if c.mode != "context":
        return protocol_specs(ckpts, chosen, c, c.settings(), c.lengths)
    context_budget = None if c.budget is None else c.docs_limit * c.context_settings["context_targets"]
    specs = protocol_specs(ckpts, chosen, c, {**c.settings(), "mode": "same_text"}, c.lengths)
    specs += protocol_specs(
        ckpts,
        chosen,
        c,
        {**c.settings(), **c.context_settings, "token_budget": context_budget},
        c.context_lengths,
        lambda n: context_window(c.context_settings, n),
    )
    return specs


def run_button(chosen, c: Choices) -> bool:
    """The Run button and one line saying what it runs."""
    rope = [i for i in chosen if i.position_encoding == "rope"]
    c1, c2 = st.columns([1, 5])
    run = c1.button("Run", type="primary", key=ui.key(P, "run"))
    c2.caption(
        f"{len(chosen)} checkpoint(s) × {len(c.lengths)} length(s) on {c.device}"
        + (f", plus {len(rope)} RoPE checkpoint(s) × {', '.join(c.scalings)}" if c.scalings else "")
        + (f", plus {len(c.fires)} FIRE checkpoint(s) with the normalizer capped at {c.cap}" if c.cap else "")
        + (f"; context use at {len(c.context_lengths)} context length(s)" if c.mode == "context" else "")
        + ". Finished lengths are cached on disk and reused."
    )
    return run


def not_computed_notes(results: list[dict], pending: list, c: Choices, said_cancelled: bool = False) -> None:
    """Say which lengths are not computed yet; stop the page when there is nothing to draw
    (silently after a cancel that finished nothing: ``ui.evaluation_jobs`` has said so)."""
    missing = sorted({e["length"] for r in results for e in r.get("per_length", []) if e.get("not_computed")})
    anything = any("error" not in e for r in results for e in r.get("per_length", []))
    drawn = any("error" not in e and not e.get("not_computed") for r in results for e in r.get("per_length", []))
    if said_cancelled and not drawn and not pending:  # the cancel's warning has said that nothing is drawn
        st.stop()
    if missing and not pending and anything:
        st.info(
            f"Not computed yet at {', '.join(map(str, missing))} tokens: press **Run** to add "
            f"{'it' if len(missing) == 1 else 'them'} (the lengths drawn are cached)."
        )
    if anything:
        return
    if not pending:
        st.info(
            "These settings have not been evaluated yet. Press **Run**."
            + (
                " (The bundled checkpoints' published numbers are CPU float32 ones: choose Device → CPU in the "
                "sidebar to see them at once.)"
                if c.device == "cuda"
                else ""
            )
            + (
                " The bundled checkpoints' numbers are published for the same-text protocol with every "
                "document at 128…8192 tokens (prose, LaTeX, code; RoPE also with PI and YaRN, FIRE also with "
                "its normalizer capped at 512), and show at once there; other settings need Run (minutes per "
                "checkpoint on a CPU; fewer Documents in the sidebar make it quicker)."
                if c.mode == "same_text"
                else " The bundled checkpoints' numbers are published for Protocol → *same text at every length*."
            )
        )
    st.stop()


def task_view(clean: list[dict], caption: str, domain: str) -> None:
    """A synthetic task: answer accuracy and bits per answer token (perplexity of a 64-symbol task says little)."""
    afig = plots.accuracy_figure(clean, chance=synthetic.load_task(domain).chance_accuracy)
    ui.show_figure(
        afig,
        caption + " Answer accuracy: the share of answer positions (the copied half) whose most "
        "likely next token is right; error bars: 95 % bootstrap interval over sequences. Length n: the "
        "model reads n tokens, as in training at seq_len n.",
        P,
        "accuracy",
    )
    ui.figure_table_downloads(P, "accuracy_vs_length", afig)
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
    three = st.column_config.NumberColumn(format="%.3f")
    numbers = ("answer accuracy", "95 % low", "95 % high", "sequences copied without error", "bits per answer token")
    st.dataframe(
        rows,
        hide_index=True,
        key=ui.key(P, "task_table"),
        height=ui.table_height(len(rows)),
        column_config={k: three for k in numbers},
    )
    ui.downloads(P, "task_results", lambda rows=rows: ui.rows_to_csv(rows), rows)


def perplexity_caption(clean: list[dict], caption: str, c: Choices) -> str:
    """The perplexity figure's caption: what the protocol answers, the settings, what the bars are."""
    if c.pool:
        bars = (
            " Seeds pooled: mean ± sample standard deviation over each encoding's training "
            "seeds (n and std in the table; the error bars are often smaller than the markers); "
            "the table's 95 % interval is over documents of the seed-mean loss. The std covers "
            "training seeds only, the interval the text only."
        )
    elif any(e.get("ci95") for r in clean for e in r["per_length"]):
        bars = (
            " Error bars: 95 % bootstrap interval over documents (the text's own spread; "
            "differences between checkpoints are much tighter, see the paired figure)."
        )
    else:
        bars = f" No error bars ({missing_interval_note(clean) or 'no interval computed'})."
    return (SAME_TEXT_ANSWERS + "\n\n" if c.mode == "same_text" else "") + caption + bars


def perplexity_table_section(shown: list[dict], pool: bool) -> None:
    """The perplexity table (seed std columns only when something is pooled)."""
    table = ui.perplexity_table(plots.group_perplexity(shown))
    if not any((r.get("n") or 1) > 1 for r in table):  # nothing pooled: no std columns of None
        table = [{k: v for k, v in r.items() if not k.endswith("_std") and k != "n"} for r in table]
    four = {"format": "%.4f"}
    # a published model reads its own tokens: every row is then per byte (fireviz's tokens are bytes)
    per_byte = any("bytes_scored" in e for r in shown for e in r.get("per_length", []))
    unit = "byte" if per_byte else "token"
    st.dataframe(
        table,
        hide_index=True,
        key=ui.key(P, "table"),
        height=ui.table_height(len(table)),
        column_config={
            "group": "encoding (seeds pooled)" if pool else "checkpoint",
            "length": st.column_config.NumberColumn("length (tokens)"),
            "bits_per_byte": st.column_config.NumberColumn("bits per byte", **four),
            "bits_per_byte_std": st.column_config.NumberColumn(
                "bits per byte std", help="sample standard deviation over pooled seeds", **four
            ),
            "ci95_low": st.column_config.NumberColumn(
                "95 % low", help="bootstrap interval over documents, bits per byte", **four
            ),
            "ci95_high": st.column_config.NumberColumn("95 % high", **four),
            "tokens_scored": st.column_config.NumberColumn("tokens scored"),
            "nats_per_token": st.column_config.NumberColumn(f"nats/{unit}", **four),
            "perplexity": st.column_config.NumberColumn(
                f"perplexity per {unit}" if per_byte else "perplexity",
                format="%.3f",
                help=f"exp(mean nats/{unit}): the perplexity of the mean loss over pooled seeds"
                + (" — per byte, so checkpoints with different tokenizers compare" if per_byte else ""),
            ),
            "perplexity_std": st.column_config.NumberColumn(
                "perplexity std", format="%.3f", help="sample standard deviation over pooled seeds"
            ),
            "n": st.column_config.NumberColumn(help="checkpoints averaged (seeds, when pooled)"),
            "train_seq_len": st.column_config.NumberColumn("training length"),
        },
    )


def loss_by_position_section(clean: list[dict], shown: list[dict], caption: str, pool: bool) -> None:
    """Loss by position in the window, per checkpoint, at the lengths picked."""
    st.subheader("Loss by position in the window")
    done_lens = sorted({e["length"] for r in clean for e in r["per_length"]})
    pick = st.multiselect("Lengths to draw", done_lens, default=done_lens[-1:], key=ui.key(P, "lbp_len"))
    if not pick:
        return
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
    ui.figure_table_downloads(P, "loss_by_position", lbp)


def same_text_view(clean: list[dict], caption: str, c: Choices) -> None:
    """Perplexity vs length (seeds pooled if asked), its table, paired differences, loss by position."""
    shown = ui.pool_seeds(clean) if c.pool else clean
    fig = plots.perplexity_figure(shown)
    ui.show_figure(fig, perplexity_caption(clean, caption, c), P, "ppl")
    ui.downloads(P, "perplexity_vs_length", lambda fig=fig: plots.figure_to_csv(fig), shown)
    perplexity_table_section(shown, c.pool)
    paired_section(shown, caption)
    loss_by_position_section(clean, shown, caption, c.pool)


def main() -> None:
    ui.setup_page("Length generalization")
    st.markdown(INTRO)
    # by default the plain run of each encoding but NoPE, whose rise would squeeze the others into one band
    chosen = ui.checkpoint_picker(P, multi=True, label="Checkpoints", default_count=8, allow_causal_lm=True)
    if not chosen:
        st.stop()
    c = sidebar(chosen)
    if not c.lengths:
        st.info("Pick at least one evaluation length in the sidebar.")
        st.stop()
    ckpts = ui.resolve_checkpoints(chosen)  # once per run; one that cannot be read is said and left out
    specs = build_specs(ckpts, chosen, c)
    if c.cap and not [n for n in c.lengths if n > c.cap]:  # at or below the cap FIRE is the plain FIRE
        st.sidebar.caption(
            f"The cap changes FIRE only at lengths beyond {c.cap} tokens: choose a longer length to see capped rows."
        )
    run = run_button(chosen, c)
    results, pending, cancelled = ui.evaluation_jobs(P, specs, run)
    not_computed_notes(results, pending, c, said_cancelled=bool(cancelled))
    clean, errors = ui.split_errors(results)
    for msg in errors:
        st.warning(f"Not evaluated: {ui.plain(msg)}")
    if not clean:
        st.stop()
    dominant = dominant_document_note(clean)
    if dominant:
        st.warning(ui.plain(dominant[0].upper() + dominant[1:]) + ".")
    caption = ui.eval_caption(clean)
    if c.mode == "context":  # its curve beside the same-text curve, its table, its paired differences
        context_use_view(clean)
    elif c.is_task:
        task_view(clean, caption, c.domain)
    else:
        same_text_view(clean, caption, c)


main()
