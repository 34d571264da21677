"""Bad input (issue 21) in training (fireviz.train, the train command line): lone surrogates in the
data, the train hint the app shows runs as written, a trained config names every encoding
option and a config missing one is refused."""

from __future__ import annotations

import json
import warnings
from pathlib import Path

import pytest

from fireviz.checkpoints import catalog as checkpoints
from fireviz.cli import train as train_cli
from fireviz.data import corpus as data
from fireviz.model import EncodingRecordWarning
from fireviz.model.gpt import GPT, CheckpointError

ROOT = Path(__file__).resolve().parents[2]


def _tiny_run_config(tmp_path: Path, model: str, train: str = "", text: str = "abcd " * 300) -> Path:
    """A 12-document corpus of ``text`` and a TOML config training on it: ``model`` is the
    [model] table's body, ``train`` the lines added to [train] after ``data``. Returns the config."""
    p = tmp_path / "d.jsonl"
    p.write_text("".join(json.dumps({"id": f"d{i}", "text": text}) + "\n" for i in range(12)))
    cfg = tmp_path / "c.toml"
    cfg.write_text(f'[model]\n{model}[train]\ndata = "{p}"\n{train}')
    return cfg


# -- progress for every long call -------------------------------------------------------------------
def test_train_takes_a_lone_surrogate(tmp_path):
    cfg = _tiny_run_config(
        tmp_path,
        'n_layer = 1\nn_head = 1\nd_model = 8\nseq_len = 16\nposition_encoding = "alibi"\n',
        "max_steps = 2\nbatch_size = 2\neval_interval = 2\ncheckpoint_interval = 2\n",
        text="ab\ud800cd " * 40,
    )
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", data.RawBytesWarning)
        rc = train_cli.main(["--config", str(cfg), "--out", str(tmp_path / "run"), "--no-progress"])
    assert rc == 0 and (tmp_path / "run" / "model.safetensors").exists()


def test_the_train_hint_the_app_and_errors_show_runs(tmp_path, monkeypatch):
    import shlex

    monkeypatch.chdir(ROOT)
    words = shlex.split(checkpoints.TRAIN_HINT.replace("<encoding>", "alibi"))
    assert words[:4] == ["python", "-m", "fireviz", "train"]
    args = words[4:]
    args[args.index("--out") + 1] = str(tmp_path / "my_run")  # never into the repository's checkpoints/
    args += [
        "--set",
        "train.max_steps=2",
        "--set",
        "train.warmup_steps=1",
        "--set",
        "train.eval_interval=2",
        "--set",
        "train.checkpoint_interval=2",
        "--set",
        "train.batch_size=2",
        "--set",
        "model.seq_len=64",
        "--no-progress",
    ]
    assert train_cli.main(args) == 0
    assert checkpoints.read_checkpoint(tmp_path / "my_run").position_encoding == "alibi"


# -- found by an adversarial review ------------------------------------------------------------------
def test_a_trained_config_names_every_encoding_option_and_refuses_a_deleted_one(tmp_path):
    cfg = _tiny_run_config(
        tmp_path,
        'n_layer = 1\nn_head = 2\nd_model = 16\nseq_len = 32\nposition_encoding = "t5"\n'
        "encoding_options = {max_distance = 20}\n",
        "max_steps = 2\nwarmup_steps = 1\nbatch_size = 2\neval_interval = 2\ncheckpoint_interval = 2\neval_batches = 1\n",
    )
    assert train_cli.main(["--config", str(cfg), "--out", str(tmp_path / "run"), "--no-progress"]) == 0
    saved = json.loads((tmp_path / "run" / "config.json").read_text())
    assert saved["config_format"] == 2
    assert saved["encoding_options"] == {
        "num_buckets": 32,
        "max_distance": 20,
        "bidirectional": False,
        "init_std": 0.02,
    }
    before = GPT.from_pretrained(str(tmp_path / "run"))
    assert before.encoding(0).max_distance == 20
    del saved["encoding_options"]["max_distance"]
    (tmp_path / "run" / "config.json").write_text(json.dumps(saved))
    with pytest.raises(CheckpointError, match="does not name encoding option.*max_distance"):
        GPT.from_pretrained(str(tmp_path / "run"))
    with pytest.raises(CheckpointError, match="max_distance"):
        checkpoints.read_checkpoint(tmp_path / "run")
    saved["config_format"] = 1  # an older file: unset options take their defaults, as they always did ...
    (tmp_path / "run" / "config.json").write_text(json.dumps(saved))
    with pytest.raises(CheckpointError, match='trained with .t5. .*"max_distance": 20'):
        GPT.from_pretrained(str(tmp_path / "run"))  # ... unless the weights record otherwise (issue #50)
    from safetensors.torch import load_file, save_file

    weights = str(tmp_path / "run" / "model.safetensors")
    save_file(load_file(weights), weights, metadata={"format": "pt"})  # weights saved before the record
    with pytest.warns(EncodingRecordWarning, match="taken from config.json"):
        assert GPT.from_pretrained(str(tmp_path / "run")).encoding(0).max_distance == 128


