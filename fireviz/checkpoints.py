"""Find, describe and load checkpoints: one place for the app, the CLI and scripts.

A checkpoint is a folder holding ``config.json`` (a ``GPTConfig``, with the trainer's
``training`` provenance dict) and ``model.safetensors``, optionally ``train_log.jsonl``
(one JSON object per logged step: step, tokens, loss [nats/token], lr, tokens_per_s, and
val_loss / val_loss_4x on evaluation steps), results JSON files and a README.md model card.

Where checkpoints come from:
  * the checkpoints root: ``$FIREVIZ_CHECKPOINTS_DIR`` if set, else ``<repo>/checkpoints``;
    every sub-folder with config.json + model.safetensors is one checkpoint;
  * any local folder with those two files;
  * a Hugging Face Hub repo id (``owner/name``), downloaded into the Hub cache.

Nothing here imports Streamlit; nothing here unpickles (weights are safetensors only).
"""

from __future__ import annotations

import math
import os
import re
import struct
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .run_records import (
    CONFIG_FILE,
    LOG_FILE,
    LOG_FILE_GZ,
    LOG_NUMBER_FIELDS,  # noqa: F401
    WEIGHTS_FILE,
    _is_number,
    _read_json,
    headline_numbers,
    read_results,
    read_train_log,
)
from .files import FileFormatError, check_safetensors_header, parse_json, read_json, sha256_files
from .model import GPT, CheckpointError
from .model_state import config_from_dict


class CheckpointNotFoundError(CheckpointError):
    """No checkpoint at a path: it does not exist, or lacks config.json / model.safetensors.
    The app shows one message for all of these, so it does not reveal which server paths exist."""


#: Environment variable naming the folder whose sub-folders are the checkpoints.
CHECKPOINTS_ENV = "FIREVIZ_CHECKPOINTS_DIR"
REPO_ROOT = Path(__file__).resolve().parent.parent
#: Files fetched from a Hub repo (never pickles: no *.bin, *.pt).
HUB_PATTERNS = [CONFIG_FILE, WEIGHTS_FILE, LOG_FILE, LOG_FILE_GZ, "*.json", "README.md"]
_HUB_ID = re.compile(r"^[A-Za-z0-9][\w.-]*/[\w.-]+$")
#: Command that creates a checkpoint, shown when none is found.
TRAIN_HINT = (
    "python -m fireviz train --config configs/tiny.toml --set model.position_encoding=<encoding> "
    "--out checkpoints/my_run"
)
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


def seed0_first(names: list[str]) -> list[str]:
    """``names`` with every extra-seed run (see :func:`seed_run`) moved after the others,
    order otherwise kept: a default selection of the first N then shows N encodings."""
    return [n for n in names if seed_run(n) is None] + [n for n in names if seed_run(n) is not None]


