"""``python -m fireviz eval``: perplexity / bits per byte vs evaluation length, as a table.

A thin layer over ``fireviz.eval.evaluate``: resolves each checkpoint once (``Checkpoint``), builds
one ``EvalSettings`` from the arguments (``settings_from_args``),
prints progress and the tables (``format_table``; mode ``context``: one row per checkpoint and
context length, ``_context_table``), writes ``--out`` / ``--figure``.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from typing import Any, Sequence

from fireviz import plots
from fireviz.checkpoints import CausalLMCheckpoint, Checkpoint, resolve_any
from fireviz.core import output_path_problem, write_json_atomic
from fireviz.data import DOMAINS, DataError, synthetic
from fireviz.data.tokenizers import BOS_MODES
from fireviz.eval import (
    ALL_ROPE_SCALINGS,
    DEFAULT_CONTEXT_LENGTHS,
    DEFAULT_CONTEXT_PREFIX,
    DEFAULT_CONTEXT_STRIDE,
    DEFAULT_CONTEXT_TARGETS,
    DEFAULT_LENGTHS,
    DEFAULT_MODE,
    DEFAULT_POSITION_BUCKETS,
    DEFAULT_TOKEN_BUDGET,
    FULL_CONTEXT,
    MODES,
    SETTING_NAMES,
    SPLITS,
    SYNTHETIC_SEQUENCES,
    EvalCache,
    EvalResult,
    EvalSettings,
    EvaluationError,
    checkpoint_list,
    dominant_document_note,
    evaluate,
    missing_interval_note,
)
from fireviz.model import CheckpointError
from fireviz.plots.export import figure_path_problem


# ---------------------------------------------------------------------------------------------
# CLI
# ---------------------------------------------------------------------------------------------
def _ci_text(ci, signed: bool = False, digits: int = 3) -> str:
    f = f"{'+' if signed else ''}.{digits}f"
    return f" [{ci[0]:{f}}, {ci[1]:{f}}]" if isinstance(ci, list) and len(ci) == 2 else ""


def _render(head: list[str], rows: list[list[str]]) -> list[str]:
    """Aligned text rows: the first three columns left-aligned, the numbers right-aligned."""
    widths = [max(len(x) for x in col) for col in zip(head, *rows, strict=True)]

    def line(cells):
        return "  ".join(
            c.rjust(w) if i >= 3 else c.ljust(w) for i, (c, w) in enumerate(zip(cells, widths, strict=True))
        )

    return [line(head), line(["-" * w for w in widths])] + [line(r) for r in rows]


def _length_head(settings: dict, n: int) -> str:
    """A length's column head: the length, and "(full)" at mode context's full context M − K."""
    return (
        f"{n} ({FULL_CONTEXT})" if settings.get("mode") == "context" and n == settings.get("full_context") else str(n)
    )


def _context_text(s: dict) -> str:
    """What mode context scored, in words (``s``: a result's settings)."""
    M, K, full, d = s.get("prefix_tokens"), s.get("context_targets"), s.get("full_context"), s.get("documents_scored")
    stride, skipped = s.get("stride") or 0, s.get("documents_skipped")
    targets = f"{d * K:,} targets" if isinstance(d, int) and isinstance(K, int) else "targets"
    drawn = f", drawn with seed {s.get('seed')}" if s.get("token_budget") else ""
    return (
        f": context use — the last K = {K} of the first M = {M} tokens (positions {full} … "
        f"{M - 1 if isinstance(M, int) else '?'}) of each of {d} document{'s' if d != 1 else ''}{drawn} "
        f"({skipped} shorter one{'s' if skipped != 1 else ''} skipped): {targets}, the same at every context "
        f"length c; each scored with c … c + {stride - 1} tokens before it (windows of c + {stride} tokens "
        f"scoring their last {stride}); c = {full} = M − K ({FULL_CONTEXT}): one window of the first M tokens, "
        "every target with its whole prefix"
    )


def _shared_text(results: Sequence[EvalResult]) -> bool:
    """True when the checkpoints read the text in tokenizers of their own (entries carry bytes)."""
    return any("bytes_scored" in e for r in results for e in r["per_length"])


def _tokenizer_lines(results: Sequence[EvalResult], lengths: list[int]) -> list[str]:
    """Per checkpoint, the bytes its targets cover and its tokens per byte at each length."""
    rows = []
    for r in results:
        by_length = {e["length"]: e for e in r["per_length"] if "bytes_scored" in e}
        rows.append(
            [r["checkpoint"], "", ""]
            + [
                f"{by_length[n]['bytes_scored']:,} B · {by_length[n]['tokens_per_byte']:.3f} tok/B"
                if n in by_length
                else ""
                for n in lengths
            ]
        )
    return ["", "bytes scored and tokens per byte (each checkpoint's own tokenizer)"] + _render(
        ["checkpoint", "", ""] + [str(n) for n in lengths], rows
    )


def _what_was_scored(results: Sequence[EvalResult], lengths: list[int]) -> list[str]:
    """The text line (data, split, protocol) and the table of documents / windows / tokens per length."""
    s0 = results[0]["settings"] if results else {}
    text = f"text: {s0.get('data')} ({s0.get('split')} split), mode {s0.get('mode')}"
    if s0.get("bos_mode"):
        text += f", BOS: {s0['bos_mode']}"
    if s0.get("mode") == "context":
        text += _context_text(s0)
    if s0.get("mode") == "same_text" and _shared_text(results):
        d = s0.get("documents_scored")
        text += (
            f": one text for every checkpoint — of each of {d} document{'s' if d != 1 else ''}, the bytes that the "
            f"first {s0.get('prefix_tokens')} tokens cover in the tokenizer where they cover the most; each checkpoint scores "
            f"its own tokens there, lengths in its own tokens ({s0.get('documents_skipped')} documents shorter "
            f"than {s0.get('prefix_tokens')} tokens in some tokenizer skipped)"
        )
    elif s0.get("mode") == "same_text":
        d = s0.get("documents_scored")
        text += (
            f": the first {s0.get('prefix_tokens')} tokens of each of {d} document{'s' if d != 1 else ''} at "
            f"every length ({s0.get('documents_skipped')} shorter documents skipped)"
        )
    task = s0.get("mode") == "synthetic"
    if task:
        text = (
            f"task: {s0.get('data')}, {s0.get('token_budget')} fresh sequences of each length "
            + ("(the published set; " if not s0.get("seed") else f"(drawn with seed {s0.get('seed')}; ")
            + "the same for every checkpoint; length n = the model reads n tokens, as in training at seq_len n); only the answer "
            "positions are scored"
        )
    # the BOS convention each checkpoint was scored with (a published model's own, by default):
    # said in the table, not only in the JSON (issue #48 point 3)
    bos = {r["checkpoint"]: r["settings"]["bos"] for r in results if r["settings"].get("bos")}
    if len(set(bos.values())) == 1:
        text += f"; BOS: {next(iter(bos.values()))}"
    elif bos:
        text += "; BOS: " + "; ".join(f"{name}: {desc}" for name, desc in bos.items())
    first: dict = {}  # per length, the first checkpoint that scored it (an absolute-embedding one may not)
    for r in results:
        for e in r["per_length"]:
            if "error" not in e:
                first.setdefault(e["length"], e)
    shown_rows = [
        ("sequences" if task else "documents", "documents"),
        ("windows", "windows"),
        ("answer tokens scored" if task else "tokens scored", "tokens_scored"),
    ]
    if s0.get("mode") in ("nonoverlapping", "sliding"):
        shown_rows.insert(1, ("documents too short", "documents_skipped"))
    if s0.get("mode") == "context":
        shown_rows.insert(2, ("tokens per window", "window_tokens"))
    rows = [
        [label, "", ""] + [f"{first[n][key]:,}" if key in first.get(n, {}) else "" for n in lengths]
        for label, key in shown_rows
    ]
    head = "context c" if s0.get("mode") == "context" else "length"
    if _shared_text(results) and results:  # each checkpoint reads its own tokens: say whose these are
        head = f"length ({results[0]['checkpoint']})"
    out = [text] + _render([head, "", ""] + [_length_head(s0, n) for n in lengths], rows)
    if _shared_text(results):
        out += _tokenizer_lines(results, lengths)
    return out


def _name_and_encoding(r: EvalResult, names: list[str]) -> tuple[str, str]:
    """A result's row name (its path when two share a folder name) and encoding (+ scaling, cap)."""
    # two checkpoints in folders of the same name (runs/x and checkpoints/x): show their paths
    name = (r.get("checkpoint_path") or r["checkpoint"]) if names.count(r["checkpoint"]) > 1 else r["checkpoint"]
    cap = r.get("normalizer_cap")
    enc = (
        r["position_encoding"]
        + (f"+{r['settings']['rope_scaling']}" if r["settings"].get("rope_scaling") else "")
        + (f" cap {cap}" if cap else "")
    )
    return name, enc


def _context_table(results: Sequence[EvalResult], lengths: list[int]) -> list[str]:
    """Mode context: one row per checkpoint and context length — bits per byte [95 %], minus the
    same checkpoint at full context [95 % paired], minus the reference checkpoint [95 % paired]."""
    s0 = results[0]["settings"]
    ref = next((e["paired_reference"] for r in results for e in r["per_length"] if e.get("paired_reference")), None)
    names = [r["checkpoint"] for r in results]
    rows = []
    for r in results:
        name, enc = _name_and_encoding(r, names)
        entries = {e["length"]: e for e in r["per_length"]}
        for n in lengths:
            e = entries.get(n)
            if e is None:
                continue
            cells = ["error", "", ""]
            if "error" not in e:
                cells = [
                    f"{e['bits_per_byte']:.3f}" + _ci_text(e.get("ci95")),
                    ""
                    if "full_delta_bpb" not in e
                    else f"{e['full_delta_bpb']:+.4f}" + _ci_text(e.get("full_ci95"), True, 4),
                    ""
                    if "paired_delta_bpb" not in e
                    else f"{e['paired_delta_bpb']:+.4f}" + _ci_text(e.get("paired_ci95"), True, 4),
                ]
            rows.append([name, enc, str(r["train_seq_len"]), _length_head(s0, n)] + cells[: 3 if ref else 2])
    head = ["checkpoint", "enc", "train", "context c", "bits per byte [95 %]", f"− {FULL_CONTEXT} [95 %]"]
    title = (
        "bits per byte of the same targets by context length c (tokens) [95 % bootstrap interval over documents]; "
        f"− {FULL_CONTEXT}: minus the same checkpoint at full context on the same targets [95 % paired interval] "
        "(above 0: the context beyond c helps)"
    )
    if ref:
        head.append(f"− {ref} [95 %]")
        title += (
            f"; − {ref}: minus the reference checkpoint {ref} at the same c [95 % paired interval] (below 0: better)"
        )
    if not any("full_delta_bpb" in e for r in results for e in r["per_length"]):
        title += f" (no − {FULL_CONTEXT} values: add {FULL_CONTEXT} to --lengths)"
    return ["", title] + _render(head, rows)


def _per_checkpoint(
    results: Sequence[EvalResult], lengths: list[int], title: str, cell, keep=lambda e: True, names=None
) -> list[str]:
    """A titled table: one row per result (name, encoding, training length), ``cell(entry)`` per length.
    ``names``: every checkpoint name of the evaluation (default: those of ``results``), so a row is
    named by its path wherever two folders share a name, in every table."""
    names = names if names is not None else [r["checkpoint"] for r in results]
    rows = []
    for r in results:
        name, enc = _name_and_encoding(r, names)
        cells = {e["length"]: cell(e) for e in r["per_length"] if keep(e)}
        rows.append([name, enc, str(r["train_seq_len"])] + [cells.get(n, "") for n in lengths])
    return ["", title] + _render(["checkpoint", "enc", "train"] + [str(n) for n in lengths], rows)


def _notes(results: Sequence[EvalResult], lengths: list[int]) -> list[str]:
    out = []
    for note in (missing_interval_note(results), dominant_document_note(results)):
        if note:
            out.append(f"({note})")
    caps = sorted({cap for r in results if (cap := r.get("normalizer_cap"))})
    if caps:
        short = [n for n in lengths if n <= min(caps)]
        out += [
            f"(the normalizer cap changes FIRE only at query positions beyond {min(caps)} tokens"
            + (f": at {', '.join(map(str, short))} the capped numbers equal the plain ones)" if short else ")")
        ]
    return out


def format_table(results: Sequence[EvalResult]) -> str:
    """A plain-text report: what was scored per length (documents, windows, tokens), then one
    row per checkpoint with "bpb [95 % CI]" cells (answer accuracy too for a task), then the
    paired differences against the reference checkpoint with their 95 % intervals, then errors.
    Mode context: one row per checkpoint and context length instead (``_context_table``)."""
    lengths = list(dict.fromkeys(e["length"] for r in results for e in r["per_length"]))
    task = bool(results) and results[0]["settings"].get("mode") == "synthetic"
    out = _what_was_scored(results, lengths)
    if results and results[0]["settings"].get("mode") == "context":
        return "\n".join(out + _context_table(results, lengths) + _notes(results, lengths) + _errors(results))
    out += _per_checkpoint(
        results,
        lengths,
        (
            "bits per answer token [95 % bootstrap interval over sequences]"
            if task
            else "bits per byte [95 % bootstrap interval over documents]"
        )
        + " by evaluation length in tokens",
        lambda e: "error" if "error" in e else f"{e['bits_per_byte']:.3f}" + _ci_text(e.get("ci95")),
    )
    if not task and any("perplexity" in e for r in results for e in r["per_length"]):
        out += _per_checkpoint(
            results,
            lengths,
            "perplexity per token (exp of nats per token; each checkpoint's own tokens, so compare it only "
            "between checkpoints of one tokenizer: bits per byte above is the common unit)",
            lambda e: f"{e['perplexity']:.3f}",
            keep=lambda e: "perplexity" in e,
        )
    if any("accuracy" in e for r in results for e in r["per_length"]):
        out += _per_checkpoint(
            results,
            lengths,
            "answer accuracy [95 % interval over sequences] / share of sequences copied without error",
            lambda e: f"{e['accuracy']:.3f}" + _ci_text(e.get("accuracy_ci95")) + f" / {e['sequence_accuracy']:.2f}",
            keep=lambda e: "accuracy" in e,
        )
    out += _notes(results, lengths)
    paired = [r for r in results if any("paired_delta_bpb" in e for e in r["per_length"])]
    if paired:
        ref = next(e["paired_reference"] for e in paired[0]["per_length"] if e.get("paired_reference"))
        names = [r["checkpoint"] for r in results]
        reference = next((r for r in results if r not in paired and r["checkpoint"] == ref), None)
        if reference is not None:  # named as in the first table (its path when two share a name)
            ref = _name_and_encoding(reference, names)[0]
        ref_cap = next((r.get("normalizer_cap") for r in results if r is reference or r["checkpoint"] == ref), None)
        ref += f" (normalizer cap {ref_cap})" if ref_cap else ""  # the reference as it was evaluated
        out += _per_checkpoint(
            paired,
            lengths,
            f"paired difference in bits per {'answer token' if task else 'byte'} vs {ref} on the same "
            + ("text (per document, each over the bytes its own targets cover)" if _shared_text(results) else "windows")
            + " [95 % interval]; negative = better than the reference",
            lambda e: f"{e['paired_delta_bpb']:+.3f}" + _ci_text(e.get("paired_ci95"), signed=True),
            keep=lambda e: "paired_delta_bpb" in e,
            names=names,
        )
        out += _unit_notes(results, paired, reference)
    return "\n".join(out + _errors(results))


def _unit_notes(results: Sequence[EvalResult], paired: Sequence[EvalResult], reference) -> list[str]:
    """A line per paired checkpoint that counts its lengths in other units than the reference (a
    BPE model's tokens against a byte model's bytes): the pair scores the same bytes, but at one
    "length" the two read contexts of different byte lengths (issue #48)."""
    if reference is None or not _shared_text(results):
        return []

    def bytes_per_token(r: EvalResult) -> float | None:
        tpb = [e["tokens_per_byte"] for e in r["per_length"] if e.get("tokens_per_byte")]
        return 1 / (sum(tpb) / len(tpb)) if tpb else None

    ref_bpt = bytes_per_token(reference)
    out = []
    for r in paired:
        bpt = bytes_per_token(r)
        if bpt is None or ref_bpt is None or abs(bpt / ref_bpt - 1) < 0.05:
            continue
        out.append(
            f"(note: lengths are each checkpoint's own tokens — {r['checkpoint']} reads ≈{bpt:.2f} bytes per "
            f"token, {reference['checkpoint']} ≈{ref_bpt:.2f}: at one length their contexts differ "
            f"≈{bpt / ref_bpt:.1f}× in bytes, so its paired row compares the same text scored with different contexts)"
        )
    return out


def _errors(results: Sequence[EvalResult]) -> list[str]:
    errors = [
        f"  {r['checkpoint']} L={e['length']}: {e['error']}" for r in results for e in r["per_length"] if "error" in e
    ]
    return ["errors:"] + list(dict.fromkeys(errors)) if errors else []


def _parse_lengths(text: str) -> list[int | str]:
    try:  # "full" (mode context: the context length M − K) is resolved by the settings
        lengths = [x.strip() if x.strip() == FULL_CONTEXT else int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"lengths must be comma-separated integers (got {text!r})") from None
    if not lengths:
        raise argparse.ArgumentTypeError("give at least one length")
    return lengths


def _parse_budget(text: str):
    if text == "auto":
        return "auto"
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"token budget must be an integer, 0 (every window) or auto (got {text!r})"
        ) from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"token budget must be >= 0 (got {value})")
    return value or None


