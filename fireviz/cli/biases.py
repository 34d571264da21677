"""``python -m fireviz biases``: a checkpoint's (or a published model's) position biases as JSON.

Parses the arguments into ``fireviz.analysis.biases.BiasSettings`` and
``fireviz.analysis.dilution_settings.DilutionSettings`` (before any checkpoint is read), loads through
``fireviz.checkpoints.load_model_or_published``, computes with
``fireviz.analysis.biases.run_bias_report`` (and ``fireviz.analysis.text_attention.attention_dilution`` for
``--text``), prints the per-head locality table and writes the report (and ``--figure``). The
library checks every value and names the problem; this module only parses text and prints
the library's message on one line.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch

from fireviz import plots
from fireviz.analysis import (
    DEFAULT_NEAR,
    BiasSettings,
    DilutionSettings,
    attention_dilution,
    locality_table,
    parse_positions,
    run_bias_report,
    text_tokens,
)
from fireviz.checkpoints import Checkpoint, load_model_or_published
from fireviz.core import atomic_write_text, output_path_problem
from fireviz.data import Document
from fireviz.model import GPT, CheckpointError
from fireviz.plots.export import figure_path_problem


class _Parser(argparse.ArgumentParser):
    def error(self, message):  # one clear stderr line, exit code 2
        print(f"fireviz biases: error: {message}", file=sys.stderr)
        raise SystemExit(2)


def _parse_window(text: str) -> tuple[int, int, int]:
    parts = text.split(":")
    try:
        vals = [int(p) for p in parts]
    except ValueError:
        raise ValueError(f"--matrix {text!r}: expected START:STOP[:STRIDE] integers (tokens)") from None
    if len(vals) == 2:
        vals.append(1)
    if len(vals) != 3:
        raise ValueError(f"--matrix {text!r}: expected START:STOP[:STRIDE] integers (tokens)")
    return vals[0], vals[1], vals[2]


def build_parser() -> argparse.ArgumentParser:
    """The ``python -m fireviz biases`` argument parser (errors: one stderr line, exit 2)."""
    ap = _Parser(
        prog="python -m fireviz biases",
        description="Learned position biases, per-head locality and attention dilution of a checkpoint.",
    )
    ap.add_argument(
        "checkpoint",
        help="checkpoint folder (config.json + model.safetensors), or a published model: "
        "a folder written by transformers or a Hugging Face repo id (T5 family, ALiBi, RoPE)",
    )
    ap.add_argument(
        "--stack",
        choices=("decoder", "encoder"),
        default="decoder",
        help="published encoder-decoder (T5-family) models: which stack's bias (default decoder)",
    )
    ap.add_argument("--revision", default=None, help="published models on the Hub: branch, tag or commit")
    ap.add_argument(
        "--query-positions",
        default=None,
        help="comma-separated query positions in tokens, 0-based (default m*seq_len-1, m=1,2,4,8)",
    )
    ap.add_argument(
        "--classify-at",
        type=int,
        default=None,
        help="query position of the headline locality (default: smallest query position)",
    )
    ap.add_argument("--matrix", default=None, help="query x key matrix grid START:STOP[:STRIDE] in tokens")
    ap.add_argument(
        "--text",
        default=None,
        help="text file: also measure attention dilution on it (in the checkpoint's tokens: its bytes, or the BPE "
        "tokenizer it was trained with)",
    )
    ap.add_argument(
        "--near", type=int, default=DEFAULT_NEAR, help=f"keys counted as near for dilution (default {DEFAULT_NEAR})"
    )
    ap.add_argument(
        "--dilution-positions",
        default=None,
        help="comma-separated dilution query positions (default m*seq_len-1, m=1,2,4,8,16)",
    )
    ap.add_argument(
        "--normalizer-cap",
        type=int,
        default=None,
        metavar="N",
        help="FIRE/FIRE-S: biases (and dilution) with the normalizer psi(min(max(L, i), N)), N in tokens",
    )
    ap.add_argument("--out", default=None, help="output JSON (default ./biases_<checkpoint name>.json)")
    ap.add_argument(
        "--figure",
        default=None,
        metavar="FILE",
        help="also write the layer x head bias grid: .svg, .pdf or .png (for a paper) or .html",
    )
    return ap


def settings_from_args(args: argparse.Namespace) -> BiasSettings:
    """The bias report the parsed arguments ask for: ``--query-positions``, ``--classify-at``,
    ``--matrix``, ``--normalizer-cap``. Raises: ValueError naming the bad one (``BiasSettings.make``)."""
    return BiasSettings.make(
        parse_positions(args.query_positions) if args.query_positions is not None else None,
        classify_at=args.classify_at,
        matrix_window=_parse_window(args.matrix) if args.matrix is not None else None,
        normalizer_cap=args.normalizer_cap,
    )


def dilution_settings_from_args(args: argparse.Namespace) -> DilutionSettings:
    """The dilution ``--text`` asks for: ``--dilution-positions``, ``--near``, ``--normalizer-cap``.
    Raises: ValueError naming the bad one (``DilutionSettings.make``)."""
    return DilutionSettings.make(
        parse_positions(args.dilution_positions) if args.dilution_positions is not None else None,
        near=args.near,
        normalizer_cap=args.normalizer_cap,
    )


def _fail(msg: str) -> int:
    one_line = " ".join(str(msg).split())  # the library's message, whole, on one stderr line
    print(f"fireviz biases: error: {one_line}", file=sys.stderr)
    return 2


def _print_report(out: dict, args) -> None:
    """The locality table (and the dilution that --text measured) on stdout."""
    rows = locality_table([out])
    if args.normalizer_cap is not None and out.get("normalizer_cap") is None:
        print(f"note: {out['encoding']} has no normalizer; --normalizer-cap changes nothing")
    if rows:
        cap = f", normalizer capped at {out['normalizer_cap']}" if out.get("normalizer_cap") else ""
        heads = {(layer["layer"], h["head"]): h for layer in out["layers"] for h in layer.get("heads", [])}
        others = [p for p in out["query_positions"] if p != out["classify_at"]]
        print(
            f"per head at query position {out['classify_at']}{cap}: locality; rho = Spearman rank correlation of "
            "the bias with the distance (log-spaced; -1: falls with distance); peak = distance of the largest "
            "bias (tokens); range = max - min bias (logits)"
            + (f"; then the locality at query positions {', '.join(map(str, others))}" if others else "")
        )
        print(
            f"{'layer':>5} {'head':>4}  {'locality':10s} {'rho':>6} {'peak':>6} {'range':>7}"
            + "".join(f" {'@' + str(p):>11s}" for p in others)
        )
        for r in rows:
            by_position = heads[(r["layer"], r["head"])].get("locality_by_query_position", {})
            print(
                f"{r['layer']:5d} {r['head']:4d}  {r['locality']:10s} {r['rank_correlation']:6.2f} "
                f"{r['peak_distance']:6d} {r['bias_range']:7.3g}"
                + "".join(f" {by_position.get(str(p), '—'):>11s}" for p in others)
            )
    else:
        print(out["note"])
    if "dilution" in out:  # what --text measured: the near share per layer at each query position
        dl = out["dilution"]
        print(f"attention share on the nearest {dl.get('near')} keys (mean over heads), by query position:")
        print("layer " + " ".join(f"{p:>8d}" for p in dl["query_positions"]))
        for layer, heads in enumerate(dl["share"]):
            means = [sum(h[k] for h in heads) / len(heads) for k in range(len(dl["query_positions"]))]
            print(f"{layer:5d} " + " ".join(f"{m:8.3f}" for m in means))


def _text_tokenizer(args, model):
    """The tokenizer --text is read in, or an error message: a byte-level checkpoint's bytes, or
    the BPE tokenizer a checkpoint trained on shards stores (``Checkpoint.tokenizer``)."""
    if not isinstance(model, GPT):
        return None, (
            "--text measures attention dilution, which needs the whole model; a published model is read "
            "for its position encoding only"
        )
    try:
        return Checkpoint.resolve(args.checkpoint).tokenizer, None
    except CheckpointError as e:
        return None, str(e)


def _text_tokens(path: str, tokenizer, need: int):
    """The tokens of the --text file ``path`` in ``tokenizer``, or an error message
    (``attention_dilution`` checks that they are enough). A byte-level checkpoint reads its raw
    bytes (text that is not UTF-8 is measured as it is). Only the first ``need`` tokens are ever
    used (BOS and the tokens up to the largest query position), so only the bytes they can cover
    are read (``need`` bytes; 16 per token for a BPE tokenizer): a huge file, a pipe or /dev/zero
    costs that, not the file (issue #38)."""
    try:
        with open(path, "rb") as f:
            raw = f.read(max(need - 1, 0) if tokenizer.key == "byte" else 16 * need)  # BOS is the first token
    except OSError as e:
        return None, f"cannot read --text {path}: {e}"
    text = raw.decode("utf-8", errors="surrogateescape")
    if tokenizer.key == "byte":
        return text_tokens(text), None
    return torch.from_numpy(tokenizer.encode(Document("text", text)).ids[:need].copy()), None


def main(argv: list[str] | None = None) -> int:
    """``python -m fireviz biases CKPT [options]``: write a checkpoint's biases and locality as JSON.

    Options: ``--query-positions 511,4095`` (tokens, 0-based; default m·seq_len − 1 for
    m = 1, 2, 4, 8), ``--classify-at I``, ``--matrix START:STOP[:STRIDE]``, ``--text FILE``
    (also measure attention dilution on ``[BOS] + bytes`` of that file), ``--near 16``,
    ``--dilution-positions``, ``--out FILE`` (default ``biases_<checkpoint name>.json`` in the
    current folder: a checkpoint folder is never written into unless asked).
    Prints the per-head locality table to stdout.
    Returns: 0 on success, 2 on bad input (one ``fireviz biases: error: …`` line on stderr).
    """
    try:
        args = build_parser().parse_args(argv)
    except SystemExit as e:
        return int(e.code or 0)
    try:  # every setting checked (by the library) before a checkpoint is read
        settings, dilution = settings_from_args(args), dilution_settings_from_args(args)
    except ValueError as e:
        return _fail(str(e))

    name = Path(args.checkpoint).resolve().name if Path(args.checkpoint).exists() else args.checkpoint
    given = args.out if args.out is not None else f"biases_{name.replace('/', '--')}.json"
    problem = output_path_problem(given, "--out" if args.out is not None else "the default output", "biases.json")
    out_path = Path(given)
    problem = problem or (figure_path_problem(args.figure) if args.figure is not None else None)
    if problem:  # bad output paths before the work
        return _fail(problem)
    try:
        model = load_model_or_published(args.checkpoint, args.stack, args.revision)
    except CheckpointError as e:  # missing folder, corrupt weights, bad config, a Hub problem: its message
        return _fail(str(e) or type(e).__name__)
    tokens = tokenizer = None
    if args.text is not None:
        d = dilution.resolve(model.config.seq_len)
        tokenizer, problem = _text_tokenizer(args, model)
        if tokenizer is not None:
            tokens, problem = _text_tokens(args.text, tokenizer, max(d.query_positions or (0,)) + 1)
        if problem:
            return _fail(problem)
    try:
        measured = None
        if tokens is not None:  # first: a text too short is refused before the report's work
            measured = attention_dilution(
                model,
                tokens,
                d.query_positions,
                near=d.near,
                rows=d.rows,
                checkpoint=name,
                normalizer_cap=d.normalizer_cap,
            ).to_dict()
        out = run_bias_report(model, settings, checkpoint=name).to_dict()
        if measured is not None:
            out["dilution"] = measured
    except ValueError as e:
        if tokenizer is not None and "give a longer text" in str(e):  # say whose tokens, and the option
            return _fail(
                f"--text {args.text}: {e} (positions count {name}'s tokens: "
                + ("bytes" if tokenizer.key == "byte" else "its BPE tokenizer's")
                + "; --dilution-positions sets smaller ones)"
            )
        return _fail(str(e))
    try:
        atomic_write_text(out_path, json.dumps(out, allow_nan=False))  # folders made, never half-written
    except OSError as e:
        return _fail(f"cannot write {out_path}: {e}")
    _print_report(out, args)
    print(f"wrote {out_path}")
    if args.figure:
        try:
            print(f"wrote {plots.write_figure(plots.bias_grid_figure(out), args.figure)}")
        except (ValueError, plots.FigureExportError, OSError) as e:
            return _fail(f"--figure {args.figure}: {e}")
    return 0
