"""Tests for fireviz.fit: FIRE fitted to T5/ALiBi/Kerple/Sandwich biases (FIRE paper, Thm 3.1).

Sizes are small (max_len 64–128, 4 heads); each fit takes well under a second on one core.
"""

from __future__ import annotations

import json
import math
import subprocess
import sys

import numpy as np
import pytest
import torch

from fireviz.cli.fit import main
from fireviz.encodings import FIRE, alibi_slopes
from fireviz.encodings.specs import t5_bucket_values
from fireviz.fit import fitting as fit
from fireviz.fit.fitting import BEYOND_FACTOR, FitResult, fit_fire, make_target
from fireviz.fit.result import FIRE_OPTIONS_KEY, load_fitted_fire
from fireviz.fit.targets import target_from_checkpoint, target_names
from fireviz.model.gpt import GPT, GPTConfig

HEADS = 4


def brute_force_errors(result: FitResult, q_rows: range) -> tuple[float, float, float]:
    """(relative RMSE, max |err|, RMSE) over all causal pairs of ``q_rows`` from the full bias."""
    top = q_rows.stop
    bias = result.module.bias(len(q_rows), top, q_offset=q_rows.start).detach().double()  # [H, q, top]
    dist = torch.arange(q_rows.start, top)[:, None] - torch.arange(top)[None, :]
    causal = dist >= 0
    tgt = result.target.bias_by_distance(dist.clamp(min=0)).double()
    err = (bias - tgt)[:, causal]
    t = tgt[:, causal]
    rmse = float(err.pow(2).mean().sqrt())
    return rmse / float(t.std(unbiased=False)), float(err.abs().max()), rmse


# ---------------------------------------------------------------------------------------------
# Each target reaches its bound (the bars, at a smaller size than the benchmark's 512)
# ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "name, params, max_len, width, bound",
    [
        ("alibi", {}, 128, 32, 0.01),
        ("alibi", {"slope": 0.25}, 128, 32, 0.01),
        ("kerple_log", {}, 128, 32, 0.01),
        ("kerple_log", {"r1": [0.5, 1.0, 2.0, 4.0], "r2": [0.02, 0.1, 0.5, 2.0]}, 128, 32, 0.01),
        ("kerple_power", {}, 128, 32, 0.01),
        ("kerple_power", {"r1": 1.0, "r2": [0.1, 0.5, 1.0, 2.0]}, 128, 32, 0.01),
        ("sandwich", {}, 64, 32, 0.02),
        ("t5", {"values": "decay"}, 128, 32, 0.05),
        ("t5", {"values": "random", "seed": 3}, 128, 128, 0.01),
    ],
)
def test_fit_reaches_bound(name, params, max_len, width, bound):
    result = fit_fire(make_target(name, HEADS, **params), max_len, mlp_width=width, steps=40)
    assert result.relative_rmse < bound
    # the per-head objective keeps even the flattest head (smallest ALiBi slope) within the bound
    assert max(result.relative_rmse_per_head) < bound
    assert result.max_abs_error < 10 * bound * float(result.target_values.std()) + 1e-4


def test_reported_errors_equal_all_pairs_errors():
    """The per-distance evaluation equals the error over every pair (i, j ≤ i), inside and beyond."""
    n = 24
    result = fit_fire(make_target("sandwich", HEADS, dbar=16), n, mlp_width=6, steps=10)
    assert result.relative_rmse > 1e-3  # a fit with real error, so the comparison means something
    rel, max_abs, rmse = brute_force_errors(result, range(0, n))
    assert result.relative_rmse == pytest.approx(rel, rel=1e-4)
    assert result.rmse == pytest.approx(rmse, rel=1e-4)
    assert result.max_abs_error == pytest.approx(max_abs, rel=1e-4, abs=1e-5)
    # beyond: with 3n <= BEYOND_ROWS every query row n..4n−1 is measured, so it is exact too
    assert result.beyond_rows == (BEYOND_FACTOR - 1) * n
    rel_b, max_b, rmse_b = brute_force_errors(result, range(n, BEYOND_FACTOR * n))
    assert result.relative_rmse_beyond == pytest.approx(rel_b, rel=1e-4)
    assert result.rmse_beyond == pytest.approx(rmse_b, rel=1e-4)
    assert result.max_abs_error_beyond == pytest.approx(max_b, rel=1e-4)
    last = result.module.bias(1, BEYOND_FACTOR * n, q_offset=BEYOND_FACTOR * n - 1)[:, 0].flip(-1).detach()
    torch.testing.assert_close(torch.as_tensor(result.beyond_fitted), last, atol=1e-5, rtol=1e-5)


