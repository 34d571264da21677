"""Bad input (issue 21) at the checkpoint doors (fireviz.checkpoints.catalog): every door says one
message per problem, and a bundled checkpoint's name is a checkpoint at every door, the eval
command line's included."""

from __future__ import annotations

import json
import shutil

import pytest

import fireviz.checkpoints as fireviz_checkpoints
from fireviz.checkpoints import catalog as checkpoints
from fireviz.cli import eval as eval_cli
from fireviz.model.gpt import CheckpointError


# -- the checkpoint doors agree (review) -----------------------------------------------------------
def _door_errors(ref) -> dict[str, tuple[str, str]]:
    """``{door: (exception type, message)}`` of every checkpoint door asked for ``ref``."""
    doors = {
        "resolve_checkpoint": lambda: checkpoints.resolve_checkpoint(str(ref), local_files_only=True),
        "read_checkpoint": lambda: checkpoints.read_checkpoint(ref),
        "checkpoint_files": lambda: checkpoints.checkpoint_files(ref),
        "checkpoint_sha256": lambda: checkpoints.checkpoint_sha256(ref),
        "load_model": lambda: fireviz_checkpoints.load_model(ref),
        "load_model_or_published": lambda: fireviz_checkpoints.load_model_or_published(str(ref)),
        "load_model_with_identity": lambda: fireviz_checkpoints.load_model_with_identity(ref),
        "checked_config": lambda: checkpoints.checked_config(ref),
    }
    out = {}
    for name, door in doors.items():
        with pytest.raises(CheckpointError) as e:
            door()
        out[name] = (type(e.value).__name__, str(e.value))
    return out


def test_every_checkpoint_door_says_one_message_per_problem(root, tmp_path, monkeypatch):
    monkeypatch.setenv("FIREVIZ_CHECKPOINTS_DIR", str(root))
    (tmp_path / "no_weights").mkdir()
    (tmp_path / "no_weights" / "config.json").write_text((root / "good" / "config.json").read_text())
    (tmp_path / "a_file").write_text("x")
    for ref, words in (
        (tmp_path / "missing", ["not found", "neither a checkpoint name under", "an existing folder"]),
        (tmp_path / "no_weights", ["has no model.safetensors", "not a fireviz checkpoint folder"]),
        (tmp_path / "a_file", ["is a file, not a checkpoint folder"]),
        ("typo_name", ["not found", str(root)]),
    ):
        said = _door_errors(ref)
        assert len(set(said.values())) == 1, said  # one type, one message
        kind, message = next(iter(said.values()))
        assert kind == "CheckpointNotFoundError" and all(w in message for w in words), message


def test_a_bundled_name_is_a_checkpoint_at_every_door(root, tmp_path, monkeypatch):
    """``python -m fireviz eval good`` means the checkpoint ``good`` under the root, as the app's
    box does; an existing local folder of that name comes first; ``~`` is expanded everywhere."""
    monkeypatch.setenv("FIREVIZ_CHECKPOINTS_DIR", str(root))
    monkeypatch.chdir(tmp_path)
    sha = checkpoints.checkpoint_sha256(root / "good")
    assert checkpoints.checkpoint_sha256("good") == sha
    assert checkpoints.checkpoint_files("good") == (root / "good" / "config.json", root / "good" / "model.safetensors")
    assert fireviz_checkpoints.load_model("good").config.position_encoding == "alibi"
    assert fireviz_checkpoints.load_model_or_published("good").config.position_encoding == "alibi"
    assert fireviz_checkpoints.load_model_with_identity("good")[1] == sha
    assert checkpoints.read_checkpoint("good").path == checkpoints.resolve_checkpoint("good").path
    for door in (checkpoints.checkpoint_files, checkpoints.resolve_checkpoint, fireviz_checkpoints.load_model):
        with pytest.raises(checkpoints.CheckpointNotFoundError, match="not found"):
            door("./good")  # spelled as a path: that path only, never the bundled name
    shutil.copytree(root / "victim", tmp_path / "good")  # a local folder named like it: the path wins
    assert checkpoints.checkpoint_sha256("good") == checkpoints.checkpoint_sha256(root / "victim")
    assert checkpoints.resolve_checkpoint("good").path == checkpoints.read_checkpoint(tmp_path / "good").path
    monkeypatch.setenv("HOME", str(tmp_path))
    assert checkpoints.checkpoint_sha256("~/good") == checkpoints.checkpoint_sha256(tmp_path / "good")
    assert checkpoints.checked_config("~/good") == fireviz_checkpoints.load_model("~/good").config
    with pytest.raises(CheckpointError, match="a checkpoint is a folder path, a checkpoint name"):
        checkpoints.checkpoint_files(5)


def test_cli_eval_takes_a_bundled_name(root, tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("FIREVIZ_CHECKPOINTS_DIR", str(root))
    monkeypatch.chdir(tmp_path)
    text = tmp_path / "t.jsonl"
    text.write_text("".join(json.dumps({"id": f"d{k}", "text": "abc " * 20}) + "\n" for k in range(3)))
    argv = ["good", "--data", str(text), "--split", "all", "--lengths", "16", "--quiet"]
    assert eval_cli.main(argv + ["--cache-dir", str(tmp_path / "c")]) == 0
    assert "good" in capsys.readouterr().out
    assert eval_cli.main(["typo_name"] + argv[1:] + ["--no-cache"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "checkpoint 'typo_name' not found" in err[0]


def test_a_repository_path_typed_elsewhere_names_the_bundled_checkpoint(tmp_path, monkeypatch):
    """A new user ran the README's ``Checkpoint.resolve("checkpoints/fire")`` outside the repository:
    it became a Hub id and failed on the network. Every door now leads with the missing folder and
    names the bundled checkpoint (``"fire"`` works from any folder); the Hub's reason follows."""
    from fireviz.checkpoints import Checkpoint

    def offline(*args, **kwargs):
        raise CheckpointError("cannot download: no connection")

    monkeypatch.setattr(checkpoints, "download_checkpoint", offline)
    monkeypatch.setattr(checkpoints.hub, "load_published", offline)
    monkeypatch.chdir(tmp_path)
    for door in (Checkpoint.resolve, checkpoints.resolve_checkpoint):
        with pytest.raises(CheckpointError) as info:
            door("checkpoints/alibi")
        said = str(info.value)
        assert said.startswith("no folder 'checkpoints/alibi' under") and "no connection" in said
        assert "bundled checkpoint of that name is 'alibi'" in said
    for ref in ("./checkpoints/alibi/", "checkpoints/alibi/"):  # tab completion's slash; not a Hub id
        with pytest.raises(CheckpointError, match="the bundled checkpoint 'alibi' works by name from any folder"):
            Checkpoint.resolve(ref)
    for ref in ("someone/not-bundled", "someone/alibi"):  # a Hub id: the Hub's words, no hint
        with pytest.raises(CheckpointError) as info:
            Checkpoint.resolve(ref)
        assert str(info.value) == "cannot download: no connection"
    assert Checkpoint.resolve("alibi").name == "alibi"
