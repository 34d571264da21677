"""What a checkpoint folder says about itself: its results JSON (schema-checked), its train log,
the headline numbers and training summary shown for it (``CheckpointInfo``), the naming of
extra-seed runs. Files fireviz did not just write are read through ``fireviz.core.files`` (bounded,
finite) and refused with the reason; a bad file affects only its own checkpoint
(``fireviz.checkpoints.catalog``, which finds and loads checkpoints, lists the rest)."""

from __future__ import annotations

import json
import math
import os
import re
import statistics
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Sequence, TypeGuard

from fireviz.checkpoints.causal_lm import is_causal_lm_folder
from fireviz.core import FileFormatError, file_state, read_json, read_jsonl
from fireviz.model import CheckpointError

CONFIG_FILE, WEIGHTS_FILE, LOG_FILE = "config.json", "model.safetensors", "train_log.jsonl"
#: The compressed train log of a shipped checkpoint (scripts/ship_checkpoint.py writes it).
LOG_FILE_GZ = LOG_FILE + ".gz"
#: JSON files in a checkpoint folder that are not evaluation results.
_NOT_RESULTS = {CONFIG_FILE, "trainer_state.json", "tokenizer.json", "generation_config.json"}


#: An extra-seed run sits beside its seed-0 run: ``fire_seed1`` is ``fire`` trained with train.seed=1.
SEED_FOLDER = re.compile(r"^(?P<base>[A-Za-z0-9_.-]+?)_seed(?P<seed>[1-9][0-9]*)$")


def seed_run(name: str) -> tuple[str, int] | None:
    """``(base name, training seed)`` for an extra-seed checkpoint name (``"fire_seed2"`` →
    ``("fire", 2)``, the naming of ``scripts/train_reference.sh`` and ``checkpoints/``); None
    for any other name, including the seed-0 run itself."""
    m = SEED_FOLDER.match(name)
    return (m["base"], int(m["seed"])) if m else None


def seed_base(name: str) -> str:
    """The seed-0 run's name for any run: ``"fire_seed2"`` → ``"fire"``, ``"fire"`` → ``"fire"``."""
    run = seed_run(name)
    return run[0] if run else name


def seed_groups(names) -> dict[str, list[str]]:
    """``{base: [base, extra-seed names…]}`` (sorted) for each name among ``names`` that has
    extra-seed runs (see :func:`seed_run`) among them too; {} when none has."""
    names = list(names)
    groups: dict[str, list[str]] = {}
    for name in sorted(names):
        run = seed_run(name)
        if run and run[0] in names:
            groups.setdefault(run[0], [run[0]]).append(name)
    return groups


def overview_first(encodings: dict[str, str], order: Sequence[str]) -> list[str]:
    """Checkpoint names (``{name: position encoding}``) in the order a first look wants them: the
    plain run of each encoding — the folder named as its encoding (``fire``, ``alibi``), trained by
    the shared recipe at seed 0 — in ``order`` (the registry's, the paper's), NoPE last (its rise
    beyond the training length squeezes every other curve into one band); then the variants
    (``fire_offset``, ``t5_plr10``…) by name; then extra seeds (``seed0_first``)."""
    rank = {e: k for k, e in enumerate(order)}
    plain = sorted(
        (n for n, e in encodings.items() if n == e),
        key=lambda n: (n == "nope", rank.get(n, len(rank)), n),
    )
    return plain + [n for n in seed0_first(sorted(encodings)) if n not in plain]


def seed0_first(names: list[str]) -> list[str]:
    """``names`` with every extra-seed run (see :func:`seed_run`) moved after the others,
    order otherwise kept: a default selection of the first N then shows N encodings."""
    return [n for n in names if seed_run(n) is None] + [n for n in names if seed_run(n) is not None]


def _read_json(path: Path, expect: type | tuple | None = None) -> Any:
    try:
        return read_json(path, expect=expect)
    except FileFormatError as e:
        raise CheckpointError(str(e)) from e


#: Train-log fields read as numbers (a record holding another type is refused).
LOG_NUMBER_FIELDS = (
    "step",
    "tokens",
    "loss",
    "lr",
    "grad_norm",
    "tokens_per_s",
    "val_loss",
    "val_loss_4x",
    "val_loss_random",
)


#: Steps over which the training-runs table averages the training loss and throughput by
#: default: one batch's loss varies by ±0.1 nats at the end of a reference run, more than
#: seeds differ.
SUMMARY_STEPS = 50