def _add_text_arguments(p: argparse.ArgumentParser) -> None:
    """What is scored: the data, lengths, protocol, budget, seed and split."""
    p.add_argument(
        "--data",
        default="prose",
        help=f"{', '.join(DOMAINS)}, a PATH.jsonl[.gz|.xz] / .txt / folder, a folder of byte token shards "
        "(python -m fireviz prepare --tokenizer byte: the same documents), or synthetic:copy (a task: "
        f"--token-budget is then the sequences per length, default {SYNTHETIC_SEQUENCES}) (default "
        "%(default)s, the "
        "bundled checkpoints' training domain)",
    )
    p.add_argument(
        "--lengths",
        type=_parse_lengths,
        default=None,
        help=f"comma-separated window lengths in tokens (default {','.join(map(str, DEFAULT_LENGTHS))}; on a "
        "synthetic task the first checkpoint's training length L times 1/4, 1/2, 1, 2, 4, 8, 16); --mode context: "
        f"context lengths c, '{FULL_CONTEXT}' = M − K (default "
        f"{','.join(map(str, DEFAULT_CONTEXT_LENGTHS))},{FULL_CONTEXT})",
    )
    p.add_argument(
        "--mode",
        choices=MODES,
        default=DEFAULT_MODE,
        help="same_text (default): the first M tokens of every document holding the largest length M, "
        "at every length; nonoverlapping: random windows per length; sliding: with --stride; context: "
        "context use, the same targets (the last K tokens of each document's first M) scored with c tokens "
        "of context at every context length c (see below)",
    )
    p.add_argument(
        "--stride",
        type=int,
        default=None,
        help="sliding-window stride in tokens (--mode sliding); --mode context: s, the targets each window "
        f"scores (its last s positions; default {DEFAULT_CONTEXT_STRIDE})",
    )
    p.add_argument(
        "--context-targets",
        type=int,
        default=None,
        metavar="K",
        help=f"--mode context: the targets per document, its last K of the first M tokens (default "
        f"{DEFAULT_CONTEXT_TARGETS})",
    )
    p.add_argument(
        "--token-budget",
        type=_parse_budget,
        default="auto",
        help=f"target tokens per length, a lower bound: whole documents (same_text) or whole windows are "
        "drawn until it is reached, so slightly more are scored; intervals need at least 10 documents, so "
        "give at least 10 × the length; default: every qualifying document for same_text, "
        f"{DEFAULT_TOKEN_BUDGET} for the random-window modes; 0 = every window",
    )
    p.add_argument(
        "--seed",
        type=int,
        default=0,
        help="seed of the documents or windows drawn (with --token-budget), or of a synthetic task's sequences (0: the published set)",
    )
    p.add_argument(
        "--prefix-tokens",
        type=int,
        default=None,
        metavar="M",
        help="same_text: score the first M tokens of each document holding them at every length (default: "
        "the largest length); e.g. --lengths 128 --prefix-tokens 8192 is the 128 column of a 128…8192 run; "
        f"--mode context: the prefix whose last K tokens are the targets (default {DEFAULT_CONTEXT_PREFIX})",
    )
    p.add_argument(
        "--split",
        choices=SPLITS,
        default="validation",
        help="documents to evaluate on (default %(default)s; 'all' for a small file of your own)",
    )


