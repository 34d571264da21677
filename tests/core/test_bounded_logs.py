"""JSON-lines files fireviz wrote (training logs) that were replaced by small-on-disk,
huge-when-read ones: refused in one line, cheaply, never read as an empty log (issue #50)."""

from __future__ import annotations

import gzip

import pytest
from bombs import RSS_BOUND_MB, gzip_repeated, one_clear_line, run_measured

from fireviz.core import FileFormatError, read_jsonl
from fireviz.core.bounded import MiB

_READ_LOG = """
from fireviz.checkpoints.records import CheckpointError, read_train_log
try:
    print(len(read_train_log({path!r})))
except CheckpointError as e:
    print(e)
    raise SystemExit(2)
"""


@pytest.mark.parametrize("newline_every", [None, 4096])
def test_a_shipped_log_of_240_mib_of_spaces_is_refused_cheaply(tmp_path, newline_every):
    """The issue's row: a 245 KB train_log.jsonl.gz of 240 MiB of spaces cost 1.2 GB on every
    Home load and read as an empty log. One long line is refused after MAX_LOG_LINE_BYTES; many
    blank lines are refused as a log with no record."""
    folder = tmp_path / "ckpt"
    folder.mkdir()
    path = folder / "train_log.jsonl.gz"
    block = b" " * MiB if newline_every is None else (b" " * (newline_every - 1) + b"\n") * (MiB // newline_every)
    path.write_bytes(gzip_repeated(b"", block, 240))
    assert path.stat().st_size < 400_000
    before = path.read_bytes()
    rc, out, rss = run_measured(_READ_LOG.format(path=str(folder)))
    assert rc == 2 and one_clear_line(out), out
    assert ("line longer than 16 MiB" if newline_every is None else "whitespace and no JSON record") in out, out
    assert rss < RSS_BOUND_MB, f"{rss:.0f} MiB"
    assert path.read_bytes() == before


def test_a_log_line_is_bounded_while_decompressing_and_a_torn_tail_still_forgiven(tmp_path):
    path = tmp_path / "train_log.jsonl.gz"
    path.write_bytes(gzip.compress(b'{"step": 1}\n{"step": 2}\n{"step"'))
    assert read_jsonl(path) == [{"step": 1}, {"step": 2}]
    path.write_bytes(gzip_repeated(b'{"step": 1}\n{"note": "', b"n" * MiB, 17, b'"}\n'))
    with pytest.raises(FileFormatError, match=r"train_log.jsonl.gz:2 is a line longer than 16 MiB"):
        read_jsonl(path)
    path.write_bytes(gzip_repeated(b'{"step": 1}\n', b"x" * MiB, 3))  # decompressed past max_bytes
    with pytest.raises(FileFormatError, match="expands to more than 2,097,152 bytes"):
        read_jsonl(path, max_bytes=2 * MiB)
    path.write_bytes(b"\x1f\x8b\x08\x00broken")
    with pytest.raises(FileFormatError, match="cannot read"):
        read_jsonl(path)


def test_a_whitespace_only_log_is_refused_an_empty_one_is_empty(tmp_path):
    path = tmp_path / "train_log.jsonl"
    path.write_bytes(b"")
    assert read_jsonl(path) == []
    path.write_bytes(b"   \n\n  \n")
    with pytest.raises(FileFormatError, match="8 bytes of whitespace and no JSON record"):
        read_jsonl(path)
