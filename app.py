"""fireviz app entry point: the page list (``st.navigation``) and the home page.

Run with ``make app`` (or ``streamlit run app.py``). The other pages live in ``pages/`` and
also run on their own (``AppTest.from_file("pages/…")``). Checkpoints come from
``checkpoints/`` (or ``$FIREVIZ_CHECKPOINTS_DIR``).
"""

import streamlit as st

from fireviz import ui

#: rows the checkpoint table shows before it scrolls: the bundled 21 and the copy task's, with room
HOME_ROWS = 40

#: Published models the Home page suggests (Hub id, what its position encoding is).
SUGGESTED_MODELS = [
    ("google/byt5-small", "ByT5: byte-level like fireviz, T5 buckets shared by all layers"),
    ("google-t5/t5-base", "T5: 32 buckets up to distance 128; try the encoder stack (bidirectional)"),
    ("google/umt5-small", "UMT5: one bucket table per layer"),
    ("bigscience/bloom-560m", "BLOOM: ALiBi"),
    ("meta-llama/Llama-3.2-1B", "Llama 3.2: RoPE with llama3 scaling (gated: set HF_TOKEN)"),
]
#: Published causal LMs the Home page suggests for the Length generalization page (Hub id, what it is).
SUGGESTED_LMS = [
    ("HuggingFaceTB/SmolLM2-135M", "SmolLM2 135M: Llama-shaped, RoPE"),
    ("Qwen/Qwen2.5-0.5B", "Qwen2.5 0.5B: RoPE θ = 10⁶"),
    ("EleutherAI/pythia-160m", "Pythia 160M: GPT-NeoX, rotary on a quarter of each head"),
    ("bigscience/bloom-560m", "BLOOM 560M: ALiBi"),
]
PAGES = {
    "biases": ("pages/1_Learned_biases.py", "Learned biases", ":material/show_chart:", "Learned_biases"),
    "fit": ("pages/2_Fit_FIRE.py", "Fit FIRE", ":material/functions:", "Fit_FIRE"),
    "lengen": (
        "pages/3_Length_generalization.py",
        "Length generalization",
        ":material/straighten:",
        "Length_generalization",
    ),
    "train": ("pages/4_Training_runs.py", "Training runs", ":material/monitoring:", "Training_runs"),
    "attention": ("pages/5_Attention.py", "Attention", ":material/grid_on:", "Attention"),
}


def _checkpoints_table(found) -> None:
    """The Home table: one row per checkpoint, headline numbers first, shared details said once."""
    rows = [i.summary_row() for i in found]
    cols = {c for r in rows for c in r}
    units = ["bpb = bits per byte from results.json"] if any(c.startswith("bpb") for c in cols) else []
    units += (
        ["val = last validation loss in the training log, nats per token (÷ ln 2 = bits per byte)"]
        if any(c.startswith("val loss") for c in cols)
        else []
    )
    st.caption(
        f"{len(found)} checkpoint(s) in `{ui.checkpoints_root()}`. Lengths in tokens (bytes, for a byte-level "
        "checkpoint; its own tokenizer's, for one trained on BPE shards); "
        + "; ".join(units + ["progress = optimizer steps done / planned, marked interim while training is unfinished"])
        + "."
    )
    # columns with nothing in them (no seeds recorded, no published numbers) are left out, and
    # details every checkpoint shares are said once above the table: the rest fits a 1024 px window
    shown = [c for c in dict.fromkeys(k for r in rows for k in r) if any(r.get(c) not in (None, "") for r in rows)]
    shared = {
        c: rows[0].get(c)
        for c in ui.HOME_DETAIL_COLUMNS
        if c in shown and len(rows) > 1 and all(r.get(c) == rows[0].get(c) for r in rows)
    }
    if shared:

        def said(c, v):
            return (
                f"{ui.human_count(v)} {c}"
                if c == "training tokens"
                else (f"{v:,} {c}" if isinstance(v, int) and c == "parameters" else f"{c} {v}")
            )

        st.caption(f"All {len(rows)} share: " + " · ".join(said(c, v) for c, v in shared.items()) + ".")
        shown = [c for c in shown if c not in shared]
    if all(str(r["checkpoint"]).startswith(str(r["encoding"])) for r in rows):
        shown = [c for c in shown if c != "encoding"]  # every name starts with its encoding: it says it
    st.dataframe(
        rows,
        hide_index=True,
        key="home_table",
        column_config=ui.checkpoint_table_config(rows),
        column_order=shown,
        height=ui.table_height(len(rows), max_rows=HOME_ROWS),  # every bundled checkpoint without scrolling
    )
    ui.downloads("home", "checkpoints", csv_text=lambda rows=rows: ui.rows_to_csv(rows), json_obj=rows)


