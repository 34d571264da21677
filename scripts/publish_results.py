"""Evaluate every checkpoint in checkpoints/ the same way and publish the results.

For each domain: ``fireviz.eval.evaluation.evaluate_many`` over all checkpoints (paired windows) with
the published protocol — ``mode="same_text"``: every validation document that holds the
largest length, its first 8192 tokens scored at every length, no token budget — so every
column scores the same text. The RoPE checkpoint is also evaluated as RoPE-PI and YaRN, and
every FIRE / FIRE-S checkpoint also with its normalizer capped at the largest query position
its training reached (``normalizer_cap``: the training length, plus the random position offset
of runs trained with one; none when that reaches 8192). Every row carries 95 % bootstrap intervals over documents (``ci95``) and
its paired difference against the reference checkpoint (``--reference``, default alibi) with
its interval (``paired_delta_bpb``, ``paired_ci95``).

Writes per checkpoint ``results.json`` (a list of evaluate results) and a model card
``README.md``; writes ``checkpoints/RESULTS.md`` (bits per byte by length and domain) and
``checkpoints/results_<domain>.html`` (+ PNG when Chromium is there) and ``results_<domain>.json.gz``
(every row of the domain) and the validation curves of all
runs (``checkpoints/validation_curves.{html,png}``); and ``checkpoints/claims.json``: every comparison
of ``docs/claims.toml`` (the ones the docs make) computed from the results with its interval, seeds
and verdict (``fireviz.eval.claims``), which RESULTS.md lists and docs/findings.md quotes between
``<!-- claim:ID -->`` markers. The README and docs/findings.md link to
``checkpoints/RESULTS.md`` instead of copying its tables (issue 34).

    python scripts/publish_results.py [--domains prose,latex,code] [--reference alibi]
        [--mode nonoverlapping --token-budget 16384]   # the earlier random-window protocol
        [--recompute]                                  # score everything again
        [--claims-only]                                # only claims.json and the docs' claim quotes

A length whose number a folder's results.json already holds for exactly these weights (sha256),
data and settings is reused, as the app does (``fireviz.eval.cache.published_results``); only
new checkpoints, changed weights or new settings are scored. ``--recompute`` scores everything.
Progress (target tokens, rate, ETA) goes to stderr.
"""

from __future__ import annotations

import argparse
import gzip
import json
import sys
import time
from pathlib import Path

from fireviz import plots
from fireviz.checkpoints import (  # config.json through the one door
    read_checkpoint,
    read_train_log,
    seed_groups,
    validation_rows,
)
from fireviz.cli.eval import format_table
from fireviz.core import atomic_write, atomic_write_text, write_json_atomic
from fireviz.encodings import has_normalizer
from fireviz.eval import (
    DEFAULT_CONTEXT_LENGTHS,
    DEFAULT_MODE,
    FULL_CONTEXT,
    cached_results,
    evaluate_many,
    with_paired_differences,
)
from fireviz.eval.claims import compute_claims, format_claim, quote_claims, read_claim_specs
from fireviz.model import GPTConfig

ROOT = Path(__file__).resolve().parent.parent
CKPTS = ROOT / "checkpoints"
LENGTHS = [128, 256, 512, 1024, 2048, 4096, 8192]
#: the context lengths c of the published context-use tables: the default ones plus 448, the
#: largest c whose windows (c + s = 512 tokens) stay inside the training length, the baseline
#: of "context beyond the training length" (issue 51)
CONTEXT_BASELINE = 448
CONTEXT_LENGTHS: list[int | str] = sorted({*DEFAULT_CONTEXT_LENGTHS, CONTEXT_BASELINE}) + [FULL_CONTEXT]
#: the comparisons the docs make (fireviz.eval.claims.ClaimSpec), their computed values, and the
#: documents that quote them between <!-- claim:ID --> … <!-- /claim --> markers
CLAIM_SPECS = ROOT / "docs" / "claims.toml"
CLAIMS = CKPTS / "claims.json"
CLAIM_DOCS = [ROOT / "docs" / "findings.md"]


#: the domains of checkpoints/RESULTS.md, in its order
DOMAIN_ORDER = {"prose": 0, "latex": 1, "code": 2}


def read_results(folder: Path) -> list[dict]:
    """The folder's results.json ([] when absent or unreadable: it is rewritten anyway)."""
    try:
        runs = json.loads((folder / "results.json").read_text())
    except (OSError, ValueError):
        return []
    if not isinstance(runs, list):
        return []
    return [
        r
        for r in runs
        if isinstance(r, dict) and isinstance(r.get("settings"), dict) and "data" in r["settings"] and "checkpoint" in r
    ]


def merge_results(old: list[dict], fresh: list[dict]) -> tuple[list[dict], list[dict]]:
    """A folder's results after this run: ``fresh`` plus the ``old`` rows for (domain, RoPE
    scaling) pairs this run did not evaluate, kept only where they were made on the same weights
    (``checkpoint_sha256``) with the same token budget, seed, split and lengths as this run's rows of
    their protocol (``mode``: same-text and context-use rows are kept side by side).

    Every row gets the current ``label`` and a repository-relative ``checkpoint_path``; a fresh
    row whose every length came from the cache keeps the old row's ``seconds`` (the file does not
    change when the numbers do not).
    Returns: ``(rows sorted by domain then scaling, old rows dropped as stale)``.
    """

    def pair(r: dict) -> tuple:
        s = r["settings"]
        return s["data"], s.get("mode"), s.get("rope_scaling"), s.get("normalizer_cap")

    def recipe(r: dict) -> tuple:
        s = r["settings"]
        return (
            r.get("checkpoint_sha256"),
            s.get("mode"),
            s.get("token_budget"),
            s.get("seed"),
            s.get("split"),
            s.get("lengths"),
        )

    done = {pair(r) for r in fresh}
    # per protocol (mode): the recipe this run used; an old row of another recipe in that mode is stale
    ref = {r["settings"].get("mode"): recipe(r) for r in fresh}

    def same(r: dict) -> str:  # the (domain, variant) and recipe of a row, as a key (lengths is a list)
        return json.dumps([pair(r), recipe(r)], default=str)

    previous = {same(r): r for r in old}
    for r in fresh:  # a row answered from the cache keeps its recorded time: no diff for the same numbers
        before = previous.get(same(r))
        if before is not None and "seconds" in before and all(e.get("cached") for e in r["per_length"]):
            r["seconds"] = before["seconds"]
            # and each length keeps where its number first came from, when it is the same number
            was = {e.get("length"): e for e in before.get("per_length", []) if isinstance(e, dict)}
            for e in r["per_length"]:
                w = was.get(e.get("length"))
                if w is not None and e.get("source") == "results.json" and _same_number(e, w):
                    e["cached"], e["source"] = w.get("cached", True), w.get("source", "results.json")
    kept, dropped = [], []
    for r in old:
        if pair(r) in done:
            continue
        mode = r["settings"].get("mode")
        (kept if mode not in ref or recipe(r) == ref[mode] else dropped).append(r)
    rows = sorted(
        kept + fresh,
        key=lambda r: (
            r["settings"].get("mode") == "context",  # the same-text rows first, as before context rows existed
            DOMAIN_ORDER.get(r["settings"]["data"], 99),
            r["settings"].get("rope_scaling") or "",
        ),
    )
    for r in rows:
        name_row(r)
    return rows, dropped


