"""``python -m fireviz biases``: a checkpoint's (or a published model's) position biases as JSON.

Parses the arguments into ``fireviz.analysis.BiasSettings`` (before any checkpoint is read),
loads through ``fireviz.checkpoints.load_model_or_published``, computes with
``fireviz.analysis.run_bias_report`` (and ``fireviz.text_attention.attention_dilution`` for
``--text``), prints the per-head locality table and writes the report (and ``--figure``).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from .analysis import (
    DEFAULT_DILUTION_MULTIPLES,
    BiasSettings,
    default_query_positions,
    locality_table,
    parse_positions,
    run_bias_report,
)
from .checkpoints import load_model_or_published
from .encodings import MAX_NORMALIZER_CAP
from .model import GPT


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
    ap.add_argument("--text", default=None, help="text file: also measure attention dilution on it (its bytes)")
    ap.add_argument("--near", type=int, default=16, help="keys counted as near for dilution (default 16, as the app)")
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


def _fail(msg: str) -> int:
    print(f"fireviz biases: error: {msg}", file=sys.stderr)
    return 2


def _print_report(out: dict, args) -> None:
    """The locality table (and the dilution that --text measured) on stdout."""
    rows = locality_table([out])
    if args.normalizer_cap is not None and out.get("normalizer_cap") is None:
        print(f"note: {out['encoding']} has no normalizer; --normalizer-cap changes nothing")
    if rows:
        cap = f", normalizer capped at {out['normalizer_cap']}" if out.get("normalizer_cap") else ""
        print(
            f"{'layer':>5} {'head':>4}  {'locality':10s} {'rho':>6} {'peak':>6}  (at query position "
            f"{out['classify_at']}{cap})"
        )
        for r in rows:
            print(
                f"{r['layer']:5d} {r['head']:4d}  {r['locality']:10s} {r['rank_correlation']:6.2f} {r['peak_distance']:6d}"
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


def _text_tokens(args, model, dil_positions):
    """The tokens of --text (its raw bytes: text that is not UTF-8 is measured as it is), or an
    error message."""
    from .text_attention import text_tokens  # it builds on fireviz.analysis

    if not isinstance(model, GPT):
        return None, (
            "--text measures attention dilution, which needs the whole model; a published model is read "
            "for its position encoding only"
        )
    try:
        tokens = text_tokens(Path(args.text).read_bytes().decode("utf-8", errors="surrogateescape"))
    except (OSError, UnicodeDecodeError) as e:
        return None, f"cannot read --text {args.text}: {e}"
    need = (dil_positions or default_query_positions(model.config.seq_len, DEFAULT_DILUTION_MULTIPLES))[-1] + 1
    if tokens.numel() < need:
        return None, (
            f"--text {args.text} gives {tokens.numel()} tokens ([BOS] + bytes) but the largest dilution "
            f"query position needs {need}; give a longer text or smaller --dilution-positions"
        )
    return tokens, None


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
    if args.normalizer_cap is not None and not 1 <= args.normalizer_cap <= MAX_NORMALIZER_CAP:
        return _fail(
            f"--normalizer-cap must be >= 1 token and at most {MAX_NORMALIZER_CAP} (got "
            f"{args.normalizer_cap}); e.g. the training length"
        )
    try:
        settings = settings_from_args(args)  # every setting checked before a checkpoint is read
        dil_positions = parse_positions(args.dilution_positions) if args.dilution_positions is not None else None
    except ValueError as e:
        return _fail(str(e))
    if args.near < 1:
        return _fail(f"--near must be >= 1 (got {args.near})")
    try:
        model = load_model_or_published(args.checkpoint, args.stack, args.revision)
    except Exception as e:  # missing folder, corrupt weights, bad config: one line
        return _fail(str(e).splitlines()[0] if str(e) else type(e).__name__)
    name = Path(args.checkpoint).resolve().name if Path(args.checkpoint).exists() else args.checkpoint
    tokens = None
    if args.text is not None:
        tokens, problem = _text_tokens(args, model, dil_positions)
        if problem:
            return _fail(problem)
    try:
        out = run_bias_report(model, settings, checkpoint=name).to_dict()
        if tokens is not None:
            from .text_attention import attention_dilution

            out["dilution"] = attention_dilution(
                model, tokens, dil_positions, near=args.near, checkpoint=name, normalizer_cap=args.normalizer_cap
            ).to_dict()
    except ValueError as e:
        return _fail(str(e))
    out_path = Path(args.out) if args.out else Path(f"biases_{name.replace('/', '--')}.json")
    try:
        out_path.parent.mkdir(parents=True, exist_ok=True)
        out_path.write_text(json.dumps(out, allow_nan=False))
    except OSError as e:
        return _fail(f"cannot write {out_path}: {e}")
    _print_report(out, args)
    print(f"wrote {out_path}")
    if args.figure:
        from . import plots  # the CLI layer draws; analysis itself only computes

        try:
            print(f"wrote {plots.write_figure(plots.bias_grid_figure(out), args.figure)}")
        except (ValueError, plots.FigureExportError, OSError) as e:
            return _fail(f"--figure {args.figure}: {e}")
    return 0