def _is_number(v: object) -> TypeGuard[int | float]:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def _is_int(v: object) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def check_results(obj: Any, source: str = "results JSON") -> None:
    """Check the types of a results JSON (one ``fireviz.eval.evaluation`` result dict or a list of them).

    Only the fields something reads are checked, each where present: ``settings`` an object
    whose ``data`` is a string and ``rope_scaling`` null/string/object; ``per_length`` a list of
    objects with an integer ``length`` and numeric ``bits_per_byte``, ``nats_per_token``,
    ``perplexity``, integer ``tokens_scored``/``windows``/``documents`` and ``ci95``/
    ``paired_ci95`` null or two numbers; ``checkpoint``, ``label``, ``position_encoding`` strings.
    Raises: CheckpointError naming ``source`` and the first bad field.
    """

    def bad(where: str, want: str):
        raise CheckpointError(
            f"{source}: {where} is not {want}; the file is not what fireviz writes — evaluate again or delete it"
        )

    items = obj if isinstance(obj, list) else [obj]
    if not isinstance(obj, (list, dict)):
        bad("the top level", "an object or a list of objects")
    for n, r in enumerate(items):
        at = f"result {n}" if isinstance(obj, list) else "the result"
        if not isinstance(r, dict):
            bad(at, "an object")
        for k in ("checkpoint", "label", "position_encoding"):
            if k in r and r[k] is not None and not isinstance(r[k], str):
                bad(f"{at}.{k}", "a string")
        if "settings" in r:
            st = r["settings"]
            if not isinstance(st, dict):
                bad(f"{at}.settings", "an object")
            if "data" in st and not isinstance(st["data"], str):
                bad(f"{at}.settings.data", "a string")
            if st.get("rope_scaling") is not None and not isinstance(st["rope_scaling"], (str, dict)):
                bad(f"{at}.settings.rope_scaling", "null, a string or an object")
        if "per_length" not in r:
            continue
        if not isinstance(r["per_length"], list):
            bad(f"{at}.per_length", "a list")
        for m, e in enumerate(r["per_length"]):
            where = f"{at}.per_length[{m}]"
            if not isinstance(e, dict):
                bad(where, "an object")
            if "length" in e and not (_is_int(e["length"]) and e["length"] >= 1):
                bad(f"{where}.length", "an integer >= 1")
            for k in ("bits_per_byte", "nats_per_token", "perplexity", "paired_delta_bpb", "accuracy"):
                if e.get(k) is not None and not _is_number(e[k]):
                    bad(f"{where}.{k}", "a number")
            for k, lo in (("bits_per_byte", 0.0), ("nats_per_token", 0.0), ("perplexity", 1.0), ("accuracy", 0.0)):
                if _is_number(e.get(k)) and not e[k] >= lo:  # a loss is never negative
                    bad(f"{where}.{k} = {e[k]}", f"a number >= {lo:g}")
            for k in ("tokens_scored", "windows", "documents"):
                if e.get(k) is not None and not (_is_int(e[k]) and e[k] >= 0):
                    bad(f"{where}.{k}", "an integer >= 0")
            for k in ("ci95", "paired_ci95", "accuracy_ci95"):
                v = e.get(k)
                if v is not None and not (isinstance(v, list) and len(v) == 2 and all(map(_is_number, v))):
                    bad(f"{where}.{k}", "null or two numbers")


def validation_rows(log: list[dict]) -> list[dict]:
    """The evaluation records of a train log, in step order: those with a numeric ``val_loss``
    (nats/token at the training length; ``val_loss_4x`` at 4× it where logged).

    Args: ``log`` as returned by :func:`read_train_log`. Returns [] when nothing was evaluated.
    """
    return [r for r in log if _is_number(r.get("val_loss")) and math.isfinite(r["val_loss"])]


def read_train_log(path: str | os.PathLike) -> list[dict]:
    """The records of a train_log.jsonl (a file, ``.gz`` too, or a checkpoint folder holding
    ``train_log.jsonl`` or, shipped compressed, ``train_log.jsonl.gz``).

    Returns: dicts in file order (step, tokens, loss [nats/token], lr, tokens_per_s, and on
      evaluation steps val_loss, val_loss_4x); [] if there is no log. A last line cut off by
      a run still writing is ignored. Parsed once per process and file state (size, modification
      time, inode); the list is a copy, its dicts are shared: treat them as read-only.
    Raises: CheckpointError naming the line if any other line is not a JSON object.
    """
    p = Path(path)
    if p.is_dir():
        p = p / LOG_FILE if (p / LOG_FILE).exists() or not (p / LOG_FILE_GZ).exists() else p / LOG_FILE_GZ
    state = file_state(p)
    if state is None:
        return []  # no log (or one that vanished): no records
    with _LOGS_LOCK:
        known = _LOGS.get(str(p))
    if known is not None and known[0] == state:
        return list(known[1])
    records = _read_train_log(p)
    with _LOGS_LOCK:
        _LOGS[str(p)] = (state, records)
    return list(records)