def _same_number(a: dict, b: dict) -> bool:
    """Whether two per-length entries hold the same measurement (provenance fields aside)."""
    skip = ("cached", "source", "seconds")
    return {k: v for k, v in a.items() if k not in skip} == {k: v for k, v in b.items() if k not in skip}


def name_row(r: dict) -> None:
    """Set a result's table ``label`` and its repository-relative ``checkpoint_path`` (shipped
    results name the folder in the repository, not this machine's path)."""
    r["label"] = label(r)
    r["checkpoint_path"] = f"{CKPTS.name}/{r['checkpoint']}"


def label(result: dict) -> str:
    scaling = result["settings"].get("rope_scaling")
    name = result["checkpoint"]
    cap = result["settings"].get("normalizer_cap")
    if cap:
        return f"{name} (normalizer cap {cap})"
    if not scaling:
        return name
    # the bundled RoPE checkpoint keeps the row names of earlier tables; any other RoPE folder is named
    return (
        {"pi": "rope_pi (zero-shot)", "yarn": "yarn (zero-shot)"}[scaling]
        if name == "rope"
        else f"{name} + {scaling} (zero-shot)"
    )


def render_png(fig, path: Path) -> None:
    """Screenshot the figure in headless Chromium (Debian's, via Playwright); skip if absent."""
    import tempfile

    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        print(f"playwright not installed: {path.name} not written", file=sys.stderr)
        return
    if not Path("/usr/bin/chromium").exists():
        print(f"/usr/bin/chromium missing: {path.name} not written", file=sys.stderr)
        return
    with tempfile.TemporaryDirectory() as tmp:
        html = Path(tmp) / "fig.html"
        fig.write_html(html, include_plotlyjs=True, full_html=True)  # offline: plotly.js inlined
        with sync_playwright() as pw:
            browser = pw.chromium.launch(
                executable_path="/usr/bin/chromium",
                args=["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking"],
            )
            page = browser.new_page(viewport={"width": 1020, "height": 620})
            page.goto(html.as_uri())
            page.wait_for_selector(".js-plotly-plot")
            page.screenshot(path=str(path))
            browser.close()


def protocol_text(settings: dict, skipped: bool = True) -> str:
    """One sentence naming the evaluation protocol of a result's ``settings`` (``skipped``:
    with its count of documents too short for the protocol, which differs between domains)."""
    if settings.get("mode") == "same_text":
        docs = (
            "all"
            if settings.get("token_budget") is None
            else f"{settings.get('documents_scored')} (drawn with seed {settings.get('seed')})"
        )
        return (
            f"the same text at every length: the first {settings.get('prefix_tokens')} tokens of {docs} "
            f"{settings.get('split')} documents at least that long "
            + (f"({settings.get('documents_skipped')} shorter ones skipped), " if skipped else "")
            + "cut into consecutive windows of each "
            "length (neighbours share one token, so every length scores exactly the same targets); 95 % bootstrap "
            "intervals over documents in brackets"
        )
    return (
        f"{settings.get('mode')} windows drawn at random per length from {settings.get('split')} documents, at "
        f"least {settings.get('token_budget')} scored tokens per length (whole windows), window-selection seed "
        f"{settings.get('seed')}"
    )


def bpb_cell(e: dict) -> str:
    """``"1.944 [1.888, 1.999]"`` (bits per byte and its 95 % interval), ``"1.944"`` without one, ``"—"``."""
    if "bits_per_byte" not in e:
        return "—"
    ci = e.get("ci95")
    return f"{e['bits_per_byte']:.3f}" + (f" [{ci[0]:.3f}, {ci[1]:.3f}]" if isinstance(ci, list) else "")


def paired_cell(e: dict) -> str:
    """``"+0.011 [+0.007, +0.014]"``: the paired difference against the reference, or ``"—"``."""
    if "paired_delta_bpb" not in e:
        return "—"
    if not e.get("paired_ci95"):
        return f"{e['paired_delta_bpb']:+.3f}"
    lo, hi = e["paired_ci95"]
    return f"{e['paired_delta_bpb']:+.3f} [{lo:+.3f}, {hi:+.3f}]"