def _add_model_arguments(p: argparse.ArgumentParser) -> None:
    """How the checkpoints run: cap, reference, RoPE scaling, buckets, device, batch size."""
    p.add_argument(
        "--normalizer-cap",
        type=int,
        default=None,
        metavar="N",
        help="FIRE/FIRE-S: evaluate with the normalizer ψ(min(max(L, i), N)), N in tokens "
        "(e.g. the training length); other checkpoints are unaffected",
    )
    p.add_argument(
        "--reference",
        default=None,
        metavar="CKPT",
        help="checkpoint the others are paired against (default: the first given)",
    )
    p.add_argument(
        "--rope-scaling",
        choices=ALL_ROPE_SCALINGS,
        default=None,
        help="zero-shot RoPE extension, factor = length / training length: pi or yarn for fireviz "
        "checkpoints; linear (= pi), dynamic, yarn or llama3 for a published model (as transformers defines them)",
    )
    p.add_argument(
        "--bos",
        dest="bos_mode",
        choices=BOS_MODES,
        default=None,
        help="BOS convention (default: each model's own — fireviz: BOS at each document start; a published "
        "model: what its tokenizer adds): document = BOS at each document start, window = BOS first in every "
        "window, none = no BOS",
    )
    p.add_argument(
        "--position-buckets",
        type=int,
        default=DEFAULT_POSITION_BUCKETS,
        help="equal-width buckets of the loss-by-position curve (default %(default)s)",
    )
    p.add_argument("--device", default="auto", help="auto (default), cpu or cuda")
    p.add_argument(
        "--batch-tokens",
        type=int,
        default=None,
        help="tokens per forward batch (default 8192 on CPU, 16384 on CUDA; not part of the cache key)",
    )