#: log path → (its ``file_state``, its checked records): a log is parsed once per process
#: and file state (a 3,700-step log is ~0.1 s to parse and check; the app's pages ask on every rerun)
_LOGS: dict[str, tuple[tuple, list[dict]]] = {}
_LOGS_LOCK = threading.Lock()


def _read_train_log(p: Path) -> list[dict]:
    """:func:`read_train_log` of the file ``p``, parsed and checked. Raises: CheckpointError."""
    try:  # NaN is kept: a diverged run logs its loss as NaN, and readers test isfinite
        records = read_jsonl(p, allow_nonfinite=True, max_bytes=256 << 20)
    except FileFormatError as e:
        raise CheckpointError(str(e)) from e
    for n, rec in enumerate(records, 1):
        for k in LOG_NUMBER_FIELDS:
            if rec.get(k) is not None and not _is_number(rec[k]):
                raise CheckpointError(
                    f"{p}: record {n} has {k} = {str(rec[k])[:40]!r}, not a number; the file is "
                    "not what fireviz writes — restore or delete it"
                )
    return records


@dataclass
class CheckpointInfo:
    """What the app shows about one checkpoint, read from its files without loading weights.

    Attributes:
      name: folder name (or the Hub repo id).
      path: absolute folder path (str).
      source: ``"local"``, ``"hub"`` (then ``repo_id`` is set) or ``"published"`` (a published
        transformers model, read through ``fireviz.checkpoints.hub``: see ``published``).
      config: config.json as a dict.
      position_encoding: the config's encoding name.
      num_parameters: parameters in model.safetensors (tied embeddings counted once).
      seq_len: training length in tokens (bytes).
      training: the config's ``training`` provenance dict (may be empty).
      training_tokens: tokens seen in training (from ``training`` or the log), or None.
      data: a short description of the training data ("" if unknown).
      results: every results JSON in the folder, as ``{file name: parsed JSON}``.
      headline: see :func:`headline_numbers`.
      problems: ``{file name: problem}`` for this checkpoint's files that were refused
        (a results JSON or train log that is not what fireviz writes); they are left out.
      published: for a published model (``source == "published"``), its
        ``fireviz.checkpoints.hub.PublishedModel`` (decoder stack); None for a fireviz checkpoint.
    """

    name: str
    path: str
    source: str
    config: dict
    position_encoding: str
    num_parameters: int
    seq_len: int
    training: dict = field(default_factory=dict)
    training_tokens: int | None = None
    data: str = ""
    results: dict = field(default_factory=dict)
    headline: dict = field(default_factory=dict)
    repo_id: str | None = None
    problems: dict = field(default_factory=dict)
    published: Any = None
    #: a published causal LM whose position encoding has no bias or kernel to read (learned absolute
    #: positions, e.g. GPT-2): evaluated and its attention drawn, not shown on the bias pages
    causal_lm_only: bool = False

    @property
    def is_published(self) -> bool:
        """True for a published model read through ``fireviz.checkpoints.hub`` (position encodings only:
        the bias pages and fit take it, evaluation and training logs do not) or a published causal LM
        (``causal_lm_only``)."""
        return self.published is not None or self.causal_lm_only

    @property
    def is_causal_lm(self) -> bool:
        """True for a published causal LM — a local folder written by transformers, or a Hub id
        whose config.json names a …ForCausalLM (``fireviz.checkpoints.causal_lm``): the whole model
        loads, so it can be evaluated and its attention drawn, besides its position encoding."""
        if not self.is_published:
            return False
        if Path(self.path).is_dir():
            return is_causal_lm_folder(self.path)
        return self.causal_lm_only or bool(getattr(self.published, "causal_lm", False))  # a Hub id

    @property
    def training_seed(self) -> int | None:
        """``train.seed`` the checkpoint was trained with (from ``training.settings``), or None."""
        settings = self.training["settings"] if isinstance(self.training.get("settings"), dict) else {}
        seed = settings.get("seed")
        return seed if isinstance(seed, int) and not isinstance(seed, bool) else None

    @property
    def label(self) -> str:
        """``name (encoding)`` for widgets and legends; ``name (published: family)`` for a published model."""
        if self.is_published:
            family = self.published.config.family if self.published is not None else self.config.get("model_type")
            return f"{self.name} (published: {family})"
        return f"{self.name} ({self.position_encoding})"

    def summary_row(self) -> dict:
        """One row for the checkpoint table: name, encoding, training seed, headline numbers (first,
        so a narrow window shows them), parameters, tokens, progress (see
        :func:`training_progress`), length, data, where the numbers come from."""
        row = {"checkpoint": self.name, "encoding": self.position_encoding, "training seed": self.training_seed}
        row.update({k: v for k, v in self.headline.items() if k != "source"})
        row.update(
            {
                "parameters": self.num_parameters,
                "training tokens": self.training_tokens,
                "progress": training_progress(self.training),
                "training length": self.seq_len,
                "data": self.data,
                "numbers from": self.headline.get("source", ""),
            }
        )
        return row


