"""Evaluate a group of synthetic-task checkpoints (e.g. checkpoints/copy) and publish its results.

A task group is a sub-folder of checkpoints/ whose checkpoints were all trained on one
synthetic task (``fireviz.data.synthetic``, e.g. ``configs/copy.toml``). It is published apart from
the prose models: its own tables, never mixed into theirs.

For every checkpoint in the group: ``fireviz.eval.evaluation.evaluate_many`` on the task (fresh
sequences of each length, the same for every checkpoint; only the answer positions scored)
at 16…1024 tokens (¼× to 16× the training length; length n: the model reads n tokens, as in
training at seq_len n), paired against ``--reference``; and
``fireviz.analysis.biases.bias_report`` with the per-head locality at the training length.

Writes per checkpoint ``results.json`` (one evaluate result: bits per byte and answer
accuracy by length with 95 % intervals) and a card ``README.md``; in the group folder
``RESULTS.md`` (accuracy, bits per byte, paired differences, heads' locality),
``results.json`` (every row), ``accuracy.png`` and ``bias_grid_<name>.png`` for every
checkpoint with an additive bias (Chromium via Playwright; skipped without it). The README and
docs/findings.md link to the group's RESULTS.md instead of copying it (issue 34).

    python scripts/publish_task_group.py [--group copy] [--lengths 32,64,128,256,512]
        [--sequences 256] [--reference alibi]   (lengths default 16…1024: ¼× to 16× the training length)
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from publish_results import ROOT, bpb_cell, paired_cell, render_png

from fireviz import plots
from fireviz.analysis import biases as analysis
from fireviz.checkpoints import checkpoint_groups, load_model, read_train_log, scan_checkpoints, validation_rows
from fireviz.core import FileFormatError, atomic_write_text, read_json, write_json_atomic
from fireviz.data import synthetic
from fireviz.eval import SYNTHETIC_SEQUENCES, EvaluationError, evaluate_many
from fireviz.model import CheckpointError

CKPTS = ROOT / "checkpoints"


def accuracy_cell(e: dict) -> str:
    """``"0.928 [0.916, 0.941]"``: answer accuracy and its 95 % interval over sequences, or ``"—"``."""
    if not isinstance(e.get("accuracy"), (int, float)):
        return "—"
    ci = e.get("accuracy_ci95")
    return f"{e['accuracy']:.3f}" + (f" [{ci[0]:.3f}, {ci[1]:.3f}]" if isinstance(ci, list) else "")


def table(runs: list[dict], lengths: list[int], cell) -> list[str]:
    """Markdown rows: one per result, ``cell(entry)`` at each length ("—" where missing)."""
    out = ["| encoding | " + " | ".join(map(str, lengths)) + " |", "|---" * (len(lengths) + 1) + "|"]
    for r in runs:
        row = {e["length"]: e for e in r["per_length"]}
        out.append(f"| {r['checkpoint']} | " + " | ".join(cell(row[n]) if n in row else "—" for n in lengths) + " |")
    return out


def locality_rows(summaries: list[dict], tables: dict[str, list[dict]]) -> list[str]:
    """Markdown rows: per checkpoint the count of local / anti-local / mixed heads and, per
    layer, each head's class with its rank correlation ρ (bias vs distance)."""
    out = ["| encoding | heads | local | anti-local | mixed | per layer: head class (ρ) |", "|---|---|---|---|---|---|"]
    for s in summaries:
        if not s["heads"]:
            out.append(f"| {s['checkpoint']} | — | — | — | — | no additive bias ({s['kind']}) |")
            continue
        layers: dict[int, list[str]] = {}
        for h in tables[s["checkpoint"]]:
            rho = h["rank_correlation"]
            layers.setdefault(h["layer"], []).append(
                f"{h['locality']} ({rho:+.2f})" if rho is not None else h["locality"]
            )
        detail = "; ".join(f"L{k}: " + ", ".join(v) for k, v in layers.items())
        out.append(
            f"| {s['checkpoint']} | {s['heads']} | {s['n_local']} | {s['n_anti_local']} | {s['n_mixed']} | {detail} |"
        )
    return out


