"""``python -m fireviz tokenizer train``: a byte-level BPE tokenizer trained on a corpus (issue #37).

A thin layer over ``fireviz.data.tokenizers.train_bpe``: the documents of ``--data`` (bundled
domains or files, their train split by default, so no validation text is learned), ``--vocab-size``
tokens, written as a Hugging Face tokenizer folder (tokenizer.json and its config) that
``transformers.AutoTokenizer`` and fireviz's ``HFTokenizer`` load.

    python -m fireviz tokenizer train --vocab-size 4096 --data prose --out runs/tokenizer-prose-4k
"""

from __future__ import annotations

import argparse
import sys

from fireviz.data import DataError
from fireviz.data.tokenizers import TOKENS_PER_BYTE_SAMPLE, train_bpe


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m fireviz tokenizer", description=__doc__.splitlines()[0])
    sub = p.add_subparsers(dest="action", required=True)
    t = sub.add_parser("train", help="train a byte-level BPE tokenizer on a corpus")
    t.add_argument("--vocab-size", type=int, required=True, help="tokens in the vocabulary, e.g. 32000 (>= 260)")
    t.add_argument(
        "--data",
        action="append",
        required=True,
        help="a bundled domain (prose, latex, code), a .txt/.jsonl/.parquet file or a folder of them, or "
        "hf:<dataset> (streamed; needs the datasets package); repeat for several",
    )
    t.add_argument(
        "--split",
        default="train",
        choices=("train", "all"),
        help="documents to learn from (default train: validation text stays unseen)",
    )
    t.add_argument("--max-documents", type=int, default=None, help="learn from the first N documents only")
    t.add_argument("--out", required=True, help="folder to write the tokenizer into (created)")
    return p


def main(argv: list[str] | None = None) -> int:
    """Returns 0 on success, 2 for bad input (one stderr line)."""
    args = build_parser().parse_args(argv)
    try:
        summary = train_bpe(args.data, args.vocab_size, args.out, split=args.split, max_documents=args.max_documents)
    except (DataError, ValueError, OSError) as e:
        print(f"fireviz tokenizer: error: {e}", file=sys.stderr)
        return 2
    print(
        f"wrote {args.out}: {summary['vocab_size']:,} tokens learned from {summary['documents']:,} documents "
        f"({summary['bytes']:,} bytes); {summary['tokens_per_byte']:.3f} tokens per byte on "
        + (
            "them"
            if summary["documents"] <= TOKENS_PER_BYTE_SAMPLE
            else f"the first {TOKENS_PER_BYTE_SAMPLE:,} of them"
        )
        + "; <s> (BOS, id 0) and </s> (id 1) are among the tokens"
    )
    return 0