def build_parser() -> argparse.ArgumentParser:
    """The ``python -m fireviz eval`` argument parser."""
    p = argparse.ArgumentParser(
        prog="python -m fireviz eval",
        description="Perplexity / bits per byte vs evaluation length for checkpoints.",
        epilog="Protocols. same_text answers how the score of a text changes when it is cut into windows of n "
        "tokens (more context, but also fewer targets near a window start). context answers only whether "
        "more context helps: every document holding M tokens (--prefix-tokens, default "
        f"{DEFAULT_CONTEXT_PREFIX}) gives its last K (--context-targets, default {DEFAULT_CONTEXT_TARGETS}) "
        "of them as targets, the same at every context length c; each block of s targets (--stride, default "
        f"{DEFAULT_CONTEXT_STRIDE}) is scored by a window of c + s tokens that scores only its last s, so "
        f"every target has at least c and fewer than c + s tokens before it; c = {FULL_CONTEXT} = M − K is one "
        "window of the M tokens, every target with its whole prefix. The table gives per checkpoint and c "
        "the bits per byte, minus the same checkpoint at full context, and minus the reference checkpoint, "
        "each with a 95 % bootstrap interval over documents; a c with c + s > M (or beyond M − K) is "
        "refused. E.g.: python -m fireviz eval checkpoints/alibi checkpoints/kerple_power --mode context "
        "--data prose",
    )
    p.add_argument(
        "checkpoints",
        nargs="+",
        metavar="CKPT",
        help="checkpoints: folder paths, bundled names (fire, copy/fire), a published causal LM (a folder "
        "transformers wrote, or a llama.cpp .gguf file: de-quantised once into $FIREVIZ_CACHE_DIR/gguf) or Hugging "
        "Face repo ids; the first is the paired reference unless --reference says otherwise",
    )
    _add_text_arguments(p)
    _add_model_arguments(p)
    p.add_argument("--cache-dir", default=None, help="default $FIREVIZ_CACHE_DIR/eval or ~/.cache/fireviz/eval")
    p.add_argument("--no-cache", action="store_true", help="neither read nor write cached results")
    p.add_argument("--out", default=None, help="write the results as JSON here (atomically)")
    p.add_argument(
        "--figure",
        default=None,
        metavar="FILE",
        help="also write the perplexity-vs-length figure: .svg, .pdf or .png (for a paper: 6.9 in "
        "wide, serif 8 pt) or .html (interactive)",
    )
    p.add_argument("--quiet", action="store_true", help="no progress bar")
    return p


