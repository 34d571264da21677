"""The paper's comparison at token level from one GPU call (issue #52): BPE models at 1024 tokens.

From the repository alone, inside a time budget it never exceeds (``--budget-s``, checked
against its own clock before and during every stage):

1. ``corpus``: the bundled corpora (prose, LaTeX, code) copied into one source folder;
2. ``tokenizer``: a byte-level BPE tokenizer (``fireviz.data.tokenizers.train_bpe``, 4,096 tokens)
   learned on their train split only;
3. ``prepare``: token shards of all three domains (``fireviz.data.prepare``; resumable);
4. ``probe``: a few optimizer steps of each encoding through the real trainer, timing one step;
5. ``sizing``: the steps every model trains (the same for all), from the time left and the
   measured step times: ``steps = train share / Σ step time`` (fixed at the first call);
6. ``train``: FIRE, FIRE-S, ALiBi, RoPE, T5, Kerple-power and NoPE at 1024 tokens — same
   shape, data order, steps and seed (``fireviz.train.train`` with a deadline: a model that
   reaches it stops with its checkpoint and a later call resumes it), each then stored in
   float16 (``scripts/ship_checkpoint.py``) with its tokenizer;
7. ``eval``: every checkpoint, from its stored float16 weights, on the validation documents of
   each domain, in same-text mode at 512 … 8192 tokens (8× the training length) and in
   context mode (c = 256 … 4096 and full, M = 8192), paired against ALiBi; lengths finished
   stay cached, so a stopped evaluation continues;
8. ``report`` and ``pack``: a card per model (GPU, minutes, tokens seen, parameters, every
   setting, its results), RESULTS.md, suite.json; then ``checkpoints/`` packed as one tar.gz in
   parts (≤ 8 files of ≤ 16 MiB, ≤ 64 MiB in all: what a device call brings back).

    python scripts/bpe_suite.py run --out runs/bpe1024 [--budget-s 540]   # on a GPU
    python scripts/bpe_suite.py run --out runs/bpe1024-dry --dry-run     # the same at toy sizes, CPU
    python scripts/bpe_suite.py unpack runs/bpe1024/pack checkpoints/bpe1024

A second ``run`` with the same ``--out`` continues an unfinished suite (stages done are kept,
a model's training resumes exactly from its last checkpoint, finished evaluation lengths come
from the cache) and changes nothing in a finished one; a folder of another suite's settings is
refused. ``unpack`` checks every part's sha256, lays the pack out as checkpoint folders
(``DEST/<encoding>/``, a checkpoint group of the app) and draws the results' figures; an
unfinished suite's pack is refused (``--partial`` to look at one), and a dry run's inside the
repository's ``checkpoints/`` (toy models are never shipped). Exit status: 0 done, 3 unfinished
(run again), 1 or 2 an error.
"""

from __future__ import annotations

import argparse
import hashlib
import io
import json
import lzma
import os
import shutil
import sys
import tarfile
import tempfile
import time
import traceback
from dataclasses import asdict, dataclass, replace
from pathlib import Path

#: the process's start on the monotonic clock (before torch's import): the budget counts from here
T0 = time.monotonic()

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "scripts"))

import torch  # noqa: E402

from fireviz.checkpoints import Checkpoint, read_checkpoint, read_train_log  # noqa: E402
from fireviz.core import atomic_write_text, sha256_files, write_json_atomic  # noqa: E402
from fireviz.data.corpus import DATA_DIR  # noqa: E402

#: the encodings of the comparison, in table order; every model is paired against REFERENCE
ENCODINGS = ("fire", "fire_s", "alibi", "rope", "t5", "kerple_power", "nope")
REFERENCE = "alibi"
DOMAINS = ("prose", "latex", "code")
EVAL_MODES = ("same_text", "context")
#: the size limits of what ships and of what one device call brings back
MAX_WEIGHT_BYTES = 40_000_000  # all float16 model.safetensors together
PART_BYTES = 16 * 2**20
MAX_FILES = 8  # parts + pack.json
MAX_PACK_BYTES = 64 * 2**20
PACK_NAME = "bpe1024.tar.gz"
STATE = "suite.json"
STATE_FORMAT = 1


@dataclass(frozen=True)
class Sizes:
    """One suite's shapes and counts (``FULL`` on a GPU, ``TOY`` for ``--dry-run``); recorded in
    suite.json, and a resumed suite must have the same.

    Lengths in tokens of the suite's tokenizer. ``corpus_documents``: the first N documents of
    each domain (None: all). ``eval_token_budget`` / ``context_token_budget``: None scores every
    validation document long enough (the published protocol); a number caps it (toy runs only).
    ``min_steps``: below this the suite refuses to train
    (the budget is too small to say anything)."""

    vocab_size: int
    n_layer: int
    n_head: int
    d_model: int
    seq_len: int
    batch_size: int
    lr: float
    probe_steps: int
    lengths: tuple[int, ...]  # same-text window lengths
    context_lengths: tuple[int | str, ...]  # context mode's c, "full" = M − K
    prefix_tokens: int  # M: the tokens of each document both modes score
    context_targets: int  # K
    corpus_documents: int | None = None
    corpus_document_bytes: int | None = None  # toy sizes: each document's text cut to this many characters
    max_steps: int | None = None  # toy sizes: the steps whatever the budget allows
    eval_token_budget: int | None = None
    context_token_budget: int | None = None
    min_steps: int = 50
    device: str = "cuda"
    num_proc: int = 16
    pack_reserve_s: float = 20.0  # seconds kept for the report and the pack
    data_stage_min_s: float = 150.0  # no tokenizer or prepare starts with less left (neither can stop midway)
    eval_unit_min_s: float = 30.0  # no evaluation unit starts with less left than this beyond the reserve