def model_card(folder: Path, results: list[dict], budget: int | None = None) -> str:
    cfg = read_checkpoint(folder).config
    tr = cfg.get("training", {})
    log = read_train_log(folder)
    vals = validation_rows(log)
    st = tr.get("settings", {})
    interim = bool(tr.get("steps") and st.get("max_steps") and tr["steps"] < st["max_steps"])
    lines = [
        f"# {folder.name}: {cfg['position_encoding']} byte-level GPT",
        "",
        f"- encoding: `{cfg['position_encoding']}`"
        + (f" {json.dumps(cfg['encoding_options'])}" if cfg.get("encoding_options") else ""),
        f"- model: {cfg['n_layer']} layers, {cfg['n_head']} heads, d_model {cfg['d_model']}, "
        f"{format(tr['num_parameters'], ',') if 'num_parameters' in tr else '?'} parameters, training length {cfg['seq_len']} bytes",
        f"- data: bundled `{tr.get('data')}` corpus, training split (fingerprint `{str(tr.get('data_fingerprint'))[:12]}`)",
        f"- trained: step {tr.get('steps')} of the {st.get('max_steps')}-step schedule, "
        f"{tr.get('tokens_seen', 0):,} tokens (batch {st.get('batch_size')} × {cfg['seq_len']}, lr {st.get('lr')}, seed {st.get('seed')})",
        f"- made by: `python -m fireviz train --config configs/tiny.toml --set model.position_encoding={cfg['position_encoding']}"
        + "".join(f" {a}" for a in recipe_overrides(cfg))
        + " --set train.checkpoint_interval=100"
        + (f" --set train.seed={st['seed']}" if st.get("seed") else "")
        + f" --out checkpoints/{folder.name}"
        + (f" --stop-at-step {tr['steps']}" if interim else "")
        + "` (run in several sessions, each resumed with `--resume`, which continues exactly; "
        "the resumable trainer state is not shipped)",
    ]
    lines += offset_lines(cfg)
    lines += position_parameter_lines(cfg, log)
    lines.append("")
    if interim:
        lines += [
            f"**Interim checkpoint**: training stopped at step {tr['steps']} of {st['max_steps']}; "
            "numbers below are not converged (validation loss was still falling; see below).",
            "",
        ]
    if vals:
        n = cfg["seq_len"]
        lines += [
            "Validation (nats/token at the training length / at 4×):",
            "",
            f"| step | tokens | val @{n} | val @{4 * n} |",
            "|---|---|---|---|",
        ]
        lines += [
            f"| {r['step']} | {r.get('tokens', 0):,} | {r['val_loss']:.3f} | {r.get('val_loss_4x', float('nan')):.3f} |"
            for r in vals
        ]
        lines.append("")
    context = [r for r in results if r["settings"].get("mode") == "context"]
    results = [r for r in results if r["settings"].get("mode") != "context"]
    protocol = protocol_text(results[0]["settings"], skipped=False) if results else "none yet"
    lines += [
        f"Evaluation (bits per byte; {protocol}):",
        "",
        "| data | documents | " + " | ".join(map(str, LENGTHS)) + " |",
        "|---" * (len(LENGTHS) + 2) + "|",
    ]
    for r in results:
        row = {e["length"]: e for e in r["per_length"]}
        s = r["settings"]
        name = (
            s["data"]
            + (f" ({s['rope_scaling']})" if s.get("rope_scaling") else "")
            + (f" (normalizer cap {s['normalizer_cap']})" if s.get("normalizer_cap") else "")
        )
        docs = max((e.get("documents", 0) for e in r["per_length"]), default=0)
        lines.append(f"| {name} | {docs} | " + " | ".join(bpb_cell(row.get(n, {})) for n in LENGTHS) + " |")
    lines += context_card_lines(context)
    lines += [
        "",
        "Reproduce: `python scripts/publish_results.py` (context use: `--context prose,latex,code`; see "
        "docs/protocol.md in the repository).",
    ]
    return "\n".join(lines) + "\n"


def context_card_lines(context: list[dict]) -> list[str]:
    """A card's context-use table (none without context-use rows)."""
    if not context:
        return []
    cols = context_columns(context)
    lines = [
        "",
        f"Context use (bits per byte; {context_protocol_text(context[0]['settings'])}; in parentheses: minus "
        "full context, paired over documents, with its 95 % interval):",
        "",
        "| data | documents | " + " | ".join(context_heading(c, context[0]) for c in cols) + " |",
        "|---" * (len(cols) + 2) + "|",
    ]
    for r in context:
        row = {e["length"]: e for e in r["per_length"]}
        docs = max((e.get("documents", 0) for e in r["per_length"]), default=0)
        cells = [bpb_cell(row.get(c, {})) + _full_suffix(row.get(c, {})) for c in cols]
        lines.append(f"| {r['settings']['data']} | {docs} | " + " | ".join(cells) + " |")
    return lines


def context_columns(runs: list[dict]) -> list[int]:
    """The context lengths c of context-use rows (tokens, ascending; full = M − K last)."""
    return sorted({e["length"] for r in runs for e in r["per_length"] if "error" not in e})


def context_heading(c: int, run: dict) -> str:
    """A context-use column heading: ``c`` or ``full (M − K)``."""
    full = run["settings"].get("full_context")
    return f"full ({c})" if c == full else str(c)


def context_protocol_text(settings: dict) -> str:
    """One sentence naming the context-use protocol of a result's ``settings``."""
    return (
        f"fixed targets, the last {settings.get('context_targets')} tokens of the first "
        f"{settings.get('prefix_tokens')} of every {settings.get('split')} document that long "
        f"({settings.get('documents_scored')} documents), each scored with c … c + {settings.get('stride', 1) - 1} "
        f"tokens of context before it by windows of c + {settings.get('stride')} tokens; full = "
        f"{settings.get('full_context')}, the whole prefix; the same targets at every c"
    )


def context_baseline_text(settings: dict, seq_len: int) -> str:
    """Which context lengths stay inside the training length: a window is c + s tokens, so
    c = seq_len − s is the last one whose windows training saw the length of."""
    s = settings.get("stride") or 1
    inside = seq_len - s
    return (
        f"Windows are c + {s} tokens long, so c = {inside} is the largest context whose windows fit the training "
        f"length ({seq_len}); from c = {seq_len} on the windows are longer than any seen in training, so the gain "
        f"beyond the training length is measured from c = {inside} (for FIRE a change along a row also moves its "
        "query positions past the training length)."
    )


def _full_suffix(e: dict) -> str:
    """``" (+0.004 [+0.001, +0.007])"``: bits per byte at c minus at full context, or ""."""
    if "full_delta_bpb" not in e:
        return ""
    ci = e.get("full_ci95")
    return f" ({e['full_delta_bpb']:+.4f}" + (f" [{ci[0]:+.4f}, {ci[1]:+.4f}]" if ci else "") + ")"