def training_progress(training: dict) -> str:
    """``"step N / max_steps"`` from the ``training`` provenance dict (``steps`` and
    ``settings.max_steps``), with ``" (interim)"`` when N < max_steps; ``"step N"`` when the
    planned total is unknown; "" when neither is recorded."""
    steps = training.get("steps")
    settings = training["settings"] if isinstance(training.get("settings"), dict) else {}
    total = settings.get("max_steps", training.get("max_steps"))
    if not isinstance(steps, (int, float)):
        return ""
    if not isinstance(total, (int, float)) or total <= 0:
        return f"step {int(steps)}"
    return f"step {int(steps)} / {int(total)}" + (" (interim)" if steps < total else "")


def _describe_data(training: dict) -> str:
    data = training.get("data", training.get("dataset", ""))
    if isinstance(data, dict):
        for k in ("domain", "name", "source", "path"):
            if data.get(k):
                return str(data[k])
        return ", ".join(f"{k}={v}" for k, v in list(data.items())[:2])
    if isinstance(data, list):
        return ", ".join(map(str, data))
    return str(data or training.get("domain", ""))


def training_summary_row(info: CheckpointInfo, log: list[dict], last_steps: int = SUMMARY_STEPS) -> dict:
    """One row for the training-runs table, from the end of a train_log.jsonl.

    Args:
      info: the checkpoint (name, encoding, training length, training seed).
      log: its records as returned by :func:`read_train_log` (may be empty).
      last_steps: how many of the last training records to average (≥ 1).
    Returns: checkpoint, encoding, training seed, training length (tokens), steps, tokens,
      "train loss (last N steps)" = mean of the finite training losses over the last
      ``last_steps`` records ("train loss (last step)" for 1; nats/token), the last validation
      loss at the training length and at 4× it (nats/token; None where the log has no
      evaluation), and "tokens/s (median, last N steps)".
    Raises: ValueError for ``last_steps`` not an integer >= 1.
    """
    if not (isinstance(last_steps, int) and not isinstance(last_steps, bool) and last_steps >= 1):
        raise ValueError(f"last_steps must be an integer >= 1 (got {last_steps!r})")
    train = [r for r in log if isinstance(r.get("loss"), (int, float))][-last_steps:]
    losses = [r["loss"] for r in train if math.isfinite(r["loss"])]
    speed = [r["tokens_per_s"] for r in train if isinstance(r.get("tokens_per_s"), (int, float))]
    span = "last step" if last_steps == 1 else f"last {last_steps} steps"
    last = log[-1] if log else {}
    evals = validation_rows(log)
    return {
        "checkpoint": info.name,
        "encoding": info.position_encoding,
        "training seed": info.training_seed,
        "training length": info.seq_len,
        "steps": last.get("step"),
        "tokens": last.get("tokens"),
        f"train loss ({span})": sum(losses) / len(losses) if losses else None,
        "last val loss": evals[-1]["val_loss"] if evals else None,
        "last val loss @ 4×": evals[-1].get("val_loss_4x") if evals else None,
        "last val loss (random windows)": evals[-1].get("val_loss_random") if evals else None,
        f"tokens/s (median, {span})": statistics.median(speed) if speed else None,
    }


def read_results(path: str | os.PathLike, problems: dict[str, str] | None = None) -> dict[str, Any]:
    """Every results JSON in a checkpoint folder (all ``*.json`` but config.json), by file name.

    Files that cannot be read or fail :func:`check_results` are left out (and untouched);
    with ``problems`` given, each is recorded there as ``{file name: reason}``.
    Returns {} if there are none.
    """
    out = {}
    for f in sorted(Path(path).glob("*.json")):
        if f.name in _NOT_RESULTS:
            continue
        try:
            obj = _read_json(f)
            check_results(obj, str(f))
        except CheckpointError as e:
            if problems is not None:
                problems[f.name] = str(e)
            continue
        out[f.name] = obj
    return out