def card(folder: Path, result: dict, summary: dict, lengths: list[int], group: str) -> str:
    cfg = json.loads((folder / "config.json").read_text())
    tr = cfg.get("training", {})
    st = tr.get("settings", {})
    vals = validation_rows(read_train_log(folder))
    row = {e["length"]: e for e in result["per_length"]}
    lines = [
        f"# {group}/{folder.name}: {cfg['position_encoding']} on the synthetic task `{tr.get('data')}`",
        "",
        f"- model: {cfg['n_layer']} layers, {cfg['n_head']} heads, d_model {cfg['d_model']}, "
        f"{tr.get('num_parameters', 0):,} parameters, training length {cfg['seq_len']} tokens",
        f"- trained: {tr.get('steps')} steps, {tr.get('tokens_seen', 0):,} tokens (batch {st.get('batch_size')}, "
        f"lr {st.get('lr')}, seed {st.get('seed')}); weights stored in float16 "
        "(`scripts/ship_checkpoint.py`; every number here is from exactly these weights)",
        f"- made by: `python -m fireviz train --config configs/copy.toml --set "
        f"model.position_encoding={cfg['position_encoding']} --out runs/copy/{folder.name}`",
        "",
    ]
    if vals:
        last = vals[-1]
        lines += [
            f"Last validation loss during training: {last['val_loss']:.3g} nats per answer token at "
            f"{cfg['seq_len']} (the copied half only, as the training loss), step {last['step']}.",
            "",
        ]
    lines += [
        f"Evaluation on {result['settings']['documents']} fresh sequences per length (only the answer "
        "positions scored; 95 % intervals over sequences):",
        "",
        "| length | " + " | ".join(map(str, lengths)) + " |",
        "|---" * (len(lengths) + 1) + "|",
        "| answer accuracy | " + " | ".join(accuracy_cell(row.get(n, {})) for n in lengths) + " |",
        "| sequences copied without error | "
        + " | ".join(
            f"{row[n]['sequence_accuracy']:.3f}" if n in row and "sequence_accuracy" in row[n] else "—" for n in lengths
        )
        + " |",
        "| bits per token | " + " | ".join(bpb_cell(row.get(n, {})) for n in lengths) + " |",
        "",
    ]
    if summary["heads"]:
        lines += [
            f"Heads at query position {summary['classify_at']}: {summary['n_local']} local, "
            f"{summary['n_anti_local']} anti-local, {summary['n_mixed']} mixed "
            f"(`python -m fireviz biases checkpoints/{group}/{folder.name}`).",
            "",
        ]
    lines += ["Reproduce: `python scripts/publish_task_group.py` (see docs/findings.md in the repository)."]
    return "\n".join(lines) + "\n"


def _parse_args() -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--group", default="copy", help="sub-folder of checkpoints/ (default copy)")
    ap.add_argument(
        "--lengths",
        default="16,32,64,128,256,512,1024",
        help="¼× to 16× the training length (64), as the app's default",
    )
    ap.add_argument("--sequences", type=int, default=SYNTHETIC_SEQUENCES)
    ap.add_argument("--reference", default="alibi")
    return ap.parse_args()


def _group(args: argparse.Namespace) -> tuple[Path, list[Path], str, list[int]]:
    """(group folder, readable checkpoint folders, their shared task, lengths); exits with one line if not."""
    groups = checkpoint_groups(CKPTS)
    if args.group not in groups or not args.group:
        sys.exit(
            f"no checkpoint group {args.group!r} under {CKPTS}; groups: {', '.join(g for g in groups if g) or 'none'}"
        )
    gdir = groups[args.group]
    infos, problems = scan_checkpoints(gdir)
    for folder, problem in problems.items():  # a broken checkpoint is left out (and said), the rest published
        print(f"skipped {folder}: {problem}", file=sys.stderr)
    if not infos:
        sys.exit(f"no readable checkpoint in {gdir}")
    folders = [Path(i.path) for i in infos]
    names = [f.name for f in folders]
    data = {i.data for i in infos}
    if len(data) != 1 or not synthetic.is_synthetic(next(iter(data))):
        sys.exit(f"the checkpoints of {gdir} must share one synthetic training task (found {sorted(map(str, data))})")
    if args.reference not in names:
        sys.exit(f"--reference {args.reference} is not in {gdir} ({', '.join(names)})")
    try:
        lengths = [int(x) for x in args.lengths.split(",")]
    except ValueError:
        sys.exit(f"--lengths {args.lengths!r} is not a comma-separated list of whole numbers of tokens, e.g. 16,32,64")
    if args.sequences < 1:
        sys.exit(f"--sequences must be at least 1 (got {args.sequences})")
    return gdir, folders, next(iter(data)), lengths


def _write_checkpoints(args, gdir: Path, folders: list[Path], runs: list[dict], lengths: list[int]):
    """Each checkpoint's results.json, card and bias grid; returns (locality summaries, one per folder;
    locality tables by checkpoint name)."""
    reports = {f.name: analysis.bias_report(load_model(f), checkpoint=f.name).to_dict() for f in folders}
    summaries = analysis.locality_summary(list(reports.values()))
    tables = {name: analysis.locality_table([rep]) for name, rep in reports.items()}
    for f, r, s in zip(folders, runs, summaries, strict=True):
        r["checkpoint_path"] = f"{CKPTS.name}/{args.group}/{f.name}"
        write_json_atomic(f / "results.json", [r])
        atomic_write_text(f / "README.md", card(f, r, s, lengths, args.group))
        if s["heads"]:
            fig = plots.bias_grid_figure(reports[f.name])
            fig.update_layout(width=1000, height=600)
            render_png(fig, gdir / f"bias_grid_{f.name}.png")
    names = [f.name for f in folders]
    for stale in gdir.glob("bias_grid_*.png"):  # figures of checkpoints no longer in the group
        if stale.stem.removeprefix("bias_grid_") not in names:
            stale.unlink()
    return summaries, tables


