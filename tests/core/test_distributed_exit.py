"""A torchrun worker ends with its exit status after a successful run, every time.

With torch 2.13, DistributedDataParallel keeps the gloo process group (and its worker threads)
alive after ``destroy_process_group``; a worker thread that lets go of a finished collective
while the interpreter finalizes aborts the process (SIGABRT, "terminate called without an
active exception"), and torchrun reports the run failed. Measured before the fix: 18 of 130
two-process trainings of a tiny FIRE model aborted after writing their checkpoint; after it,
0 of 60. ``exit_process`` ends such a worker without the interpreter's teardown.
"""

from __future__ import annotations

import importlib.metadata
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


def _run(script: str, tmp_path: Path, *argv: str) -> subprocess.CompletedProcess:
    path = tmp_path / "script.py"
    path.write_text(textwrap.dedent(script))
    env = dict(os.environ, PYTHONPATH=str(REPO), OMP_NUM_THREADS="1")
    return subprocess.run([*argv, str(path)], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)


# Leaves collectives in flight on a process group DDP holds on to: without exit_process (a
# plain sys.exit) this aborted in 8 of 11 two-process runs here.
IN_FLIGHT = """
    import torch, torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel
    from fireviz.core.distributed import exit_process, init_distributed

    d = init_distributed("cpu")
    model = DistributedDataParallel(torch.nn.Linear(4, 4))
    for _ in range(300):
        dist.all_reduce(torch.ones(256), async_op=True)
    print("finished", d.rank, end="")  # no newline: still in the buffer when exit_process runs
    exit_process(7)
"""


@pytest.mark.slow
def test_a_torchrun_worker_with_collectives_in_flight_ends_with_its_status(tmp_path):
    torchrun = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2"]
    for _ in range(3):
        proc = _run(IN_FLIGHT, tmp_path, *torchrun, "--tee=1")
        assert "SIGABRT" not in proc.stderr and "terminate called" not in proc.stderr, proc.stderr[-2000:]
        assert "exitcode  : 7" in proc.stderr, proc.stderr[-2000:]  # the worker's own status, not a signal
        assert "finished 0" in proc.stdout and "finished 1" in proc.stdout  # buffered output was flushed


def test_a_process_without_a_group_exits_normally_with_its_status(tmp_path):
    script = """
        import atexit
        from fireviz.core.distributed import exit_process

        atexit.register(lambda: print("teardown ran"))
        print("body", end="")
        exit_process(3)
    """
    proc = _run(script, tmp_path, sys.executable)
    assert proc.returncode == 3
    assert proc.stdout == "bodyteardown ran\n"


def test_a_worker_that_made_a_group_runs_its_exit_handlers_and_keeps_its_output(tmp_path):
    script = """
        import atexit, logging, sys
        import fireviz.core.distributed as distributed

        distributed._CREATED_GROUP = True  # as init_distributed sets it under torchrun
        atexit.register(lambda: print("exit handler ran", end=""))
        logging.basicConfig(stream=sys.stderr, format="%(message)s")
        logging.getLogger("x").warning("logged")
        print("body", end="")
        distributed.exit_process(5)
    """
    proc = _run(script, tmp_path, sys.executable)
    assert proc.returncode == 5
    assert proc.stdout == "bodyexit handler ran" and proc.stderr == "logged\n"


def test_a_worker_started_with_its_output_closed_still_ends_with_its_status(tmp_path):
    script = """
        import sys
        import fireviz.core.distributed as distributed

        assert sys.stdout is None and sys.stderr is None  # started with both closed
        distributed._CREATED_GROUP = True
        distributed.exit_process(4)
    """
    path = tmp_path / "closed.py"
    path.write_text(textwrap.dedent(script))
    env = dict(os.environ, PYTHONPATH=str(REPO))
    proc = subprocess.run(["bash", "-c", f'"{sys.executable}" "{path}" >&- 2>&-'], env=env, timeout=60)
    assert proc.returncode == 4


# Both entry points end in fireviz.cli.run: an object alive at the end is finalized by a normal
# exit, never by a torchrun worker's.
ENTRY = """
    import importlib.metadata, runpy, sys
    import fireviz.core.distributed as distributed

    class Finalized:
        def __del__(self):
            print("finalized", end="")

    keep = Finalized()
    distributed._CREATED_GROUP = {group}
    sys.argv = ["fireviz", "--version"]
    if "{entry}" == "module":
        runpy.run_module("fireviz", run_name="__main__")
    else:
        (script,) = importlib.metadata.entry_points(group="console_scripts", name="fireviz")
        sys.exit(script.load()())  # what pip's generated `fireviz` script does
"""


@pytest.mark.parametrize("entry", ["module", "script"])
def test_both_entry_points_end_a_worker_without_teardown(tmp_path, entry):
    version = f"fireviz {importlib.metadata.version('fireviz')}\n"
    for group, tail in ((False, "finalized"), (True, "")):
        proc = _run(ENTRY.format(group=group, entry=entry), tmp_path, sys.executable)
        assert proc.returncode == 0, proc.stderr[-2000:]
        assert proc.stdout == version + tail
