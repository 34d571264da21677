"""The running app in a real browser: `streamlit run app.py` + headless Chromium (Playwright).

Starts the server on a free port against the tiny test checkpoints, opens every page, drives
the ones whose charts need a click (Fit FIRE, Length generalization with an uploaded file),
waits for the plotly charts, asserts no exception is shown, and saves a screenshot of each
page to out/screenshots/. Chromium is Debian's (/usr/bin/chromium; .ci/run installs it).
"""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SHOTS = ROOT / "out" / "screenshots"
CHROMIUM = "/usr/bin/chromium"
#: the running server's log file (set by the ``server`` fixture), quoted when a wait fails
SERVER_LOG: list[Path] = []
#: the running server's process id
SERVER_PID: list[int] = []
CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]
PAGE_TIMEOUT_MS = 300_000  # generous: a fresh clone may compile the numba kernels on first use, on 2 shared cores
#: Longest wait for a page's first chart (s), from the page's opening (or the click that asks for
#: it): generous against the 5 s the app aims at on a quiet machine, so only a regression of the
#: size issue #48 found (98–285 s; 0 charts on 6 pages within 60 s) fails it on a loaded CI machine
FIRST_CHART_BOUND_S = 30.0
#: page name → seconds to its first chart (printed at the end of the module, in the test output)
FIRST_CHART_S: dict[str, float] = {}

pytestmark = [pytest.mark.browser, pytest.mark.slow]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def server(tiny_checkpoints_dir, tmp_path_factory):
    """``streamlit run app.py`` on a free port; yields its base URL; always terminated."""
    # FIRE's numba row kernel compiles once per clone and is cached on disk: compiled here first,
    # so FIRST_CHART_BOUND_S times the app, not the compiler
    from fireviz.encodings import build_encoding

    build_encoding("fire", num_heads=2, head_dim=8).bias(q_len=64, k_len=64)
    port = _free_port()
    env = dict(
        os.environ,
        FIREVIZ_CHECKPOINTS_DIR=str(tiny_checkpoints_dir),
        FIREVIZ_CACHE_DIR=str(tmp_path_factory.mktemp("eval_cache")),
        HF_HUB_OFFLINE="1",
        FIREVIZ_JOB_WORKER="process",  # as the app runs for a user (conftest sets thread for in-process tests)
    )
    log_path = tmp_path_factory.mktemp("server") / "streamlit.log"
    SERVER_LOG[:] = [log_path]
    log = open(log_path, "w+")
    proc = subprocess.Popen(
        [
            sys.executable,
            "-c",
            # `streamlit run`, whose threads' stacks SIGUSR1 writes to the log (a wait that times out sends it)
            "import faulthandler, signal, sys; faulthandler.register(signal.SIGUSR1, all_threads=True); "
            "from streamlit.web.cli import main; sys.exit(main())",
            "run",
            "app.py",
            "--server.headless",
            "true",
            "--server.port",
            str(port),
            "--server.address",
            "127.0.0.1",
            "--browser.gatherUsageStats",
            "false",
            "--server.fileWatcherType",
            "none",
        ],
        cwd=ROOT,
        env=env,
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    SERVER_PID[:] = [proc.pid]
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.time() + 90
        while True:
            try:
                with urllib.request.urlopen(f"{url}/_stcore/health", timeout=2) as r:
                    if r.status == 200:
                        break
            except OSError:
                pass
            if proc.poll() is not None or time.time() > deadline:
                log.seek(0)
                pytest.fail(f"streamlit did not come up (exit {proc.poll()}):\n{log.read()[-3000:]}")
            time.sleep(0.5)
        yield url
    finally:
        if FIRST_CHART_S:  # what the bound guards, kept beside the screenshots
            SHOTS.mkdir(parents=True, exist_ok=True)
            (SHOTS / "first_chart_seconds.json").write_text(json.dumps(FIRST_CHART_S, indent=1))
        proc.terminate()
        try:
            proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        log.close()


@pytest.fixture(scope="module")
def browser():
    from playwright.sync_api import sync_playwright

    assert Path(CHROMIUM).exists(), f"{CHROMIUM} is missing: apt-get install -y chromium (.ci/run does)"
    with sync_playwright() as p:
        b = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS, headless=True)
        try:
            yield b
        finally:
            b.close()