@pytest.mark.parametrize(
    "edit, named",
    [
        (lambda c: c.update(n_head=1), "n_head: run 2 vs config.json 1"),
        (lambda c: c["encoding_options"].update(max_distance=99), "encoding_options"),
        (lambda c: c["training"]["settings"].update(lr=0.5), "train.lr"),
    ],
)
def test_resume_refuses_a_config_json_edited_since_its_checkpoint(tmp_path, capsys, edit, named):
    """Issue #38: --resume took its settings from the trainer state, ignored an edited config.json
    and overwrote it. Now it is refused with one message naming the field; nothing is changed."""
    import hashlib

    cfg = _tiny_run_config(
        tmp_path,
        'n_layer = 1\nn_head = 2\nd_model = 16\nseq_len = 32\nposition_encoding = "t5"\n',
        "max_steps = 4\nwarmup_steps = 1\nbatch_size = 2\neval_interval = 2\ncheckpoint_interval = 2\neval_batches = 1\n",
    )
    run = tmp_path / "run"
    assert train_cli.main(["--config", str(cfg), "--out", str(run), "--no-progress", "--stop-at-step", "2"]) == 0
    saved = json.loads((run / "config.json").read_text())
    edit(saved)
    (run / "config.json").write_text(json.dumps(saved))
    digest = {f.name: hashlib.sha256(f.read_bytes()).hexdigest() for f in run.iterdir()}
    capsys.readouterr()
    assert train_cli.main(["--out", str(run), "--resume", "--no-progress"]) != 0
    err = capsys.readouterr().err
    assert "was edited since its checkpoint" in err and named in err and "Traceback" not in err
    assert {f.name: hashlib.sha256(f.read_bytes()).hexdigest() for f in run.iterdir()} == digest


def _hold_folder(run):
    """Another process holding ``run`` as a running ``fireviz train`` does (flock on the folder);
    returns once it holds it. Kill it to let go."""
    import subprocess
    import sys

    holder = subprocess.Popen(
        [
            sys.executable,
            "-c",
            f"import fcntl, os, time; fd = os.open({str(run)!r}, os.O_RDONLY); "
            "fcntl.flock(fd, fcntl.LOCK_EX); print('held', flush=True); time.sleep(600)",
        ],
        stdout=subprocess.PIPE,
        text=True,
    )
    assert holder.stdout.readline().strip() == "held"
    return holder


def test_one_run_per_folder_and_a_killed_run_leaves_no_stale_lock(tmp_path, capsys):
    """Issue #38: two runs into one --out interleaved their logs and the second replaced the first.
    A run holds its folder (flock on the folder, no file added): a second one is refused with one
    message and changes nothing; once the holder is killed (-9), the folder is free again."""
    import signal
    import time

    cfg = _tiny_run_config(
        tmp_path,
        'n_layer = 1\nn_head = 1\nd_model = 8\nseq_len = 16\nposition_encoding = "alibi"\n',
        "max_steps = 2\nbatch_size = 2\neval_interval = 2\ncheckpoint_interval = 2\neval_batches = 1\n",
    )
    run = tmp_path / "run"
    run.mkdir()
    holder = _hold_folder(run)
    try:
        capsys.readouterr()
        assert train_cli.main(["--config", str(cfg), "--out", str(run), "--no-progress"]) != 0
        err = capsys.readouterr().err
        assert "another fireviz train is writing into" in err and "Traceback" not in err
        assert list(run.iterdir()) == []  # nothing written
    finally:
        holder.send_signal(signal.SIGKILL)
        holder.wait()
    time.sleep(0.1)
    assert train_cli.main(["--config", str(cfg), "--out", str(run), "--no-progress"]) == 0
    assert (run / "model.safetensors").exists() and not [f for f in run.iterdir() if "lock" in f.name]