FULL = Sizes(
    vocab_size=4096,
    n_layer=4,
    n_head=4,
    d_model=192,
    seq_len=1024,
    batch_size=64,
    lr=1e-3,
    probe_steps=12,
    lengths=(512, 1024, 2048, 4096, 8192),
    context_lengths=(256, 512, 1024, 2048, 4096, "full"),
    prefix_tokens=8192,
    context_targets=256,
)
TOY = Sizes(
    vocab_size=300,
    n_layer=2,  # two: FIRE-S (one bias shared by the layers) differs from FIRE
    n_head=2,
    d_model=32,
    seq_len=64,
    batch_size=4,
    lr=3e-3,
    probe_steps=3,
    lengths=(32, 64, 128, 256, 512),
    context_lengths=(32, 64, 128, "full"),
    prefix_tokens=512,
    context_targets=128,
    corpus_documents=30,
    corpus_document_bytes=6000,
    max_steps=8,
    eval_token_budget=1536,  # three documents' first 512 tokens
    context_token_budget=256,  # two documents' last 128 tokens
    min_steps=4,
    device="cpu",
    num_proc=1,
    pack_reserve_s=5.0,
    data_stage_min_s=10.0,
    eval_unit_min_s=2.0,
)


class Budget:
    """Seconds left of the budget, on this process's monotonic clock."""

    def __init__(self, seconds: float, start: float | None = None):
        self.seconds = seconds
        self.start = time.monotonic() if start is None else start
        self.end = self.start + seconds

    def left(self) -> float:
        return self.end - time.monotonic()

    def elapsed(self) -> float:
        return time.monotonic() - self.start


class OutOfBudget(Exception):
    """A stage that would not finish inside the budget: the suite stops there, state written."""


def say(budget: Budget, text: str) -> None:
    print(f"[{budget.elapsed():6.1f} s] {text}", flush=True)


# ---------------------------------------------------------------------------------------------
# state
# ---------------------------------------------------------------------------------------------
def new_state(sizes: Sizes, dry_run: bool, seed: int) -> dict:
    return {
        "format": STATE_FORMAT,
        "suite": "bpe1024",
        "dry_run": dry_run,
        "seed": seed,
        "sizes": json.loads(json.dumps(asdict(sizes))),
        "encodings": list(ENCODINGS),
        "reference": REFERENCE,
        "stages": {},
        "step_seconds": {},
        "steps": None,
        "models": {},
        "eval": {},
        "calls": [],
        "complete": False,
    }


def load_state(out: Path, sizes: Sizes, dry_run: bool, seed: int) -> dict:
    """The suite's state in ``out`` (a new one for a new folder). Raises SystemExit naming the
    problem for a folder of another suite's settings or one that holds other files."""
    fresh = new_state(sizes, dry_run, seed)
    path = out / STATE
    if not path.exists():
        if out.exists() and any(out.iterdir()):
            raise SystemExit(f"bpe_suite: error: {out} holds other files and no {STATE}; give a new or empty --out")
        return fresh
    try:
        state = json.loads(path.read_text())
    except (OSError, ValueError) as e:
        raise SystemExit(f"bpe_suite: error: {path} does not read ({e}); give a new --out") from None
    keys = ("format", "dry_run", "seed", "sizes", "encodings", "reference")
    if not isinstance(state, dict) or any(state.get(k) != fresh[k] for k in keys):
        diff = [k for k in keys if not isinstance(state, dict) or state.get(k) != fresh[k]]
        raise SystemExit(
            f"bpe_suite: error: {out} holds a suite of other settings ({', '.join(diff)}); "
            "continue it with the same options, or give a new --out"
        )
    return state


def save_state(out: Path, state: dict) -> None:
    write_json_atomic(out / STATE, state)