def _result_entries(results: dict[str, Any], sha256: str | None = None):
    """Yield ``(domain, length in tokens, bits per byte)`` of the checkpoint's own plain numbers in
    ``results`` (a file holds one :func:`fireviz.eval.evaluate` result dict or a list of them):
    rows made on exactly these weights (``checkpoint_sha256`` equal to ``sha256``, when given), in
    a window protocol (``mode`` same_text, else nonoverlapping or sliding — never ``context``, whose
    lengths are context lengths), on the validation split in float32, without zero-shot RoPE
    scaling or a capped FIRE normalizer (evaluation variants, not the checkpoint as trained), and
    no entry that reports an error. Rows are taken in a fixed order whatever the file order
    (same-text last, so it wins where protocols overlap; then by their settings). JSON of any other
    shape is ignored rather than guessed at."""
    rows = []
    for obj in results.values():
        for r in obj if isinstance(obj, list) else [obj]:
            if not (
                isinstance(r, dict) and isinstance(r.get("settings"), dict) and isinstance(r.get("per_length"), list)
            ):
                continue
            st = r["settings"]
            if st.get("rope_scaling") or st.get("normalizer_cap") is not None or st.get("mode") == "context":
                continue
            if st.get("split", "validation") != "validation" or st.get("precision", "float32") != "float32":
                continue  # numbers on training text, or in bf16: not the headline
            if sha256 is not None and r.get("checkpoint_sha256") != sha256:
                continue  # made on other weights (a copied or stale results.json): not this checkpoint's
            rows.append(r)
    rows.sort(
        key=lambda r: (r["settings"].get("mode") == "same_text", json.dumps(r["settings"], sort_keys=True, default=str))
    )
    for r in rows:
        for e in r["per_length"]:
            if (
                isinstance(e, dict)
                and "error" not in e
                and isinstance(e.get("length"), int)
                and not isinstance(e.get("length"), bool)
                and isinstance(e.get("bits_per_byte"), (int, float))
                and math.isfinite(e["bits_per_byte"])
            ):
                yield r["settings"].get("data"), e["length"], float(e["bits_per_byte"])


def headline_numbers(seq_len: int, results: dict[str, Any], log: list[dict], sha256: str | None = None) -> dict:
    """The numbers the home page shows for a checkpoint.

    From its results JSON — only rows made on exactly these weights (``sha256``: the checkpoint's
    identity; rows of other weights are ignored) and only its plain numbers (see
    ``_result_entries``: no capped FIRE, no zero-shot RoPE scaling, no context-use rows) — on
    prose (or the only domain there is): bits per byte at the
    training length ``L`` and at the longest evaluated length up to 8·L, as
    ``{"bpb @ L": ..., "bpb @ 8L": ..., "source": "results"}`` (key names carry the lengths
    in tokens, e.g. ``"bpb @ 512"``). Otherwise from the log: the last ``val_loss`` (nats per
    token) and ``val_loss_4x`` if logged, ``source = "train_log"``. {} if neither exists.
    Values are not rounded: the display formats them (rounding twice turns 1.95054 into 1.950).
    """
    by_domain: dict[Any, dict[int, float]] = {}
    for dom, length, bpb in _result_entries(results, sha256):
        by_domain.setdefault(dom, {})[length] = bpb
    table = by_domain.get("prose") or (next(iter(by_domain.values())) if len(by_domain) == 1 else None)
    if table:
        out: dict[str, Any] = {}
        if seq_len in table:
            out[f"bpb @ {seq_len}"] = table[seq_len]
        longer = [n for n in table if seq_len < n <= 8 * seq_len]
        if longer:
            n = max(longer)
            out[f"bpb @ {n}"] = table[n]
        if out:
            out["source"] = "results" + (" (prose)" if "prose" in by_domain else "")
            return out
    evals = validation_rows(log)
    if evals:
        last = evals[-1]
        out = {"val loss (nats/token)": float(last["val_loss"])}
        if isinstance(last.get("val_loss_4x"), (int, float)):
            out["val loss @ 4L (nats/token)"] = float(last["val_loss_4x"])
        out["source"] = f"train_log step {last.get('step', '?')}"
        return out
    return {}