def _wait_text(page, text, timeout_ms: int = PAGE_TIMEOUT_MS) -> None:
    """Wait until ``text`` (a substring, or a compiled regex) shows on ``page``; on timeout fail with
    what the page shows instead, its connection and last websocket frames (:func:`_connection_report`)
    and the end of the server's log with its threads' stacks (an intermittent failure then says
    what happened)."""
    from playwright.sync_api import TimeoutError as PlaywrightTimeout

    try:
        page.get_by_text(text).first.wait_for(timeout=timeout_ms)
    except PlaywrightTimeout:
        body = page.inner_text("body")
        if SERVER_PID:  # the server's threads, where they stand now
            os.kill(SERVER_PID[0], signal.SIGUSR1)
            time.sleep(2)
        log = SERVER_LOG[0].read_text(errors="replace")[-12000:] if SERVER_LOG else "(no log)"
        pytest.fail(
            f"{text!r} did not show within {timeout_ms / 1000:.0f} s; the page shows:\n{body}\n"
            f"--- the page's connection:\n{_connection_report(page)}\n--- server log:\n{log}"
        )


#: per page (by ``id``): when it opened (``time.time()``) and what its websocket did since,
#: ``(seconds since it opened, event)`` — quoted by :func:`_connection_report` when a wait fails
_PAGE_EVENTS: dict[int, tuple[float, list[tuple[float, str]]]] = {}


def _watch(page) -> None:
    """Record the page's websocket frames (decoded, :func:`_describe`) and console errors."""
    t0, events = _PAGE_EVENTS.setdefault(id(page), (time.time(), []))

    def note(what: str) -> None:
        events.append((time.time() - t0, what))

    def on_ws(ws) -> None:
        note(f"websocket open {ws.url}")
        ws.on("framesent", lambda payload: note(f"sent {_describe(payload, sent=True)}"))
        ws.on("framereceived", lambda payload: note(f"received {_describe(payload, sent=False)}"))
        ws.on("socketerror", lambda error: note(f"socket error {error}"))
        ws.on("close", lambda _ws: note("websocket closed"))

    page.on("websocket", on_ws)
    page.on("console", lambda msg: msg.type in ("error", "warning") and note(f"console {msg.type}: {msg.text[:300]}"))
    page.on("pageerror", lambda err: note(f"page error: {err}"))


def _describe(payload, sent: bool) -> str:
    """One websocket frame of Streamlit's protocol in words: a BackMsg (sent) or ForwardMsg."""
    from streamlit.proto.BackMsg_pb2 import BackMsg
    from streamlit.proto.ForwardMsg_pb2 import ForwardMsg

    if isinstance(payload, str):
        return f"text {payload[:80]!r}"
    try:
        msg = (BackMsg if sent else ForwardMsg).FromString(payload)
    except Exception as e:  # a report must not hide the failure it reports
        return f"{len(payload)} B (undecoded: {e})"
    kind = msg.WhichOneof("type")
    run = ""
    if not sent and msg.metadata.HasField("run"):
        run = f" [run {msg.metadata.run.script_run_id[:6]} fragments {list(msg.metadata.run.fragment_ids)}]"
    return _describe_kind(msg, kind, len(payload)) + run