# ---------------------------------------------------------------------------------------------
# 1-3. corpus, tokenizer, shards
# ---------------------------------------------------------------------------------------------
def write_corpus(folder: Path, sizes: Sizes) -> None:
    """The three bundled domains as one source folder: the files themselves, or (toy sizes) each
    domain's first ``corpus_documents`` documents as JSONL, each text cut to
    ``corpus_document_bytes`` characters."""
    tmp = folder.with_name(folder.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    for domain in DOMAINS:
        src = DATA_DIR / f"{domain}.jsonl.xz"
        if sizes.corpus_documents is None:
            shutil.copyfile(src, tmp / src.name)
            continue
        with lzma.open(src, "rt", encoding="utf-8") as f:
            docs = [json.loads(line) for _, line in zip(range(sizes.corpus_documents), f, strict=False)]
        for d in docs:
            d["text"] = d["text"][: sizes.corpus_document_bytes]
        (tmp / f"{domain}.jsonl").write_text("".join(json.dumps(d) + "\n" for d in docs), encoding="utf-8")
    shutil.rmtree(folder, ignore_errors=True)
    os.replace(tmp, folder)


def data_stages(out: Path, state: dict, sizes: Sizes, budget: Budget) -> Path:
    """Stages 1-3; returns the shard folder. Each is skipped when done by an earlier call."""
    from fireviz.checkpoints.causal_lm import load_tokenizer
    from fireviz.data.prepare import prepare
    from fireviz.data.tokenizers import train_bpe

    work = out / "work"
    # the shard folder's name is what a card and the app's Home say the models were trained on
    corpus, tok, shards = work / "corpus", work / "tokenizer", work / f"shards-prose-latex-code-bpe{sizes.vocab_size}"
    if not state["stages"].get("corpus"):
        write_corpus(corpus, sizes)
        mark(out, state, "corpus", budget)
    if not state["stages"].get("tokenizer"):
        check_left(budget, sizes.data_stage_min_s, "training the tokenizer")
        shutil.rmtree(tok, ignore_errors=True)
        summary = train_bpe(str(corpus), sizes.vocab_size, tok, split="train")
        state["tokenizer"] = {k: summary[k] for k in ("vocab_size", "documents", "bytes", "tokens_per_byte")}
        mark(out, state, "tokenizer", budget)
    if not state["stages"].get("prepare"):
        check_left(budget, sizes.data_stage_min_s, "preparing the token shards")
        procs = max(1, min(sizes.num_proc, os.cpu_count() or 1))
        m = prepare(str(corpus), load_tokenizer(tok), shards, num_proc=procs, chunk_bytes=4 << 20, progress=False)
        state["shards"] = {s: m["splits"][s] for s in ("train", "validation")}
        mark(out, state, "prepare", budget)
    return shards


def mark(out: Path, state: dict, stage: str, budget: Budget) -> None:
    state["stages"][stage] = {"done_at_s": round(budget.elapsed(), 1), "call": len(state["calls"])}
    save_state(out, state)
    say(budget, f"{stage}: done")


def check_left(budget: Budget, need: float, what: str) -> None:
    if budget.left() < need:
        raise OutOfBudget(f"{what} needs about {need:.0f} s; {max(0.0, budget.left()):.0f} s are left")


# ---------------------------------------------------------------------------------------------
# 4-6. probe, sizing, training
# ---------------------------------------------------------------------------------------------
def recipe(sizes: Sizes, shards: Path, encoding: str, steps: int, seed: int):
    """The ``(GPTConfig, TrainConfig)`` every model of the suite shares but its encoding."""
    from fireviz.train import configs_from_tables

    model = {
        "n_layer": sizes.n_layer,
        "n_head": sizes.n_head,
        "d_model": sizes.d_model,
        "seq_len": sizes.seq_len,
        "vocab_size": sizes.vocab_size,
        "dropout": 0.0,
        "position_encoding": encoding,
    }
    train = {
        "data": str(shards),
        "batch_size": sizes.batch_size,
        "max_steps": steps,
        "lr": sizes.lr,
        "min_lr": sizes.lr / 10,
        "warmup_steps": max(1, steps // 20),
        "weight_decay": 0.1,
        # the encodings' own parameters (T5's buckets, FIRE's f_θ, c and L, Kerple's r) at 10 × lr: Adam
        # moves a parameter by about its learning rate a step, and a run of ~1,000 steps sums lr to
        # ~0.6, which left the bundled T5 (3,700 steps, Σ lr ≈ 2) 0.16 bits per byte behind at its
        # training length and collapsing beyond, while t5_plr10 stayed flat (checkpoints/RESULTS.md)
        "position_lr_multiplier": 10.0,
        "seed": seed,
        "eval_interval": max(1, steps // 4),
        "eval_batches": 1,
        "checkpoint_interval": max(1, steps // 4),
        "device": sizes.device,
        "dtype": "auto",
        # off: for models this small a step is launch-bound and compiling each of seven models
        # costs more than it saves (benchmarks/results/gpu_run1.md: the tiny recipe 171k tokens/s
        # eager against 170k compiled, 22.7 s against 51.4 s in all)
        "compile": False,
    }
    return configs_from_tables({"model": model, "train": train})


def weight_bytes(sizes: Sizes, encoding: str) -> int:
    """float16 bytes of one model's weights (safetensors header aside)."""
    from fireviz.model import GPT

    mc, _ = recipe(sizes, Path("unused"), encoding, 1, 0)
    return 2 * GPT(mc).num_parameters()


def probe(out: Path, state: dict, sizes: Sizes, shards: Path, budget: Budget) -> None:
    """Seconds per optimizer step of each encoding: ``probe_steps`` steps through the trainer on
    the suite's data; the median of the steps after the first two (warm-up) of its train log."""
    from fireviz.train import train

    for enc in ENCODINGS:
        if enc in state["step_seconds"]:
            continue
        check_left(budget, 30, f"timing {enc}")
        folder = out / "work" / "probe" / enc
        shutil.rmtree(folder, ignore_errors=True)
        mc, tc = recipe(sizes, shards, enc, sizes.probe_steps, state["seed"])
        tc = replace(tc, eval_interval=0, checkpoint_interval=0, warmup_steps=1)
        t = time.monotonic()
        train(mc, tc, folder, progress=False)
        wall = time.monotonic() - t
        dts = [mc.seq_len * tc.batch_size / r["tokens_per_s"] for r in read_train_log(folder) if r.get("tokens_per_s")]
        timed = sorted(dts[2:] or dts)
        step = state["step_seconds"][enc] = timed[len(timed) // 2]
        # what a run costs besides its steps: setup (data, model), the first steps' warm-up, a validation
        state.setdefault("overhead_seconds", {})[enc] = max(0.0, wall - sizes.probe_steps * step)
        shutil.rmtree(folder, ignore_errors=True)
        save_state(out, state)
        say(budget, f"probe {enc}: {step * 1000:.1f} ms per step, {state['overhead_seconds'][enc]:.1f} s besides")


def size_steps(out: Path, state: dict, sizes: Sizes, budget: Budget, share: float) -> int:
    """The steps of every model, fixed at the first call that gets here: ``share`` of the time
    left (the pack's reserve aside), less 10 % and twice each model's measured overhead (setup
    and one validation in the probe; a run has one setup, five validations and four checkpoints),
    over the sum of the measured step times. Raises OutOfBudget when fewer than ``min_steps`` fit."""
    if state["steps"] is not None:
        return state["steps"]
    per_step = sum(state["step_seconds"].values())
    train_s = (budget.left() - sizes.pack_reserve_s) * share
    fixed_s = 2 * sum(state.get("overhead_seconds", {}).values())
    steps = int((0.9 * train_s - fixed_s) / per_step)
    if sizes.max_steps is not None:
        steps = min(steps, sizes.max_steps)
    if steps < sizes.min_steps:
        raise OutOfBudget(
            f"only {steps} steps of all seven models fit in {train_s:.0f} s (one step of each: {per_step:.3f} s); "
            f"the suite needs at least {sizes.min_steps}: give a larger --budget-s"
        )
    state["steps"] = steps
    state["sizing"] = {
        "train_seconds": round(train_s, 1),
        "seconds_per_step_all_models": round(per_step, 4),
        "overhead_seconds_all_models": round(fixed_s, 1),
        "tokens_per_model": steps * sizes.batch_size * sizes.seq_len,
    }
    save_state(out, state)
    say(budget, f"sizing: {steps} steps × {sizes.batch_size} × {sizes.seq_len} tokens for each model")
    return steps


def train_all(
    out: Path, state: dict, sizes: Sizes, shards: Path, budget: Budget, share: float, stop_at_step: int | None
) -> bool:
    """Stage 6: each model trained to ``steps`` (resumed where an earlier call stopped) and stored
    in float16. The stage ends at ``share`` of the time left (with 5 % to spare over what sizing
    planned), and never later than the pack's reserve: a model that reaches it stops with its
    checkpoint and the next call resumes it. Returns whether every model is trained."""
    from ship_checkpoint import ship

    steps = state["steps"]
    stage_end = time.monotonic() + max(0.0, budget.left() - sizes.pack_reserve_s) * share / 0.95
    for enc in ENCODINGS:
        info = state["models"].setdefault(enc, {"step": 0, "train_seconds": 0.0, "calls": 0})
        if info.get("shipped") or info.get("failed"):
            continue
        run = out / "work" / "runs" / enc
        if info["step"] < steps:
            if time.monotonic() >= stage_end - 5 or budget.left() < sizes.pack_reserve_s + 10:
                say(budget, f"train {enc}: no time left in this call (at step {info['step']} of {steps})")
                return False
            deadline = min(stage_end, budget.end - sizes.pack_reserve_s - 5)
            if not train_one(out, state, sizes, shards, enc, deadline, stop_at_step):
                return False
            if info.get("failed"):
                continue
        ship(run, out / "checkpoints" / enc)
        info["shipped"] = sha256_files(out / "checkpoints" / enc / "model.safetensors")
        save_state(out, state)
    return True


def train_one(
    out: Path, state: dict, sizes: Sizes, shards: Path, enc: str, deadline: float, stop_at_step: int | None
) -> bool:
    """One model trained (or resumed) until its steps, the deadline or ``stop_at_step``; its state
    updated. A run that fails (a loss or weights no longer finite: ``TrainingError``) is recorded
    as failed, and the suite goes on without it. Returns whether the model reached its steps or failed."""
    from fireviz.train import TrainingError, train

    info, steps, run = state["models"][enc], state["steps"], out / "work" / "runs" / enc
    mc, tc = recipe(sizes, shards, enc, steps, state["seed"])
    resume = (run / "trainer_state.json").exists()
    t = time.monotonic()
    try:
        result = train(
            None if resume else mc,
            None if resume else tc,
            run,
            resume=resume,
            progress=False,
            stop_at_step=stop_at_step,
            deadline=deadline,
            command="python scripts/bpe_suite.py run (issue #52)",
        )
    except TrainingError as e:
        info["failed"] = str(e)
        save_state(out, state)
        print(f"train {enc}: failed, the suite goes on without it: {e}", file=sys.stderr, flush=True)
        return True
    finally:
        info["train_seconds"] = round(info["train_seconds"] + time.monotonic() - t, 2)
        info["calls"] += 1
    info["step"], info["tokens"] = result["step"], result["tokens"]
    save_state(out, state)
    loss = f", loss {result['loss']:.4f}" if result.get("loss") is not None else ""
    print(f"train {enc}: step {info['step']} of {steps}{loss}", flush=True)
    return info["step"] >= steps


# ---------------------------------------------------------------------------------------------
# 7. evaluation
# ---------------------------------------------------------------------------------------------
def eval_settings(sizes: Sizes, mode: str) -> tuple[list, dict]:
    """The lengths and settings of one evaluation unit (``evaluate_many`` keywords)."""
    if mode == "same_text":
        return list(sizes.lengths), {
            "mode": "same_text",
            "prefix_tokens": sizes.prefix_tokens,
            "token_budget": sizes.eval_token_budget,
        }
    return list(sizes.context_lengths), {
        "mode": "context",
        "prefix_tokens": sizes.prefix_tokens,
        "context_targets": sizes.context_targets,
        "token_budget": sizes.context_token_budget,
    }


def evaluate_all(out: Path, state: dict, sizes: Sizes, budget: Budget) -> bool:
    """Stage 7: every (mode, domain) unit over the stored checkpoints (all seven unless one failed
    to train), paired against ALiBi (the first one if ALiBi failed); stopped at the budget's
    reserve (the lengths done stay in the cache). Returns whether every unit is done."""
    from fireviz.eval import EvaluationCancelled, evaluate_many

    names = [enc for enc in ENCODINGS if state["models"].get(enc, {}).get("shipped")]
    folders = [str(out / "checkpoints" / enc) for enc in names]
    for mode in EVAL_MODES:
        for domain in DOMAINS:
            unit = f"{mode}/{domain}"
            if state["eval"].get(unit):
                continue
            if budget.left() < sizes.pack_reserve_s + sizes.eval_unit_min_s:
                say(budget, f"eval {unit}: no time left in this call")
                return False
            lengths, kw = eval_settings(sizes, mode)
            t = time.monotonic()
            try:
                rows = evaluate_many(
                    folders,
                    domain,
                    lengths,
                    reference=names.index(REFERENCE) if REFERENCE in names else 0,
                    cache_dir=out / "work" / "eval_cache",
                    use_published=False,
                    should_stop=lambda: budget.left() < sizes.pack_reserve_s,
                    device=sizes.device,
                    seed=0,
                    **kw,
                )
            except EvaluationCancelled:
                say(budget, f"eval {unit}: stopped at the budget (the lengths done are cached)")
                return False
            for r in rows:
                r["label"] = r["checkpoint"]
                r["checkpoint_path"] = f"checkpoints/bpe1024/{r['checkpoint']}"
            write_json_atomic(out / "results" / f"{mode}_{domain}.json", rows)
            state["eval"][unit] = {"seconds": round(time.monotonic() - t, 1), "call": len(state["calls"])}
            save_state(out, state)
            say(budget, f"eval {unit}: done in {state['eval'][unit]['seconds']} s")
    return True


def read_rows(out: Path) -> dict[str, list[dict]]:
    """``{"mode/domain": rows}`` of the units evaluated so far."""
    found = {}
    for mode in EVAL_MODES:
        for domain in DOMAINS:
            p = out / "results" / f"{mode}_{domain}.json"
            if p.exists():
                found[f"{mode}/{domain}"] = json.loads(p.read_text())
    return found


# ---------------------------------------------------------------------------------------------
# 8. report and pack
# ---------------------------------------------------------------------------------------------
def device_name(sizes: Sizes) -> str:
    if sizes.device == "cuda" and torch.cuda.is_available():
        return torch.cuda.get_device_name()
    sys.path.insert(0, str(ROOT / "benchmarks"))
    from eval_protocol import cpu_model

    return f"CPU: {cpu_model()}"


def length_table(rows: list[dict], cell, lengths: list) -> list[str]:
    head = ["| encoding | " + " | ".join(map(str, lengths)) + " |", "|---" * (len(lengths) + 1) + "|"]
    for r in rows:
        by = {e["length"]: e for e in r["per_length"]}
        head.append(f"| {r['label']} | " + " | ".join(cell(by.get(n, {})) for n in lengths) + " |")
    return head


def results_lines(units: dict[str, list[dict]], only: str | None = None) -> list[str]:
    """Markdown of every evaluated unit (``only``: one checkpoint's rows)."""
    from publish_results import bpb_cell, fmt_context_tables, paired_cell, protocol_text

    lines: list[str] = []
    for unit, rows in units.items():
        mode, domain = unit.split("/")
        rows = [r for r in rows if only is None or r["checkpoint"] == only]
        if not rows:
            continue
        s = rows[0]["settings"]
        if mode == "same_text":
            lengths = [e["length"] for e in rows[0]["per_length"]]
            lines += [f"### {domain}: bits per byte by window length ({protocol_text(s)})", ""]
            lines += length_table(rows, bpb_cell, lengths) + [""]
            if only is None:
                lines += [f"Minus {REFERENCE}, paired over documents [95 % interval]:", ""]
                lines += length_table([r for r in rows if r["checkpoint"] != REFERENCE], paired_cell, lengths)
                lines += [""]
        else:
            lines += [f"### {domain}: context use (the last {s.get('context_targets')} of the first "]
            lines[-1] += f"{s.get('prefix_tokens')} tokens of each of {s.get('documents_scored')} documents)"
            lines += ["", *fmt_context_tables(rows), ""]
    return lines


def card(out: Path, state: dict, enc: str, units: dict, gpu: str) -> str:
    """A model card: what trained it where, for how long, on what, with every setting, and its results."""
    folder = out / "checkpoints" / enc
    cfg = json.loads((folder / "config.json").read_text())
    tr = cfg.get("training", {})
    info = state["models"][enc]
    n_params = read_checkpoint(folder).num_parameters
    settings = {k: v for k, v in cfg.items() if k != "training"}
    train = tr.get("settings", {})
    return "\n".join(
        [
            f"# {enc}: BPE GPT at 1024 tokens (fireviz suite bpe1024, issue #52)",
            "",
            f"- encoding: `{enc}`; {n_params:,} parameters (tied embeddings counted once), weights stored in float16",
            f"- trained on: {gpu}; {info['train_seconds'] / 60:.2f} minutes of training in {info['calls']} call(s)",
            f"- tokens seen: {tr.get('tokens_seen', 0):,} ({tr.get('steps')} steps × {train.get('batch_size')} sequences × "
            f"{cfg.get('seq_len')} tokens); {tr.get('train_tokens_available', 0):,} training tokens available",
            f"- data: the train split of the bundled prose, LaTeX and code, in a {state['sizes']['vocab_size']:,}-token "
            "byte-level BPE tokenizer learned on that split (its files are in this folder)",
            f"- the same data order, steps and seed ({state['seed']}) as the six other models of the suite",
            f"- dry run (toy sizes): {state['dry_run']}",
            "",
            "Every setting (config.json: the model's fields, and `training.settings`, the [train] table):",
            "",
            "```json",
            json.dumps({"model": settings, "train": train}, indent=1),
            "```",
            "",
            "## Results (bits per byte, from these float16 weights)",
            "",
            *results_lines(units, only=enc),
            "Made by `python scripts/bpe_suite.py run` (see the repository's docs/scale.md).",
            "",
        ]
    )


def training_lines(out: Path, state: dict) -> list[str]:
    """Markdown: per model its parameters, steps, tokens, minutes and last validation losses (nats
    per token at the training length and 4×, from its train log); failures and errors named."""
    lines = [
        "| encoding | parameters | steps | tokens | minutes | val loss @1× | val loss @4× |",
        "|---|---|---|---|---|---|---|",
    ]
    for enc in ENCODINGS:
        info = state["models"].get(enc)
        if info is None:
            lines.append(f"| {enc} | – | not trained yet | | | | |")
            continue
        folder = out / "checkpoints" / enc
        shipped = folder.is_dir() and info.get("shipped")
        params = f"{read_checkpoint(folder).num_parameters:,}" if shipped else "–"
        val = [r for r in (read_train_log(folder) if shipped else []) if "val_loss" in r]
        last = val[-1] if val else {}
        cells = [f"{last[k]:.4f}" if k in last else "–" for k in ("val_loss", "val_loss_4x")]
        status = f"failed: {info['failed'][:120]}" if info.get("failed") else str(info["step"])
        lines.append(
            f"| {enc} | {params} | {status} | {info.get('tokens', 0):,} | {info['train_seconds'] / 60:.2f} | "
            + " | ".join(cells)
            + " |"
        )
    lines += [""] + [f"Error: {e}" for e in state.get("errors", [])] + ([""] if state.get("errors") else [])
    return lines


def write_report(out: Path, state: dict, sizes: Sizes) -> None:
    """Cards, results.json per model, RESULTS.md and a copy of suite.json, under out/checkpoints."""
    units = read_rows(out)
    gpu = state.setdefault("device", device_name(sizes))
    ck = out / "checkpoints"
    for enc in ENCODINGS:
        if not state["models"].get(enc, {}).get("shipped"):
            continue
        rows = [r for unit in units.values() for r in unit if r["checkpoint"] == enc]
        write_json_atomic(ck / enc / "results.json", rows)
        atomic_write_text(ck / enc / "README.md", card(out, state, enc, units, gpu))
    if not ck.is_dir():
        return
    lines = [
        "# BPE models at 1024 tokens: the paper's comparison at token level (issue #52)",
        "",
        f"Seven encodings, one recipe: {sizes.n_layer} layers, {sizes.n_head} heads, d = {sizes.d_model}, "
        f"{sizes.vocab_size:,}-token BPE, {sizes.seq_len} tokens × batch {sizes.batch_size}, "
        f"{state['steps']} steps each, seed {state['seed']}, on {gpu}. Complete: {state['complete']}.",
        "",
        *training_lines(out, state),
        *results_lines(units),
    ]
    atomic_write_text(ck / "RESULTS.md", "\n".join(lines) + "\n")
    write_json_atomic(ck / STATE, state)


def pack(out: Path, state: dict) -> dict:
    """``out/checkpoints`` as one deterministic tar.gz in parts of ≤ 16 MiB under ``out/pack``,
    with pack.json (each part's and the whole's sha256). Raises SystemExit when the limits break."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz", compresslevel=6) as tar:
        for p in sorted((out / "checkpoints").rglob("*")):
            if p.is_file():
                info = tar.gettarinfo(str(p), arcname=str(p.relative_to(out / "checkpoints")))
                info.mtime, info.uid, info.gid, info.uname, info.gname, info.mode = 0, 0, 0, "", "", 0o644
                with open(p, "rb") as f:
                    tar.addfile(info, f)
    data = buf.getvalue()
    dest = out / "pack"
    shutil.rmtree(dest, ignore_errors=True)
    dest.mkdir()
    parts = []
    for i in range(0, max(1, len(data)), PART_BYTES):
        name = f"{PACK_NAME}.part{i // PART_BYTES:02d}"
        chunk = data[i : i + PART_BYTES]
        (dest / name).write_bytes(chunk)
        parts.append({"name": name, "bytes": len(chunk), "sha256": hashlib.sha256(chunk).hexdigest()})
    manifest = {"name": PACK_NAME, "bytes": len(data), "sha256": hashlib.sha256(data).hexdigest(), "parts": parts}
    manifest["state"] = state
    write_json_atomic(dest / "pack.json", manifest)
    files = sorted(dest.iterdir())
    total = sum(f.stat().st_size for f in files)
    if len(files) > MAX_FILES or total > MAX_PACK_BYTES or any(f.stat().st_size > PART_BYTES for f in files):
        raise SystemExit(
            f"bpe_suite: error: the pack is {len(files)} files, {total / 2**20:.1f} MiB; a device call brings back "
            f"at most {MAX_FILES} files of ≤ 16 MiB, 64 MiB in all"
        )
    return manifest


def unpack(pack_dir: Path, dest: Path, partial: bool = False) -> None:
    """The pack in ``pack_dir`` laid out in ``dest`` (new): each part and the whole checked against
    pack.json, the tar's members refused outside ``dest`` (tarfile's data filter), then moved into
    place in one rename; then each checkpoint resolved and the figures drawn (``figures``).
    An unfinished suite's pack is refused unless ``partial``. Raises SystemExit naming the
    problem; ``dest`` is left untouched."""
    try:
        manifest = json.loads((pack_dir / "pack.json").read_text())
    except (OSError, ValueError) as e:
        raise SystemExit(f"bpe_suite unpack: error: {pack_dir}/pack.json does not read ({e})") from None
    if manifest["state"].get("dry_run") and (ROOT / "checkpoints").resolve() in [
        dest.resolve(),
        *dest.resolve().parents,
    ]:
        raise SystemExit(
            "bpe_suite unpack: error: a dry run's toy models are not shipped; unpack it outside checkpoints/"
        )
    if not manifest["state"].get("complete") and not partial:
        raise SystemExit(
            "bpe_suite unpack: error: the pack is of an unfinished suite; run the suite again to finish it "
            "(or pass --partial to look at what it holds)"
        )
    if dest.exists() and any(dest.iterdir()):
        raise SystemExit(f"bpe_suite unpack: error: {dest} exists and is not empty; remove it or name another")
    data = bytearray()
    for part in manifest["parts"]:
        chunk = (pack_dir / part["name"]).read_bytes()
        if hashlib.sha256(chunk).hexdigest() != part["sha256"]:
            raise SystemExit(f"bpe_suite unpack: error: {part['name']} is damaged (sha256 differs from pack.json)")
        data += chunk
    if hashlib.sha256(data).hexdigest() != manifest["sha256"]:
        raise SystemExit("bpe_suite unpack: error: the parts together do not give the packed file (sha256 differs)")
    dest.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=dest.parent, prefix=f".{dest.name}-") as tmp:
        with tarfile.open(fileobj=io.BytesIO(bytes(data)), mode="r:gz") as tar:
            tar.extractall(Path(tmp) / "x", filter="data")
        if dest.exists():
            dest.rmdir()
        os.replace(Path(tmp) / "x", dest)
    for enc in manifest["state"]["encodings"]:
        if (dest / enc).is_dir():
            Checkpoint.resolve(str(dest / enc))  # refused here, naming the problem, if it does not load
    figures(dest)


def figures(group: Path) -> None:
    """``results_<domain>.html`` (and ``.png`` where Chromium is installed) in ``group``: bits per
    byte against length of the same-text rows of its checkpoints' results.json, one per domain."""
    from publish_results import render_png

    from fireviz import plots

    rows = []
    for f in sorted(p for p in group.iterdir() if (p / "results.json").is_file()):
        rows += json.loads((f / "results.json").read_text())
    for domain in DOMAINS:
        runs = [r for r in rows if r["settings"].get("data") == domain and r["settings"].get("mode") == "same_text"]
        if runs:
            fig = plots.perplexity_figure(runs)
            fig.update_layout(width=1000, height=600)
            fig.write_html(group / f"results_{domain}.html", include_plotlyjs="cdn")
            render_png(fig, group / f"results_{domain}.png")


# ---------------------------------------------------------------------------------------------
# main
# ---------------------------------------------------------------------------------------------
def run(args: argparse.Namespace) -> int:
    budget = Budget(args.budget_s, start=T0)
    sizes = TOY if args.dry_run else FULL
    if sizes.device == "cuda" and not torch.cuda.is_available():
        print("bpe_suite: error: CUDA is not available; use --dry-run for the toy pipeline on the CPU", file=sys.stderr)
        return 2
    out = Path(args.out)
    state = load_state(out, sizes, args.dry_run, args.seed)
    if state["complete"]:
        print(f"{out} holds a complete suite; its pack is {out / 'pack'} (nothing to do)")
        return 0
    out.mkdir(parents=True, exist_ok=True)
    total = sum(weight_bytes(sizes, enc) for enc in ENCODINGS)
    if total > MAX_WEIGHT_BYTES:
        raise SystemExit(f"bpe_suite: error: the seven models' float16 weights are {total:,} bytes, over 40 MB")
    started = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime())
    state["calls"].append({"started": started, "budget_s": args.budget_s, "train_share": args.train_share})
    save_state(out, state)
    say(budget, f"suite in {out}: {total / 1e6:.1f} MB of float16 weights in all; budget {args.budget_s:.0f} s")
    done = failed = False
    try:
        shards = data_stages(out, state, sizes, budget)
        probe(out, state, sizes, shards, budget)
        size_steps(out, state, sizes, budget, args.train_share)
        done = train_all(out, state, sizes, shards, budget, args.train_share, args.stop_at_step)
        done = done and evaluate_all(out, state, sizes, budget)
    except OutOfBudget as e:
        say(budget, f"stopped: {e}")
    except Exception as e:  # whatever failed, what is done is still reported and packed
        traceback.print_exc()
        state.setdefault("errors", []).append(f"call {len(state['calls'])}: {type(e).__name__}: {e}"[:2000])
        failed = True
    # a suite is complete on disk only once its pack is written (a call killed while packing is not done)
    state["complete"] = done
    state["calls"][-1]["seconds"] = round(budget.elapsed(), 1)
    write_report(out, state, sizes)
    if (out / "checkpoints").is_dir():
        m = pack(out, state)
        say(budget, f"packed {len(m['parts'])} part(s), {m['bytes'] / 2**20:.1f} MiB, into {out / 'pack'}")
    state["calls"][-1]["seconds"] = round(budget.elapsed(), 1)
    save_state(out, state)
    say(budget, "suite complete" if done else "suite unfinished: run the same command again to continue")
    return 1 if failed else 0 if done else 3


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="command", required=True)
    r = sub.add_parser("run", help="run (or continue) the suite into --out")
    r.add_argument("--out", required=True, help="the suite's folder (created; an unfinished one is continued)")
    r.add_argument("--budget-s", type=float, default=540.0, help="seconds this call may take in all (default 540)")
    r.add_argument("--dry-run", action="store_true", help="the same pipeline at toy sizes on the CPU")
    r.add_argument("--seed", type=int, default=0, help="the seed of every model (default 0)")
    r.add_argument(
        "--train-share",
        type=float,
        default=0.6,
        help="the part of the time left after the data stages and the timing that training gets; the rest is "
        "for evaluation and the pack (default 0.6)",
    )
    r.add_argument(
        "--stop-at-step",
        type=int,
        default=None,
        help="stop each model's training at this step in this call (a test of resuming); continue with a second run",
    )
    u = sub.add_parser("unpack", help="lay a pack out as checkpoint folders")
    u.add_argument("pack", type=Path, help="the folder holding pack.json and its parts")
    u.add_argument("dest", type=Path, help="a new folder, e.g. checkpoints/bpe1024")
    u.add_argument("--partial", action="store_true", help="also the pack of an unfinished suite")
    args = ap.parse_args(argv)
    if args.command == "unpack":
        unpack(args.pack, args.dest, args.partial)
        print(f"unpacked {args.pack} into {args.dest}")
        return 0
    if not args.budget_s > 0:
        ap.error("--budget-s must be a positive number of seconds")
    if not 0 < args.train_share < 1:
        ap.error("--train-share must lie strictly between 0 and 1 (e.g. 0.6)")
    return run(args)


if __name__ == "__main__":
    sys.exit(main())
