"""Checkpoint groups, and the bundled copy-task group (checkpoints/copy) as shipped.

A group is a sub-folder of the checkpoints root holding checkpoints of its own (the synthetic
copy-task models); it is listed apart and never mixed into the prose models' lists. The
shipped copy-task numbers are re-derived here from exactly the stored weights.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest
from conftest import make_tiny_checkpoint
from streamlit.testing.v1 import AppTest

import fireviz.checkpoints as fireviz_checkpoints
from fireviz import plots
from fireviz.analysis import biases as analysis
from fireviz.checkpoints import catalog as checkpoints
from fireviz.data import synthetic
from fireviz.eval import evaluation as evaluate

ROOT = Path(__file__).resolve().parents[2]
COPY = ROOT / "checkpoints" / "copy"
COPY_NAMES = ["alibi", "fire", "fire_s", "kerple_log", "nope", "rope", "t5"]


def test_groups_are_subfolders_that_hold_checkpoints(tmp_path):
    make_tiny_checkpoint(tmp_path / "alibi", "alibi")
    make_tiny_checkpoint(tmp_path / "copy" / "fire", "fire")
    (tmp_path / "empty").mkdir()
    (tmp_path / "deep" / "x").mkdir(parents=True)  # a folder of folders, none a checkpoint
    make_tiny_checkpoint(tmp_path / "deep" / "x" / "fire", "fire")  # two levels down: not a group
    groups = checkpoints.checkpoint_groups(tmp_path)
    assert groups == {"": tmp_path, "copy": tmp_path / "copy"}
    assert [i.name for i in checkpoints.list_checkpoints(tmp_path)] == ["alibi"]  # the group is not mixed in
    assert checkpoints.scan_checkpoints(tmp_path)[1] == {}  # nor reported as a broken checkpoint
    assert [i.name for i in checkpoints.list_checkpoints(groups["copy"])] == ["fire"]
    assert checkpoints.checkpoint_groups(tmp_path / "missing") == {"": tmp_path / "missing"}


def test_bundled_copy_group_is_listed_apart_from_the_prose_models():
    groups = checkpoints.checkpoint_groups(ROOT / "checkpoints")
    assert groups.get("copy") == COPY
    prose, problems = checkpoints.scan_checkpoints(ROOT / "checkpoints")
    assert "copy" not in {i.name for i in prose} and not problems
    found = checkpoints.list_checkpoints(COPY)
    assert [i.name for i in found] == COPY_NAMES
    assert {i.data for i in found} == {"synthetic:copy"} and {i.seq_len for i in found} == {64}


#: float32's unit roundoff (2^-24)
U32 = 2.0**-24


def float32_tolerance_bpb(bits_per_byte: float, targets: int, vocab_size: int = 257) -> float:
    """How far a float32 evaluation's bits per byte may move between machines (AMD and Intel sum
    in different orders): the targets' losses are summed in float32 (a sum of N terms moves by at
    most N·u of its value), and each target's log-softmax by a few u times the logits' scale,
    bounded here by 4·u·ln(vocab) nats. In bits per byte (1 byte per token, ÷ ln 2)."""
    return targets * U32 * bits_per_byte + 4 * U32 * math.log(vocab_size) / math.log(2)


def test_shipped_copy_results_are_reproduced_from_the_stored_weights(tmp_path):
    shipped = {r["checkpoint"]: r for r in json.loads((COPY / "results.json").read_text())}
    assert set(shipped) == set(COPY_NAMES)
    fresh = evaluate.evaluate_many(
        [COPY / "fire", COPY / "alibi"],
        "synthetic:copy",
        [64, 128],
        device="cpu",
        cache_dir=tmp_path,
        use_published=False,
    )
    assert fresh[0]["settings"]["token_budget"] == shipped["fire"]["settings"]["token_budget"] == 256
    for r in fresh:
        old = {e["length"]: e for e in shipped[r["checkpoint"]]["per_length"]}
        for e in r["per_length"]:
            assert e["accuracy"] == pytest.approx(old[e["length"]]["accuracy"], abs=1e-12)
            tolerance = float32_tolerance_bpb(old[e["length"]]["bits_per_byte"], e["tokens_scored"])
            assert e["bits_per_byte"] == pytest.approx(old[e["length"]]["bits_per_byte"], abs=tolerance)
    acc = {n: {e["length"]: e["accuracy"] for e in shipped[n]["per_length"]} for n in COPY_NAMES}
    # what the README says: every encoding copies at the training length (four of them without an error)
    assert min(acc[n][64] for n in COPY_NAMES) > 0.9
    assert all(acc[n][64] > 0.999 for n in ("alibi", "nope", "rope", "t5"))
    assert acc["fire"][128] == max(acc[n][128] for n in COPY_NAMES)  # FIRE keeps the most at 2×
    assert max(acc[n][k] for n in COPY_NAMES for k in (256, 512, 1024)) < 0.05  # nothing copies at 4×–16×
    assert shipped["fire"]["settings"]["lengths"] == [16, 32, 64, 128, 256, 512, 1024]  # the app's default


def test_task_lengths_are_the_training_format():
    """Length n of a task = the model reads n tokens, as a training window of seq_len + 1 = n + 1
    tokens: at the training length the string and the copy distance are those trained on."""
    r = evaluate.evaluate_many([COPY / "rope"], "synthetic:copy", [64], token_budget=16, device="cpu", use_cache=False)[
        0
    ]["per_length"][0]
    assert r["sequence_tokens"] == 65 and r["first_answer_position"] == synthetic.load_task("synthetic:copy").split(65)
    assert r["accuracy"] == 1.0


def test_copy_fire_learns_anti_local_heads_alibi_cannot():
    reps = [
        analysis.bias_report(fireviz_checkpoints.load_model(COPY / n), checkpoint=n)
        for n in ("fire", "fire_s", "alibi")
    ]
    rows = analysis.locality_table(reps)
    fire_l0 = [r for r in rows if r["checkpoint"] == "fire" and r["layer"] == 0]
    assert [r["locality"] for r in fire_l0] == ["anti-local"] * 4
    assert all(30 <= r["peak_distance"] <= 40 for r in fire_l0)  # next to the copy distance, 32 at length 64
    assert {r["locality"] for r in rows if r["checkpoint"] == "fire_s"} == {"anti-local"}
    assert {r["locality"] for r in rows if r["checkpoint"] == "alibi"} == {"local"}


def test_accuracy_figure_draws_the_results_numbers():
    runs = json.loads((COPY / "results.json").read_text())
    fig = plots.accuracy_figure(runs, chance=synthetic.load_task("synthetic:copy").chance_accuracy)
    assert [t.name for t in fig.data] == [r["checkpoint"] for r in runs]
    for t, r in zip(fig.data, runs, strict=True):
        np.testing.assert_allclose(np.asarray(t.y), [e["accuracy"] for e in r["per_length"]])
        lo = np.asarray([e["accuracy_ci95"][0] for e in r["per_length"]])
        np.testing.assert_allclose(np.asarray(t.y) - np.asarray(t.error_y.arrayminus), lo)
    assert fig.layout.meta["train_seq_len"] == [64]
    with pytest.raises(ValueError, match="synthetic"):
        plots.accuracy_figure([{"checkpoint": "x", "per_length": [{"length": 8, "bits_per_byte": 1.0}]}])


def _page(name: str, **query) -> AppTest:
    at = AppTest.from_file(str(ROOT / name), default_timeout=60)
    for k, v in query.items():
        at.query_params[k] = v
    return at


@pytest.fixture
def bundled_env(tmp_path, monkeypatch):
    monkeypatch.setenv("FIREVIZ_CHECKPOINTS_DIR", str(ROOT / "checkpoints"))
    monkeypatch.setenv("FIREVIZ_CACHE_DIR", str(tmp_path / "eval_cache"))


def test_app_group_picker_shows_the_copy_models_and_their_anti_local_heads(bundled_env):
    at = _page("pages/1_Learned_biases.py", group="copy", ckpt="fire").run()
    assert not at.exception, [e.value for e in at.exception]
    assert at.sidebar.selectbox(key="biases_group").value == "copy"
    ms = at.sidebar.multiselect[0]
    assert ms.value == ["fire"] and {o.split(" (")[0] for o in ms.options} == set(COPY_NAMES)  # options: labels
    assert any("anti-local" in str(df.value.to_dict()) for df in at.dataframe)
    # back to the bundled prose models: the copy models' names go, the default prose choice comes
    at.sidebar.selectbox(key="biases_group").set_value("").run()
    assert not at.exception, [e.value for e in at.exception]
    assert (
        any(o.startswith("kerple_power") for o in at.sidebar.multiselect[0].options) and "group" not in at.query_params
    )


def test_app_length_page_on_the_copy_group_defaults_to_its_task_and_draws_accuracy(bundled_env):
    import time

    at = _page("pages/3_Length_generalization.py", group="copy", ckpt=["fire", "alibi"], len=["64", "128"])
    end = time.time() + 90
    at.run()
    while (
        not any(
            json.loads(el.proto.spec)["layout"]["title"]["text"].startswith("Answer accuracy")
            for el in at.get("plotly_chart")
        )
        and time.time() < end
    ):
        assert not at.exception, [e.value for e in at.exception]
        time.sleep(0.25)
        at.run()
    assert at.sidebar.selectbox(key="lengen_domain").value == "synthetic:copy"
    figs = [json.loads(el.proto.spec) for el in at.get("plotly_chart")]
    acc = next(f for f in figs if f["layout"]["title"]["text"].startswith("Answer accuracy"))
    shipped = {r["checkpoint"]: r for r in json.loads((COPY / "results.json").read_text())}
    for t in acc["data"]:
        want = {e["length"]: e["accuracy"] for e in shipped[t["name"]]["per_length"]}
        ys = (
            t["y"]
            if isinstance(t["y"], list)
            else np.frombuffer(__import__("base64").b64decode(t["y"]["bdata"]), dtype=t["y"]["dtype"])
        )
        np.testing.assert_allclose(ys, [want[64], want[128]])


@pytest.mark.parametrize(
    "args, message",
    [
        (["--group", "no_such_group"], "no checkpoint group 'no_such_group'"),
        (["--lengths", "16,x"], "is not a comma-separated list of whole numbers"),
        (["--sequences", "0"], "--sequences must be at least 1"),
        (["--reference", "no_such_model"], "--reference no_such_model is not in"),
    ],
)
def test_publish_task_group_refuses_bad_arguments_in_one_line(args, message):
    import subprocess
    import sys

    script = ROOT / "scripts" / "publish_task_group.py"
    readme = (ROOT / "README.md").read_bytes()
    r = subprocess.run([sys.executable, str(script), *args], capture_output=True, text=True, timeout=300)
    assert r.returncode != 0 and message in r.stderr and "Traceback" not in r.stderr, r.stderr
    assert (ROOT / "README.md").read_bytes() == readme  # nothing written


def test_a_group_checkpoint_is_found_by_group_and_name():
    """``copy/fire`` names the copy group's FIRE folder (no Hub lookup for an owner/name look-alike)."""
    folder = COPY / "fire"
    assert Path(checkpoints.resolve_checkpoint("copy/fire").path).resolve() == folder
    config, weights = checkpoints.checkpoint_files("copy/fire")
    assert (config.resolve(), weights.resolve()) == (folder / "config.json", folder / "model.safetensors")
    # a name the group lacks is answered locally, naming the group's checkpoints (no Hub lookup)
    for door in (
        checkpoints.resolve_checkpoint,
        checkpoints.checkpoint_files,
        fireviz_checkpoints.load_model_or_published,
    ):
        with pytest.raises(
            checkpoints.CheckpointNotFoundError, match="group 'copy' .* no 'fier'; it holds alibi, fire"
        ):
            door("copy/fier")
    # the group itself is not a checkpoint: the message names its members
    with pytest.raises(
        checkpoints.CheckpointNotFoundError, match="group of checkpoints, not one; name one of them: copy/alibi"
    ):
        checkpoints.checkpoint_files("copy")


