"""App uploads are bounded in documents and in expanded bytes while they stream (issue #50)."""

from __future__ import annotations

import pytest
from bombs import RSS_BOUND_MB, gzip_repeated, one_clear_line, run_measured

from fireviz.eval.uploads import MAX_UPLOAD_DOCUMENTS


def test_an_upload_of_ten_million_tiny_documents_is_refused_in_bounded_memory(tmp_path):
    """The issue's row: a 252 KB .jsonl.gz of ~10 million one-character documents was stored and
    took 1.96 GB in the app server. Refused once MAX_UPLOAD_DOCUMENTS are counted, with the
    upload's own name (not the server's path), and nothing is stored."""
    blob = gzip_repeated(b"", b'{"text":"a"}\n' * 100_000, 100)
    assert len(blob) < 300_000
    (tmp_path / "u.jsonl.gz").write_bytes(blob)
    cache = tmp_path / "cache"
    code = (
        "from pathlib import Path\nfrom fireviz.data import DataError\nfrom fireviz.eval.uploads import save_upload\n"
        f"try:\n    save_upload('tiny docs.jsonl.gz', Path({str(tmp_path / 'u.jsonl.gz')!r}).read_bytes())\n"
        "except DataError as e:\n    print(e)\n    raise SystemExit(2)\n"
    )
    rc, out, rss = run_measured(code, env={"FIREVIZ_CACHE_DIR": str(cache)})
    assert rc == 2 and one_clear_line(out), out
    assert out.startswith("tiny docs.jsonl.gz holds more than") and f"{MAX_UPLOAD_DOCUMENTS:,} documents" in out, out
    assert str(cache) not in out
    assert rss < RSS_BOUND_MB, f"{rss:.0f} MiB"
    assert not [p for p in cache.rglob("*") if p.is_file()]  # nothing stored


def test_an_upload_with_a_line_past_the_line_limit_is_refused_and_not_stored(tmp_path, monkeypatch):
    from fireviz.data import DataError
    from fireviz.eval import uploads

    monkeypatch.setenv("FIREVIZ_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setenv("FIREVIZ_MAX_LINE_MB", "1")
    blob = gzip_repeated(b'{"text": "', b"q" * (1 << 20), 2, b'"}\n')
    with pytest.raises(DataError, match=r"^long\.jsonl\.gz:1 is a line longer than 1 MiB"):
        uploads.save_upload("long.jsonl.gz", blob)
    assert not [p for p in (tmp_path / "cache").rglob("*") if p.is_file()]