def fmt_context_tables(runs: list[dict]) -> list[str]:
    """Markdown for one domain's context-use rows: bits per byte at each context length c (95 %
    interval over documents); the same minus full context (paired over documents: the value of
    the context beyond c); and minus the reference checkpoint on the same targets."""
    cols = context_columns(runs)
    head = [
        "| encoding | " + " | ".join(context_heading(c, runs[0]) for c in cols) + " |",
        "|---" * (len(cols) + 1) + "|",
    ]
    full = runs[0]["settings"].get("full_context")

    def delta(e: dict, key: str, ci_key: str) -> str:
        if key not in e:
            return "—"
        ci = e.get(ci_key)
        return f"{e[key]:+.4f}" + (f" [{ci[0]:+.4f}, {ci[1]:+.4f}]" if ci else "")

    def table(cell) -> list[str]:
        out = list(head)
        for r in runs:
            row = {e["length"]: e for e in r["per_length"]}
            out.append(f"| {r['label']} | " + " | ".join(cell(row.get(c, {})) for c in cols) + " |")
        return out

    ref = next((r["paired_reference"] for r in runs if r.get("paired_reference")), "the reference")
    return [
        "Bits per byte of the same targets with c tokens of context [95 % bootstrap interval over documents]:",
        "",
        *table(bpb_cell),
        "",
        f"Minus full context ({full} tokens), paired over documents [95 % interval]: above 0, the context beyond c "
        "lowers the loss of these targets.",
        "",
        *table(lambda e: delta(e, "full_delta_bpb", "full_ci95")),
        "",
        f"Minus {ref} on the same targets and context, paired over documents [95 % interval]; below 0: better.",
        "",
        *table(lambda e: delta(e, "paired_delta_bpb", "paired_ci95")),
    ]


def fmt_bpb_table(runs: list[dict]) -> list[str]:
    """Markdown rows: one per result, bits per byte at each of LENGTHS with its 95 % interval
    where the result has one (``bpb_cell``; "—" where missing)."""
    out = ["| encoding | " + " | ".join(map(str, LENGTHS)) + " |", "|---" * (len(LENGTHS) + 1) + "|"]
    for r in runs:
        row = {e["length"]: e for e in r["per_length"]}
        out.append(f"| {r['label']} | " + " | ".join(bpb_cell(row.get(n, {})) for n in LENGTHS) + " |")
    return out


def fmt_paired_table(runs: list[dict]) -> list[str]:
    """Markdown rows: per result but the reference, its paired difference in bits per byte
    against the reference on the same documents, with the 95 % paired bootstrap interval
    (``paired_cell``). Returns [] when no result carries a paired difference."""
    paired = [r for r in runs if any("paired_delta_bpb" in e for e in r["per_length"])]
    if not paired:
        return []
    out = ["| encoding | " + " | ".join(map(str, LENGTHS)) + " |", "|---" * (len(LENGTHS) + 1) + "|"]
    for r in paired:
        row = {e["length"]: e for e in r["per_length"]}
        out.append(f"| {r['label']} | " + " | ".join(paired_cell(row.get(n, {})) for n in LENGTHS) + " |")
    return out


def fmt_validation_table(logs: dict[str, list[dict]], seq_len: int) -> list[str]:
    """Markdown rows: the last validation of each run and its change since the previous one.

    ``val_loss`` is measured at ``seq_len`` tokens and ``val_loss_4x`` at 4 × seq_len (fireviz.train).
    """
    out = [
        f"| encoding | step | tokens | val @{seq_len} (nats/token) | val @{4 * seq_len} | "
        f"change @{seq_len} since previous eval |",
        "|---|---|---|---|---|---|",
    ]
    for name, rows in logs.items():
        vals = validation_rows(rows)
        if not vals:
            continue
        last = vals[-1]
        delta = (
            f"{last['val_loss'] - vals[-2]['val_loss']:+.3f} (from step {vals[-2]['step']})" if len(vals) > 1 else "—"
        )
        out.append(
            f"| {name} | {last['step']} | {last.get('tokens', 0):,} | {last['val_loss']:.3f} | "
            f"{last.get('val_loss_4x', float('nan')):.3f} | {delta} |"
        )
    return out


def fmt_seed_table(runs: list[dict]) -> list[str]:
    """Markdown rows: per encoding with extra seeds, mean ± sample standard deviation over its
    seeds of bits per byte at each of LENGTHS, and the number of seeds.

    ``runs`` are one domain's results labelled by checkpoint folder (``label``); RoPE-scaled
    rows are ignored. Returns [] when no encoding has extra seeds.
    """
    plain = {r["label"]: r for r in runs if not r["settings"].get("rope_scaling")}
    groups = seed_groups(list(plain))
    if not groups:
        return []
    # the app's "Pool training seeds" table comes from the same plots.group_perplexity
    pooled = plots.group_perplexity(
        [{**plain[name], "group": enc} for enc, names in groups.items() for name in names], group_key="group"
    )
    by = {(r["group"], r["length"]): r for r in pooled}
    out = ["| encoding | seeds | " + " | ".join(map(str, LENGTHS)) + " |", "|---" * (len(LENGTHS) + 2) + "|"]
    for enc, names in groups.items():
        cells = []
        for n in LENGTHS:
            r = by.get((enc, n))
            cells.append(
                f"{r['bits_per_byte']:.3f} ± {r['bits_per_byte_std']:.3f}" if r and r["n"] == len(names) else "—"
            )
        out.append(f"| {enc} | {len(names)} | " + " | ".join(cells) + " |")
    return out


