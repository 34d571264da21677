"""``python -m fireviz prepare``: tokenize a corpus once into token shards (issue #37).

A thin layer over ``fireviz.data.prepare.prepare``: the tokenizer is resolved once here
(``byte``, a tokenizer folder or tokenizer.json, a Hub id), the shards are written into ``--out``
(format: ``fireviz.data.shards``), and training reads them with ``train.data = "<--out>"``.
Run the same command again after a kill: finished chunks are kept, the rest written.

    python -m fireviz prepare --data prose --tokenizer byte --out shards/prose
    python -m fireviz prepare --data corpus.parquet --tokenizer runs/tok-32k --out shards/c4 --num-proc 8
"""

from __future__ import annotations

import argparse
import math
import os
import sys
from pathlib import Path

from fireviz.checkpoints.causal_lm import load_tokenizer
from fireviz.data import DataError
from fireviz.data.prepare import DEFAULT_CHUNK_BYTES, prepare
from fireviz.data.shards import MANIFEST
from fireviz.model import CheckpointError


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m fireviz prepare", description=__doc__.splitlines()[0])
    p.add_argument(
        "--data",
        required=True,
        help="a bundled domain (prose, latex, code), a .jsonl/.txt/.parquet file or a folder of them, or "
        "hf:<dataset> (streamed; needs the datasets package)",
    )
    p.add_argument(
        "--tokenizer",
        default="byte",
        help="byte (default: one token per byte, BOS 256), a folder with tokenizer.json (python -m fireviz "
        "tokenizer train writes one), a tokenizer.json file, or a Hub id",
    )
    p.add_argument("--out", required=True, help="a new or empty folder (or one a killed prepare left: resumed)")
    p.add_argument("--num-proc", type=int, default=1, help="tokenizing processes (default 1)")
    p.add_argument(
        "--chunk-mb",
        type=float,
        default=DEFAULT_CHUNK_BYTES / 2**20,
        help="MiB of text per pair of shards (default 16)",
    )
    p.add_argument("--text-column", default="text", help="Parquet / datasets column holding the text (default text)")
    p.add_argument("--id-column", default="id", help="column holding a document id, when there is one (default id)")
    p.add_argument("--hf-config", default=None, help="hf: sources: the dataset's configuration (e.g. en)")
    p.add_argument("--hf-split", default="train", help="hf: sources: the split to read (default train)")
    p.add_argument(
        "--max-documents", type=int, default=None, help="the source's first N documents only (e.g. of hf:allenai/c4)"
    )
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    return p


def main(argv: list[str] | None = None) -> int:
    """Returns 0 on success, 2 for bad input (one stderr line)."""
    args = build_parser().parse_args(argv)
    if not (math.isfinite(args.chunk_mb) and args.chunk_mb * 2**20 >= 1):
        print(
            f"fireviz prepare: error: --chunk-mb must be a positive number of MiB (got {args.chunk_mb}); e.g. 16",
            file=sys.stderr,
        )
        return 2
    done_before = (Path(args.out) / MANIFEST).is_file()
    try:
        tokenizer = load_tokenizer(args.tokenizer)
        manifest = prepare(
            args.data,
            tokenizer,
            args.out,
            chunk_bytes=int(args.chunk_mb * 2**20),
            num_proc=args.num_proc,
            text_column=args.text_column,
            id_column=args.id_column,
            hf_config=args.hf_config,
            hf_split=args.hf_split,
            max_documents=args.max_documents,
            progress=False if args.no_progress else None,
        )
    except (DataError, CheckpointError, ValueError, OSError) as e:
        print(f"fireviz prepare: error: {e}", file=sys.stderr)
        return 2
    sp = manifest["splits"]
    print(
        f"{'already prepared (checked, nothing rewritten)' if done_before else 'wrote'} {os.path.normpath(args.out)}: {manifest['chunks']} chunk(s) of {manifest['tokenizer']['name']} tokens "
        f"({manifest['dtype']}); train {sp['train']['documents']:,} documents, {sp['train']['tokens']:,} tokens "
        f"({sp['train']['tokens'] / max(sp['train']['bytes'], 1):.3f} per byte); validation "
        f"{sp['validation']['documents']:,} documents, {sp['validation']['tokens']:,} tokens. Train on it with "
        f"--set train.data={os.path.normpath(args.out)}"
    )
    return 0