class _ProgressBar:
    """``progress(done, total, message)`` for evaluate_many as a tqdm bar on stderr (tokens, not
    windows: a 16k-token window is 128× a 128-token one; the message carries the ETA). Created
    on the first report, so an early error prints one line only; nothing with ``quiet``."""

    #: seconds between plain progress lines when stderr is not a terminal (a log, nohup, a pipe)
    LINE_EVERY = 30.0
    bar: Any  # the tqdm bar, once drawn
    last_line: float | None  # time.monotonic() of the last plain line

    def __init__(self, quiet: bool):
        self.quiet, self.bar = quiet, None
        self.plain = not sys.stderr.isatty()
        self.last_line = None

    def __call__(self, done: int, total: int, message: str) -> None:
        if self.quiet or (self.bar is None and total == 0):
            return
        if self.plain:  # tqdm draws nothing here: a line now and then, so a long run does not look hung
            now = time.monotonic()
            if self.last_line is None or now - self.last_line >= self.LINE_EVERY or done >= total:
                self.last_line = now
                print(f"fireviz eval: {done:,}/{total:,} tokens · {message[:100]}", file=sys.stderr, flush=True)
            return
        if self.bar is None:
            from tqdm.auto import tqdm

            # no rate or ETA: a cached length jumps ahead at once and would make both meaningless
            self.bar = tqdm(
                total=total,
                file=sys.stderr,
                dynamic_ncols=True,
                disable=None,  # None: off when not a terminal
                bar_format="{desc}: {percentage:3.0f}%|{bar}| {n_fmt}/{total_fmt} tokens [{elapsed}]",
            )
        self.bar.total = total
        self.bar.n = done
        self.bar.set_description_str(message[:100], refresh=False)
        self.bar.refresh()

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()