def test_fire_is_a_function_of_distance_on_the_fitted_range():
    """L = max_len: every fitted row shares ψ(L), so the bias is Toeplitz there (Thm 3.1 construction)."""
    n = 40
    result = fit_fire("kerple_log", n, num_heads=HEADS, steps=5)
    assert float(result.module.threshold().detach()) >= n
    bias = result.module.bias(n, n, q_offset=0)
    for i in range(n):
        row = bias[:, i, : i + 1].flip(-1)  # distances 0..i
        torch.testing.assert_close(row, torch.as_tensor(result.fitted_values[:, : i + 1]), atol=1e-5, rtol=1e-5)


def test_construction_alone_starts_close():
    """Closed-form start (c on a grid, kinks by least squares) before any optimisation step."""
    for name in ("alibi", "kerple_log", "kerple_power"):
        result = fit_fire(make_target(name, HEADS), 128, steps=0)
        assert result.steps_run == 0 and len(result.loss_curve) == 1
        assert result.relative_rmse < 0.01


def test_alibi_fit_reproduces_the_slopes():
    n = 64
    result = fit_fire(make_target("alibi", HEADS), n, steps=0)
    slopes = -np.diff(result.fitted_values, axis=1).mean(axis=1)
    np.testing.assert_allclose(slopes, alibi_slopes(HEADS).numpy(), rtol=1e-3)


def test_refinement_keeps_the_best_iterate():
    result = fit_fire(make_target("sandwich", HEADS), 96, mlp_width=8, steps=30)
    objective = float(np.mean(np.square(result.relative_rmse_per_head)))
    assert objective == pytest.approx(min(result.loss_curve), rel=1e-3)
    assert min(result.loss_curve) <= result.loss_curve[0]


def test_fit_is_deterministic_and_leaves_global_rng_alone():
    target = make_target("t5", HEADS, num_buckets=8, max_distance=32)
    torch.manual_seed(5)
    expected_draw = torch.rand(3)
    torch.manual_seed(5)
    a = fit_fire(target, 48, mlp_width=8, steps=5, seed=0)
    assert torch.equal(torch.rand(3), expected_draw)
    b = fit_fire(target, 48, mlp_width=8, steps=5, seed=1)
    assert a.loss_curve == b.loss_curve
    for (name, p), q in zip(a.module.state_dict().items(), b.module.state_dict().values(), strict=True):
        assert torch.equal(p, q), name


# ---------------------------------------------------------------------------------------------
# Progress and stopping
# ---------------------------------------------------------------------------------------------
def test_progress_reports_every_step():
    calls = []
    result = fit_fire(make_target("kerple_power", HEADS), 48, steps=7, progress=lambda *a: calls.append(a))
    assert [c[0] for c in calls] == list(range(8))
    assert all(c[1] == 7 for c in calls)
    assert [c[2] for c in calls] == result.loss_curve
    assert result.steps_run == 7 and not result.stopped


@pytest.mark.parametrize("stop_after", [0, 3])
def test_stop_request_gives_valid_partial_result(stop_after):
    polls = []

    def should_stop() -> bool:  # polled once per candidate of the closed-form start, then before each step
        polls.append(1)
        return len(polls) > len(fit._CL_GRID) + stop_after

    steps = 50
    result = fit_fire(make_target("sandwich", HEADS), 64, mlp_width=8, steps=steps, should_stop=should_stop)
    assert result.stopped and result.steps_run == stop_after < steps
    assert len(result.loss_curve) == stop_after + 1
    assert math.isfinite(result.relative_rmse) and math.isfinite(result.relative_rmse_beyond)
    assert torch.isfinite(result.module.bias(64, 64)).all()
    assert result.relative_rmse < 0.1  # the closed-form start is already a usable fit
    json.dumps(result.to_dict())


