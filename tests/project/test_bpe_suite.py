"""scripts/bpe_suite.py (issue #52): the whole BPE comparison at toy sizes on the CPU (``--dry-run``),
interrupted after its first model's second step and continued by a second call; then what it
wrote: seven checkpoints that load, results of three domains in both modes to 8× the training
length, cards, a pack within a device call's limits, and an unpack that lays it out as a
checkpoint group and refuses what it must."""

from __future__ import annotations

import gzip
import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from fireviz.checkpoints import Checkpoint, checkpoint_groups
from fireviz.checkpoints.catalog import group_members
from fireviz.core.files import read_safetensors

ROOT = Path(__file__).resolve().parents[2]
ENCODINGS = ["fire", "fire_s", "alibi", "rope", "t5", "kerple_power", "nope"]
slow = pytest.mark.slow  # the suite's dry run: ~90 s on 2 busy cores (a tokenizer, shards, 7 × 8 steps, 6 evaluations)


def _module():
    spec = importlib.util.spec_from_file_location("bpe_suite", ROOT / "scripts" / "bpe_suite.py")
    mod = importlib.util.module_from_spec(spec)
    sys.modules["bpe_suite"] = mod  # its dataclasses look their module up there
    spec.loader.exec_module(mod)
    return mod


def test_the_gpu_recipe_fits_40_mb_and_its_settings_validate():
    """The full sizes, which only a GPU runs: seven models of one shape under 40 MB of float16
    weights, valid training settings for every encoding, and evaluation settings that reach 8×
    the training length in both modes (validated as the evaluation validates them)."""
    from fireviz.eval import EvalSettings

    suite = _module()
    full = suite.FULL
    assert list(suite.ENCODINGS) == ENCODINGS and full.seq_len == 1024
    sizes = [suite.weight_bytes(full, enc) for enc in ENCODINGS]
    assert sum(sizes) <= 40_000_000 and max(sizes) - min(sizes) < 10_000  # one shape; only the encodings differ
    for enc in ENCODINGS:
        mc, tc = suite.recipe(full, Path("shards"), enc, 1000, 0)
        assert (mc.position_encoding, mc.vocab_size, tc.max_steps, tc.seed) == (enc, full.vocab_size, 1000, 0)
    same, kw = suite.eval_settings(full, "same_text")
    s = EvalSettings.make("prose", same, device="cpu", **kw)
    assert max(s.lengths) == 8 * full.seq_len == s.prefix_tokens and s.token_budget is None
    ctx, kw = suite.eval_settings(full, "context")
    s = EvalSettings.make("prose", ctx, device="cpu", **kw)
    assert s.prefix_tokens == 8 * full.seq_len and s.lengths[-1] == s.prefix_tokens - s.context_targets