def test_a_live_run_before_its_first_checkpoint_is_never_called_stopped(tmp_path, capsys):
    """A second run into the folder of a live run that has logged but not yet checkpointed was told
    to delete the folder (a breaker's find, issue #38): it is told another run is writing there;
    once that run is gone, the same folder is the stopped run it is."""
    import signal
    import time

    cfg = _tiny_run_config(
        tmp_path,
        'n_layer = 1\nn_head = 1\nd_model = 8\nseq_len = 16\nposition_encoding = "nope"\n',
        "max_steps = 2\nbatch_size = 2\neval_interval = 2\ncheckpoint_interval = 2\neval_batches = 1\n",
    )
    run = tmp_path / "run"
    run.mkdir()
    (run / "train_log.jsonl").write_text('{"step": 1, "loss": 5.0}\n')
    holder = _hold_folder(run)
    try:
        capsys.readouterr()
        assert train_cli.main(["--config", str(cfg), "--out", str(run), "--no-progress"]) != 0
        err = capsys.readouterr().err
        assert "another fireviz train is writing into" in err and "delete" not in err and "Traceback" not in err
    finally:
        holder.send_signal(signal.SIGKILL)
        holder.wait()
    time.sleep(0.1)
    assert train_cli.main(["--config", str(cfg), "--out", str(run), "--no-progress"]) != 0
    assert "stopped before its first checkpoint" in capsys.readouterr().err
    assert [f.name for f in run.iterdir()] == ["train_log.jsonl"]


def test_a_run_logged_to_a_file_says_how_it_goes(tmp_path):
    """Issue #40 (a new user): `train … > log 2>&1` wrote nothing until the end (the bar is off when
    stderr is not a terminal). A plain line at the first step (issue #48: the first one came at the
    first validation, 19 minutes in) and one per validation now say the step, the losses in
    nats/token, the throughput and the time left; --no-progress still prints none."""
    import subprocess
    import sys

    cfg = _tiny_run_config(
        tmp_path,
        'n_layer = 1\nn_head = 1\nd_model = 8\nseq_len = 16\nposition_encoding = "alibi"\n',
        "max_steps = 4\nwarmup_steps = 1\nbatch_size = 2\neval_interval = 2\ncheckpoint_interval = 2\neval_batches = 1\n",
    )
    cmd = [sys.executable, "-m", "fireviz", "train", "--config", str(cfg)]
    p = subprocess.run(cmd + ["--out", str(tmp_path / "a")], cwd=ROOT, capture_output=True, text=True, timeout=300)
    lines = [line for line in p.stderr.splitlines() if line.startswith("train alibi: step")]
    assert p.returncode == 0 and [line.split(" · ")[0] for line in lines] == [
        "train alibi: step 1/4",
        "train alibi: step 2/4",
        "train alibi: step 4/4",
    ], p.stderr
    assert "loss " in lines[0] and "tokens/s" in lines[0] and "left" in lines[0]  # val: the step-0 validation
    assert "val " in lines[1] and "@ 16" in lines[1] and "nats/token" in lines[1] and "left" in lines[1]
    q = subprocess.run(
        cmd + ["--out", str(tmp_path / "b"), "--no-progress"], cwd=ROOT, capture_output=True, text=True, timeout=300
    )
    assert q.returncode == 0 and "train alibi: step" not in q.stderr


def test_a_reader_that_closes_the_pipe_costs_the_progress_lines_not_the_checkpoint(tmp_path):
    """A new user's finding: `train … 2>&1 | head -1` ended the run at its next progress line with
    BrokenPipeError, before the final checkpoint (and under torchrun before the first one)."""
    import subprocess
    import sys

    cfg = _tiny_run_config(
        tmp_path,
        'n_layer = 1\nn_head = 1\nd_model = 8\nseq_len = 16\nposition_encoding = "alibi"\n',
        "max_steps = 6\nwarmup_steps = 1\nbatch_size = 2\neval_interval = 2\ncheckpoint_interval = 6\neval_batches = 1\n",
    )
    cmd = [sys.executable, "-m", "fireviz", "train", "--config", str(cfg), "--out", str(tmp_path / "run")]
    p = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    assert p.stderr is not None
    p.stderr.close()  # the reader is gone before the first progress line
    assert p.wait(timeout=300) == 0
    config = json.loads((tmp_path / "run" / "config.json").read_text())
    assert config["training"]["steps"] == 6