# ---------------------------------------------------------------------------------------------
# Targets and bad parameters
# ---------------------------------------------------------------------------------------------
def test_targets_match_their_encodings():
    d = torch.arange(300)
    t = make_target("kerple_log", 2, r1=[1.0, 2.0], r2=[0.5, 0.25])
    torch.testing.assert_close(t.bias_by_distance(d)[1], -2.0 * torch.log1p(0.25 * d.float()))
    t = make_target("kerple_power", 2, r1=1.5, r2=0.5)
    torch.testing.assert_close(t.bias_by_distance(d)[0], -1.5 * d.float().sqrt())
    t = make_target("alibi", 8)
    torch.testing.assert_close(t.bias_by_distance(d)[0], -d.float() / 2)  # m_1 = 2^-1 for 8 heads
    t = make_target("t5", 2, num_buckets=32, max_distance=128, values="decay")
    g = t.bias_by_distance(d)
    assert g[:, 0].tolist() == [0.0, 0.0]
    assert (g[:, 200] == g[:, 299]).all()  # past max_distance: the last bucket
    assert torch.all(g[:, 1:] <= g[:, :-1])  # decaying profile
    t = make_target("sandwich", 4, dbar=128)
    assert t.bias_by_distance(torch.tensor([0]))[:, 0].tolist() == [0.0, 0.0, 0.0, 0.0]


def test_kerple_targets_draw_the_reference_init_ranges():
    # the KERPLE reference code: log r1 ~ U(0, 2), r2 ~ U(0, 1); power r1 (scale) ~ U(0, 1), r2 (exponent) ~ U(0, 2)
    draws = {
        name: [make_target(name, 64, seed=seed).params for seed in range(3)] for name in ("kerple_log", "kerple_power")
    }
    for name, (r1_max, r2_max) in {"kerple_log": (2.0, 1.0), "kerple_power": (1.0, 2.0)}.items():
        r1 = torch.tensor([v for p in draws[name] for v in p["r1"]])
        r2 = torch.tensor([v for p in draws[name] for v in p["r2"]])
        assert r1.min() >= 0.01 and r1.max() <= r1_max and r1.max() > 0.9 * r1_max  # 192 draws fill the range
        assert r2.min() >= 0.01 and r2.max() <= r2_max and r2.max() > 0.9 * r2_max


def test_t5_values():
    v = t5_bucket_values("random", 16, 3, seed=1)
    assert v.shape == (16, 3) and torch.equal(v, t5_bucket_values("random", 16, 3, seed=1))
    assert not torch.equal(v, t5_bucket_values("random", 16, 3, seed=2))
    given = list(range(16))
    assert torch.equal(t5_bucket_values(given, 16, 3)[:, 2], torch.arange(16.0))
    with pytest.raises(ValueError, match="shape"):
        t5_bucket_values([1.0, 2.0], 16, 3)
    with pytest.raises(ValueError, match="unknown T5 value profile"):
        t5_bucket_values("rising", 16, 3)


@pytest.mark.parametrize(
    "name, params, match",
    [
        ("kerple_log", {"r2": 0.0}, "r2 > 0"),
        ("kerple_power", {"r2": -1.0}, "r2 > 0"),
        ("kerple_log", {"r1": [1.0, -1.0, 1.0, 1.0]}, "r1 > 0"),
        ("kerple_power", {"r2": 2.5}, "r2 <= 2"),
        ("kerple_log", {"r2": 0.001}, ">= 0.01"),
        ("kerple_log", {"r2": [0.5, 0.5]}, "1 or num_heads=4"),
        ("alibi", {"slope": 0.0}, "slope must be a finite number > 0"),
        ("sandwich", {"dbar": 15}, "dbar"),
        ("t5", {"max_distance": 8, "num_buckets": 32}, "max_distance"),
        ("alibi", {"r1": 1.0}, "does not take"),
        ("rope", {}, "unknown fit target"),
        ("checkpoint", {}, "needs path"),
    ],
)
def test_bad_target_parameters(name, params, match):
    with pytest.raises(ValueError, match=match):
        make_target(name, HEADS, **params)


@pytest.mark.parametrize(
    "kwargs, match",
    [
        ({"max_len": 1}, "max_len must be an integer >= 2"),
        ({"max_len": 0}, "max_len must be an integer >= 2"),
        ({"max_len": 16, "mlp_width": 1}, "mlp_width"),
        ({"max_len": 16, "steps": -1}, "steps"),
        ({"max_len": 16, "num_heads": 3}, "num_heads=3"),
    ],
)
def test_bad_fit_arguments(kwargs, match):
    with pytest.raises(ValueError, match=match):
        fit_fire(make_target("alibi", HEADS), **kwargs)


