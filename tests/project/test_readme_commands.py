"""Every documented command runs as written on a copy of the repository (issues 23, 34): the
commands of the README's "Command line" section and every ```bash block of docs/*.md and
CHANGELOG.md, shortened only by flags the docs name (training steps, sequence length, token
budget; the GPU suite as its dry run, unpacked outside checkpoints/), and none of them but the publish script — whose purpose that is — touches
``checkpoints/``. The published-model commands run against the tests' loopback Hub server (no
internet here), serving repos with the real layout. Commands that are only shown (the make
targets of the README's quick start) are listed in ``SHOWN_ONLY``; any other command outside
the sections that run fails ``test_every_documented_command_is_run_or_shown_only``."""

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

ROOT = Path(__file__).resolve().parents[2]
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
#: The same for the context-use protocol (targets: two documents' last 256 tokens) and for a
#: synthetic task (where the budget counts sequences per length).
SHORT_CONTEXT_BUDGET = ["--token-budget", "512"]
SHORT_TASK_BUDGET = ["--token-budget", "32"]
#: The README's sections whose commands run; docs/*.md and CHANGELOG.md run whole (``doc_sources``).
SECTIONS = ("## Command line",)
#: Commands the docs show but this test does not run: they install .venv, start the app or run
#: every test (``make test`` runs this file).
SHOWN_ONLY = frozenset({"make app", "make test", "bash .ci/run", "source .venv/bin/activate"})


def doc_sources() -> list[tuple[Path, tuple[str, ...] | None]]:
    """Each documentation file with the sections whose commands run (None: the whole file), in
    the order their commands run: the README, then docs/*.md by name, then CHANGELOG.md."""
    docs = sorted((ROOT / "docs").glob("*.md"))
    return [(ROOT / "README.md", SECTIONS), *((d, None) for d in docs), (ROOT / "CHANGELOG.md", None)]


def bash_commands(text: str) -> list[str]:
    """The shell commands of ``text``'s ```bash blocks, continuation lines joined, comments dropped."""
    out = []
    for block in re.findall(r"```bash\n(.*?)```", text, flags=re.S):
        joined = re.sub(r"\\\n\s*", " ", block)
        for line in joined.splitlines():
            line = line.split(" #", 1)[0].strip() if not line.lstrip().startswith("#") else ""
            if line:
                out.append(line)
    return out


def section_text(text: str, title: str) -> str:
    """The section of ``text`` that starts at the heading ``title``, up to the next ``## `` heading."""
    start = text.index(title)
    nxt = text.find("\n## ", start + len(title))
    return text[start : nxt if nxt >= 0 else len(text)]


def readme_commands() -> list[str]:
    """The commands that run: those of ``doc_sources`` in order, each once, ``SHOWN_ONLY`` left out."""
    out = []
    for path, sections in doc_sources():
        if not path.exists():
            continue
        text = path.read_text(encoding="utf-8")
        bodies = [text] if sections is None else [section_text(text, title) for title in sections]
        for body in bodies:
            for c in bash_commands(body):
                if c not in out and c not in SHOWN_ONLY:
                    out.append(c)
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
        data = argv[argv.index("--data") + 1] if "--data" in argv else ""
        if data.startswith("synthetic:"):
            argv += SHORT_TASK_BUDGET
        elif "context" in argv and argv[argv.index("context") - 1] == "--mode":
            argv += SHORT_CONTEXT_BUDGET
        else:
            argv += SHORT_BUDGET
    elif argv[1:3] == ["scripts/bpe_suite.py", "run"] and "--dry-run" not in argv:  # the GPU suite, toy sizes
        argv += ["--dry-run"]
    elif argv[1:3] == ["scripts/bpe_suite.py", "unpack"]:  # a dry run's pack: never into checkpoints/
        argv[-1] = "runs/bpe1024-unpacked"
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


def test_every_documented_command_is_run_or_shown_only():
    """No ```bash command in the README, docs/*.md or CHANGELOG.md escapes the run below: each is
    run, or one of ``SHOWN_ONLY`` (the README's make targets); and docs/ does hold commands."""
    runs = set(readme_commands())
    files = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md")), ROOT / "CHANGELOG.md"]
    for path in files:
        if path.exists():
            for c in bash_commands(path.read_text(encoding="utf-8")):
                assert c in runs or c in SHOWN_ONLY, f"{path.relative_to(ROOT)}: {c!r} is neither run nor shown-only"
    assert {"make app", "make test"} <= set(bash_commands((ROOT / "README.md").read_text(encoding="utf-8")))
    assert bash_commands("".join(p.read_text(encoding="utf-8") for p in sorted((ROOT / "docs").glob("*.md"))))


@pytest.mark.slow
def test_every_readme_command_runs_and_leaves_checkpoints_alone(tmp_path):
    from hub_folders import t5_folder
    from hub_server import HubServer

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
    from causal_lm_folders import write_causal_lm

    write_causal_lm(hub / "smollm", "llama")  # a tiny random Llama with a BPE tokenizer, as a Hub repo
    repos = {
        "HuggingFaceTB/SmolLM2-135M": hub / "smollm",
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
    assert tree_digest(repo / "checkpoints") == before, "a documented command changed checkpoints/"
    assert (repo / "runs" / "alibi" / "model.safetensors").exists() and (repo / "r.json").exists()
    for cmd in publish:
        argv, extra = shortened(cmd)
        r = subprocess.run(argv, cwd=repo, env={**env, **extra}, capture_output=True, text=True, timeout=900)
        assert r.returncode == 0, f"{cmd}\n→ {argv}\n{r.stdout[-2000:]}\n{r.stderr[-3000:]}"
        assert json.loads((repo / "checkpoints" / "alibi" / "results.json").read_text())
