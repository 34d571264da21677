"""Peak memory and seconds to refuse each class of input that is small on disk and huge when
parsed (issue #50), each read in a fresh process through the door a user reaches it by.

    .venv/bin/python benchmarks/bad_input_memory.py

Builds every input in a temporary folder (concatenated gzip members: gigabytes of content in a
few MB, built in no time), then prints per class: its size on disk, the child's exit status,
the first line it printed, its peak resident memory (``VmHWM``) and wall seconds, beside
the peak of a child that only imports fireviz (the floor). Acceptance (issue #50): every class
ends in one clear line with peak RSS < 1 GB.
"""

from __future__ import annotations

import gzip
import json
import os
import struct
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(Path(__file__).resolve().parent))
from eval_protocol import cpu_model  # noqa: E402

MiB = 1 << 20
# VmHWM: the peak of this address space (ru_maxrss would carry over the forking parent's peak)
WRAP = (
    "import atexit, sys\n"
    "def _peak():\n"
    "    with open('/proc/self/status') as f:\n"
    "        kb = next(int(x.split()[1]) for x in f if x.startswith('VmHWM:'))\n"
    "    sys.stderr.write('\\nPEAK_RSS_KB %d\\n' % kb)\n"
    "atexit.register(_peak)\n"
)


def gz_repeat(head: bytes, block: bytes, times: int, tail: bytes = b"") -> bytes:
    member = gzip.compress(block, 9)
    return gzip.compress(head) + member * times + gzip.compress(tail)


def run(code: str, env: dict | None = None) -> tuple[int, str, float, float]:
    t = time.perf_counter()
    p = subprocess.run(
        [sys.executable, "-c", WRAP + code],
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONPATH": str(ROOT), **(env or {})},
        cwd=ROOT,
    )
    secs = time.perf_counter() - t
    lines = (p.stdout + p.stderr).splitlines()
    rss = [float(x.split()[1]) / 1024 for x in lines if x.startswith("PEAK_RSS_KB ")]
    said = [x for x in lines if x.strip() and not x.startswith("PEAK_RSS_KB ")]
    return (
        p.returncode,
        (said[0] if said else "") + (f"  (+{len(said) - 1} lines)" if len(said) > 1 else ""),
        rss[-1],
        secs,
    )


def cli(args: list[str]) -> str:
    return f"import runpy, sys\nsys.argv = ['fireviz', *{args!r}]\nrunpy.run_module('fireviz', run_name='__main__')\n"


def guarded(call: str, errors: str) -> str:
    return f"try:\n    {call}\nexcept ({errors}) as e:\n    print(e)\n    raise SystemExit(2)\n"


def stream_and_gguf_cases(tmp: Path) -> list[tuple[str, Path, str, dict]]:
    """The compressed-line and GGUF-header cases: (name, file, code to run, extra environment)."""
    cases: list[tuple[str, Path, str, dict]] = []
    p = tmp / "huge_line.jsonl.gz"  # one 2 GiB line
    p.write_bytes(gz_repeat(b'{"text": "', b"a" * MiB, 2048, b'"}\n'))
    cases.append(
        ("prepare: .jsonl.gz, one 2 GiB line", p, cli(["prepare", "--data", str(p), "--out", str(tmp / "o1")]), {})
    )
    cases.append(
        (
            "eval --data: the same file",
            p,
            "from fireviz.data import DataError, load_documents\n"
            + guarded(f"load_documents({str(p)!r})", "DataError"),
            {},
        )
    )

    g = tmp / "bad.gguf"  # metadata claims 8M strings
    kv = struct.pack("<Q", 21) + b"tokenizer.ggml.tokens" + struct.pack("<IIQ", 9, 8, 8_000_000)
    g.write_bytes((b"GGUF" + struct.pack("<IQQ", 3, 0, 1) + kv).ljust(4096, b"\0"))
    load = "from fireviz.checkpoints import resolve_any\nfrom fireviz.model import CheckpointError\n"
    cases.append(
        ("GGUF: 4 KB claiming 8M strings", g, load + guarded(f"resolve_any({str(g)!r})", "CheckpointError"), {})
    )
    g2 = tmp / "trunc.gguf"  # key count past the file
    g2.write_bytes(
        b"GGUF" + struct.pack("<IQQ", 3, 0, 300) + struct.pack("<Q", 4) + b"name" + struct.pack("<I", 4) + b"\1\0"
    )
    cases.append(
        ("GGUF: key count past the file", g2, load + guarded(f"resolve_any({str(g2)!r})", "CheckpointError"), {})
    )
    return cases


