"""Bad input (issue 21) in evaluation (fireviz.eval, the eval command line): a broken config is one
error, NaN weights give no number and nothing cached, a length that cannot fit is refused before
work, short documents are counted, and a text file changed while in use is refused."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
from bad_content import NESTED
from safetensors.torch import load_file, save_file

from fireviz.checkpoints import checkpoint_sha256
from fireviz.cli import eval as eval_cli
from fireviz.data import corpus as data
from fireviz.eval import evaluation as evaluate
from fireviz.model.gpt import GPT

ROOT = Path(__file__).resolve().parents[2]


# -- the app's scan: a broken file costs only its own checkpoint ----------------------------
def test_eval_cli_on_a_nested_config_is_one_error_not_a_traceback(root, capsys, tmp_path):
    (root / "victim" / "config.json").write_text(NESTED)
    rc = eval_cli.main(
        [str(root / "victim"), "--data", str(_small_text(tmp_path)), "--split", "all", "--lengths", "16", "--no-cache"]
    )
    err = capsys.readouterr().err
    assert rc == 2 and "nests 100000 levels" in err and "Traceback" not in err


# -- numeric policy ------------------------------------------------------------------------------
def _small_text(tmp_path: Path) -> Path:
    p = tmp_path / "text.jsonl"
    p.write_text(
        "".join(
            json.dumps({"id": f"d{i}", "text": "the quick brown fox jumps over the lazy dog " * 3}) + "\n"
            for i in range(3)
        )
    )
    return p


def test_nan_weights_are_reported_by_name_never_cached_and_fail_the_cli(root, tmp_path, capsys):
    w = root / "victim" / "model.safetensors"
    state = load_file(str(w))
    name = next(k for k in state if k.endswith("ln_1.weight"))
    state[name][0] = float("nan")
    save_file(state, str(w))
    cache = tmp_path / "cache"
    with pytest.raises(evaluate.NonFiniteLossError, match=f"the weights contain NaN/inf in {name}"):
        evaluate.evaluate_many([str(root / "victim")], str(_small_text(tmp_path)), [16], split="all", cache_dir=cache)
    assert not any(cache.rglob("*.json")) if cache.exists() else True
    for extra in ([], ["--no-cache"]):
        rc = eval_cli.main(
            [
                str(root / "victim"),
                "--data",
                str(_small_text(tmp_path)),
                "--split",
                "all",
                "--lengths",
                "16",
                "--cache-dir",
                str(cache),
            ]
            + extra
        )
        assert rc != 0 and name in capsys.readouterr().err


# -- memory before work ---------------------------------------------------------------------------
def test_a_length_that_cannot_fit_in_memory_is_refused_before_work(root, tmp_path, monkeypatch):
    from fireviz.model import memory

    cfg = GPT.from_pretrained(str(root / "good")).config
    need_16 = memory.forward_bytes(cfg, 1, 16)
    monkeypatch.setattr(memory, "available_bytes", lambda device="cpu": need_16 + 1)
    calls = []
    monkeypatch.setattr(
        evaluate, "score_windows", lambda *a, **k: calls.append(a) or (_ for _ in ()).throw(AssertionError)
    )
    text = tmp_path / "long.jsonl"
    text.write_text(json.dumps({"id": "a", "text": "x" * 5000}) + "\n")
    r = evaluate.evaluate_many([str(root / "good")], str(text), [4096], split="all", use_cache=False, batch_tokens=16)[
        0
    ]
    err = r["per_length"][0]["error"]
    assert "needs about" in err and "available" in err and "largest length that fits is about" in err
    largest = int(err.split("largest length that fits is about ")[1].split(" ")[0].replace(",", ""))
    assert memory.forward_bytes(cfg, max(1, 16 // largest), largest) <= need_16 + 1
    assert memory.forward_bytes(cfg, max(1, 16 // (largest + 1)), largest + 1) > need_16 + 1
    assert not calls  # nothing was scored


def test_a_checkpoint_whose_every_length_is_refused_is_not_loaded(root, tmp_path, monkeypatch):
    """Issue #48: a published model's length that could not fit was refused only after 258 s of
    loading its weights. Memory is checked before any weights are read; a checkpoint with no length
    left to score is never loaded (one that has one still is)."""
    from fireviz.checkpoints import Checkpoint
    from fireviz.model import memory

    cfg = GPT.from_pretrained(str(root / "good")).config
    monkeypatch.setattr(memory, "available_bytes", lambda device="cpu": memory.forward_bytes(cfg, 1, 16) + 1)
    loads = []
    real_load = Checkpoint.load
    monkeypatch.setattr(Checkpoint, "load", lambda self, *a, **k: loads.append(self.name) or real_load(self, *a, **k))
    text = tmp_path / "long.jsonl"
    text.write_text(json.dumps({"id": "a", "text": "x" * 5000}) + "\n")
    (r,) = evaluate.evaluate_many(
        [str(root / "good")], str(text), [4096], split="all", use_cache=False, batch_tokens=16
    )
    assert "needs about" in r["per_length"][0]["error"] and loads == []
    (r,) = evaluate.evaluate_many(
        [str(root / "good")], str(text), [8, 4096], split="all", use_cache=False, batch_tokens=16
    )
    assert "bits_per_byte" in r["per_length"][0] and "needs about" in r["per_length"][1]["error"] and loads == ["good"]


# -- progress for every long call -------------------------------------------------------------------
def test_eval_counts_documents_too_short_and_takes_lone_surrogates(root, tmp_path):
    p = tmp_path / "d.jsonl"
    p.write_text(
        "".join(json.dumps({"id": f"d{i}", "text": ("ab\ud800cd " * 20)[: 60 + 40 * i]}) + "\n" for i in range(4))
    )
    with pytest.warns(data.RawBytesWarning):
        r = evaluate.evaluate_many(
            [str(root / "good")], str(p), [100], split="all", use_cache=False, mode="nonoverlapping"
        )[0]
    e = r["per_length"][0]
    assert e["documents_skipped"] == 1 and e["documents"] == 3 and math.isfinite(e["bits_per_byte"])
    assert "documents too short" in eval_cli.format_table([r])


@pytest.mark.slow
def test_eval_memory_grows_little_with_one_long_single_line_document(tmp_path, root):
    """One 24 MB single-line text file: peak RSS does not grow with it (windows read where they
    lie, fireviz.data.corpus.FileBytes), not the 18 bytes per byte of int64 tokens plus copies."""
    import subprocess
    import sys

    code = (
        "import resource, sys; from fireviz.eval import evaluation as evaluate; "
        "evaluate.evaluate_many([sys.argv[1]], sys.argv[2], [256], split='all', mode='nonoverlapping', "
        "token_budget=4096, use_cache=False); print(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024)"
    )
    peaks: dict[int, int] = {}
    for mb in (1, 24):
        p = tmp_path / f"doc{mb}.txt"
        p.write_text(("river stone of the delta " * (mb * 2**20 // 25 + 1))[: mb * 2**20])
    for mb in (1, 24, 1, 24):  # the lower of two runs each: a first run's peak can be ~40 MB higher by chance
        out = subprocess.run(
            [sys.executable, "-c", code, str(root / "good"), str(tmp_path / f"doc{mb}.txt")],
            capture_output=True,
            text=True,
            check=True,
            cwd=ROOT,
        )
        peaks[mb] = min(peaks.get(mb, 1 << 62), int(out.stdout.strip().splitlines()[-1]))
    per_byte = (peaks[24] - peaks[1]) / (23 * 2**20)
    assert per_byte < 0.5, f"{per_byte:.2f} bytes of memory per document byte (a text file is read where windows lie)"


# -- found by an adversarial review ------------------------------------------------------------------
def test_nan_weights_give_no_number_even_from_a_matching_results_json(root, tmp_path):
    w = root / "victim" / "model.safetensors"
    state = load_file(str(w))
    k = "wte.weight" if "wte.weight" in state else "lm_head.weight"
    state[k][0, 0] = float("nan")
    save_file(state, str(w))
    sha = checkpoint_sha256(root / "victim")
    text = _small_text(tmp_path)
    fp = data.data_fingerprint(data.load_documents(text))
    (root / "victim" / "results.json").write_text(
        json.dumps(
            [{"checkpoint_sha256": sha, "data_fingerprint": fp, "settings": {"data": str(text)}, "per_length": []}]
        )
    )
    with pytest.raises(evaluate.NonFiniteLossError, match=k):
        evaluate.evaluate_many([str(root / "victim")], str(text), [16], split="all", cache_dir=tmp_path / "c")


def test_a_text_file_changed_or_deleted_while_in_use_is_refused_and_nothing_is_cached(tmp_path, root):
    """The fingerprint is taken when the data is read; a file that changes afterwards must not be
    scored as other text under it (nor cached)."""
    import os

    text = tmp_path / "t.txt"
    text.write_text("The quick brown fox jumps over the lazy dog. " * 60)
    cache = tmp_path / "cache"

    def rewrite(done, total, message):
        if "L=128" in message:  # the first length is finished: now the file changes (same size)
            text.write_bytes(text.read_bytes()[::-1])
            os.utime(text, ns=(1, 1))

    with pytest.raises(data.DataError, match="changed"):
        evaluate.evaluate_many(
            [root / "good"],
            str(text),
            [64, 128],
            mode="nonoverlapping",
            token_budget=320,
            split="all",
            cache_dir=cache,
            progress=rewrite,
        )
    assert len(list(cache.glob("*.json"))) == 1  # the length scored before the change, nothing after
    docs = data.load_documents(text)
    text.unlink()
    with pytest.raises(data.DataError, match="deleted"):
        data.DocumentTokens(docs[0])[0:10]
    fifo = tmp_path / "pipe.txt"
    os.mkfifo(fifo)
    with pytest.raises(data.DataError, match="not a regular file"):
        data.load_documents(fifo)


def test_a_full_disk_costs_the_cache_entry_not_the_evaluation(root, tmp_path, monkeypatch, capsys):
    """Issue #38: a cache write that fails (no space left) is said and skipped; the numbers are
    returned, equal to a run without the cache, and the CLI still writes --out."""
    import errno

    def full(*args, **kwargs):
        raise OSError(errno.ENOSPC, "No space left on device")

    text = str(_small_text(tmp_path))
    plain = evaluate.evaluate_many([str(root / "victim")], text, [16, 32], split="all", use_cache=False)
    monkeypatch.setattr(evaluate, "write_json_atomic", full)
    with pytest.warns(RuntimeWarning, match="could not cache victim at length 16 .*No space left"):
        got = evaluate.evaluate_many([str(root / "victim")], text, [16, 32], split="all", cache_dir=tmp_path / "c")
    assert [e["bits_per_byte"] for e in got[0]["per_length"]] == [e["bits_per_byte"] for e in plain[0]["per_length"]]
    out = tmp_path / "out.json"
    args = [
        str(root / "victim"),
        "--data",
        text,
        "--split",
        "all",
        "--lengths",
        "16",
        "--cache-dir",
        str(tmp_path / "d"),
    ]
    with pytest.warns(RuntimeWarning):
        assert eval_cli.main(args + ["--out", str(out)]) == 0
    assert json.loads(out.read_text())