@dataclass
class CheckpointInfo:
    """What the app shows about one checkpoint, read from its files without loading weights.

    Attributes:
      name: folder name (or the Hub repo id).
      path: absolute folder path (str).
      source: ``"local"`` or ``"hub"`` (then ``repo_id`` is set).
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
        ``fireviz.hub.PublishedModel`` (decoder stack); None for a fireviz checkpoint.
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

    @property
    def is_published(self) -> bool:
        """True for a published model read through ``fireviz.hub`` (position encodings only:
        the bias pages and fit take it, evaluation and training logs do not)."""
        return self.published is not None

    @property
    def training_seed(self) -> int | None:
        """``train.seed`` the checkpoint was trained with (from ``training.settings``), or None."""
        settings = self.training.get("settings") if isinstance(self.training.get("settings"), dict) else {}
        seed = settings.get("seed")
        return seed if isinstance(seed, int) and not isinstance(seed, bool) else None

    @property
    def label(self) -> str:
        """``name (encoding)`` for widgets and legends; ``name (published: family)`` for a published model."""
        if self.is_published:
            return f"{self.name} (published: {self.published.config.family})"
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
    settings = training.get("settings") if isinstance(training.get("settings"), dict) else {}
    total = settings.get("max_steps", training.get("max_steps"))
    if not isinstance(steps, (int, float)):
        return ""
    if not isinstance(total, (int, float)) or total <= 0:
        return f"step {int(steps)}"
    return f"step {int(steps)} / {int(total)}" + (" (interim)" if steps < total else "")


def checkpoints_root() -> Path:
    """The folder whose sub-folders are the checkpoints: ``$FIREVIZ_CHECKPOINTS_DIR`` or ``<repo>/checkpoints``."""
    env = os.environ.get(CHECKPOINTS_ENV)
    if not env:
        return REPO_ROOT / "checkpoints"
    try:
        return Path(env).expanduser().resolve()
    except (OSError, RuntimeError):  # a symlink loop: the path as given (scanning it finds nothing)
        return Path(env).expanduser()


def is_checkpoint_dir(path: str | os.PathLike) -> bool:
    """True if ``path`` is a folder holding config.json and model.safetensors."""
    p = Path(path)
    return p.is_dir() and (p / CONFIG_FILE).is_file() and (p / WEIGHTS_FILE).is_file()


def checkpoint_groups(root: str | os.PathLike | None = None) -> dict[str, Path]:
    """The groups of checkpoints under ``root`` (default :func:`checkpoints_root`), by name.

    ``""`` is the root itself (its direct checkpoint folders: the bundled prose models); every
    other group is a sub-folder that is not itself a checkpoint but holds checkpoint folders
    directly (e.g. ``checkpoints/copy``, the synthetic copy-task models). A group has its own
    tables and defaults: its models are never listed or compared with another group's.
    Returns: ``{name: folder}``, the root first, then sub-folders by name; ``{"": root}`` when
    there are no sub-groups (also when root does not exist).
    """
    root = Path(root) if root is not None else checkpoints_root()
    groups = {"": root}
    try:
        subs = sorted(p for p in root.iterdir() if p.is_dir()) if root.is_dir() else []
    except OSError:
        return groups  # an unreadable root: no groups (the scan reports it)
    for sub in subs:
        try:
            if not is_checkpoint_dir(sub) and any(is_checkpoint_dir(c) for c in sub.iterdir() if c.is_dir()):
                groups[sub.name] = sub
        except OSError:
            continue  # an unreadable folder is not a group
    return groups


def list_checkpoints(root: str | os.PathLike | None = None) -> list[CheckpointInfo]:
    """Every checkpoint folder directly under ``root`` (default :func:`checkpoints_root`), by name.

    Folders that look like checkpoints but cannot be read are skipped (``checkpoint_problems``
    lists them with the reason). Returns [] if ``root`` does not exist.
    """
    infos, _ = scan_checkpoints(root)
    return infos


def scan_checkpoints(root: str | os.PathLike | None = None) -> tuple[list[CheckpointInfo], dict[str, str]]:
    """Like :func:`list_checkpoints`, also returning ``{folder: problem}`` for unreadable ones."""
    root = Path(root) if root is not None else checkpoints_root()
    infos, problems = [], {}
    try:
        if not root.is_dir():
            return infos, problems
        subs = sorted(p for p in root.iterdir() if p.is_dir())
    except OSError as e:
        return infos, {str(root): f"cannot read the folder ({e.strerror or e}); check its permissions"}
    for sub in subs:
        try:
            if not (sub / CONFIG_FILE).exists() and not (sub / WEIGHTS_FILE).exists():
                continue  # not meant to be a checkpoint (e.g. a cache folder, a group)
            infos.append(read_checkpoint(sub))
        except CheckpointError as e:
            problems[str(sub)] = str(e)
        except OSError as e:  # e.g. a folder this user may not read: skipped, said once
            problems[str(sub)] = f"cannot read the folder ({e.strerror or e}); check its permissions"
    return infos, problems


def count_parameters(weights: str | os.PathLike) -> int:
    """Parameters stored in a safetensors file, from its header alone (no tensor is read).

    Tied weights are stored once in safetensors, so they are counted once.
    Raises: CheckpointError if the header is unreadable or the file is shorter than the
      header says (a truncated copy or download).
    """
    try:
        size = os.path.getsize(weights)
        with open(weights, "rb") as f:
            (n,) = struct.unpack("<Q", f.read(8))
            if n > 100_000_000:
                raise ValueError(f"header length {n} is implausible")
            header = parse_json(f.read(n).decode("utf-8"), f"the header of {weights}")
        entries = check_safetensors_header(header, size - 8 - n, str(weights))
    except FileFormatError as e:
        fix = "copy, download or train the checkpoint again"
        raise CheckpointError(
            f"{e}; {fix}" if "truncated" in str(e) else f"{weights} is not a readable safetensors file ({e}); {fix}"
        ) from e
    except (OSError, struct.error, ValueError, UnicodeDecodeError) as e:
        raise CheckpointError(
            f"{weights} is not a readable safetensors file ({e}); copy, download or train the checkpoint again"
        ) from e
    return int(sum(math.prod(v["shape"]) for v in entries.values()))


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


def read_checkpoint(path: str | os.PathLike, name: str | None = None, repo_id: str | None = None) -> CheckpointInfo:
    """Describe the checkpoint folder ``path`` from its files (weights are not loaded).

    Returns: a :class:`CheckpointInfo`.
    Raises: CheckpointError if config.json or model.safetensors is missing or unreadable,
      naming the file and what to do.
    """
    p = Path(path).expanduser().resolve()
    if not p.is_dir():
        raise CheckpointNotFoundError(
            f"checkpoint folder {p} does not exist; give a folder holding "
            f"{CONFIG_FILE} and {WEIGHTS_FILE}, or a Hugging Face repo id (owner/name)"
        )
    for f in (CONFIG_FILE, WEIGHTS_FILE):
        if not (p / f).is_file():
            raise CheckpointNotFoundError(
                f"{p} has no {f}: not a fireviz checkpoint folder (create one with {TRAIN_HINT})"
            )
    config = _read_json(p / CONFIG_FILE)
    config_from_dict(config, str(p / CONFIG_FILE))  # every field that changes the numbers, well typed
    training = config.get("training") if isinstance(config.get("training"), dict) else {}
    problems: dict[str, str] = {}
    try:
        log = read_train_log(p)
    except CheckpointError as e:  # a broken log costs the log, not the checkpoint
        log, problems[LOG_FILE] = [], str(e)
    results = read_results(p, problems)
    tokens = None
    for k in ("tokens", "tokens_seen", "training_tokens", "total_tokens"):
        v = training.get(k)
        if _is_number(v) and 0 <= v < 1e15:  # a token count (1e15 is far beyond any run)
            tokens = int(v)
            break
    if tokens is None:
        logged = [r["tokens"] for r in log if _is_number(r.get("tokens")) and 0 <= r["tokens"] < 1e15]
        tokens = int(logged[-1]) if logged else None
    seq_len = int(config.get("seq_len", 0))
    return CheckpointInfo(
        name=name or p.name,
        path=str(p),
        source="hub" if repo_id else "local",
        config=config,
        position_encoding=str(config["position_encoding"]),
        num_parameters=count_parameters(p / WEIGHTS_FILE),
        seq_len=seq_len,
        training=training,
        training_tokens=tokens,
        data=_describe_data(training),
        results=results,
        headline=headline_numbers(seq_len, results, log),
        repo_id=repo_id,
        problems=problems,
    )


def looks_like_hub_id(ref: str) -> bool:
    """True if ``ref`` has the shape of a Hub repo id (``owner/name``) and is not a local path
    (see ``fireviz.hub.looks_like_hub_id``: one rule for the app, the CLI and the library)."""
    from .hub import looks_like_hub_id as rule

    return rule(ref)


def resolve_checkpoint(
    ref: str, root: str | os.PathLike | None = None, local_files_only: bool = False
) -> CheckpointInfo:
    """Find a checkpoint by name under the root, local folder path, or Hub repo id.

    Order: a folder name under ``root`` (default :func:`checkpoints_root`), then an existing
    local path, then a Hub repo id (downloads config.json, model.safetensors, train_log.jsonl,
    results JSON and README.md into the Hub cache; never pickles).
    Returns: the :class:`CheckpointInfo` of the local folder.
    Raises: CheckpointError with the reason and the fix: not found, not a checkpoint folder,
      or the Hub could not be reached (offline) / has no such repo.
    """
    ref = (ref or "").strip()
    if not ref:
        raise CheckpointError(
            "no checkpoint given; pick one from the list, or type a folder path or a Hugging Face repo id (owner/name)"
        )
    root = Path(root) if root is not None else checkpoints_root()
    if "/" not in ref and (root / ref).is_dir():
        return read_checkpoint(root / ref)
    local = Path(ref).expanduser()
    if local.is_dir() and _is_transformers_folder(local):
        return published_info(str(local))
    if local.exists():
        return read_checkpoint(local)
    if looks_like_hub_id(ref) and not local_files_only:
        from . import hub

        try:
            return published_info(ref)
        except hub.NotPublishedModelError:
            pass  # a fireviz checkpoint on the Hub: fetched below
        # any other HubModelError (offline, no such repo, gated) is the answer, said as the CLI says it
    if not looks_like_hub_id(ref):
        raise CheckpointNotFoundError(
            f"{ref!r} is neither a checkpoint under {root}, an existing folder, nor a "
            "Hugging Face repo id of the form owner/name; check the spelling or the path"
        )
    from huggingface_hub import snapshot_download

    try:
        folder = snapshot_download(repo_id=ref, allow_patterns=HUB_PATTERNS, local_files_only=local_files_only)
    except Exception as e:  # offline, unknown repo, gated repo, rate limit: all end the same way
        kind = type(e).__name__
        msg = str(e).splitlines()[0] if str(e) else kind
        if (
            "connect" in str(e).lower()
            or "internet" in str(e).lower()
            or kind in ("LocalEntryNotFoundError", "ConnectionError", "ConnectError")
        ):
            raise CheckpointError(
                f"cannot download {ref!r} from the Hugging Face Hub: no connection ({msg}). "
                "Connect to the internet, or download the repo elsewhere and give its local "
                "folder instead"
            ) from e
        raise CheckpointError(
            f"cannot download {ref!r} from the Hugging Face Hub ({kind}: {msg}); "
            "check the repo id and your access to it"
        ) from e
    return read_checkpoint(folder, name=ref, repo_id=ref)


def _is_transformers_folder(folder: Path) -> bool:
    from . import hub

    try:
        return (
            hub.is_transformers_config(read_json(folder / CONFIG_FILE)) if (folder / CONFIG_FILE).is_file() else False
        )
    except FileFormatError:
        return False


def published_info(ref: str, stack: str = "decoder", revision: str | None = None) -> CheckpointInfo:
    """A :class:`CheckpointInfo` for a published model (a transformers folder or a Hub id), read
    through ``fireviz.hub.load_published`` (config.json, and for T5-family models the bias
    tables only). Raises: ``fireviz.hub.HubModelError`` (a CheckpointError) naming the problem."""
    from . import hub

    model = hub.load_published(ref, stack=stack, revision=revision)
    c = model.config
    return CheckpointInfo(
        name=ref if not Path(ref).expanduser().is_dir() else Path(ref).name,
        path=str(Path(ref).expanduser().resolve()) if Path(ref).expanduser().is_dir() else ref,
        source="published",
        config={
            "n_layer": c.n_layer,
            "n_head": c.n_head,
            "seq_len": c.seq_len,
            "position_encoding": c.position_encoding,
            "family": c.family,
            "model_type": c.model_type,
            "revision": c.revision,
            "stack": c.stack,
        },
        position_encoding=c.position_encoding,
        num_parameters=0,
        seq_len=c.seq_len,
        data="(published model)",
        repo_id=ref if hub.looks_like_hub_id(ref) else None,
        published=model,
    )


_FINGERPRINTS: dict[tuple, str] = {}


def checkpoint_files(checkpoint: str | os.PathLike) -> tuple[Path, Path]:
    """``(config.json, model.safetensors)`` of a checkpoint folder, or of a fireviz checkpoint
    on the Hugging Face Hub (``owner/name``, :func:`looks_like_hub_id`; fetched into the
    huggingface_hub cache).

    Raises: CheckpointNotFoundError (a CheckpointError) if there is no such folder or repo;
      CheckpointError if either file is missing or cannot be fetched.
    """
    path = Path(checkpoint)
    if path.is_dir():
        files = path / CONFIG_FILE, path / WEIGHTS_FILE
        missing = [f.name for f in files if not f.is_file()]
        if missing:
            raise CheckpointError(
                f"checkpoint {checkpoint} has no {' or '.join(missing)}: not a fireviz checkpoint "
                "folder (save one with GPT.save_pretrained or `python -m fireviz train`)"
            )
        return files
    name = str(checkpoint)
    if not looks_like_hub_id(name):  # a path under an existing folder (checkpoints/typo) is a local path
        raise CheckpointNotFoundError(
            f"checkpoint {checkpoint} not found: give a folder holding config.json and "
            "model.safetensors (or a Hugging Face repo id owner/name)"
        )
    from huggingface_hub import hf_hub_download

    try:
        return tuple(Path(hf_hub_download(repo_id=name, filename=f)) for f in (CONFIG_FILE, WEIGHTS_FILE))
    except Exception as e:  # network, auth, 404, bad repo id: all mean "cannot load"
        raise CheckpointError(
            f"checkpoint {checkpoint} is not a local folder and could not be fetched from the "
            f"Hugging Face Hub ({type(e).__name__}: {e})"
        ) from e


def checkpoint_sha256(checkpoint: str | os.PathLike) -> str:
    """The identity of a checkpoint: sha256 (hex) of ``model.safetensors`` followed by
    ``config.json`` bytes (the evaluation and dilution caches' key, the jobs' key, results'
    ``checkpoint_sha256``), memoized per file state. Raises: CheckpointError as :func:`checkpoint_files`."""
    config, weights = checkpoint_files(checkpoint)
    try:  # memoized per (file, modification time, size) of both: asking again is free
        memo = tuple((str(f.resolve()), st.st_mtime_ns, st.st_size) for f in (weights, config) for st in (f.stat(),))
        if memo not in _FINGERPRINTS:
            _FINGERPRINTS[memo] = sha256_files(weights, config)
    except OSError as e:
        raise CheckpointError(f"cannot read {weights} or {config}: {e}") from e
    return _FINGERPRINTS[memo]


def load_model(path: str | os.PathLike, device: str = "cpu") -> GPT:
    """Load the GPT of a checkpoint folder (or a fireviz checkpoint's Hub id) through
    safetensors only (never pickle, strict), on ``device``, in eval mode. The one loader:
    evaluation, analysis, fitting and the app all call it.

    Raises: CheckpointError (CheckpointNotFoundError when there is nothing there) for a
      missing, corrupt or inconsistent checkpoint; never another exception type for bad files.
    """
    config, _ = checkpoint_files(path)
    try:
        model = GPT.from_pretrained(str(config.parent), map_location=device)
    except CheckpointError:
        raise
    except (OSError, ValueError, TypeError, KeyError) as e:
        raise CheckpointError(f"checkpoint {path} does not load: {type(e).__name__}: {e}") from e
    return model.to(device).eval()


def load_model_or_published(ref: str, stack: str = "decoder", revision: str | None = None):
    """A fireviz checkpoint (GPT) or a published model's position encodings (``hub.PublishedModel``):
    a folder whose config.json names ``model_type`` or a repo id not on disk is read through
    ``fireviz.hub``; everything else is a fireviz checkpoint (:func:`load_model`).
    Raises: CheckpointError (``hub.HubModelError`` for a published one) naming the problem."""
    from . import hub

    folder = Path(ref).expanduser()
    cfg = folder / "config.json"
    if folder.is_dir() and cfg.is_file():
        try:
            published = hub.is_transformers_config(read_json(cfg))
        except ValueError:
            published = False  # let the checkpoint loader name the problem
        if published:
            return hub.load_published(str(folder), stack=stack)
        return load_model(folder)
    if hub.looks_like_hub_id(ref):
        try:
            return hub.load_published(ref, stack=stack, revision=revision)
        except hub.NotPublishedModelError:  # a fireviz checkpoint on the Hub
            pass
    return load_model(ref)


def default_device() -> str:
    """``"cuda"`` when a GPU is visible to torch, else ``"cpu"``."""
    import torch

    return "cuda" if torch.cuda.is_available() else "cpu"