def fmt_paired_seed_table(runs: list[dict]) -> list[str]:
    """Markdown rows: per encoding with extra seeds, its paired difference against the reference
    pooled over its seeds — mean ± sample standard deviation over seeds — beside the mean
    half-width of one seed's 95 % paired interval over documents (text noise), so a claim can
    be sized against both. ``runs`` as ``fmt_seed_table``; [] when no encoding has extra seeds
    or no row is paired. When the reference has seeds of its own, its row is its seeds' differences
    against it (0 for itself): its own seed spread, which every other row's difference carries
    too."""
    plain = {r["label"]: r for r in runs if not r["settings"].get("rope_scaling")}
    groups = seed_groups(list(plain))
    ref = next((r["paired_reference"] for r in runs if r.get("paired_reference")), None)
    out = [
        "| encoding | seeds | " + " | ".join(map(str, LENGTHS)) + " |",
        "|---" * (len(LENGTHS) + 2) + "|",
    ]
    for enc, names in groups.items():
        cells = []
        for n in LENGTHS:
            rows = [next((e for e in plain[m]["per_length"] if e["length"] == n), {}) for m in names]
            deltas = [
                0.0 if m == ref else e.get("paired_delta_bpb")  # the reference against itself
                for m, e in zip(names, rows, strict=True)
            ]
            deltas = [d for d in deltas if d is not None]
            halves = [(e["paired_ci95"][1] - e["paired_ci95"][0]) / 2 for e in rows if e.get("paired_ci95")]
            if ref in names and halves:  # the reference's own row has no interval: the mean of its seeds'
                halves += [sum(halves) / len(halves)]
            if len(deltas) < 2 or len(deltas) != len(names):
                cells.append("—")
                continue
            mean = sum(deltas) / len(deltas)
            std = (sum((d - mean) ** 2 for d in deltas) / (len(deltas) - 1)) ** 0.5
            text = f" (text ±{sum(halves) / len(halves):.3f})" if len(halves) == len(names) else ""
            cells.append(f"{mean:+.3f} ± {std:.3f}{text}")
        out.append(f"| {enc} | {len(names)} | " + " | ".join(cells) + " |")
    return out if len(out) > 2 else []


def replace_generated(text: str, name: str, body: list[str]) -> str:
    """Replace the lines between ``<!-- generated:name -->`` and ``<!-- /generated:name -->``.

    Raises: SystemExit naming the missing marker (the README must carry both markers).
    """
    start, end = f"<!-- generated:{name} -->", f"<!-- /generated:{name} -->"
    if start not in text or end not in text:
        sys.exit(f"README.md lacks the markers {start} … {end}; add them where the {name} table belongs")
    head, rest = text.split(start, 1)
    _, tail = rest.split(end, 1)
    return head + start + "\n" + "\n".join(body) + "\n" + end + tail


def trained_query_positions(cfg: dict) -> int:
    """The largest query position (tokens) a checkpoint's training windows reached: the training
    length, plus ``train.random_position_offset`` where the run drew random starting positions.
    FIRE's normalizer is capped there for its capped row; a run whose training already reached
    every evaluated length gets no capped row (the cap would change nothing)."""
    settings = cfg.get("training", {}).get("settings", {})
    return cfg["seq_len"] + int(settings.get("random_position_offset") or 0)


def offset_lines(cfg: dict) -> list[str]:
    """The card line on random absolute training positions (``train.random_position_offset``), or []."""
    st = cfg.get("training", {}).get("settings", {})
    if not st.get("random_position_offset"):
        return []
    return [
        (
            f"- positions: every training batch starts at a random absolute position in "
            f"[0, {st['random_position_offset']}] (`train.random_position_offset`; one draw per micro-batch, "
            "shared by its windows), so query positions up to "
            f"{trained_query_positions(cfg)} were seen in training while windows stayed {cfg['seq_len']} tokens long"
            + (
                "; without progressive interpolation this FIRE depends on i − j only, so the offset changes "
                "nothing (the same run as with offset 0) and its threshold L is unused"
                if has_normalizer(cfg["position_encoding"])
                and (cfg.get("encoding_options") or {}).get("progressive_interpolation") is False
                else ""
            )
            + "; the validation below is scored from position 0"
        )
    ]


def position_parameter_lines(cfg: dict, log: list[dict]) -> list[str]:
    """Card lines on how the position parameters were trained and where they ended: the learning
    rate of their AdamW group (``train.position_lr_multiplier``), Kerple-power's init, and the
    last logged values (FIRE's c and L, T5's table range, Kerple's r1 and r2) from the train log."""
    st = cfg.get("training", {}).get("settings", {})
    enc = cfg["position_encoding"]
    out = []
    multiplier = st.get("position_lr_multiplier", 1)
    if multiplier != 1:
        out.append(
            f"- position parameters: their own AdamW group at {multiplier:g} × lr (no weight decay; "
            f"`train.position_lr_multiplier={multiplier:g}`), so FIRE's c and L, T5's bucket table and "
            "Kerple's r1, r2 can move further than the recipe's Σ lr ≈ 2 allows"
        )
    if enc == "kerple_power":
        reference = kerple_reference_init(cfg)
        out.append(
            "- init: r1 (scale) ~ U(0, 1), r2 (exponent) ~ U(0, 2), as in the KERPLE reference code"
            if reference
            else "- init: r1 (scale) ~ U(0, 2), r2 (exponent) ~ U(0, 1) — fireviz 0.1's init, the reverse of the "
            "KERPLE reference code (bias_p ~ U(0, 2) is the exponent there); runs trained from 2026-12-04 use the reference"
        )
    last = next((r["position_parameters"] for r in reversed(log) if r.get("position_parameters")), None)
    if last:
        parts = []
        for name, layers in last.items():
            values = [v for per_head in layers.values() for v in per_head]
            parts.append(f"{name} {min(values):.3g} … {max(values):.3g}")
        out.append("- position parameters at the end (over layers and heads): " + "; ".join(parts))
    return out


def recipe_overrides(cfg: dict) -> list[str]:
    """The ``--set`` arguments beyond the shared recipe, encoding and seed that made a checkpoint:
    ``train.random_position_offset`` when on, ``train.position_lr_multiplier`` when not 1, and every encoding option whose stored value differs
    from its default at the checkpoint's training length (e.g. FIRE's
    ``progressive_interpolation = false``). [] for a run of the shared recipe."""
    out = []
    offset = cfg.get("training", {}).get("settings", {}).get("random_position_offset")
    if offset:
        out.append(f"--set train.random_position_offset={offset}")
    multiplier = cfg.get("training", {}).get("settings", {}).get("position_lr_multiplier", 1)
    if multiplier != 1:
        out.append(f"--set train.position_lr_multiplier={multiplier:g}")
    defaults = GPTConfig(position_encoding=cfg["position_encoding"], seq_len=cfg["seq_len"]).complete_encoding_options()
    for key, value in sorted((cfg.get("encoding_options") or {}).items()):
        if key in defaults and value != defaults[key]:
            out.append(f"--set model.encoding_options.{key}={json.dumps(value)}")
    return out