def _suite(*args: str, timeout: int = 600) -> subprocess.CompletedProcess:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT)}
    return subprocess.run(
        [sys.executable, "scripts/bpe_suite.py", *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=timeout,
        env=env,
    )


def _log_lines(folder: Path) -> list[str]:
    return (folder / "train_log.jsonl").read_text().splitlines()


@pytest.fixture(scope="module")
def suite(tmp_path_factory):  # used by the slow tests only
    out = tmp_path_factory.mktemp("bpe") / "suite"
    first = _suite("run", "--out", str(out), "--dry-run", "--stop-at-step", "2")
    assert first.returncode == 3, first.stdout[-2000:] + first.stderr[-2000:]  # 3: unfinished
    state1 = json.loads((out / "suite.json").read_text())
    tok_stamp = (out / "work" / "tokenizer" / "tokenizer.json").stat().st_mtime_ns
    fire_log = _log_lines(out / "work" / "runs" / "fire")
    second = _suite("run", "--out", str(out), "--dry-run")
    assert second.returncode == 0, second.stdout[-2000:] + second.stderr[-2000:]
    return out, state1, tok_stamp, fire_log, second.stdout


@slow
def test_an_interrupted_suite_continues_where_it_stopped(suite):
    out, state1, tok_stamp, fire_log, _ = suite
    assert state1["complete"] is False and state1["models"]["fire"]["step"] == 2
    assert set(state1["models"]) == {"fire"} and state1["steps"] == 8
    state = json.loads((out / "suite.json").read_text())
    assert state["complete"] is True and len(state["calls"]) == 2 and state["steps"] == 8
    # the data stages and the timing ran once, in the first call; the second reused them
    assert all(state["stages"][s]["call"] == 1 for s in ("corpus", "tokenizer", "prepare"))
    assert (out / "work" / "tokenizer" / "tokenizer.json").stat().st_mtime_ns == tok_stamp
    assert state["step_seconds"] == state1["step_seconds"]
    # FIRE resumed from step 2: its first three log lines are the first call's, then steps 3 … 8
    log = _log_lines(out / "work" / "runs" / "fire")
    assert log[:3] == fire_log[:3] and [json.loads(x)["step"] for x in log] == list(range(9))
    assert state["models"]["fire"]["calls"] == 2
    assert all(state["models"][e]["calls"] == 1 and state["models"][e]["step"] == 8 for e in ENCODINGS[1:])
    # every model: the same steps, data order and seed (the same windows: the same tokens seen)
    seen = {
        json.loads((out / "checkpoints" / e / "config.json").read_text())["training"]["tokens_seen"] for e in ENCODINGS
    }
    assert seen == {8 * 4 * 64}
    again = _suite("run", "--out", str(out), "--dry-run")  # a complete suite: nothing to do
    assert again.returncode == 0 and "nothing to do" in again.stdout
    other = _suite("run", "--out", str(out), "--dry-run", "--seed", "1")
    assert other.returncode != 0 and "other settings (seed)" in other.stderr


@slow
def test_pack_fits_a_device_call_and_unpacks_to_a_group_of_seven_loadable_checkpoints(suite, tmp_path, monkeypatch):
    out = suite[0]
    files = sorted((out / "pack").iterdir())
    assert 2 <= len(files) <= 8 and all(f.stat().st_size <= 16 * 2**20 for f in files)
    assert sum(f.stat().st_size for f in files) <= 64 * 2**20
    root = tmp_path / "ckpts"
    dest = root / "bpe1024"
    r = _suite("unpack", str(out / "pack"), str(dest))
    assert r.returncode == 0, r.stderr
    assert all((dest / f"results_{d}.html").is_file() for d in ("prose", "latex", "code"))
    assert "bpe1024" in checkpoint_groups(root) and group_members(dest) == sorted(ENCODINGS)
    from app_pages import ok, page

    monkeypatch.setenv("FIREVIZ_CHECKPOINTS_DIR", str(root))
    monkeypatch.setenv("FIREVIZ_CACHE_DIR", str(tmp_path / "cache"))
    at = page("app.py")  # the app's Home lists the unpacked folder as a group of its own
    ok(at)
    assert any("Group `bpe1024`" in m.value and "7 more checkpoint" in m.value for m in at.markdown)
    for enc in ENCODINGS:
        ck = Checkpoint.resolve(str(dest / enc))
        assert ck.config.position_encoding == enc and ck.config.seq_len == 64 and ck.config.vocab_size == 300
        assert ck.tokenizer.key != "byte"  # the suite's BPE tokenizer, stored beside the weights
        tensors, meta = read_safetensors(dest / enc / "model.safetensors")
        assert meta["fireviz_stored_dtype"] == "float16"
        assert all(t.dtype == torch.float16 for t in tensors.values() if t.is_floating_point())
        ck.load()
        log = [json.loads(x) for x in gzip.decompress((dest / enc / "train_log.jsonl.gz").read_bytes()).splitlines()]
        assert log[-1]["step"] == 8


@slow
def test_results_cover_three_domains_in_both_modes_to_eight_times_the_training_length(suite):
    out = suite[0]
    for enc in ENCODINGS:
        rows = json.loads((out / "checkpoints" / enc / "results.json").read_text())
        got = {(r["settings"]["mode"], r["settings"]["data"]) for r in rows}
        assert got == {(m, d) for m in ("same_text", "context") for d in ("prose", "latex", "code")}
        for r in rows:
            assert r["checkpoint"] == enc and r["checkpoint_path"] == f"checkpoints/bpe1024/{enc}"
            assert all("error" not in e and e["bits_per_byte"] > 0 for e in r["per_length"]), r["per_length"]
            if r["settings"]["mode"] == "same_text":
                assert [e["length"] for e in r["per_length"]] == [32, 64, 128, 256, 512]  # to 8 × 64
            if enc != "alibi":
                assert r["paired_reference"] == "alibi"
                assert all("paired_delta_bpb" in e for e in r["per_length"])
    text = (out / "checkpoints" / "RESULTS.md").read_text()
    assert all(
        f"### {d}: context use" in text and f"### {d}: bits per byte" in text for d in ("prose", "latex", "code")
    )


@slow
def test_cards_name_the_device_time_tokens_parameters_and_every_setting(suite):
    out = suite[0]
    for enc in ENCODINGS:
        text = (out / "checkpoints" / enc / "README.md").read_text()
        cfg = json.loads((out / "checkpoints" / enc / "config.json").read_text())
        assert "trained on: CPU" in text and "minutes of training" in text
        assert f"tokens seen: {cfg['training']['tokens_seen']:,}" in text
        assert f"{cfg['training']['num_parameters']:,} parameters" in text
        settings = json.loads(text.split("```json\n", 1)[1].split("```", 1)[0])
        assert settings["train"] == cfg["training"]["settings"] and settings["model"]["position_encoding"] == enc


@slow
def test_unpack_refuses_a_damaged_part_an_unfinished_suite_and_toy_models_in_checkpoints(suite, tmp_path):
    out = suite[0]
    pack = tmp_path / "pack"
    pack.mkdir()
    for f in (out / "pack").iterdir():
        (pack / f.name).write_bytes(f.read_bytes())
    part = next(p for p in pack.iterdir() if ".part" in p.name)
    data = bytearray(part.read_bytes())
    data[len(data) // 2] ^= 1
    part.write_bytes(bytes(data))
    r = _suite("unpack", str(pack), str(tmp_path / "dest"))
    assert r.returncode != 0 and "damaged" in r.stderr and not (tmp_path / "dest").exists()
    part.write_bytes((out / "pack" / part.name).read_bytes())  # whole again; the suite said unfinished
    manifest = json.loads((pack / "pack.json").read_text())
    manifest["state"]["complete"] = False
    (pack / "pack.json").write_text(json.dumps(manifest))
    r = _suite("unpack", str(pack), str(tmp_path / "dest"))
    assert r.returncode != 0 and "unfinished suite" in r.stderr and not (tmp_path / "dest").exists()
    never = ROOT / "checkpoints" / "bpe1024-dry-run-test"
    r = _suite("unpack", str(out / "pack"), str(never))
    assert r.returncode != 0 and "toy models are not shipped" in r.stderr and not never.exists()