def _write_figure(results: Sequence[EvalResult], path: str) -> bool:
    """Write the perplexity-vs-length figure of the evaluated lengths to ``path``; False (and
    one stderr line) if that fails."""

    try:
        shown: list[EvalResult] = [
            {**r, "per_length": [e for e in r["per_length"] if "error" not in e]} for r in results
        ]
        shown = [r for r in shown if r["per_length"]]
        context = shown[0]["settings"].get("mode") == "context"
        fig = plots.context_use_figure(shown) if context else plots.perplexity_figure(shown)
        print(f"wrote {plots.write_figure(fig, path)}")
    except (ValueError, plots.FigureExportError, OSError) as e:
        print(f"fireviz eval: error: --figure {path}: {e}", file=sys.stderr)
        return False
    return True


def _lengths(args, checkpoints: Sequence[Checkpoint | CausalLMCheckpoint]) -> list[int | str] | None:
    """The lengths asked for; without ``--lengths``: None (the settings' defaults: 128 … 8192, or in
    mode context 128 … 4096 and full), or on a synthetic task (``synthetic:copy``, whose models
    train on short sequences) L/4 … 16·L around the first checkpoint's training length L, as the
    task groups are published (16…1024 for L = 64)."""
    if args.lengths:
        return args.lengths
    if not synthetic.is_synthetic(str(args.data)) or not checkpoints:
        return None
    seq_len = checkpoints[0].config.seq_len
    # a task sequence needs a few tokens (the copy task at least 4): shorter defaults are left out
    return sorted({n for n in (seq_len * k // 4 for k in (1, 2, 4, 8, 16, 32, 64)) if n >= 4} | {seq_len})


def settings_from_args(args, checkpoints: Sequence[Checkpoint | CausalLMCheckpoint]) -> EvalSettings:
    """The one :class:`EvalSettings` of a command line: ``--data``, the lengths and every setting
    flag (their ``dest`` names are ``SETTING_NAMES``). Raises: EvaluationError."""
    return EvalSettings.make(args.data, _lengths(args, checkpoints), **{k: getattr(args, k) for k in SETTING_NAMES})


def _run(args, bar) -> list[EvalResult]:
    """Resolve the checkpoints, build the settings and the cache once, evaluate.
    Raises: CheckpointError, DataError, EvaluationError."""
    cache = EvalCache(args.cache_dir, not args.no_cache)
    if not synthetic.is_synthetic(str(args.data)) or args.lengths:
        settings = settings_from_args(args, [])  # bad settings are said before a checkpoint is read
        cache.checked_root()
        checkpoints = [resolve_any(c) for c in checkpoint_list(args.checkpoints)]
    else:  # a task's default lengths follow the first checkpoint's training length
        checkpoints = [resolve_any(c) for c in checkpoint_list(args.checkpoints)]
        settings = settings_from_args(args, checkpoints)
    reference = 0 if args.reference is None else args.reference
    return evaluate(checkpoints, settings, cache=cache, reference=reference, progress=bar)


def main(argv: list[str] | None = None) -> int:
    """``python -m fireviz eval``. Returns 0 on success, 2 for bad input (one stderr line),
    or when no length of any checkpoint could be evaluated, 130 when interrupted."""
    args = build_parser().parse_intermixed_args(argv)

    problem = output_path_problem(args.out) if args.out is not None else None  # bad output paths before the evaluation
    if problem is None and args.figure is not None:
        problem = figure_path_problem(args.figure)
    if problem:
        print(f"fireviz eval: error: {problem}", file=sys.stderr)
        return 2
    follower = int(os.environ.get("RANK", "0")) > 0  # torchrun: the first process prints and writes
    bar = _ProgressBar(args.quiet or follower)
    try:
        results = _run(args, bar)
    except (CheckpointError, DataError, EvaluationError) as e:
        bar.close()
        print(f"fireviz eval: error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        bar.close()
        print("fireviz eval: interrupted; finished lengths are cached", file=sys.stderr)
        return 130
    bar.close()
    if follower:
        return 0
    write_error = None
    if args.out:  # written before anything is printed: a reader that closes the pipe early loses no file
        try:
            write_json_atomic(args.out, results)
        except OSError as e:  # a place that takes no file (/proc, a full disk); the numbers stay cached
            write_error = e
    print(format_table(results))
    if write_error is not None:
        print(f"fireviz eval: error: cannot write {args.out}: {write_error}; the results are cached", file=sys.stderr)
        return 2
    if args.out:
        print(f"wrote {args.out}")
    evaluated = any("error" not in e for r in results for e in r["per_length"])
    if args.figure and evaluated and not _write_figure(results, args.figure):
        return 2
    if not evaluated:
        first = next(e["error"] for r in results for e in r["per_length"])
        print(f"fireviz eval: error: no length could be evaluated: {first}", file=sys.stderr)
        return 2
    return 0