def evaluate_domain(folders: list[Path], domain: str, reference: int, kw: dict) -> list[dict]:
    """Every checkpoint on one domain, plus RoPE as PI and YaRN and FIRE with its normalizer capped
    at the largest query position its training reached (``trained_query_positions``), all paired
    against the reference on the same windows."""
    runs = evaluate_many([str(f) for f in folders], domain, LENGTHS, reference=reference, **kw)
    for f in folders:
        cfg = read_checkpoint(f).config
        if cfg["position_encoding"] == "rope":
            for scaling in ("pi", "yarn"):
                runs += evaluate_many([str(f)], domain, LENGTHS, rope_scaling=scaling, **kw)
        cap = trained_query_positions(cfg)
        if has_normalizer(cfg["position_encoding"]) and cap < max(LENGTHS):  # FIRE as trained, and capped
            runs += evaluate_many([str(f)], domain, LENGTHS, normalizer_cap=cap, **kw)
    # the scaled and capped rows were scored on the same windows: pair them with the reference too
    return with_paired_differences(runs, reference)


def evaluate_context(
    folders: list[Path], domain: str, reference: int, kw: dict, cached_only: bool = False
) -> list[dict]:
    """Every checkpoint on one domain with the context-use protocol (``mode="context"``, its default
    context lengths ``CONTEXT_LENGTHS``: 128, 256, 448, 512 … 4096 and full, M = 8192, K = 256, s = 64), paired against the reference
    on the same targets. ``cached_only``: nothing is scored — the rows whose every context length
    is already in the eval cache or a results.json (e.g. from ``python -m fireviz eval … --mode
    context``), with intervals; the others are named on stdout and left out."""
    kw = {k: v for k, v in kw.items() if k not in ("mode", "token_budget")}
    if not cached_only:
        return evaluate_many(
            [str(f) for f in folders], domain, CONTEXT_LENGTHS, mode="context", reference=reference, **kw
        )
    found = cached_results(
        [str(f) for f in folders],
        domain,
        CONTEXT_LENGTHS,
        mode="context",
        reference=reference,
        use_published=kw.get("use_published", True),
        require_intervals=True,
        seed=kw.get("seed", 0),
        device=kw.get("device", "auto"),
    )
    complete = [r for r in found if all("error" not in e for e in r["per_length"])]
    if len(complete) < len(found):
        have = {r["checkpoint"] for r in complete}
        missing = [r["checkpoint"] for r in found if r["checkpoint"] not in have]
        print(f"context use on {domain}: not in the cache yet, left out: {', '.join(missing)}", flush=True)
    return complete


def progress_printer(every_s: float = 10.0):
    """A ``progress(done, total, message)`` callback for ``evaluate_many`` that prints to stderr at
    most every ``every_s`` seconds (and at the end of each call): tokens done of all, and the
    evaluation's own message (which carries the rate and ETA once scoring runs)."""
    last = [0.0]

    def progress(done: int, total: int, message: str) -> None:
        now = time.monotonic()
        if now - last[0] >= every_s or done >= total:
            last[0] = now
            pct = 100.0 * done / total if total else 100.0
            print(f"  {pct:5.1f} % ({done:,} of {total:,} target tokens) {message}", file=sys.stderr, flush=True)

    return progress


def write_validation_figure(logs: dict, seq_len: int) -> None:
    """The validation-curves figure of every checkpoint (``checkpoints/validation_curves.{html,png}``)."""
    vfig = plots.validation_curves_figure(logs, seq_len=seq_len)
    vfig.update_layout(width=1000, height=600)
    vfig.write_html(CKPTS / "validation_curves.html", include_plotlyjs="cdn")
    render_png(vfig, CKPTS / "validation_curves.png")


def _parse_args() -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--domains", default="prose,latex,code")
    ap.add_argument("--only", default="", help="comma-separated checkpoint names (default: all)")
    ap.add_argument("--mode", default=DEFAULT_MODE, choices=["same_text", "nonoverlapping"])
    ap.add_argument(
        "--token-budget",
        type=int,
        default=None,
        help="default: none for same_text (every qualifying document), 16384 for nonoverlapping",
    )
    ap.add_argument(
        "--context",
        default="",
        help="also evaluate these domains (comma-separated) with the context-use protocol (mode context; "
        "minutes per checkpoint and domain on a CPU); context rows already in results.json are kept and shown",
    )
    ap.add_argument(
        "--context-cached",
        action="store_true",
        help="with --context: score nothing, publish the context-use rows already in the eval cache (e.g. "
        "from `python -m fireviz eval ... --mode context`) and name the checkpoints still missing",
    )
    ap.add_argument(
        "--claims-only",
        action="store_true",
        help="evaluate nothing: recompute checkpoints/claims.json, RESULTS.md's claims section and the claim "
        "quotes of docs/findings.md from the results.json files as they are",
    )
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--reference", default="alibi", help="checkpoint every other row is paired against")
    ap.add_argument(
        "--recompute",
        action="store_true",
        help="score every length again instead of reusing the numbers a results.json holds for the same weights",
    )
    args = ap.parse_args()
    if args.token_budget is None and args.mode == "nonoverlapping":
        args.token_budget = 16384
    return args


def _folders(args: argparse.Namespace) -> list[Path]:
    folders = sorted(
        p
        for p in CKPTS.iterdir()
        if (p / "model.safetensors").exists() and (not args.only or p.name in args.only.split(","))
    )
    if not folders:
        sys.exit("no checkpoints in checkpoints/")
    names = [f.name for f in folders]
    if args.reference not in names:
        sys.exit(
            f"--reference {args.reference} is not among the checkpoints evaluated ({', '.join(names)}); "
            "name one of them"
        )
    return folders