def _describe_kind(msg, kind: str, size: int) -> str:
    """The message's kind and what matters of it for a page's runs and polls."""
    if kind == "rerun_script":
        r = msg.rerun_script
        return f"rerun_script fragment={r.fragment_id!r} auto={r.is_auto_rerun} widgets={len(r.widget_states.widgets)}"
    if kind == "new_session":
        return "new_session"
    if kind == "auto_rerun":
        return f"auto_rerun {msg.auto_rerun.fragment_id!r} every {msg.auto_rerun.interval} s"
    if kind == "stop_auto_rerun":
        return f"stop_auto_rerun {list(msg.stop_auto_rerun.fragment_ids)}"
    if kind == "session_status_changed":
        return f"session_status running={msg.session_status_changed.script_is_running}"
    if kind == "script_finished":
        return f"script_finished {msg.script_finished}"
    if kind == "delta":
        d = msg.delta
        what = d.new_element.WhichOneof("type") if d.HasField("new_element") else d.WhichOneof("type")
        return f"delta {what} path={list(msg.metadata.delta_path)}"
    return f"{kind} ({size} B)"


def _connection_report(page) -> str:
    """The page's Streamlit connection and script state, and its last 40 websocket events."""
    app = page.locator('[data-testid="stApp"]')
    try:
        connection = app.get_attribute("data-test-connection-state", timeout=5_000)
        state = f"connection {connection}, script {app.get_attribute('data-test-script-state', timeout=5_000)}"
    except Exception as e:  # a report must not hide the failure it reports
        state = f"(state unreadable: {e})"
    t0, events = _PAGE_EVENTS.get(id(page), (time.time(), []))
    sent = [t for t, e in events if e.startswith("sent")] or [0.0]
    got = [t for t, e in events if e.startswith("received")] or [0.0]
    lines = [
        state,
        f"{len(sent)} frames sent (last at {sent[-1]:.1f} s), {len(got)} received (last at {got[-1]:.1f} s); "
        f"now {time.time() - t0:.1f} s",
    ]
    return "\n".join(lines + [f"{t:7.2f} s  {e}" for t, e in events[-40:]])


#: Window widths every page is looked at in (a laptop and a desktop browser), px.
WIDTHS = (1024, 1400)


@pytest.fixture(params=WIDTHS, ids=lambda w: f"{w}px")
def width(request) -> int:
    return request.param


def _open(browser, url: str, width: int = 1400):
    page = browser.new_page(viewport={"width": width, "height": 1000})
    _watch(page)
    page.set_default_timeout(PAGE_TIMEOUT_MS)
    page.goto(url, wait_until="domcontentloaded")
    page.wait_for_selector('[data-testid="stApp"]')
    return page


def _stop_and_see_it_stopped(page) -> None:
    """Press Stop on the running fit; the page draws the stopped fit within 60 s, with no
    exception; the page is closed."""
    started = time.time()
    _click_stop(page)
    _wait_text(page, "Stopped after", 60_000)
    assert time.time() - started < 60
    assert page.locator('[data-testid="stException"]').count() == 0
    page.close()


def _click_stop(page) -> None:
    """Click the job panel's Stop button. While its fragment redraws every 0.5 s the page can hold,
    for a moment, the outgoing copy beside the new one (CI once found two): click when one is there."""
    from playwright.sync_api import Error as PlaywrightError

    stop = page.get_by_role("button", name="Stop", exact=True)
    for _ in range(50):
        stop.first.wait_for(timeout=PAGE_TIMEOUT_MS)
        if stop.count() == 1:
            try:
                stop.click(timeout=5_000)  # strict: fails rather than click a copy on its way out
                return
            except PlaywrightError:
                pass
        page.wait_for_timeout(100)
    raise AssertionError("the Stop button never stood alone on the page for a click")


def _settle(page) -> None:
    """Wait until Streamlit has finished running the script.

    The app root's ``data-test-script-state`` turns to ``notRunning`` as soon as a run ends (the
    "running" status widget only shows after a run has lasted 500 ms, so its absence proves
    nothing); the short pause lets a just-requested rerun start first.
    """
    page.wait_for_timeout(300)
    page.wait_for_selector('[data-testid="stApp"][data-test-script-state="notRunning"]', timeout=PAGE_TIMEOUT_MS)
    page.wait_for_function("() => !document.querySelector('[data-testid=\"stStatusWidget\"]')", timeout=PAGE_TIMEOUT_MS)
    page.wait_for_timeout(300)


