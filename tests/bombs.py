"""Inputs that are small on disk and huge when parsed (issue #50), and a child process that
reads one and reports its peak memory.

``run_measured`` runs Python code in a fresh interpreter (so the peak resident memory it
reports is that reading's, not the test session's) and returns its exit status, its output and
its peak RSS in MiB (``VmHWM`` of /proc/self/status at exit: ``ru_maxrss`` would carry over the
forking test session's own peak).
"""

from __future__ import annotations

import gzip
import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
#: what every bad input class must stay under (issue #50's acceptance: peak RSS < 1 GB)
RSS_BOUND_MB = 1000

# VmHWM (the peak resident set of this address space) rather than ru_maxrss, which Linux carries
# over an execve from the forking parent (the test session's own size)
_WRAP = """
import atexit, sys
def _peak():
    with open("/proc/self/status") as f:
        kb = next(int(x.split()[1]) for x in f if x.startswith("VmHWM:"))
    sys.stderr.write("\\nPEAK_RSS_KB %d\\n" % kb)
atexit.register(_peak)
"""


def gzip_repeated(head: bytes, block: bytes, times: int, tail: bytes = b"") -> bytes:
    """A gzip file (concatenated members, as gzip reads them) whose content is ``head``, then
    ``block`` ``times`` times, then ``tail``: 2 GiB of one byte costs ~2 MB on disk and no time
    to build."""
    member = gzip.compress(block, 9)
    return gzip.compress(head) + member * times + gzip.compress(tail)


def run_measured(code: str, timeout: float = 300, env: dict | None = None) -> tuple[int, str, float]:
    """Run ``code`` in a fresh ``python`` (the repository importable). Returns ``(exit status,
    stdout + stderr without the measurement line, peak RSS in MiB)``."""
    full_env = {**os.environ, "PYTHONPATH": str(REPO), **(env or {})}
    proc = subprocess.run(
        [sys.executable, "-c", _WRAP + code],
        capture_output=True,
        text=True,
        timeout=timeout,
        env=full_env,
        cwd=REPO,
    )
    out = proc.stdout + proc.stderr
    lines = out.splitlines()
    rss = [float(x.split()[1]) / 1024 for x in lines if x.startswith("PEAK_RSS_KB ")]
    text = "\n".join(x for x in lines if not x.startswith("PEAK_RSS_KB ")).strip()
    return proc.returncode, text, rss[-1] if rss else float("nan")


def run_cli_measured(args: list[str], timeout: float = 300, env: dict | None = None) -> tuple[int, str, float]:
    """``python -m fireviz *args`` measured as :func:`run_measured` measures code."""
    code = f"import runpy, sys\nsys.argv = ['fireviz', *{args!r}]\nrunpy.run_module('fireviz', run_name='__main__')\n"
    return run_measured(code, timeout, env)


def one_clear_line(text: str) -> bool:
    """True when ``text`` is one line of words, not a traceback."""
    return "Traceback" not in text and len([x for x in text.splitlines() if x.strip()]) == 1