def test_unknown_target_name_in_fit():
    with pytest.raises(ValueError, match="unknown fit target 'fire'"):
        fit_fire("fire", 16, num_heads=2)
    assert set(target_names()) == {"t5", "alibi", "kerple_log", "kerple_power", "sandwich", "checkpoint"}


# ---------------------------------------------------------------------------------------------
# Checkpoint target
# ---------------------------------------------------------------------------------------------
def _checkpoint(tmp_path, encoding: str):
    torch.manual_seed(0)
    model = GPT(GPTConfig(n_layer=2, n_head=2, d_model=32, seq_len=16, position_encoding=encoding))
    if encoding == "kerple_log":
        with torch.no_grad():
            model.encoding(1).r1.copy_(torch.tensor([0.7, 1.9]))
            model.encoding(1).r2.copy_(torch.tensor([0.3, 0.05]))
    folder = tmp_path / encoding
    model.save_pretrained(folder)
    return folder, model


def test_checkpoint_target_is_the_layer_bias(tmp_path):
    folder, model = _checkpoint(tmp_path, "kerple_log")
    target = make_target("checkpoint", path=str(folder), layer=1)
    assert target.num_heads == 2 and target.params["encoding"] == "kerple_log"
    d = torch.arange(50)
    with torch.no_grad():
        expected = model.encoding(1).bias_by_distance(d)
    torch.testing.assert_close(target.bias_by_distance(d), expected)
    assert not torch.equal(target.bias_by_distance(d), make_target("checkpoint", path=str(folder)).bias_by_distance(d))
    result = fit_fire(target, 64, steps=10)
    assert result.relative_rmse < 0.01


def test_checkpoint_target_errors(tmp_path):
    folder, _ = _checkpoint(tmp_path, "fire")
    with pytest.raises(ValueError, match="uses position encoding 'fire'"):
        target_from_checkpoint(str(folder))
    folder, _ = _checkpoint(tmp_path, "alibi")
    with pytest.raises(ValueError, match="layer 5 is out of range"):
        target_from_checkpoint(str(folder), layer=5)
    with pytest.raises(ValueError, match="has 2 heads, not 4"):
        make_target("checkpoint", 4, path=str(folder))


# ---------------------------------------------------------------------------------------------
# Saving, loading, JSON
# ---------------------------------------------------------------------------------------------
def test_save_and_load_fitted_fire(tmp_path):
    result = fit_fire(make_target("kerple_log", HEADS), 32, steps=3)
    path = result.save(tmp_path / "fit.safetensors")
    loaded = load_fitted_fire(path)
    assert isinstance(loaded, FIRE) and loaded.init_L == 32.0 and loaded.mlp_width == 32
    torch.testing.assert_close(loaded.bias(100, 100), result.module.bias(100, 100), atol=0, rtol=0)


def test_load_rejects_other_files(tmp_path):
    from safetensors.torch import save_file

    with pytest.raises(FileNotFoundError, match="does not exist"):
        load_fitted_fire(tmp_path / "missing.safetensors")
    other = tmp_path / "other.safetensors"
    save_file({"x": torch.zeros(2)}, str(other))
    with pytest.raises(ValueError, match="fire_options"):
        load_fitted_fire(other)
    (tmp_path / "junk.safetensors").write_bytes(b"not a safetensors file")
    with pytest.raises(ValueError, match="not a readable safetensors"):
        load_fitted_fire(tmp_path / "junk.safetensors")
    wrong = tmp_path / "wrong.safetensors"
    state = FIRE(2, mlp_width=4).state_dict()
    save_file(state, str(wrong), metadata={FIRE_OPTIONS_KEY: json.dumps({"num_heads": 2, "mlp_width": 8})})
    with pytest.raises(ValueError, match="do not match"):
        load_fitted_fire(wrong)


