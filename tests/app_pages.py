"""Driving one app page through ``streamlit.testing``'s AppTest: open it with query parameters,
check it drew without an exception or an error, click a button and wait for what it starts."""

from __future__ import annotations

import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def page(name: str, **params):
    """``pages/<name>`` (or ``app.py``), run once with ``params`` as its query parameters."""
    from streamlit.testing.v1 import AppTest

    at = AppTest.from_file(str(ROOT / ("app.py" if name == "app.py" else f"pages/{name}")), default_timeout=120)
    for k, v in params.items():
        at.query_params[k] = v
    return at.run()


def click_and_wait(at, label: str, done, seconds: float = 120):
    """Click the button labelled ``label``, then rerun the page until ``done(at)`` (or ``seconds``)."""
    next(b for b in at.button if b.label == label).click().run()
    end = time.time() + seconds
    while not done(at) and time.time() < end:
        time.sleep(0.5)
        at.run()
    return at


def ok(at) -> None:
    """The page drew with no exception and no error message."""
    assert not at.exception, [e.value for e in at.exception]
    assert not at.error, [e.value for e in at.error]
