"""Bad input (issue 21) to a fit (fireviz.fit, the fit command line): absurd head counts are
refused, and the fit reports progress from its start and stops when asked."""

from __future__ import annotations

import math

from fireviz.fit import targets as fit_targets


# -- progress for every long call -------------------------------------------------------------------
def test_fit_refuses_absurd_head_counts_and_reports_its_start(capsys):
    from fireviz.cli import fit as fit_cli
    from fireviz.fit import fitting as fit

    rc = fit_cli.main(["--target", "alibi", "--max-len", "64", "--heads", "100000"])
    err = capsys.readouterr().err
    assert rc == 2 and "100000" in err and f"{fit_targets.MAX_FIT_HEADS}" in err
    seen, stops = [], iter([False, False, True])
    r = fit.fit_fire(
        "alibi",
        64,
        num_heads=2,
        steps=5,
        start_progress=lambda d, t: seen.append((d, t)),
        should_stop=lambda: next(stops, True),
    )
    assert seen[:3] == [(1, 9), (2, 9), (3, 9)] and r.stopped and r.steps_run == 0  # Stop works in the start
    assert math.isfinite(r.relative_rmse)