def _click_when_idle(page, button: str, ready_text: str) -> float:
    """Click ``button`` once the script run that draws it has finished; returns when it was clicked
    (``time.time()``).

    Streamlit drops a click that lands while the previous run (page load, file upload) is still
    going: the page then only says ``ready_text`` again. So wait for the text the finished run
    ends with, and for the running indicator to go, before clicking.
    """
    ready, exception = page.get_by_text(ready_text), page.locator('[data-testid="stException"]')
    ready.or_(exception).first.wait_for(timeout=PAGE_TIMEOUT_MS)
    assert exception.count() == 0, exception.first.inner_text()
    _settle(page)
    assert ready.count(), (
        f"the page no longer says {ready_text!r} before {button} is pressed:\n{page.inner_text('body')}"
    )
    page.get_by_role("button", name=button, exact=True).click()
    return time.time()


def _check_and_shoot(page, name: str, charts: int = 1, width: int = 1400, since: float | None = None) -> None:
    """Wait for the page's charts, then check it and save a screenshot. Its first chart must come
    within FIRST_CHART_BOUND_S of the page's opening (or of ``since``, the click that asks for it)."""
    t0 = since if since is not None else _PAGE_EVENTS[id(page)][0]
    page.wait_for_function(
        "() => document.querySelectorAll('.js-plotly-plot .main-svg').length >= 1", timeout=PAGE_TIMEOUT_MS
    )
    first = FIRST_CHART_S[f"{name} {width}px"] = time.time() - t0
    assert first <= FIRST_CHART_BOUND_S, (
        f"{name} at {width}px drew its first chart after {first:.1f} s (bound {FIRST_CHART_BOUND_S:.0f} s): "
        "something on the page's path got slow (benchmarks/app_responsiveness.py times every page)"
    )
    page.wait_for_function(
        f"() => document.querySelectorAll('.js-plotly-plot .main-svg').length >= {charts}", timeout=PAGE_TIMEOUT_MS
    )
    _settle(page)
    assert page.locator('[data-testid="stException"]').count() == 0, page.locator(
        '[data-testid="stException"]'
    ).first.inner_text()
    body = page.inner_text("body")
    assert "Traceback" not in body
    SHOTS.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=str(SHOTS / f"{name}_{width}px.png"), full_page=True)


def test_home_page(server, browser, width):
    page = _open(browser, server, width)
    page.wait_for_selector('[data-testid="stDataFrame"]')
    _settle(page)
    assert page.locator('[data-testid="stException"]').count() == 0
    body = page.inner_text("body")
    assert "Traceback" not in body and "FIRE" in body
    for name in ("Learned biases", "Fit FIRE", "Length generalization", "Training runs"):
        assert name in body
    SHOTS.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=str(SHOTS / f"0_home_{width}px.png"), full_page=True)
    page.close()


def test_learned_biases_page(server, browser, width):
    page = _open(browser, f"{server}/Learned_biases?ckpt=fire&ckpt=alibi", width)
    _check_and_shoot(page, "1_learned_biases_grid", charts=2, width=width)
    page.close()
    page = _open(browser, f"{server}/Learned_biases?ckpt=fire&view=head&layer=1&head=0&x=normalized", width)
    _check_and_shoot(page, "1_learned_biases_head", charts=2, width=width)
    page.close()


def test_fit_fire_page(server, browser, width):
    page = _open(browser, f"{server}/Fit_FIRE?target=t5&heads=2&max_len=64&steps=20&width=16", width)
    ready = "Pick a target and" if width == WIDTHS[0] else "relative RMSE"  # the second width finds the fit done
    clicked = _click_when_idle(page, "Fit", ready_text=ready) if width == WIDTHS[0] else None
    _check_and_shoot(page, "2_fit_fire", width=width, since=clicked)
    page.close()