def tokenizer_log_upload_cases(tmp: Path) -> list[tuple[str, Path, str, dict]]:
    """The tokenizer, train-log and upload cases: (name, file, code to run, extra environment)."""
    cases: list[tuple[str, Path, str, dict]] = []
    tok = tmp / "tok"
    tok.mkdir()
    entries = ",".join(f'"t{k}":{k}' for k in range(3_000_000))
    (tok / "tokenizer.json").write_text(
        '{"version":"1.0","model":{"type":"WordLevel","unk_token":"t0","vocab":{' + entries + "}}}"
    )
    d = tmp / "d.jsonl"
    d.write_text('{"text": "hello"}\n')
    cases.append(
        (
            "prepare: tokenizer.json of 3M entries",
            tok / "tokenizer.json",
            cli(["prepare", "--data", str(d), "--tokenizer", str(tok), "--out", str(tmp / "o2")]),
            {},
        )
    )

    ck = tmp / "ckpt"
    ck.mkdir()
    (ck / "train_log.jsonl.gz").write_bytes(gz_repeat(b"", b" " * MiB, 240))
    rec = "from fireviz.checkpoints.records import CheckpointError, read_train_log\n"
    cases.append(
        (
            "train_log.jsonl.gz: 240 MiB of spaces",
            ck / "train_log.jsonl.gz",
            rec + guarded(f"read_train_log({str(ck)!r})", "CheckpointError"),
            {},
        )
    )
    ck2 = tmp / "ckpt2"
    ck2.mkdir()
    (ck2 / "train_log.jsonl.gz").write_bytes(gz_repeat(b"", (b" " * 4095 + b"\n") * 256, 240))
    cases.append(
        (
            "train_log.jsonl.gz: 240 MiB of blank lines",
            ck2 / "train_log.jsonl.gz",
            rec + guarded(f"read_train_log({str(ck2)!r})", "CheckpointError"),
            {},
        )
    )

    u = tmp / "u.jsonl.gz"
    u.write_bytes(gz_repeat(b"", b'{"text":"a"}\n' * 100_000, 100))
    up = (
        "from pathlib import Path\nfrom fireviz.data import DataError\nfrom fireviz.eval.uploads import save_upload\n"
        + guarded(f"save_upload('u.jsonl.gz', Path({str(u)!r}).read_bytes())", "DataError")
    )
    cases.append(("upload: 10M one-character documents", u, up, {"FIREVIZ_CACHE_DIR": str(tmp / "cache")}))
    return cases


def main() -> None:
    tmp = Path(tempfile.mkdtemp(prefix="fireviz-bad-"))
    cases = stream_and_gguf_cases(tmp) + tokenizer_log_upload_cases(tmp)
    print(f"CPU: {cpu_model()}; python {sys.version.split()[0]}")
    _, _, floor, fsecs = run("import fireviz.checkpoints, fireviz.data, fireviz.eval")
    print(f"floor (imports only): {floor:.0f} MiB, {fsecs:.1f} s\n")
    print(f"{'class':45} {'on disk':>10} {'rc':>3} {'peak MiB':>9} {'s':>6}  first line")
    for name, path, code, env in cases:
        rc, said, rss, secs = run(code, env)
        print(f"{name:45} {path.stat().st_size / 1024:>8.0f}KB {rc:>3} {rss:>9.0f} {secs:>6.1f}  {said[:150]}")
    print(json.dumps({"bound_mib": 1000}))


if __name__ == "__main__":
    main()
