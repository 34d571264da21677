"""Bad input (issue 21): the one JSON reader (fireviz.core.files) refuses deep nesting, non-finite
numbers, broken text and files too large or of the wrong type, and never rewrites a file."""

from __future__ import annotations

import math

import pytest
from bad_content import NESTED

from fireviz.core.files import FileFormatError, json_depth, parse_json, read_json, read_jsonl


# -- one reader --------------------------------------------------------------------------------
def test_json_depth_ignores_brackets_in_strings_and_needs_no_recursion():
    assert json_depth('{"a": "[[[[", "b": [1, {"c": "}}"}]}') == 3
    assert json_depth('"\\"[["') == 0
    assert json_depth(NESTED) == 100_000


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