def _write_domain(domain: str, runs: list[dict]) -> None:
    """The domain's figure (HTML, PNG) and JSON, showing every checkpoint."""
    fig = plots.perplexity_figure(runs)
    fig.update_layout(width=1000, height=600)
    fig.write_html(CKPTS / f"results_{domain}.html", include_plotlyjs="cdn")
    # every run of the domain in one file, compressed (the same results are in each folder's
    # results.json; this copy holds the per-document losses of all rows, ~4× smaller as gzip)
    data = gzip.compress((json.dumps(runs, indent=1, allow_nan=False) + "\n").encode("utf-8"), mtime=0)
    atomic_write(CKPTS / f"results_{domain}.json.gz", lambda p: Path(p).write_bytes(data))
    render_png(fig, CKPTS / f"results_{domain}.png")


def _write_folders(folders: list[Path], by_ckpt: dict[str, list[dict]]) -> None:
    """Each folder's results.json and card; results for domains not evaluated now are kept."""
    for f in folders:
        by_ckpt[f.name], dropped = merge_results(read_results(f), by_ckpt[f.name])
        for r in dropped:
            print(
                f"{f.name}: dropped its {r['settings'].get('data')} result made on other weights or settings; "
                "run without --domains to evaluate every domain again",
                flush=True,
            )
        write_json_atomic(f / "results.json", by_ckpt[f.name])
        atomic_write_text(f / "README.md", model_card(f, by_ckpt[f.name]))


def kerple_reference_init(cfg: dict) -> bool:
    """Whether a kerple_power config.json's run drew its init as the KERPLE reference code does (a
    config.json written before the option existed does not name it: those runs drew the old way)."""
    return (cfg.get("encoding_options") or {}).get("reference_init") is True


def seed_recipe_notes(folders: list[Path]) -> list[str]:
    """One sentence per seed group whose members were not trained the same way apart from the seed
    (today: Kerple-power's init, which changed on 2026-12-04), so its seed spread is read as such."""
    cfgs = {f.name: read_checkpoint(f).config for f in folders}
    notes = []
    for base, members in seed_groups(list(cfgs)).items():
        if cfgs[base].get("position_encoding") != "kerple_power":
            continue
        ref = [m for m in members if kerple_reference_init(cfgs[m])]
        old = [m for m in members if m not in ref]
        if ref and old:
            notes.append(
                f"{base}: {', '.join(ref)} drew its init as the KERPLE reference code does (r1 ~ U(0, 1), "
                f"r2 ~ U(0, 2)); {', '.join(old)} with fireviz 0.1's reversed init. Its seed rows pool the two "
                "inits, so their spread includes the init, not training seeds alone."
            )
    return notes


def results_markdown(
    table: dict[str, list[dict]],
    logs: dict[str, list[dict]],
    seq_len: int,
    context: dict[str, list[dict]] | None = None,
    notes: list[str] | None = None,
    claims: dict | None = None,
) -> str:
    """checkpoints/RESULTS.md: per domain the bits-per-byte table, the paired and seed tables; per
    domain with context-use rows (``context``) their tables (``fmt_context_tables``)."""
    md = [
        "# Results: bits per byte by evaluation length",
        "",
        f"Per domain: {protocol_text(next(iter(table.values()))[0]['settings'], skipped=False)}; training length {seq_len} "
        "bytes. Lower is better.",
        "",
    ]
    for domain, runs in table.items():
        md += [f"## {domain}", "", protocol_text(runs[0]["settings"]) + ".", ""] + fmt_bpb_table(runs) + [""]
        if paired := fmt_paired_table(runs):
            ref = next(r["paired_reference"] for r in runs if r.get("paired_reference"))
            md += [
                f"Paired difference against {ref} on the same documents (bits per byte; below 0: better), "
                "95 % paired bootstrap interval over documents:",
                "",
                *paired,
                "",
            ]
        if seeds := fmt_seed_table(runs):
            md += [f"Seed noise ({domain}): mean ± sample standard deviation over seeds", ""] + seeds + [""]
            md += [f"Note: {n}" for n in notes or []] + ([""] if notes else [])
        if paired_seeds := fmt_paired_seed_table(runs):
            ref = next(r["paired_reference"] for r in runs if r.get("paired_reference"))
            md += [
                f"Paired difference against {ref} pooled over training seeds ({domain}): mean ± sample "
                "standard deviation over seeds, and in parentheses the mean half-width of one seed's 95 % "
                "interval over documents. A difference smaller than the seed spread is not a property of "
                "the encoding.",
                "",
                *paired_seeds,
                "",
            ]
    for domain, runs in (context or {}).items():
        missing = sorted({r["checkpoint"] for r in table.get(domain, [])} - {r["checkpoint"] for r in runs})
        md += [
            f"## Context use: {domain}",
            "",
            context_protocol_text(runs[0]["settings"]) + ". A change along a row is exactly the value of more "
            "context for these targets (the same-text tables above also change how many targets sit near a "
            "window start). " + context_baseline_text(runs[0]["settings"], seq_len),
            "",
            *fmt_context_tables(runs),
            "",
        ]
        if missing:
            md += [
                f"Not evaluated with this protocol yet ({len(missing)} of {len(missing) + len(runs)}): "
                + ", ".join(missing)
                + f" (`python scripts/publish_results.py --context {domain}` scores them).",
                "",
            ]
    md += claims_section(claims) if claims else []
    md += ["## Validation during training", "", "![validation curves](validation_curves.png)", ""]
    md += fmt_validation_table(logs, seq_len) + [""]
    return "\n".join(md)


def context_rows(folders: list[Path], by_ckpt: dict[str, list[dict]]) -> dict[str, list[dict]]:
    """Per domain, the context-use rows (from this run or kept in results.json) of the checkpoints
    that have one; ``missing_context`` names the others in the tables' text, so a partial table
    says who is missing."""
    out: dict[str, list[dict]] = {}
    for domain in DOMAIN_ORDER:
        rows = [
            r
            for f in folders
            for r in by_ckpt[f.name]
            if r["settings"].get("mode") == "context" and r["settings"]["data"] == domain
        ]
        if rows:
            out[domain] = rows
            if missing := missing_context(folders, rows):
                print(
                    f"context use on {domain}: {len(rows)} of {len(folders)} checkpoints evaluated (missing: "
                    f"{', '.join(missing)}); run --context {domain}",
                    flush=True,
                )
    return out