def seeds_lines(gdir: Path) -> list[str]:
    """The group's seed table from ``seeds.json`` (``scripts/task_seeds.py``): per encoding, the seeds
    trained and how many learned the task, each seed's answer accuracy at the training length; a line
    saying it is missing otherwise. Exits with one line if the file is unreadable."""
    path = gdir / "seeds.json"
    if not path.exists():
        return [
            "Seeds: one training seed per encoding (no `seeds.json`: run `python scripts/task_seeds.py` to train more "
            "and count how many learn the task).",
        ]
    try:
        data = read_json(path, expect=dict)
        rows, threshold, n = data["rows"], data["learned_accuracy"], data["training_length"]
    except (FileFormatError, KeyError, TypeError) as e:
        sys.exit(f"{path} is not a seeds file written by scripts/task_seeds.py ({e}); run it again")
    by_enc: dict[str, list[dict]] = {}
    for r in rows:
        by_enc.setdefault(r["encoding"], []).append(r)
    out = [
        f"Seeds (`scripts/task_seeds.py`, {data['sequences']} fresh sequences at the training length {n}): a run "
        f"*learned the task* when its answer accuracy at {n} tokens is at least {threshold}. Seed 0 is the shipped "
        "checkpoint (the tables above); the other seeds are the same recipe with only `train.seed` changed, "
        "trained on this repository's CPU (float rounding differs between CPU kinds, so a seed's outcome may too).",
        "",
        f"| encoding | seeds | learned the task | answer accuracy at {n} by seed |",
        "|---|---|---|---|",
    ]
    for enc in sorted(by_enc):
        rs = sorted(by_enc[enc], key=lambda r: r["seed"])
        accs = ", ".join(f"seed {r['seed']}: {r['accuracy']:.3f}" for r in rs)
        out.append(f"| {enc} | {len(rs)} | {sum(r['learned'] for r in rs)} of {len(rs)} | {accs} |")
    return out


def _summary_lines(args, task: str, seq_len: int, runs, lengths, summaries, tables) -> list[str]:
    """The README block: accuracy by length and the heads' locality."""
    chance = synthetic.load_task(task).chance_accuracy
    return (
        [
            f"Task `{task}`, training length {seq_len} tokens; {args.sequences} fresh sequences per length, the same "
            f"for every checkpoint, only the answer positions scored; 95 % intervals over sequences. Answer accuracy "
            f"(chance {chance:.3f}):",
            "",
        ]
        + table(runs, lengths, accuracy_cell)
        + [""]
        + seeds_lines(args.group_dir)
        + [
            "",
            f"Heads' locality at query position {summaries[0]['classify_at']} (`fireviz biases`; ρ: rank correlation "
            "of bias with distance, below −0.5 local, above +0.5 anti-local):",
            "",
        ]
        + locality_rows(summaries, tables)
    )


def main() -> int:
    args = _parse_args()
    gdir, folders, task, lengths = _group(args)
    args.group_dir = gdir
    names = [f.name for f in folders]
    try:
        runs = evaluate_many(
            [str(f) for f in folders],
            task,
            lengths,
            token_budget=args.sequences,
            reference=names.index(args.reference),
            device="cpu",
            use_published=False,
        )
    except (EvaluationError, CheckpointError) as e:
        sys.exit(f"cannot evaluate the group: {e}")
    summaries, tables = _write_checkpoints(args, gdir, folders, runs, lengths)
    write_json_atomic(gdir / "results.json", runs)
    afig = plots.accuracy_figure(runs, chance=synthetic.load_task(task).chance_accuracy)
    afig.update_layout(width=1000, height=600)
    render_png(afig, gdir / "accuracy.png")
    seq_len = json.loads((folders[0] / "config.json").read_text())["seq_len"]
    body = _summary_lines(args, task, seq_len, runs, lengths, summaries, tables)
    md = [
        f"# Results: the `{args.group}` task group",
        "",
        *body,
        "",
        "Bits per answer token [95 % interval]:",
        "",
        *table(runs, lengths, bpb_cell),
        "",
        f"Paired difference against {args.reference} on the same sequences (bits per answer token; below 0: better):",
        "",
        *table([r for r in runs if r["checkpoint"] != args.reference], lengths, paired_cell),
        "",
        "![answer accuracy vs length](accuracy.png)",
        "",
    ]
    md += [f"![{n} biases](bias_grid_{n}.png)" for n, s in zip(names, summaries, strict=True) if s["heads"]] + [""]
    atomic_write_text(gdir / "RESULTS.md", "\n".join(md))
    print("\n".join(md))
    return 0


if __name__ == "__main__":
    sys.exit(main())
