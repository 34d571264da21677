"""Evaluate every checkpoint in checkpoints/ the same way and publish the results.

For each domain: ``fireviz.evaluate.evaluate_many`` over all checkpoints (paired windows),
non-overlapping, the same token budget per length; the RoPE checkpoint also as RoPE-PI and
YaRN. Writes per checkpoint ``results.json`` (a list of evaluate results) and a model card
``README.md``; writes ``checkpoints/RESULTS.md`` (bits per byte by length and domain) and
``checkpoints/results_<domain>.html`` plus a PNG of the prose figure when Chromium is there.

    python scripts/publish_results.py [--domains prose,latex,code] [--token-budget 16384]
"""
from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path

from fireviz import evaluate, plots
from fireviz.checkpoints import read_train_log
from fireviz.files import atomic_write_text, write_json_atomic

ROOT = Path(__file__).resolve().parent.parent
CKPTS = ROOT / "checkpoints"
LENGTHS = [128, 256, 512, 1024, 2048, 4096, 8192]


def label(result: dict) -> str:
    scaling = result["settings"].get("rope_scaling")
    name = result["checkpoint"]
    return {"pi": "rope_pi (zero-shot)", "yarn": "yarn (zero-shot)"}.get(scaling, name) if name == "rope" else name


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
            browser = pw.chromium.launch(executable_path="/usr/bin/chromium", args=[
                "--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking"])
            page = browser.new_page(viewport={"width": 1020, "height": 620})
            page.goto(html.as_uri())
            page.wait_for_selector(".js-plotly-plot")
            page.screenshot(path=str(path))
            browser.close()


def model_card(folder: Path, results: list[dict], budget: int) -> str:
    cfg = json.loads((folder / "config.json").read_text())
    tr = cfg.get("training", {})
    log = read_train_log(folder / "train_log.jsonl")
    vals = [r for r in log if "val_loss" in r]
    st = tr.get("settings", {})
    lines = [f"# {folder.name}: {cfg['position_encoding']} byte-level GPT", "",
             f"- encoding: `{cfg['position_encoding']}` {json.dumps(cfg.get('encoding_options') or {})}",
             f"- model: {cfg['n_layer']} layers, {cfg['n_head']} heads, d_model {cfg['d_model']}, "
             f"{tr.get('num_parameters', '?'):,} parameters, training length {cfg['seq_len']} bytes",
             f"- data: bundled `{tr.get('data')}` corpus, training split (fingerprint `{str(tr.get('data_fingerprint'))[:12]}`)",
             f"- trained: step {tr.get('steps')} of the {st.get('max_steps')}-step schedule, "
             f"{tr.get('tokens_seen', 0):,} tokens (batch {st.get('batch_size')} × {cfg['seq_len']}, lr {st.get('lr')}, seed {st.get('seed')})",
             f"- made by: `python -m fireviz train --config configs/tiny.toml --set model.position_encoding={cfg['position_encoding']} "
             f"--set train.checkpoint_interval=100 --out checkpoints/{folder.name}` (stopped at step {tr.get('steps')}; "
             f"the resumable trainer state is not shipped)", ""]
    if tr.get("steps") and st.get("max_steps") and tr["steps"] < st["max_steps"]:
        lines += [f"**Interim checkpoint**: training stopped at step {tr['steps']} of {st['max_steps']}; "
                  "numbers below are far from converged.", ""]
    if vals:
        lines += ["Validation (nats/token at the training length / at 4×):", "",
                  "| step | tokens | val @512 | val @2048 |", "|---|---|---|---|"]
        lines += [f"| {r['step']} | {r.get('tokens', 0):,} | {r['val_loss']:.3f} | {r.get('val_loss_4x', float('nan')):.3f} |"
                  for r in vals]
        lines.append("")
    lines += [f"Evaluation (bits per byte, non-overlapping windows, {budget} tokens per length, validation split):", "",
              "| data | " + " | ".join(map(str, LENGTHS)) + " |", "|---" * (len(LENGTHS) + 1) + "|"]
    for r in results:
        row = {e["length"]: e for e in r["per_length"]}
        name = r["settings"]["data"] + (f" ({r['settings']['rope_scaling']})" if r["settings"].get("rope_scaling") else "")
        lines.append(f"| {name} | " + " | ".join(f"{row[n]['bits_per_byte']:.3f}" if "bits_per_byte" in row.get(n, {})
                                                  else "—" for n in LENGTHS) + " |")
    lines += ["", "Reproduce: `python scripts/publish_results.py` (see the repository README)."]
    return "\n".join(lines) + "\n"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--domains", default="prose,latex,code")
    ap.add_argument("--only", default="", help="comma-separated checkpoint names (default: all)")
    ap.add_argument("--token-budget", type=int, default=16384)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    folders = sorted(p for p in CKPTS.iterdir() if (p / "model.safetensors").exists()
                     and (not args.only or p.name in args.only.split(",")))
    if not folders:
        sys.exit("no checkpoints in checkpoints/")
    by_ckpt: dict[str, list[dict]] = {f.name: [] for f in folders}
    table: dict[str, list[dict]] = {}
    for domain in args.domains.split(","):
        runs = evaluate.evaluate_many([str(f) for f in folders], domain, LENGTHS, token_budget=args.token_budget,
                                      seed=args.seed, device="auto")
        for f in folders:
            cfg = json.loads((f / "config.json").read_text())
            if cfg["position_encoding"] == "rope":
                for scaling in ("pi", "yarn"):
                    runs += evaluate.evaluate_many([str(f)], domain, LENGTHS, token_budget=args.token_budget,
                                                   seed=args.seed, rope_scaling=scaling, device="auto")
        for r in runs:
            r["label"] = label(r)
            by_ckpt[r["checkpoint"]].append(r)
        table[domain] = runs
        fig = plots.perplexity_figure(runs)
        fig.update_layout(width=1000, height=600)
        fig.write_html(CKPTS / f"results_{domain}.html", include_plotlyjs="cdn")
        write_json_atomic(CKPTS / f"results_{domain}.json", runs)
        render_png(fig, CKPTS / f"results_{domain}.png")
        print(evaluate.format_table(runs), flush=True)
    for f in folders:
        write_json_atomic(f / "results.json", by_ckpt[f.name])
        atomic_write_text(f / "README.md", model_card(f, by_ckpt[f.name], args.token_budget))
    md = ["# Results: bits per byte by evaluation length", "",
          f"Non-overlapping windows from validation documents at least as long as the window, "
          f"{args.token_budget} scored tokens per length, seed {args.seed}; training length 512 bytes. "
          "Lower is better.", ""]
    for domain, runs in table.items():
        md += [f"## {domain}", "", "| encoding | " + " | ".join(map(str, LENGTHS)) + " |", "|---" * (len(LENGTHS) + 1) + "|"]
        for r in runs:
            row = {e["length"]: e for e in r["per_length"]}
            md.append(f"| {r['label']} | " + " | ".join(
                f"{row[n]['bits_per_byte']:.3f}" if "bits_per_byte" in row.get(n, {}) else "—" for n in LENGTHS) + " |")
        md.append("")
    atomic_write_text(CKPTS / "RESULTS.md", "\n".join(md))
    print("\n".join(md))
    return 0


if __name__ == "__main__":
    sys.exit(main())