def test_to_dict_is_json_with_curves():
    n = 32
    result = fit_fire(make_target("sandwich", HEADS, dbar=16), n, mlp_width=4, steps=2)
    data = json.loads(json.dumps(result.to_dict()))
    assert data["max_abs_error"] > 1e-3  # residuals are not all zero, so their sign is tested
    for key in (
        "relative_rmse",
        "max_abs_error",
        "relative_rmse_beyond",
        "seconds",
        "loss_curve",
        "relative_rmse_per_head",
        "max_abs_error_beyond",
        "fire",
        "target_params",
    ):
        assert key in data
    inside, beyond = data["inside"], data["beyond"]
    assert inside["distance"] == list(range(n)) and inside["weight"][0] == n
    assert np.asarray(inside["residual"]).shape == (HEADS, n)
    np.testing.assert_allclose(
        np.asarray(inside["target"]) - np.asarray(inside["fitted"]), np.asarray(inside["residual"]), atol=1e-6
    )
    assert beyond["query_position"] == BEYOND_FACTOR * n - 1
    assert np.asarray(beyond["fitted"]).shape == (HEADS, BEYOND_FACTOR * n)
    # the last row's bias at d = 0 is f(0), the same as inside: FIRE only stretches the rest
    np.testing.assert_allclose(np.asarray(beyond["fitted"])[:, 0], np.asarray(inside["fitted"])[:, 0], atol=1e-5)
    assert "inside" not in result.to_dict(curves=False)


# ---------------------------------------------------------------------------------------------
# CLI
# ---------------------------------------------------------------------------------------------
def test_cli_writes_json(tmp_path, capsys):
    out, module = tmp_path / "fit.json", tmp_path / "fit.safetensors"
    rc = main(
        [
            "--target",
            "kerple_log",
            "--max-len",
            "64",
            "--heads",
            "2",
            "--width",
            "16",
            "--steps",
            "5",
            "--r1",
            "1,2",
            "--r2",
            "0.5",
            "--out",
            str(out),
            "--save-module",
            str(module),
            "--quiet",
        ]
    )
    assert rc == 0
    data = json.loads(out.read_text())
    assert {"relative_rmse", "max_abs_error", "relative_rmse_beyond", "seconds"} <= set(data)
    assert data["relative_rmse"] < 0.01 and data["num_heads"] == 2 and data["target_params"]["r1"] == [1.0, 2.0]
    assert "relative RMSE" in capsys.readouterr().out
    assert load_fitted_fire(module).num_heads == 2


@pytest.mark.parametrize(
    "argv, match",
    [
        (["--target", "kerple_log", "--max-len", "64", "--r2", "0"], "r2 > 0"),
        (["--target", "kerple_power", "--max-len", "64", "--r2", "-0.5"], "r2 > 0"),
        (["--target", "alibi", "--max-len", "1"], "max_len must be an integer >= 2"),
        (["--target", "bogus", "--max-len", "64"], "unknown --target 'bogus'"),
        (["--target", "checkpoints/no_such_run", "--max-len", "64"], "is no checkpoint folder (no such directory)"),
        (["--target", "fire", "--max-len", "64"], "fitting FIRE needs a Toeplitz bias"),  # the bundled fire, by name
        (["--target", "alibi", "--max-len", "64", "--r1", "1"], "--r1 applies to kerple_log/kerple_power"),
        (["--target", "checkpoint", "--max-len", "64"], "needs --checkpoint PATH"),
        (["--target", "checkpoint", "--max-len", "64", "--checkpoint", "/nonexistent/ckpt"], "not found"),
        (["--target", "kerple_log", "--max-len", "64", "--r1", "a,b"], "comma-separated numbers"),
        (["--target", "alibi", "--max-len", "64", "--save-module", "."], "such as fire_fit.safetensors"),
    ],
)
def test_cli_bad_parameters(argv, match, capsys):
    assert main(argv + ["--quiet"]) == 2
    err = capsys.readouterr().err
    assert match in err and "Traceback" not in err
    assert err.startswith("fireviz fit: error:") and err.count("\n") == 1


def test_cli_usage_error(capsys):
    assert main(["--max-len", "64"]) == 2  # --target missing: argparse's own message
    assert "--target" in capsys.readouterr().err