def test_length_generalization_page(server, browser, tmp_path, width):
    docs = [
        {"id": f"d{k}", "text": "Position encodings decide what a transformer sees. " * (10 + 3 * k)} for k in range(6)
    ]
    upload = tmp_path / "mini.jsonl"
    upload.write_text("".join(json.dumps(d) + "\n" for d in docs))
    page = _open(
        browser,
        f"{server}/Length_generalization?domain=upload&len=16&len=32&len=64&len=128&budget=512&mode=nonoverlapping",
        width,
    )
    page.locator('input[type="file"]').set_input_files(str(upload))
    clicked = _click_when_idle(page, "Run", ready_text="have not been evaluated yet") if width == WIDTHS[0] else None
    _check_and_shoot(page, "3_length_generalization", charts=2, width=width, since=clicked)
    page.close()


def test_training_runs_page(server, browser, width):
    page = _open(browser, f"{server}/Training_runs", width)
    _check_and_shoot(page, "4_training_runs", width=width)
    page.close()


def test_attention_page(server, browser, width):
    page = _open(browser, f"{server}/Attention?ckpt=fire&alen=100&cap=16", width)
    _check_and_shoot(page, "5_attention", charts=2, width=width)
    page.close()


def test_fit_stop_shows_the_stopped_fit_every_time(server, browser):
    """Fit → Stop, three times in a row (issue #40: the page once froze on its progress bar for 15
    minutes after the fit had stopped): each time the page draws the stopped fit's best parameters
    within a bounded wait, and a second tab opened meanwhile sees the job running."""
    for seed in (101, 102, 103):
        # a fit that runs for minutes, so the second tab finds it still running: ALiBi's closed-form
        # start is already exact, so the time is the 5000 steps' own (at 1024 tokens and width 64 they
        # took ~10 s on one core, and a slow second tab then found the fit finished)
        url = f"{server}/Fit_FIRE?target=alibi&heads=16&max_len=4096&steps=5000&width=256&seed={seed}"
        page = _open(browser, url)
        _click_when_idle(page, "Fit", ready_text="Pick a target and")
        # optimising in the worker: its progress says "step k/5000" ("step " alone would also match
        # the sidebar's "Optimisation steps" label, whitespace being normalised)
        _wait_text(page, re.compile(r"step \d+/\d+"))
        # the second tab in a browser of its own (another window, or another person). The first page
        # then sometimes froze on its progress bar after Stop (CI, and 2 of ~60 stops here): Stop reran
        # the whole page while the job still ran, and a poll arriving as that run ended made Streamlit
        # start a new script runner and drop the run's last messages, the poll's re-arming among them
        # (the frames _connection_report decodes showed it). Stop now only asks the job to stop; the
        # next test stops during the closed-form start
        other_browser = browser.browser_type.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS, headless=True)
        other = _open(other_browser, url)
        # the running job, in another tab (how fast a page draws under load is benchmarks/app_responsiveness.py's)
        _wait_text(other, "fit FIRE to alibi")
        # seen while it runs: the panel's progress and its button arrive one after the other, so the
        # button is waited for (a count at once found none in the moment between them)
        other.get_by_role("button", name="Stop", exact=True).first.wait_for(timeout=60_000)
        other_browser.close()
        _stop_and_see_it_stopped(page)


def test_stop_during_the_closed_form_start_shows_the_stopped_fit(server, browser):
    """Stop pressed while the fit still chooses its closed-form start (before any optimisation
    step): the page draws the stopped fit within a bounded wait, as it does for a Stop during the
    steps."""
    url = f"{server}/Fit_FIRE?target=alibi&heads=16&max_len=4096&steps=5000&width=256&seed=104"
    page = _open(browser, url)
    _click_when_idle(page, "Fit", ready_text="Pick a target and")
    _wait_text(page, "closed-form start: candidate")
    _stop_and_see_it_stopped(page)
