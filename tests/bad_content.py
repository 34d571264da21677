"""Content for the bad-input tests of issue 21 (tests/checkpoints/test_bad_checkpoint_files.py,
tests/ui/test_bad_app_input.py and others): a JSON text nested 100,000 levels deep, hypothesis
strategies of arbitrary JSON and bytes for a checkpoint's files, and one pristine pair of tiny
checkpoints (``good``, ``victim``) to copy per example."""

from __future__ import annotations

import json
from pathlib import Path

from conftest import make_tiny_checkpoint
from hypothesis import strategies as st

NESTED = "[" * 100_000 + "]" * 100_000


_json = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False, allow_infinity=False) | st.text(max_size=8),
    lambda c: st.lists(c, max_size=4) | st.dictionaries(st.text(max_size=6), c, max_size=4),
    max_leaves=12,
)

_key_json = st.fixed_dictionaries(
    {},
    optional={
        k: _json
        for k in (
            "settings",
            "per_length",
            "data",
            "length",
            "bits_per_byte",
            "n_layer",
            "seq_len",
            "position_encoding",
            "step",
            "loss",
            "val_loss",
            "tokens",
            "ci95",
        )
    },
)

_content = st.one_of(
    st.binary(max_size=200),
    _json.map(json.dumps),
    _key_json.map(json.dumps),
    st.just(NESTED),
    st.just('{"settings": {"data": "prose"}, "per_length": [{"length": 1e999}]}'),
)


_PRISTINE: dict = {}


def _pristine(factory) -> Path:
    if "root" not in _PRISTINE:
        r = factory.mktemp("pristine") / "root"
        make_tiny_checkpoint(r / "good", "alibi", results=True)
        make_tiny_checkpoint(r / "victim", "fire", results=True)
        _PRISTINE["root"] = r
    return _PRISTINE["root"]
