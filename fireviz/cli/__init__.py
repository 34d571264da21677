"""``python -m fireviz <command>`` / ``fireviz <command>``: one entry point, one module per command.

Commands: ``train``, ``eval``, ``fit``, ``biases``, ``tokenizer``, ``prepare`` — one module each
under ``fireviz.cli``, exposing ``main(argv) -> int``. Both entry points end in :func:`run`.
"""

from __future__ import annotations

import importlib
import sys
from typing import NoReturn

from fireviz import __version__
from fireviz.core.distributed import exit_process

COMMANDS = {
    "train": ("fireviz.cli.train", "train a GPT with one position encoding (TOML config)"),
    "eval": ("fireviz.cli.eval", "perplexity vs evaluation length for checkpoints"),
    "fit": ("fireviz.cli.fit", "fit FIRE to a T5/ALiBi/Kerple/Sandwich bias (Theorem 3.1)"),
    "biases": ("fireviz.cli.biases", "learned biases and per-head locality of a checkpoint"),
    "tokenizer": ("fireviz.cli.tokenizer", "train a byte-level BPE tokenizer on a corpus"),
    "prepare": ("fireviz.cli.prepare", "tokenize a corpus once into token shards for training"),
}


def main(argv: list[str] | None = None) -> int:
    """Dispatch to a command's ``main``. Returns the process exit code."""
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["--version"]:
        print(f"fireviz {__version__}")
        return 0
    if not argv or argv[0] in ("-h", "--help"):
        print("usage: python -m fireviz {" + ",".join(COMMANDS) + "} [options]   (or --version)\n")
        for name, (_, text) in COMMANDS.items():
            print(f"  {name:8s} {text}")
        return 0 if argv else 2
    name, rest = argv[0], argv[1:]
    if name not in COMMANDS:
        print(f"fireviz: unknown command {name!r}; choose one of {', '.join(COMMANDS)}", file=sys.stderr)
        return 2
    module = importlib.import_module(COMMANDS[name][0])
    return int(module.main(rest) or 0)


def run() -> NoReturn:
    """The process entry point (``python -m fireviz``, the ``fireviz`` script): :func:`main`, then
    :func:`fireviz.core.distributed.exit_process` with its code (a ``torchrun`` worker ends
    without the interpreter's teardown, where gloo's threads could abort it)."""
    exit_process(main())
