"""How long the app's Home page takes to draw while an evaluation runs: job in a thread vs in a worker process (issue #40).

    .venv/bin/python benchmarks/app_responsiveness.py [--renders 5] [--checkpoints checkpoints/fire,checkpoints/alibi]

The Streamlit server draws every page of every tab in one Python process. This script is that
process: it starts one evaluation (the bundled FIRE and ALiBi checkpoints at 2048, 4096 and 8192 tokens, the
eval cache off so it really computes; long enough to outlast the draws even with all cores) on a job queue, then draws Home (``app.py`` through ``streamlit.testing``'s
AppTest, as a browser request would) ``--renders`` times while the job runs, and reports the median
draw time and the job's own progress rate. Three rows, measured one after another in one run:
idle (no job), the job computed in the queue's thread (fireviz before issue #40), and the job
computed in the queue's worker process (``fireviz.core.worker.WorkerProcess``, today's app).
Quote the ratios to idle, with the CPU model printed in the header.
"""

from __future__ import annotations

import argparse
import functools
import os
import statistics
import sys
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


def draw_home() -> float:
    """Seconds to draw Home once (a fresh session, as a new tab)."""
    t = time.perf_counter()
    at = AppTest.from_file(str(ROOT / "app.py"), default_timeout=900).run()
    if at.exception:
        raise RuntimeError(f"Home raised: {at.exception[0].value}")
    return time.perf_counter() - t


def measure(mode: str, renders: int, checkpoints: list[Checkpoint], settings: EvalSettings) -> dict:
    """Median Home draw time with no job (``idle``) or with the evaluation running in ``mode``."""
    job = q = None
    if mode != "idle":
        q = jobs.JobQueue(name=f"bench-{mode}", process=mode == "process")
        work = functools.partial(jobs._evaluation_work, checkpoints, settings, EvalCache(enabled=False), 0, "")
        job = q.submit({"bench": mode, "t": time.time()}, work)
        while job.done == 0 and job.status not in jobs.FINISHED:  # computing (the worker has started)
            time.sleep(0.1)
    start_done, t0 = (job.done if job else 0), time.perf_counter()
    times = [draw_home() for _ in range(renders)]
    rate = ((job.done - start_done) / (time.perf_counter() - t0)) if job else None
    still_running = job is not None and job.status == jobs.RUNNING
    if job is not None:
        q.cancel(job.key)
        q.wait(job.key, 300)
        if q.in_process:
            q._worker.close()
    return {"mode": mode, "median_s": statistics.median(times), "max_s": max(times), "rate": rate, "ran": still_running}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--renders", type=int, default=5, help="Home draws per row (default %(default)s)")
    p.add_argument(
        "--checkpoints", default="checkpoints/fire,checkpoints/alibi", help="comma-separated (default %(default)s)"
    )
    p.add_argument("--lengths", default="2048,4096,8192", help="evaluation lengths in tokens (default %(default)s)")
    a = p.parse_args(argv)
    os.environ.setdefault("FIREVIZ_JOB_WORKER", "process")
    ckpts = [Checkpoint.resolve(c) for c in a.checkpoints.split(",") if c]
    lengths = [int(n) for n in a.lengths.split(",") if n]
    settings = EvalSettings.make("prose", lengths, mode="same_text", device="cpu")
    draw_home()  # warm-up: imports and st.cache entries a running server already has
    print(
        f"Home draw time while an evaluation of {', '.join(c.name for c in ckpts)} at {a.lengths} tokens runs; {a.renders} draws per row; "
        f"CPU {cpu_model()}, {len(os.sched_getaffinity(0))} cores, load average {os.getloadavg()[0]:.1f} at start"
    )
    rows = [measure(m, a.renders, ckpts, settings) for m in ("idle", "thread", "process")]
    idle = rows[0]["median_s"]
    print(f"{'job computed in':16s} {'median s':>9s} {'max s':>7s} {'× idle':>7s} {'job windows/s':>14s}")
    for r in rows:
        rate = "—" if r["rate"] is None else f"{r['rate']:.1f}" + ("" if r["ran"] else " (job ended)")
        print(f"{r['mode']:16s} {r['median_s']:9.2f} {r['max_s']:7.2f} {r['median_s'] / idle:7.2f} {rate:>14s}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