def home() -> None:
    """What FIRE is, the checkpoints found with their headline numbers, where to go next."""
    ui.setup_page("fireviz: position encodings and length generalization")

    st.markdown(
        "**FIRE** (Functional Interpolation for Relative Positions, Li et al., ICLR 2024) adds a learned "
        "bias to every attention logit: $b(i,j) = f_\\theta\\big(\\psi(i-j)\\,/\\,\\psi(\\max(L, i))\\big)$ "
        "with $\\psi(x)=\\log(|c\\,x|+1)$ and $f_\\theta$ a small MLP.\n\n"
        "Dividing by the query position *interpolates*: every distance a long input produces maps into the "
        "[0, 1] range seen in training — the paper's reason FIRE generalizes to longer inputs. (At the "
        "bundled models' small scale it did not beat ALiBi or Kerple beyond the training length: see the "
        "Length generalization page and docs/findings.md.)\n\n"
        "The same form can represent T5's buckets, ALiBi, Kerple and Sandwich (Theorem 3.1), and the paper "
        "finds trained heads that are local and others that are anti-local. In the bundled prose models every "
        "head is local (its bias falls with distance; one T5 head is mixed); the Learned biases page shows why their FIRE loses "
        "ground past the training length: the normalizer keeps growing, far keys look near, attention "
        "spreads thin."
    )

    found, problems = ui.list_checkpoints()
    st.subheader("Checkpoints")
    ui.checkpoint_warnings(found, problems)
    if not found:
        ui.no_checkpoints_message()
    else:
        _checkpoints_table(found)

    for group in [g for g in ui.checkpoint_groups() if g]:  # e.g. copy: models of a synthetic task
        gfound, _ = ui.list_checkpoints(group)
        st.markdown(
            f"**Group `{group}`**: {len(gfound)} more checkpoint(s), "
            f"trained on {', '.join(sorted({i.data for i in gfound if i.data})) or 'other data'} "
            f"({', '.join(i.name for i in gfound)}); choose *Checkpoint group → {group}* in a page's sidebar, "
            f"or open its [biases](/{PAGES['biases'][3]}?group={group}) and "
            f"[length generalization](/{PAGES['lengen'][3]}?group={group})."
            + (
                " The copy task needs attention a fixed distance back: there FIRE learns anti-local heads."
                if group == "copy"
                else ""
            )
        )

    st.subheader("Where next")
    blurbs = {
        "biases": "what each head learned: local, anti-local or mixed",
        "fit": "Theorem 3.1 live: FIRE imitating T5, ALiBi, Kerple, Sandwich",
        "lengen": "perplexity far beyond the training length",
        "train": "loss curves from each checkpoint's log",
        "attention": "each head's attention on real text, and how much of it is position",
    }
    for k, (path, title, icon, _) in PAGES.items():
        st.page_link(path, label=f"{title}: {blurbs[k]}", icon=icon)

    st.subheader("Published models")
    st.markdown(
        "The Learned biases and Fit FIRE pages also read models from the Hugging Face Hub (or a folder "
        "`transformers` wrote): T5's learned bucket tables per layer and head, ALiBi slopes, RoPE kernels with "
        "every `rope_scaling` type. Only config.json and, for T5, the bias tables' bytes are fetched. Type an id into "
        "a page's *Add a checkpoint* box, or open one of these (needs an internet connection the first time):"
    )
    links = [f"[`{m}`](/{PAGES['biases'][3]}?ckpt={m}) — {what}" for m, what in SUGGESTED_MODELS]
    st.markdown("\n".join(f"- {line}" for line in links))
    st.markdown(
        "A published **causal LM** runs whole on the Length generalization and Attention pages (and in the "
        "dilution panel): in its own tokenizer, in bits per byte on the same text as the fireviz checkpoints, "
        "with zero-shot RoPE scaling. Its safetensors weights and tokenizer are downloaded once (hundreds of MB), "
        "or give a folder `transformers` wrote. For example:"
    )
    lm_links = [
        f"[`{m}`](/{PAGES['lengen'][3]}?ckpt={m}&ckpt=alibi&len=512&len=2048) — {what}" for m, what in SUGGESTED_LMS
    ]
    st.markdown("\n".join(f"- {line}" for line in lm_links))


nav = st.navigation(
    [st.Page(home, title="Home", icon=":material/home:", default=True)]
    + [st.Page(path, title=title, icon=icon, url_path=url) for path, title, icon, url in PAGES.values()]
)
nav.run()