def test_the_copy_groups_seed_table_is_its_seed_runs():
    """checkpoints/copy/seeds.json (scripts/task_seeds.py): several seeds per encoding, seed 0 is the
    shipped checkpoint with its published accuracy at the training length, ``learned`` follows the
    stated threshold, and RESULTS.md prints exactly these counts."""
    data = json.loads((COPY / "seeds.json").read_text())
    assert data["task"] == "synthetic:copy" and data["training_length"] == 64 and data["sequences"] == 256
    rows = data["rows"]
    by_enc: dict[str, list[dict]] = {}
    for r in rows:
        by_enc.setdefault(r["encoding"], []).append(r)
    assert set(by_enc) == set(COPY_NAMES)
    shipped = {r["checkpoint"]: r for r in json.loads((COPY / "results.json").read_text())}
    md = (COPY / "RESULTS.md").read_text()
    for enc, rs in by_enc.items():
        seeds = sorted(r["seed"] for r in rs)
        assert len(seeds) >= 2 and len(set(seeds)) == len(seeds) and seeds[0] == 0
        (zero,) = [r for r in rs if r["seed"] == 0]
        at64 = next(e for e in shipped[enc]["per_length"] if e["length"] == 64)
        assert zero["folder"] == f"checkpoints/copy/{enc}" and zero["accuracy"] == pytest.approx(
            at64["accuracy"], abs=1e-12
        )
        for r in rs:
            assert r["learned"] == (r["accuracy"] >= data["learned_accuracy"])
        learned = sum(r["learned"] for r in rs)
        assert f"| {enc} | {len(rs)} | {learned} of {len(rs)} |" in md


def test_task_seeds_scores_runs_at_the_training_length(monkeypatch):
    """scripts/task_seeds.py's scoring: one row per folder, its encoding, seed and folder from the
    checkpoint, ``learned`` from the stated threshold (shipped alibi copies without an error)."""
    monkeypatch.syspath_prepend(str(ROOT / "scripts"))
    import task_seeds

    rows = task_seeds.score([COPY / "alibi", COPY / "rope"], "synthetic:copy", 64, 16)
    assert [(r["encoding"], r["seed"], r["folder"]) for r in rows] == [
        ("alibi", 0, "checkpoints/copy/alibi"),
        ("rope", 0, "checkpoints/copy/rope"),
    ]
    for r in rows:
        assert 0.0 <= r["accuracy"] <= 1.0 and r["learned"] == (r["accuracy"] >= task_seeds.LEARNED_ACCURACY)
        assert r["accuracy_ci95"][0] <= r["accuracy"] <= r["accuracy_ci95"][1]
    assert rows[0]["learned"] and rows[0]["accuracy"] > 0.99