@pytest.mark.slow
def test_python_dash_m_fireviz_fit(tmp_path):
    out = tmp_path / "fit.json"
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "fireviz",
            "fit",
            "--target",
            "alibi",
            "--max-len",
            "32",
            "--heads",
            "2",
            "--steps",
            "3",
            "--out",
            str(out),
            "--quiet",
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    assert json.loads(out.read_text())["relative_rmse"] < 0.01
    bad = subprocess.run(
        [sys.executable, "-m", "fireviz", "fit", "--target", "kerple_log", "--max-len", "32", "--r2", "0"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert bad.returncode == 2 and "r2 > 0" in bad.stderr and "Traceback" not in bad.stderr


def test_cli_output_paths(tmp_path, capsys):
    from fireviz.cli.fit import main as fit_main

    args = ["--target", "alibi", "--max-len", "16", "--heads", "2", "--steps", "1", "--quiet"]
    assert fit_main(args + ["--out", str(tmp_path)]) == 2  # a folder is refused before fitting
    assert "is a folder" in capsys.readouterr().err
    out, module = tmp_path / "new" / "fit.json", tmp_path / "new2" / "fit.safetensors"
    assert fit_main(args + ["--out", str(out), "--save-module", str(module)]) == 0  # parents created
    assert json.loads(out.read_text())["target"] == "alibi" and module.stat().st_size > 0


def test_fit_adam_equals_torch_optim_adam():
    """fit.py's written-out Adam (kept to avoid torch.optim's import cost) takes the same steps
    as torch.optim.Adam with the same settings, float64, on a non-quadratic objective."""
    from fireviz.fit.fitting import _Adam

    torch.manual_seed(0)
    start = [torch.randn(3, dtype=torch.float64), torch.randn(2, 4, dtype=torch.float64)]
    runs = []
    for make in (lambda ps: _Adam(ps, lr=0.05), lambda ps: torch.optim.Adam(ps, lr=0.05, betas=(0.9, 0.999), eps=1e-8)):
        ps = [torch.nn.Parameter(t.clone()) for t in start]
        opt = make(ps)
        for _ in range(25):
            opt.zero_grad()
            loss = (ps[0].sin() ** 2).sum() + (ps[1] @ ps[1].T).exp().sum() * 1e-2 + ps[0].sum() * ps[1].mean()
            loss.backward()
            opt.step()
        runs.append([p.detach() for p in ps])
    for a, b in zip(*runs, strict=True):
        assert torch.allclose(a, b, rtol=1e-12, atol=1e-12)


def test_overlapping_fits_restore_the_thread_count_once_both_end():
    """Two fits in app worker threads overlap as A-enter, B-enter, A-exit, B-exit; the count
    torch had before A is back only after B ends (not left at 1 by B's save/restore)."""
    from fireviz.fit.fitting import one_torch_thread

    before = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        a, b = one_torch_thread(), one_torch_thread()
        a.__enter__()
        b.__enter__()
        assert torch.get_num_threads() == 1
        a.__exit__(None, None, None)
        assert torch.get_num_threads() == 1  # B is still fitting
        b.__exit__(None, None, None)
        assert torch.get_num_threads() == 2
    finally:
        torch.set_num_threads(before)


# ---------------------------------------------------------------------------------------------
# FitSettings: the fit's one validated unit (job key, caption, CLI)
# ---------------------------------------------------------------------------------------------
def test_fit_settings_validate_once_and_describe_the_fit():
    s = fit.FitSettings.make("alibi", 24, num_heads=2, mlp_width=6, steps=5, seed=3)
    assert (s.max_len, s.mlp_width, s.steps, s.seed, s.num_heads, s.lr) == (24, 6, 5, 3, 2, fit.DEFAULT_LR)
    d = s.describe()
    assert json.loads(json.dumps(d, allow_nan=False)) == d
    assert d["target"] == "alibi" and d["target_params"]["slopes"] == alibi_slopes(2).tolist() and d["max_len"] == 24
    assert d == fit.FitSettings.make("alibi", 24, 2, 6, 5, 3).describe()  # same fit, same key
    assert d != fit.FitSettings.make("alibi", 24, 2, 6, 6, 3).describe()
    assert "0 ≤ j ≤ i < 24 tokens" in s.caption() and "width 6" in s.caption() and "2 heads" in s.caption()
    with pytest.raises(AttributeError):
        s.max_len = 5  # frozen
    # the settings are the call: run_fit(settings) is fit_fire with the same arguments
    a, b = fit.run_fit(s), fit_fire(make_target("alibi", 2), 24, mlp_width=6, steps=5, seed=3)
    assert a.loss_curve == b.loss_curve and a.relative_rmse == b.relative_rmse and a.c == b.c
    t5 = fit.FitSettings.make("t5", 32, num_heads=2, target_params={"num_buckets": 8, "max_distance": 16})
    assert t5.target.params["num_buckets"] == 8


@pytest.mark.parametrize(
    "kwargs, match",
    [
        ({"max_len": 1.5}, "max_len must be an integer >= 2"),
        ({"max_len": 16, "mlp_width": 2.5}, "mlp_width must be an integer >= 2"),
        ({"max_len": 16, "steps": True}, "steps must be an integer >= 0"),
        ({"max_len": 16, "seed": 0.5}, "seed must be an integer"),
        ({"max_len": 16, "lr": 0.0}, "lr must be a finite number > 0"),
        ({"max_len": 16, "lr": math.nan}, "lr must be a finite number > 0"),
        ({"max_len": 16, "target_params": {"slope": 0.5}}, "target_params apply to a target name"),
    ],
)
def test_fit_settings_refuse_bad_values(kwargs, match):
    with pytest.raises(ValueError, match=match):
        fit.FitSettings.make(make_target("alibi", HEADS), **kwargs)


# ---------------------------------------------------------------------------------------------
# Bad input: one clear ValueError naming the argument, never a changed value or a raw error
# ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "args, kwargs, match",
    [
        (("alibi", 64, "4"), {}, r"num_heads must be an integer in 1..1024 \(got '4'\)"),
        (("alibi", 64, 2.7), {}, r"num_heads must be an integer in 1..1024 \(got 2.7\)"),
        (("alibi", 64, True), {}, r"num_heads must be an integer .*\(got True\)"),
        (("alibi", 64, "x"), {}, r"num_heads must be an integer .*\(got 'x'\)"),
        (("alibi", 64, math.nan), {}, r"num_heads must be an integer .*\(got nan\)"),
        ((None, 64, 4), {}, "target must be a target name"),
        ((3, 64, 4), {}, "target must be a target name"),
        (("alibi", 64, 4), {"target_params": [1]}, "target_params must be a dict"),
        (("alibi", 64, 4), {"seed": 2**64}, r"seed must be an integer in 0..18446744073709551615"),
        (("alibi", 64, 4), {"seed": -1}, "seed must be an integer in 0.."),
        (("alibi", 64, 4), {"lr": "0.1"}, "lr must be a finite number > 0"),
        (("alibi", 64, 4), {"target_params": {"slope": True}}, r"slope must be a finite number .*\(got True\)"),
        (("alibi", 64, 4), {"target_params": {"slope": "x"}}, r"slope must be a finite number .*\(got 'x'\)"),
        (("alibi", 64, 4), {"target_params": {"slope": 1e300}}, r"slope must be a finite number <= 10000"),
        (("alibi", 64, 4), {"target_params": {"slope": -1.0}}, "slope must be a finite number > 0"),
        (("kerple_log", 64, 4), {"target_params": {"r1": "a"}}, r"r1 must be a finite number .*\(got 'a'\)"),
        (("kerple_log", 64, 4), {"target_params": {"r1": [1.0, math.nan]}}, r"r1 .*\(got nan\)"),
        (("kerple_log", 64, 4), {"target_params": {"seed": 2**70}}, "seed must be an integer in 0.."),
        (("kerple_power", 64, 4), {"target_params": {"seed": "a"}}, "seed must be an integer"),
        (("t5", 64, 4), {"target_params": {"num_buckets": 2.5}}, r"num_buckets must be an integer .*\(got 2.5\)"),
        (("t5", 64, 4), {"target_params": {"num_buckets": True}}, "num_buckets must be an integer"),
        (("t5", 64, 4), {"target_params": {"values": [math.nan] * 32}}, r"T5 value must be a finite number"),
        (("t5", 64, 4), {"target_params": {"values": ["a"] * 32}}, r"T5 value must be a finite number"),
        (("sandwich", 64, 4), {"target_params": {"dbar": math.nan}}, r"dbar must be an integer .*\(got nan\)"),
        (("sandwich", 64, 4), {"target_params": {"dbar": 128.0}}, "dbar must be an integer"),
        (("checkpoint", 64), {"target_params": {"path": None}}, "path must be a checkpoint folder"),
        (("checkpoint", 64), {"target_params": {"path": "x", "stack": "middle"}}, "stack must be 'decoder'"),
    ],
)
def test_fit_settings_name_the_bad_argument(args, kwargs, match):
    with pytest.raises(ValueError, match=match):
        fit.FitSettings.make(*args, **kwargs)


def test_checkpoint_layer_must_be_an_integer_and_cheap_checks_come_first(tmp_path, monkeypatch):
    from fireviz.fit import targets as fit_targets

    folder, _ = _checkpoint(tmp_path, "alibi")
    for layer in (1.7, True, "1"):
        with pytest.raises(ValueError, match=r"layer must be an integer >= 0"):
            fit.FitSettings.make("checkpoint", 16, target_params={"path": str(folder), "layer": layer})
        with pytest.raises(ValueError, match=r"layer must be an integer >= 0"):
            target_from_checkpoint(str(folder), layer)

    def no_loading(*a, **k):
        raise AssertionError("the checkpoint was read before the cheap checks")

    monkeypatch.setattr(fit_targets, "target_from_checkpoint", no_loading)
    for kwargs, match in (
        ({"max_len": 1}, "max_len"),
        ({"max_len": 16, "mlp_width": 1}, "mlp_width"),
        ({"max_len": 16, "steps": -1}, "steps"),
        ({"max_len": 16, "seed": 2**64}, "seed"),
        ({"max_len": 16, "num_heads": "2"}, "num_heads"),
        ({"max_len": 16, "target_params": {"path": str(folder), "layer": 0.5}}, "layer"),
    ):
        kwargs.setdefault("target_params", {"path": str(folder)})
        with pytest.raises(ValueError, match=match):
            fit.FitSettings.make("checkpoint", **kwargs)
    assert main(["--target", "checkpoint", "--checkpoint", str(tmp_path / "missing"), "--max-len", "1"]) == 2


def test_direct_construction_is_validated_and_a_non_finite_target_is_refused():
    target = make_target("alibi", HEADS)
    with pytest.raises(ValueError, match="max_len must be an integer >= 2"):
        fit.FitSettings(target, -5, 1, -1, 0, -1.0)
    with pytest.raises(ValueError, match="mlp_width"):
        fit.FitSettings(target, 16, 1, 0, 0)
    with pytest.raises(ValueError, match="target must be a FitTarget"):
        fit.FitSettings("alibi", 16, 4, 0, 0)
    s = fit.FitSettings(target, np.int64(16), 4, 0, 0)
    assert s == fit.FitSettings.make(target, 16, mlp_width=4, steps=0) and type(s.max_len) is int
    broken = make_target("alibi", 2)
    broken.encoding.slopes[1] = math.inf  # -inf·d, NaN at d = 0
    with pytest.raises(ValueError, match="non-finite bias at distance 0"):
        fit.FitSettings.make(broken, 16)


def test_result_records_every_setting_and_the_checkpoint_identity(tmp_path):
    from safetensors import safe_open

    from fireviz.checkpoints.catalog import checkpoint_sha256

    s = fit.FitSettings.make("alibi", 16, 2, mlp_width=4, steps=2, seed=5, lr=0.01)
    result = fit.run_fit(s)
    d = result.to_dict(curves=False)
    assert {k: d[k] for k in s.describe()} == s.describe() and d["lr"] == 0.01 and result.lr == 0.01
    with safe_open(str(result.save(tmp_path / "m.safetensors")), "pt") as f:
        saved = json.loads(f.metadata()["fireviz.fit"])
    assert {k: saved[k] for k in s.describe()} == s.describe()
    folder, _ = _checkpoint(tmp_path, "alibi")
    r = fit.run_fit(fit.FitSettings.make("checkpoint", 16, steps=0, target_params={"path": str(folder)}))
    params = r.to_dict(curves=False)["target_params"]
    assert params["path"] == str(folder) and params["checkpoint_sha256"] == checkpoint_sha256(folder)
    argv = ["--target", "alibi", "--max-len", "16", "--heads", "2", "--steps", "1", "--lr", "0.02", "--quiet"]
    assert main(argv + ["--out", str(tmp_path / "f.json")]) == 0
    assert json.loads((tmp_path / "f.json").read_text())["lr"] == 0.02
