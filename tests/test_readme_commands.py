"""Every command of the README's "Bundled checkpoints" and "Command line" sections runs as
written on a copy of the repository (issue 23), shortened only by flags those sections name
(training steps, sequence length, token budget), and none of them but the publish script —
whose purpose that is — touches ``checkpoints/``. The published-model commands run against
the tests' loopback Hub server (no internet here), serving repos with the real layout."""

from __future__ import annotations

import hashlib
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
#: Flags that shorten a training command (the recipe's own options, smaller).
SHORT_TRAIN = [
    "--set",
    "train.max_steps=4",
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
    "--set",
    "train.eval_batches=1",
]
#: Token budget that shortens an evaluation (same text: the documents it needs; otherwise targets).
SHORT_BUDGET = ["--token-budget", "3000"]
SECTIONS = ("## Bundled checkpoints and results", "## Command line")


def readme_commands() -> list[str]:
    """The shell commands of the README's sections above, continuation lines joined, comments dropped."""
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    out = []
    for title in SECTIONS:
        start = text.index(title)
        nxt = text.find("\n## ", start + len(title))
        body = text[start : nxt if nxt >= 0 else len(text)]
        for block in re.findall(r"```bash\n(.*?)```", body, flags=re.S):
            joined = re.sub(r"\\\n\s*", " ", block)
            for line in joined.splitlines():
                line = line.split(" #", 1)[0].strip() if not line.lstrip().startswith("#") else ""
                if line:
                    out.append(line)
    return out


def shortened(cmd: str) -> tuple[list[str], dict]:
    """``cmd`` as argv with this machine's Python, shortened; and extra environment variables."""
    argv, env = shlex.split(cmd), {}
    if argv[0] == "python":
        argv[0] = sys.executable
    elif argv[0] == "torchrun":
        argv = [sys.executable, "-m", "torch.distributed.run"] + argv[1:]
    elif argv[0] == "scripts/train_reference.sh":
        env = {"RUNS": "alibi", "PYTHON": sys.executable}
        return argv + SHORT_TRAIN, env
    tool = argv[argv.index("fireviz") + 1] if "fireviz" in argv else None
    if tool == "train":
        if "--resume" not in argv:
            argv += SHORT_TRAIN
        if "--stop-at-step" in argv:  # "train in sessions": stop at a step inside the short run
            argv[argv.index("--stop-at-step") + 1] = "3"
    elif tool == "eval" and "--token-budget" not in argv:
        argv += SHORT_BUDGET
    elif argv[1:2] == ["scripts/publish_results.py"]:  # one checkpoint, one domain, a few documents
        if "--domains" in argv:
            i = argv.index("--domains")
            del argv[i : i + 2]
        argv += ["--only", "alibi", "--domains", "prose"] + SHORT_BUDGET
    return argv, env


def tree_digest(folder: Path) -> dict[str, str]:
    return {
        str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(folder.rglob("*"))
        if p.is_file()
    }


def test_readme_commands_parse():
    cmds = readme_commands()
    assert any("fireviz train" in c for c in cmds) and any("fireviz eval" in c for c in cmds)
    assert any("publish_results.py" in c for c in cmds) and any("fireviz biases google" in c for c in cmds)
    for c in cmds:
        argv, _ = shortened(c)
        assert argv[0] in (sys.executable, "scripts/train_reference.sh"), c


@pytest.mark.slow
def test_every_readme_command_runs_and_leaves_checkpoints_alone(tmp_path):
    from hub_server import HubServer
    from test_hub import t5_folder

    repo = tmp_path / "repo"
    shutil.copytree(
        ROOT,
        repo,
        ignore=shutil.ignore_patterns(
            ".venv", ".git", "runs", ".pytest_cache", ".hypothesis", "__pycache__", "*.egg-info"
        ),
    )
    before = tree_digest(repo / "checkpoints")
    hub = tmp_path / "hub"
    t5_folder(hub / "t5-small", layers=2, dec_layers=2, heads=4)
    t5_folder(hub / "umt5-small", model_type="umt5", layers=2, dec_layers=2, heads=4)
    (hub / "bloom").mkdir(parents=True)
    (hub / "bloom" / "config.json").write_text(
        json.dumps({"model_type": "bloom", "n_head": 16, "n_layer": 24, "hidden_size": 1024, "seq_length": 2048})
    )
    repos = {
        "google-t5/t5-small": hub / "t5-small",
        "google/umt5-small": hub / "umt5-small",
        "bigscience/bloom-560m": hub / "bloom",
    }
    env = {
        **os.environ,
        "FIREVIZ_CACHE_DIR": str(tmp_path / "cache"),
        "HF_HOME": str(tmp_path / "hf"),
        "HF_HUB_CACHE": str(tmp_path / "hf" / "hub"),
        "OMP_NUM_THREADS": "1",
        "PYTHONPATH": str(repo),
    }
    publish = []
    with HubServer(repos) as server:
        env["HF_ENDPOINT"] = server.url
        for cmd in readme_commands():
            if "publish_results.py" in cmd:
                publish.append(cmd)  # last: rewriting checkpoints/ is its purpose
                continue
            argv, extra = shortened(cmd)
            r = subprocess.run(argv, cwd=repo, env={**env, **extra}, capture_output=True, text=True, timeout=600)
            assert r.returncode == 0, f"{cmd}\n→ {argv}\n{r.stdout[-2000:]}\n{r.stderr[-3000:]}"
    assert tree_digest(repo / "checkpoints") == before, "a README command changed checkpoints/"
    assert (repo / "runs" / "alibi" / "model.safetensors").exists() and (repo / "r.json").exists()
    for cmd in publish:
        argv, extra = shortened(cmd)
        r = subprocess.run(argv, cwd=repo, env={**env, **extra}, capture_output=True, text=True, timeout=900)
        assert r.returncode == 0, f"{cmd}\n→ {argv}\n{r.stdout[-2000:]}\n{r.stderr[-3000:]}"
        assert json.loads((repo / "checkpoints" / "alibi" / "results.json").read_text())