def claims_document(folders: list[Path], by_ckpt: dict[str, list[dict]]) -> dict:
    """checkpoints/claims.json: every comparison of docs/claims.toml computed from these
    checkpoints' results (``fireviz.eval.claims.compute_claims``); a claim naming a checkpoint not
    among them is listed under ``pending`` (e.g. a run still training), not computed."""
    specs = read_claim_specs(CLAIM_SPECS)
    claims, pending = compute_claims(specs, {f.name: by_ckpt[f.name] for f in folders}, skip_missing=True)
    return {
        "rule": "docs/protocol.md, Claims and their verdicts (fireviz.eval.claims)",
        "specs": f"{CLAIM_SPECS.parent.name}/{CLAIM_SPECS.name}",
        "claims": claims,
        "pending": pending,
    }


def fmt_claims_table(doc: dict) -> list[str]:
    """Markdown: one row per computed claim (id, its numbers and verdict, the test), then the
    pending ones by id."""
    out = ["| claim | what is compared | a − b, bits per byte [95 %] (seeds, test: verdict) |", "|---|---|---|"]
    out += [f"| `{c['id']}` | {c['statement']} | {format_claim(c)} |" for c in doc["claims"]]
    if doc["pending"]:
        out += ["", "Not computed yet (their checkpoints are not published): " + ", ".join(doc["pending"]) + "."]
    return out


def write_claims(doc: dict) -> None:
    """checkpoints/claims.json and the claim quotes of the docs (``CLAIM_DOCS``) from ``doc``."""
    write_json_atomic(CLAIMS, doc)
    for path in CLAIM_DOCS:
        text = path.read_text(encoding="utf-8")
        new = quote_claims(text, doc["claims"], doc["pending"], where=str(path.relative_to(ROOT)))
        if new != text:
            atomic_write_text(path, new)
    if doc["pending"]:
        print(f"claims not computed yet (checkpoints missing): {', '.join(doc['pending'])}", flush=True)


def claims_section(doc: dict) -> list[str]:
    """RESULTS.md's claims section, between its generated markers."""
    return [
        "## Claims",
        "",
        "<!-- generated:claims -->",
        "Every comparison docs/findings.md makes, computed from the checkpoints' results.json into "
        "[claims.json](claims.json) (docs/claims.toml lists them; the verdict rule is in docs/protocol.md, "
        "*Claims and their verdicts*: with ≥ 2 seeds per arm a t-test over seed means, p < 0.05 resolved, "
        "p < 0.2 suggestive; with one seed on either side an interval over documents, resolved only for "
        "differences of at least 0.1 bpb, or 3 seed standard deviations where that is larger).",
        "",
        *fmt_claims_table(doc),
        "<!-- /generated:claims -->",
        "",
    ]


def missing_context(folders: list[Path], rows: list[dict]) -> list[str]:
    """The checkpoints (folder names) without a context-use row among ``rows``."""
    have = {r["checkpoint"] for r in rows}
    return [f.name for f in folders if f.name not in have]


def publish_claims_only(folders: list[Path]) -> int:
    """``--claims-only``: claims.json, RESULTS.md's claims section and the docs' claim quotes from
    the results.json files as they are (nothing is evaluated)."""
    by_ckpt = {f.name: read_results(f) for f in folders}
    doc = claims_document(folders, by_ckpt)
    write_claims(doc)
    md = (CKPTS / "RESULTS.md").read_text(encoding="utf-8")
    start, end = "<!-- generated:claims -->", "<!-- /generated:claims -->"
    if start in md and end in md:
        section = claims_section(doc)
        body = section[section.index(start) + 1 : section.index(end)]
        atomic_write_text(CKPTS / "RESULTS.md", replace_generated(md, "claims", body))
    else:
        print("checkpoints/RESULTS.md has no claims section yet: run without --claims-only", flush=True)
    print(f"{len(doc['claims'])} claims written to {CLAIMS.relative_to(ROOT)}", flush=True)
    return 0


def main() -> int:
    args = _parse_args()
    folders = _folders(args)
    if args.claims_only:
        return publish_claims_only(folders)
    by_ckpt: dict[str, list[dict]] = {f.name: [] for f in folders}
    table: dict[str, list[dict]] = {}
    reference = [f.name for f in folders].index(args.reference)
    # reuse what each results.json holds for exactly these weights, data and settings (issue #40):
    # the identity check makes a stale file harmless; --recompute scores everything again
    kw = dict(
        mode=args.mode,
        token_budget=args.token_budget,
        seed=args.seed,
        device="auto",
        use_published=not args.recompute,
        progress=progress_printer(),
    )
    for domain in sorted(args.domains.split(","), key=lambda d: DOMAIN_ORDER.get(d, 99)):
        runs = evaluate_domain(folders, domain, reference, kw)
        for r in runs:
            name_row(r)
            by_ckpt[r["checkpoint"]].append(r)
        table[domain] = runs
        if not args.only:  # the domain's figure and JSON show every checkpoint; --only leaves them alone
            _write_domain(domain, runs)
        print(format_table(runs), flush=True)
    for domain in [d for d in args.context.split(",") if d]:
        runs = evaluate_context(folders, domain, reference, kw, cached_only=args.context_cached)
        for r in runs:
            name_row(r)
            by_ckpt[r["checkpoint"]].append(r)
        print(format_table(runs), flush=True)
    _write_folders(folders, by_ckpt)
    context = context_rows(folders, by_ckpt)
    logs = {f.name: read_train_log(f) for f in folders}
    seq_len = read_checkpoint(folders[0]).seq_len
    if not args.only:  # the figure shows every checkpoint; a partial run leaves it alone
        write_validation_figure(logs, seq_len)
    if args.only or set(table) != set(DOMAIN_ORDER):
        print("checkpoints/RESULTS.md left as it was: it shows every checkpoint on every domain", flush=True)
        return 0
    claims = claims_document(folders, by_ckpt)
    write_claims(claims)
    md = results_markdown(table, logs, seq_len, context, seed_recipe_notes(folders), claims)
    atomic_write_text(CKPTS / "RESULTS.md", md)
    print(md)
    return 0


if __name__ == "__main__":
    sys.exit(main())