def test_ctrl_c_stops_after_a_whole_step_with_its_checkpoint_and_resume_is_exact(tmp_path):
    """Issue #40: Ctrl-C in `fireviz train` printed a traceback and wrote nothing. Now the first one
    ends the run after the step in progress, writes that step's checkpoint, says how to resume and
    exits 130; --resume then ends bit-identical to a run never interrupted."""
    import signal
    import subprocess
    import sys

    from safetensors.torch import load_file

    cfg = _tiny_run_config(
        tmp_path,
        'n_layer = 1\nn_head = 2\nd_model = 16\nseq_len = 16\nposition_encoding = "fire"\n',
        "max_steps = 100\nwarmup_steps = 1\nbatch_size = 2\neval_interval = 2\ncheckpoint_interval = 1000\n"
        "eval_batches = 1\n",
    )
    base = [sys.executable, "-m", "fireviz", "train", "--config", str(cfg)]
    p = subprocess.Popen(base + ["--out", str(tmp_path / "cut")], cwd=ROOT, stderr=subprocess.PIPE, text=True)
    assert p.stderr is not None
    for line in p.stderr:  # the first progress line: the loop is running
        if line.startswith("train fire: step"):
            p.send_signal(signal.SIGINT)
            break
    rest = p.stderr.read()
    assert p.wait(timeout=120) == 130, rest
    assert "Traceback" not in rest and "--resume" in rest
    stopped = json.loads((tmp_path / "cut" / "trainer_state.json").read_text())["step"]
    assert 1 <= stopped < 100 and f"interrupted after step {stopped}" in rest  # the first line comes at step 1
    resumed = subprocess.run(
        [sys.executable, "-m", "fireviz", "train", "--out", str(tmp_path / "cut"), "--resume", "--no-progress"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert resumed.returncode == 0, resumed.stderr
    whole = subprocess.run(
        base + ["--out", str(tmp_path / "whole"), "--no-progress"], cwd=ROOT, capture_output=True, timeout=300
    )
    assert whole.returncode == 0
    a, b = (load_file(tmp_path / f / "model.safetensors") for f in ("cut", "whole"))
    assert a.keys() == b.keys() and all(a[k].equal(b[k]) for k in a)


def test_a_huge_copy_task_batch_is_refused_before_its_data_is_made(tmp_path, capsys):
    """Issue #38: a copy-task run with batch_size 1e8 was checked for memory only after its batches
    had grown to 6 GB. The step's memory is checked first: one message, bounded memory, nothing written."""
    import resource

    rss0 = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    argv = ["--config", str(ROOT / "configs" / "copy.toml"), "--set", "train.batch_size=100000000"]
    assert train_cli.main(argv + ["--out", str(tmp_path / "run"), "--no-progress"]) == 2
    err = capsys.readouterr().err
    assert "lower train.batch_size" in err and "Traceback" not in err
    assert resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - rss0 < 256 << 10  # < 256 MiB
    assert not (tmp_path / "run").exists() or not any((tmp_path / "run").iterdir())


def test_a_config_file_far_larger_than_a_config_is_refused_before_it_is_read(tmp_path, capsys):
    """Issue #50's class, one more reader: a TOML "config" of 8 MiB (a list of millions of values
    parses into hundreds of MB) is refused from its size, in one line, before it is read."""
    from fireviz.train.config import MAX_CONFIG_BYTES

    cfg = tmp_path / "huge.toml"
    cfg.write_text("[model]\nn_layer = 1\n[train]\nx = [" + "1," * (4 << 20) + "1]\n")
    assert cfg.stat().st_size > MAX_CONFIG_BYTES
    assert train_cli.main(["--config", str(cfg), "--out", str(tmp_path / "run")]) != 0
    err = capsys.readouterr().err
    assert "more than the" in err and "huge.toml" in err and "Traceback" not in err
    assert not (tmp_path / "run").exists()
