"""How long every page of the app takes to draw, idle and while an evaluation runs (issues #40, #48).

    .venv/bin/python benchmarks/app_responsiveness.py [--renders 3] [--extra-group 20] [--modes idle,process]

The Streamlit server draws every page of every tab in one Python process. This script is that
process: it draws each page (``app.py`` and ``pages/*.py`` through ``streamlit.testing``'s AppTest,
as a browser request would) as a fresh session (a new tab) and as a rerun (a widget change), on the
bundled checkpoints plus a second group of ``--extra-group`` copies of them (links, as a user's own
runs would sit beside the bundled ones), and prints absolute seconds per page with the CPU model and
the load average. A whole script run bounds the time to the page's first chart from above.

Modes, measured one after another in one run:
  * ``idle``: no job;
  * ``process``: while one evaluation (the bundled FIRE and ALiBi at 2048, 4096 and 8192 tokens,
    the cache off so it really computes) runs in the job queue's worker process (today's app);
  * ``thread``: the same job in the server's own thread (fireviz before issue #40).

The first draw of a page in a process also pays imports and the first read of every checkpoint
folder (``first`` column); what a user meets on every later visit is ``fresh`` and ``rerun``.
"""

from __future__ import annotations

import argparse
import functools
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

from eval_protocol import cpu_model  # noqa: E402
from streamlit.testing.v1 import AppTest  # noqa: E402

from fireviz.checkpoints import Checkpoint  # noqa: E402
from fireviz.eval import EvalCache, EvalSettings  # noqa: E402
from fireviz.ui import jobs  # noqa: E402

#: page file → URL parameters a user arriving from Home would have (so each page draws its charts)
PAGES: dict[str, dict[str, list[str]]] = {
    "app.py": {},
    "pages/1_Learned_biases.py": {"ckpt": ["fire", "alibi"]},
    "pages/2_Fit_FIRE.py": {},
    "pages/3_Length_generalization.py": {},
    "pages/4_Training_runs.py": {},
    "pages/5_Attention.py": {"ckpt": ["fire"]},
}


def draw(page: str, params: dict[str, list[str]]) -> tuple[float, float]:
    """(seconds to draw ``page`` as a fresh session, seconds to rerun it once more)."""
    at = AppTest.from_file(str(ROOT / page), default_timeout=900)
    for k, v in params.items():
        at.query_params[k] = v
    t = time.perf_counter()
    at.run()
    fresh = time.perf_counter() - t
    if at.exception:
        raise RuntimeError(f"{page} raised: {at.exception[0].value}")
    t = time.perf_counter()
    at.run()
    return fresh, time.perf_counter() - t


def measure(mode: str, renders: int, checkpoints: list[Checkpoint], settings: EvalSettings) -> dict[str, dict]:
    """``{page: {"fresh": median s, "rerun": median s, "max": s}}`` with no job or the evaluation in ``mode``."""
    job = q = None
    if mode != "idle":
        q = jobs.JobQueue(name=f"bench-{mode}", process=mode == "process")
        work = functools.partial(jobs._evaluation_work, checkpoints, settings, EvalCache(enabled=False), 0, "")
        job = q.submit({"bench": mode, "t": time.time()}, work)
        while job.done == 0 and job.status not in jobs.FINISHED:  # computing (the worker has started)
            time.sleep(0.1)
    out = {}
    for page, params in PAGES.items():
        times = [draw(page, params) for _ in range(renders)]
        fresh, rerun = [t[0] for t in times], [t[1] for t in times]
        out[page] = {"fresh": statistics.median(fresh), "rerun": statistics.median(rerun), "max": max(fresh + rerun)}
    out["_ran"] = {"job running to the end": job is not None and job.status == jobs.RUNNING}
    if job is not None and q is not None:
        q.cancel(job.key)
        q.wait(job.key, 300)
        if q.in_process:
            q._worker.close()
    return out


def with_extra_group(n: int) -> tempfile.TemporaryDirectory | None:
    """A checkpoints root holding the bundled checkpoints and a group ``mine`` of ``n`` links to
    them (set as ``FIREVIZ_CHECKPOINTS_DIR``); None when ``n`` is 0."""
    if n <= 0:
        return None
    tmp = tempfile.TemporaryDirectory(prefix="fireviz-bench-")
    root, bundled = Path(tmp.name), sorted(p for p in (ROOT / "checkpoints").iterdir() if (p / "config.json").exists())
    for p in bundled:
        (root / p.name).symlink_to(p)
    (root / "mine").mkdir()
    for k in range(n):
        (root / "mine" / f"run{k:02d}").symlink_to(bundled[k % len(bundled)])
    os.environ["FIREVIZ_CHECKPOINTS_DIR"] = str(root)
    return tmp


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--renders", type=int, default=3, help="draws per page and mode (default %(default)s)")
    p.add_argument("--extra-group", type=int, default=20, help="checkpoints in a second group (default %(default)s)")
    p.add_argument(
        "--modes", default="idle,process", help="comma-separated: idle, process, thread (default %(default)s)"
    )
    p.add_argument(
        "--checkpoints",
        default="checkpoints/fire,checkpoints/alibi",
        help="the job's checkpoints (default %(default)s)",
    )
    p.add_argument("--lengths", default="2048,4096,8192", help="the job's lengths in tokens (default %(default)s)")
    a = p.parse_args(argv)
    os.environ.setdefault("FIREVIZ_JOB_WORKER", "process")
    tmp = with_extra_group(a.extra_group)
    ckpts = [Checkpoint.resolve(str(ROOT / c)) for c in a.checkpoints.split(",") if c]
    settings = EvalSettings.make("prose", [int(n) for n in a.lengths.split(",") if n], mode="same_text", device="cpu")
    n_ckpts = sum(1 for _ in (ROOT / "checkpoints").glob("*/config.json"))
    load0 = os.getloadavg()[0]
    first = {}
    for page, params in PAGES.items():  # the first draw in this process: imports, first read of every folder
        t = time.perf_counter()
        draw(page, params)
        first[page] = time.perf_counter() - t
    print(
        f"Page draw times (s): {n_ckpts} bundled checkpoints + a group of {a.extra_group}; {a.renders} draws per "
        f"page and mode; CPU {cpu_model()}, {len(os.sched_getaffinity(0))} cores, load average {load0:.1f} at start"
    )
    modes = [m for m in a.modes.split(",") if m]
    rows = {m: measure(m, a.renders, ckpts, settings) for m in modes}
    head = f"{'page':34s} {'first':>6s}" + "".join(f" {m + ' fresh':>14s} {m + ' rerun':>14s}" for m in modes)
    print(head)
    for page in PAGES:
        cells = "".join(f" {rows[m][page]['fresh']:14.2f} {rows[m][page]['rerun']:14.2f}" for m in modes)
        print(f"{page:34s} {first[page]:6.2f}{cells}")
    for m in modes:
        if m != "idle" and not rows[m]["_ran"]["job running to the end"]:
            print(f"note: the {m} job ended before the draws did; its rows are partly idle")
    print(f"load average at the end {os.getloadavg()[0]:.1f}")
    if tmp is not None:
        tmp.cleanup()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
