"""Bad input (issue 21): the one JSON reader (fireviz.core.files) refuses deep nesting, non-finite
numbers, broken text and files too large or of the wrong type, and never rewrites a file."""

from __future__ import annotations

import math

import pytest
from bad_content import NESTED

from fireviz.core.files import (
    MAX_JSON_VALUES,
    FileFormatError,
    json_depth,
    json_values,
    parse_json,
    read_json,
    read_jsonl,
)


# -- one reader --------------------------------------------------------------------------------
def test_json_depth_ignores_brackets_in_strings_and_needs_no_recursion():
    assert json_depth('{"a": "[[[[", "b": [1, {"c": "}}"}]}') == 3
    assert json_depth('"\\"[["') == 0
    assert json_depth(NESTED) == 100_000


def test_json_values_counts_outside_strings_and_across_scan_pieces(monkeypatch):
    import fireviz.core.files as files

    assert json_values('{"a": "[,{", "b": [1, 2, {"c": 3}]}') == 7  # an upper bound: 6 values
    assert json_values("3") == 1 and json_values('"x,y"') == 1
    assert json_values(r'["a\\", "b\\\", [", {}]') == 5  # escaped backslashes before quotes
    assert json_depth(r'["\\\"[[[", [[]]]') == 3
    text = "[" + ",".join(["[1]"] * 5000) + "]"
    whole = (json_depth(text), json_values(text))
    monkeypatch.setattr(files, "_SCAN_CHUNK", 7)  # a depth, count, string or escape carried across pieces is not lost
    tricky = r'["\\", "\"[{,", {"k": ["\\\"]"]}]' * 3
    assert (json_depth(text), json_values(text)) == whole == (2, 1 + 1 + 5000 + 4999)
    monkeypatch.setattr(files, "_SCAN_CHUNK", 1 << 18)
    expected = (json_depth(tricky), json_values(tricky))
    for chunk in range(1, 12):
        monkeypatch.setattr(files, "_SCAN_CHUNK", chunk)
        assert (json_depth(tricky), json_values(tricky)) == expected


@pytest.mark.parametrize("item", ["{}", "[]", "0", '""', "null", '{"k":[]}'])
def test_many_small_values_under_the_byte_cap_are_refused_in_bounded_memory(item):
    """The byte cap (64 MiB) alone let 60 MB of ``[{},{},…]`` cost 1.3 GB to parse (issue #38): any
    JSON that would parse into more than MAX_JSON_VALUES values is refused, and checking costs a
    few times the text, not per value."""
    import tracemalloc

    n = MAX_JSON_VALUES + 1000
    text = "[" + ",".join([item] * n) + "]"
    tracemalloc.start()
    try:
        with pytest.raises(FileFormatError, match="JSON values"):
            parse_json(text, "many.json")
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 2 * len(text) + (32 << 20), f"{peak >> 20} MiB to refuse {len(text) >> 20} MiB of JSON"
    ok = "[" + ",".join([item] * 1000) + "]"
    assert len(parse_json(ok, "few.json")) == 1000


@pytest.mark.parametrize(
    "text, match",
    [
        (NESTED, "nests 100000 levels"),
        ("[NaN]", "non-finite"),
        ("[-Infinity]", "non-finite"),
        ("[1e999]", "out of float range"),
        ("{", "not valid JSON"),
    ],
)
def test_parse_json_refuses_deep_nonfinite_and_broken(text, match):
    with pytest.raises(FileFormatError, match=match):
        parse_json(text, "x.json")


def test_read_json_bounds_size_and_type(tmp_path):
    p = tmp_path / "a.json"
    p.write_text('{"a": 1}')
    assert read_json(p, expect=dict) == {"a": 1}
    with pytest.raises(FileFormatError, match="not the list"):
        read_json(p, expect=list)
    with pytest.raises(FileFormatError, match="more than the 4 read"):
        read_json(p, max_bytes=4)
    p.write_bytes(b'{"a": "\xff"}')
    with pytest.raises(FileFormatError, match="cannot read"):
        read_json(p)
    assert p.read_bytes() == b'{"a": "\xff"}'  # left untouched


def test_read_jsonl_keeps_nan_only_when_asked_and_drops_a_torn_tail(tmp_path):
    p = tmp_path / "log.jsonl"
    p.write_text('{"loss": NaN}\n{"loss": 1.0}\n{"loss": 2')
    recs = read_jsonl(p, allow_nonfinite=True)
    assert math.isnan(recs[0]["loss"]) and recs[1] == {"loss": 1.0} and len(recs) == 2
    with pytest.raises(FileFormatError, match=":1 "):
        read_jsonl(p)


@pytest.mark.parametrize("line", ["{}", '{"step":1}', "", '{"a":[0,0,0,0]}'])
def test_a_json_lines_file_of_many_small_lines_is_refused_in_bounded_memory(tmp_path, line):
    """A 100 KB gzip of 100 MB of ``{}`` lines made 35 million dicts (> 4 GB) while the app listed
    its checkpoint (issue #38): lines and values are counted before any is parsed, compressed or
    not, and checking costs a few times the text."""
    import gzip
    import tracemalloc

    n = MAX_JSON_VALUES + 1000
    text = "\n".join([line] * n) + "\n"
    path = tmp_path / "train_log.jsonl.gz"
    path.write_bytes(gzip.compress(text.encode()))
    before = path.read_bytes()
    tracemalloc.start()
    try:
        with pytest.raises(FileFormatError, match="JSON lines or values"):
            read_jsonl(path)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 6 * len(text) + (32 << 20), f"{peak >> 20} MiB to refuse {len(text) >> 20} MiB of lines"
    assert path.read_bytes() == before
    few = tmp_path / "few.jsonl"
    few.write_text("\n".join(['{"step":1}'] * 1000) + "\n")
    assert len(read_jsonl(few)) == 1000
