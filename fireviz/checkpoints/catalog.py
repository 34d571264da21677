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

A checkpoint's identity is :func:`checkpoint_sha256` (its weights and config bytes);
``fireviz.checkpoints.checkpoint.Checkpoint`` is a checkpoint resolved once (identity, checked
config) and loads exactly the bytes it hashed; :func:`checked_config` is the config with the
weights' header checked against it (no tensor read).
Nothing here imports Streamlit; nothing here unpickles (weights are safetensors only).
"""

from __future__ import annotations

import dataclasses
import math
import os
import re
import struct
import threading
from pathlib import Path
from typing import BinaryIO

from fireviz.checkpoints import hub
from fireviz.checkpoints.causal_lm import CausalLMCheckpoint, is_causal_lm_folder, is_gguf_file

# one rule for a Hub repo id and one Hub download for the app, the CLI and the library
from fireviz.checkpoints.hub import download_checkpoint, looks_like_hub_id

# the naming of extra-seed runs (``fire_seed1``), which the pages and scripts import from here
from fireviz.checkpoints.records import (  # noqa: F401
    CONFIG_FILE,
    LOG_FILE,
    LOG_FILE_GZ,
    SEED_FOLDER,
    WEIGHTS_FILE,
    CheckpointInfo,
    _describe_data,
    _is_number,
    _read_json,
    headline_numbers,
    read_results,
    read_train_log,
    seed0_first,
    seed_base,
    seed_groups,
    seed_run,
)
from fireviz.core import (
    FileFormatError,
    check_safetensors_header,
    file_state,
    parse_json,
    read_json,
    sha256_files,
)
from fireviz.model import GPT, CheckpointError, GPTConfig, config_from_dict, nonfinite_tensors


class CheckpointNotFoundError(CheckpointError):
    """No checkpoint at a path: it does not exist, or lacks config.json / model.safetensors.
    The app shows one message for all of these, so it does not reveal which server paths exist."""


#: Environment variable naming the folder whose sub-folders are the checkpoints.
CHECKPOINTS_ENV = "FIREVIZ_CHECKPOINTS_DIR"
REPO_ROOT = Path(__file__).resolve().parents[2]
#: Files fetched from a Hub repo (never pickles: no *.bin, *.pt).
HUB_PATTERNS = [CONFIG_FILE, WEIGHTS_FILE, LOG_FILE, LOG_FILE_GZ, "*.json", "README.md"]
_HUB_ID = re.compile(r"^[A-Za-z0-9][\w.-]*/[\w.-]+$")
#: Command that creates a checkpoint, shown when none is found.
TRAIN_HINT = (
    "python -m fireviz train --config configs/tiny.toml --set model.position_encoding=<encoding> "
    "--out checkpoints/my_run"
)


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
            if group_members(sub):
                groups[sub.name] = sub
        except OSError:
            continue  # an unreadable folder is not a group
    return groups


def group_members(folder: Path) -> list[str]:
    """The names of the checkpoint folders directly inside ``folder``, sorted, when ``folder`` is
    a checkpoint group (a folder that is not itself a checkpoint, e.g. ``checkpoints/copy``); []
    otherwise. Raises: OSError for a folder that cannot be listed."""
    if not folder.is_dir() or is_checkpoint_dir(folder):
        return []
    return sorted(c.name for c in folder.iterdir() if is_checkpoint_dir(c))


def list_checkpoints(root: str | os.PathLike | None = None) -> list[CheckpointInfo]:
    """Every checkpoint folder directly under ``root`` (default :func:`checkpoints_root`), by name.

    Folders that look like checkpoints but cannot be read are skipped (:func:`scan_checkpoints`
    lists them with the reason). Returns [] if ``root`` does not exist.
    """
    infos, _ = scan_checkpoints(root)
    return infos


def scan_checkpoints(root: str | os.PathLike | None = None) -> tuple[list[CheckpointInfo], dict[str, str]]:
    """Like :func:`list_checkpoints`, also returning ``{folder: problem}`` for unreadable ones."""
    root = Path(root) if root is not None else checkpoints_root()
    infos: list[CheckpointInfo] = []
    problems: dict[str, str] = {}
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


#: Largest safetensors header read (bytes): thousands of tensors fit in far less; a bigger one is
#: metadata stuffing, refused before it is read (issue #38).
MAX_SAFETENSORS_HEADER = 2 << 20  # a 1,000-tensor model's header is ~150 KB


def _safetensors_entries(f: BinaryIO, size: int, source: str) -> dict[str, dict]:
    """The checked header entries of the safetensors file open as ``f`` (``size`` bytes long), read
    from its header alone. Raises: CheckpointError if the header is unreadable or the file is
    shorter than the header says (a truncated copy or download)."""
    fix = "copy, download or train the checkpoint again"
    try:
        (n,) = struct.unpack("<Q", f.read(8))
        if n > MAX_SAFETENSORS_HEADER:  # a fireviz header is a few KB; metadata cannot make it huge
            raise ValueError(
                f"its header is {n:,} bytes, more than the {MAX_SAFETENSORS_HEADER:,} a checkpoint's tensor list needs"
            )
        header = parse_json(f.read(n).decode("utf-8"), f"the header of {source}")
        return check_safetensors_header(header, size - 8 - n, source)
    except FileFormatError as e:
        raise CheckpointError(
            f"{e}; {fix}" if "truncated" in str(e) else f"{source} is not a readable safetensors file ({e}); {fix}"
        ) from e
    except (OSError, struct.error, ValueError, UnicodeDecodeError) as e:
        raise CheckpointError(f"{source} is not a readable safetensors file ({e}); {fix}") from e


def _weights_header(weights: Path) -> dict[str, dict]:
    """:func:`_safetensors_entries` of the file ``weights``. Raises: CheckpointError."""
    try:
        with open(weights, "rb") as f:
            return _safetensors_entries(f, os.fstat(f.fileno()).st_size, str(weights))
    except OSError as e:
        raise CheckpointError(
            f"{weights} is not a readable safetensors file ({e}); copy, download or train the checkpoint again"
        ) from e


def count_parameters(weights: str | os.PathLike) -> int:
    """Parameters stored in a safetensors file, from its header alone (no tensor is read).

    Tied weights are stored once in safetensors, so they are counted once.
    Raises: CheckpointError if the header is unreadable or the file is shorter than the
      header says (a truncated copy or download).
    """
    entries = _weights_header(Path(weights))
    return int(sum(math.prod(v["shape"]) for v in entries.values()))


#: (folder, name, repo id) → (the folder's file state, its CheckpointInfo): what :func:`read_checkpoint`
#: derived, kept until a file of the folder changes (one entry per folder, replaced on change)
_INFOS: dict[tuple[str, str | None, str | None], tuple[tuple, CheckpointInfo]] = {}
_INFOS_LOCK = threading.Lock()


def read_checkpoint(path: str | os.PathLike, name: str | None = None, repo_id: str | None = None) -> CheckpointInfo:
    """Describe the checkpoint folder ``path`` from its files (weights are not loaded).

    Read once per process and folder state: a second call for a folder whose files (names, sizes,
    modification times) are unchanged costs one ``stat`` per file and returns a copy of the first
    answer; any change (a trainer's next checkpoint, a new results file) reads the folder again
    (issue #48: a page's checkpoint scan cost 22 s, re-paid every 5 s).

    Returns: a :class:`CheckpointInfo` (a shallow copy: treat its dicts as read-only).
    Raises: CheckpointError if config.json or model.safetensors is missing or unreadable,
      naming the file and what to do.
    """
    p = _local_path(path)
    _folder_files(p, path)
    # a symlinked folder is named by its link, not its target: a link to another "fire" must not
    # appear as a second "fire" (issue #38); "." and the like fall back to the folder's own name
    own_name = Path(os.path.abspath(p)).name
    p = p.resolve()
    memo_key = (str(p), name or own_name, repo_id)
    state = file_state(p)
    with _INFOS_LOCK:
        known = _INFOS.get(memo_key)
    if state is not None and known is not None and known[0] == state:
        return dataclasses.replace(known[1])
    info = _read_checkpoint(p, name or own_name, repo_id)
    if state is not None:
        with _INFOS_LOCK:
            _INFOS[memo_key] = (state, info)
    return dataclasses.replace(info)


def _read_checkpoint(p: Path, name: str, repo_id: str | None) -> CheckpointInfo:
    """:func:`read_checkpoint` of the resolved folder ``p``, read from its files. Raises: CheckpointError."""
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
    num_parameters = count_parameters(p / WEIGHTS_FILE)  # the header checked (size, entries) before any tensor is read
    sha256 = _files_sha256(p / CONFIG_FILE, p / WEIGHTS_FILE)
    unusable = _unusable_weights(p, config, sha256)
    if unusable:  # no number describes these weights: not its results', not its training log's
        problems[WEIGHTS_FILE] = (
            f"{unusable}, so no number is shown for it (its results and training log describe other weights); "
            "restore or retrain it"
        )
    return CheckpointInfo(
        name=name or p.name,
        path=str(p),
        source="hub" if repo_id else "local",
        config=config,
        position_encoding=str(config["position_encoding"]),
        num_parameters=num_parameters,
        seq_len=seq_len,
        training=training,
        training_tokens=tokens,
        data=_describe_data(training),
        results=results,
        # only numbers made on exactly these weights (a results.json copied from elsewhere shows none)
        headline={} if unusable else headline_numbers(seq_len, results, log, sha256),
        repo_id=repo_id,
        problems=problems,
    )


def resolve_checkpoint(
    ref: str, root: str | os.PathLike | None = None, local_files_only: bool = False
) -> CheckpointInfo:
    """Find a checkpoint by name under the root, local folder path, or Hub repo id.

    Order: an existing local path (as every other door takes a reference), then a folder name
    under ``root`` (default :func:`checkpoints_root`; ``group/name`` for a checkpoint group's
    folder such as ``copy/fire``), then a Hub repo id (downloads config.json, model.safetensors, train_log.jsonl[.gz],
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
    local = Path(ref).expanduser()
    if local.is_dir() and _is_transformers_folder(local):
        return published_info(str(local))
    if is_gguf_file(local):  # a GGUF file (llama.cpp): a published causal LM, run whole
        return _causal_lm_only_info(CausalLMCheckpoint.resolve(local))
    if local.exists():  # an existing path first, as every other door takes it (_local_path)
        return read_checkpoint(local)
    if "/" not in ref and not _spelled_as_path(ref) and (root / ref).is_dir():
        return read_checkpoint(root / ref)
    grouped = _group_folder(ref, root)
    if grouped is not None:
        return read_checkpoint(grouped)
    if not looks_like_hub_id(ref):
        raise _not_found(ref, root)
    try:
        if not local_files_only:
            try:
                return published_info(ref)
            except hub.NotPublishedModelError:
                pass  # a fireviz checkpoint on the Hub: fetched below
            # any other HubModelError (offline, no such repo, gated) is the answer, said as the CLI says it
        folder = download_checkpoint(ref, HUB_PATTERNS, local_files_only=local_files_only)
    except CheckpointError as e:
        raise _as_missing_path(ref, e, root) from None
    return read_checkpoint(folder, name=ref, repo_id=ref)


def _as_missing_path(ref: str, e: CheckpointError, root: Path | None = None) -> CheckpointError:
    """The Hub's error for ``ref``, led by what a new user meant when its last part names a bundled
    checkpoint (``checkpoints/fire`` typed outside the repository: a path, not a Hub id)."""
    bundled = _bundled_meant(ref, root if root is not None else checkpoints_root())
    if bundled is None:
        return e
    message = (
        f"no folder {ref!r} under {Path.cwd()}, so it was taken as a Hugging Face Hub id: {e}. "
        f"The bundled checkpoint of that name is {bundled!r} (a name works from any folder)"
    )
    try:  # the same kind of error (callers tell a missing repo from an unreachable Hub by it)
        return type(e)(message)
    except TypeError:
        return CheckpointError(message)


def _is_transformers_folder(folder: Path) -> bool:

    try:
        return (
            hub.is_transformers_config(read_json(folder / CONFIG_FILE)) if (folder / CONFIG_FILE).is_file() else False
        )
    except FileFormatError:
        return False


def published_info(ref: str, stack: str = "decoder", revision: str | None = None) -> CheckpointInfo:
    """A :class:`CheckpointInfo` for a published model (a transformers folder or a Hub id), read
    through ``fireviz.checkpoints.hub.load_published`` (config.json, and for T5-family models the bias
    tables only). Raises: ``fireviz.checkpoints.hub.HubModelError`` (a CheckpointError) naming the problem."""

    try:
        model = hub.load_published(ref, stack=stack, revision=revision)
    except hub.HubModelError as e:
        local = Path(ref).expanduser()
        if local.is_dir() and is_causal_lm_folder(local):
            return _causal_lm_only_info(CausalLMCheckpoint.resolve(local))  # no bias to read; it still runs whole
        if local.exists() or not looks_like_hub_id(ref) or "absolute position" not in str(e):
            raise
        try:  # a Hub causal LM whose positions are learned (GPT-2): fetched whole, it still runs
            return _causal_lm_only_info(CausalLMCheckpoint.resolve(ref))
        except CheckpointError:
            raise e from None
    c = model.config
    in_folder = Path(ref).expanduser().is_dir()
    return _published_record(
        Path(ref).name if in_folder else ref,
        str(Path(ref).expanduser().resolve()) if in_folder else ref,
        ref if hub.looks_like_hub_id(ref) else None,
        c,
        {"family": c.family, "revision": c.revision, "stack": c.stack},
        published=model,
    )


def _published_record(name: str, path: str, repo_id: str | None, c, extra: dict, **fields) -> CheckpointInfo:
    """The :class:`CheckpointInfo` of a published model: ``c`` its config (``n_layer``, ``n_head``,
    ``seq_len``, ``position_encoding``, ``model_type``), ``extra`` more config entries, ``fields``
    the record's own (``published`` or ``causal_lm_only``)."""
    return CheckpointInfo(
        name=name,
        path=path,
        repo_id=repo_id,
        source="published",
        config={
            "n_layer": c.n_layer,
            "n_head": c.n_head,
            "seq_len": c.seq_len,
            "position_encoding": c.position_encoding,
            "model_type": c.model_type,
            **extra,
        },
        position_encoding=c.position_encoding,
        num_parameters=0,
        seq_len=c.seq_len,
        data="(published model)",
        **fields,
    )


def _causal_lm_only_info(ckpt: CausalLMCheckpoint) -> CheckpointInfo:
    """A :class:`CheckpointInfo` for a published causal LM whose position encoding
    ``fireviz.checkpoints.hub`` cannot read as a bias (learned absolute positions): what
    ``CausalLMCheckpoint`` reads of its config (a folder: its absolute path; a Hub id as given)."""
    where = ckpt.folder / ckpt.gguf_file if ckpt.gguf_file else ckpt.folder
    return _published_record(
        ckpt.path if ckpt.repo_id else where.name,
        ckpt.path if ckpt.repo_id else str(where.resolve()),
        ckpt.repo_id,
        ckpt.config,
        {"family": ckpt.config.model_type},
        causal_lm_only=True,
    )


_FINGERPRINTS: dict[tuple, str] = {}


def _local_path(checkpoint: str | os.PathLike) -> Path:
    """The local path a checkpoint reference names: the path itself (``~`` expanded) when it
    exists, else for a bare name (``fire``) that folder under :func:`checkpoints_root`, as
    :func:`resolve_checkpoint` takes it, or for ``group/name`` (``copy/fire``) a checkpoint
    group's folder there, else the path as given (which does not exist).
    Raises: CheckpointError for a reference that is not a path or a string."""
    if not isinstance(checkpoint, (str, os.PathLike)) or not str(checkpoint).strip() or "\0" in str(checkpoint):
        raise CheckpointError(
            f"a checkpoint is a folder path, a checkpoint name or a Hugging Face repo id (owner/name), "
            f"not {checkpoint!r}"
        )
    path = Path(checkpoint).expanduser()
    if not path.exists() and len(path.parts) == 1 and not _spelled_as_path(checkpoint):
        named = checkpoints_root() / path.name
        if named.is_dir():
            return named
    grouped = None if path.exists() else _group_folder(checkpoint, checkpoints_root())
    return grouped if grouped is not None else path


def _group_folder(ref: str | os.PathLike, root: Path) -> Path | None:
    """``root/group/name`` for a reference ``group/name`` (``copy/fire``) naming a checkpoint
    group's folder under ``root`` (one holding config.json), else None. Never leaves ``root``.
    Callers look for a local path ``ref`` first.
    Raises: CheckpointNotFoundError for a name the group lacks (``copy/fier``): answered here,
    naming the group's checkpoints, not sent to the Hub."""
    rel = Path(ref)
    if len(rel.parts) != 2 or ".." in rel.parts or _spelled_as_path(ref):
        return None
    folder = root / rel
    if (folder / CONFIG_FILE).is_file():
        return folder
    if members := group_members(root / rel.parts[0]):
        raise CheckpointNotFoundError(
            f"checkpoint {str(ref)!r} not found: the checkpoint group {rel.parts[0]!r} under {root} has no "
            f"{rel.parts[1]!r}; it holds {', '.join(members)} (check the spelling)"
        )
    return None


def _spelled_as_path(ref: str | os.PathLike) -> bool:
    """``ref`` is written as a path (``./fire``, ``../x``, ``/abs``, ``~/x``): it names that path
    only, never a checkpoint name or group under the root (``Path`` would drop a leading ``./``)."""
    return str(ref).startswith((".", "/", "~", os.sep))


def _not_found(ref, root: Path | None = None) -> CheckpointNotFoundError:
    """The one error for a checkpoint reference that names nothing (every door says it so), naming
    the bundled checkpoint a repository path typed elsewhere meant (``_bundled_meant``)."""
    root = root if root is not None else checkpoints_root()
    meant = _bundled_meant(str(ref), root)
    return CheckpointNotFoundError(
        f"checkpoint {str(ref)!r} not found: it is neither a checkpoint name under "
        f"{root}, an existing folder, nor a Hugging Face repo id (owner/name); check the spelling or the path"
        + (f" (from {Path.cwd()}; the bundled checkpoint {meant!r} works by name from any folder)" if meant else "")
    )


def _bundled_meant(ref: str, root: Path) -> str | None:
    """The bundled checkpoint ``ref`` names when it is a path into the checkpoints folder typed
    from elsewhere — ``checkpoints/fire``, ``./checkpoints/fire/`` (the folder's own name, then a
    bundled name) — else None; ``someone/fire`` (a Hub id) is not one."""
    parts = [p for p in Path(ref).parts if p not in (".", "")]
    if len(parts) == 2 and parts[0] == root.name and (root / parts[1]).is_dir():
        return parts[1]
    return None


def _folder_files(path: Path, ref) -> tuple[Path, Path]:
    """``(config.json, model.safetensors)`` of the local checkpoint folder ``path`` (``ref`` as given).
    Raises: CheckpointNotFoundError, one message per problem: nothing there, a file, or a folder
    without one of the two files."""
    if not path.is_dir():
        if path.exists():
            raise CheckpointNotFoundError(
                f"checkpoint {path} is a file, not a checkpoint folder; give the folder holding "
                f"{CONFIG_FILE} and {WEIGHTS_FILE}"
            )
        raise _not_found(ref)
    files = path / CONFIG_FILE, path / WEIGHTS_FILE
    missing = [f.name for f in files if not f.is_file()]
    if missing and (members := group_members(path)):  # a group of checkpoints (checkpoints/copy), not one
        raise CheckpointNotFoundError(
            f"{path} is a group of checkpoints, not one; name one of them: "
            + ", ".join(f"{ref if isinstance(ref, str) else path}/{m}" for m in members)
        )
    if missing:
        raise CheckpointNotFoundError(
            f"{path} has no {' or '.join(missing)}: not a fireviz checkpoint folder (create one with {TRAIN_HINT})"
        )
    return files


def checkpoint_folder(checkpoint: str | os.PathLike) -> Path | None:
    """The local folder a checkpoint reference names (a path, ``~`` expanded, or a name under
    :func:`checkpoints_root`, as :func:`checkpoint_files` takes it); None when there is none here
    (a Hub repo id, or nothing). Nothing is downloaded. Raises: CheckpointError for a reference
    that is not a path or a string."""
    path = _local_path(checkpoint)
    return path if path.is_dir() else None


def checkpoint_files(checkpoint: str | os.PathLike) -> tuple[Path, Path]:
    """``(config.json, model.safetensors)`` of a checkpoint folder (``~`` expanded), a checkpoint
    name under :func:`checkpoints_root` (``fire``, as :func:`resolve_checkpoint` takes it; an
    existing local path of that name comes first), or a fireviz checkpoint on the Hugging Face
    Hub (``owner/name``, :func:`looks_like_hub_id`; fetched into the huggingface_hub cache).

    Raises: CheckpointNotFoundError (a CheckpointError) if there is no such folder or repo, it
      is a file, or a file is missing; CheckpointError if the Hub files cannot be fetched.
    """
    path = _local_path(checkpoint)
    name = str(checkpoint)
    if path.exists() or not looks_like_hub_id(name):  # a path under an existing folder (checkpoints/typo) is local
        return _folder_files(path, checkpoint)
    try:
        folder = download_checkpoint(name, [CONFIG_FILE, WEIGHTS_FILE])
    except CheckpointError as e:
        raise _as_missing_path(name, e) from None
    return _folder_files(folder, checkpoint)


def checkpoint_sha256(checkpoint: str | os.PathLike) -> str:
    """The identity of a checkpoint: sha256 (hex) of ``model.safetensors`` followed by
    ``config.json`` bytes (``Checkpoint.sha256``: the evaluation and dilution caches' key, the jobs'
    key, results' ``checkpoint_sha256``), memoized per file state. Raises: CheckpointError as
    :func:`checkpoint_files`."""
    return _files_sha256(*checkpoint_files(checkpoint))


#: checkpoint sha256 → why its weights cannot be the model its config describes ("" if they can)
_UNUSABLE_WEIGHTS: dict[str, str] = {}


def _unusable_weights(folder: Path, config: dict, sha256: str) -> str:
    """Why the weights of the checkpoint ``folder`` are not a model whose numbers can be shown:
    tensors that do not match its config (names, shapes, integer or bool kinds: from the header,
    nothing allocated), or NaN/inf values (read one tensor at a time); "" if none. Once per
    ``sha256``. Raises: CheckpointError if the weights cannot be read at all."""
    if sha256 not in _UNUSABLE_WEIGHTS:
        weights = folder / WEIGHTS_FILE
        try:
            _weights_match(_weights_header(weights), config_from_dict(config, str(folder / CONFIG_FILE)), WEIGHTS_FILE)
            bad = nonfinite_tensors(weights)
            why = f"the weights contain NaN/inf in {', '.join(bad[:3])}{' …' if len(bad) > 3 else ''}" if bad else ""
        except CheckpointError as e:
            why = str(e)
        _UNUSABLE_WEIGHTS[sha256] = why
    return _UNUSABLE_WEIGHTS[sha256]


def _files_sha256(config: Path, weights: Path) -> str:
    """sha256 of ``weights`` then ``config`` bytes, memoized per (file, mtime, size) of both.
    Raises: CheckpointError if either cannot be read."""
    try:  # memoized per (file, modification time, size) of both: asking again is free
        memo = tuple((str(f.resolve()), st.st_mtime_ns, st.st_size) for f in (weights, config) for st in (f.stat(),))
        if memo not in _FINGERPRINTS:
            _FINGERPRINTS[memo] = sha256_files(weights, config)
    except OSError as e:
        raise CheckpointError(f"cannot read {weights} or {config}: {e}") from e
    return _FINGERPRINTS[memo]


#: repr(GPTConfig, training provenance left out) → its model's {tensor name: shape}: one meta build per distinct config (a build
#: runs every initializer through torch's Python references: ~0.4 s each on a busy machine)
_SHAPES: dict[str, dict[str, tuple]] = {}


def _model_shapes(config: GPTConfig) -> dict[str, tuple]:
    """``{name: shape}`` of the state dict of ``GPT(config)``, built on the meta device (nothing
    allocated), once per distinct config."""
    import torch

    memo = repr(dataclasses.replace(config, training={}))  # provenance does not change the tensors
    with _INFOS_LOCK:
        known = _SHAPES.get(memo)
    if known is None:
        with torch.device("meta"):  # the structure alone: nothing is allocated
            known = {k: tuple(t.shape) for k, t in GPT(config).state_dict().items()}
        with _INFOS_LOCK:
            _SHAPES[memo] = known
    return dict(known)


def _weights_match(entries: dict[str, dict], config: GPTConfig, source: str) -> None:
    """Raises: CheckpointError unless the tensors a safetensors header names are those of the model
    of ``config`` — names and shapes, as ``load_state_checked`` requires — without reading any."""
    own = _model_shapes(config)
    stored = {k: tuple(e["shape"]) for k, e in entries.items()}
    # a float parameter stored as an integer or bool tensor would be cast and evaluated as if trained
    not_float = [f"{k}: {e['dtype']}" for k, e in entries.items() if not str(e["dtype"]).startswith(("F", "BF"))]
    if not_float:
        raise CheckpointError(
            f"{source} stores parameters as integer or bool tensors ({', '.join(not_float[:5])}): not weights "
            "fireviz wrote; restore the file or train again"
        )
    for a, b in (("lm_head.weight", "wte.weight"), ("wte.weight", "lm_head.weight")):
        if a not in stored and b in stored:  # safetensors keeps one name of a tied pair
            stored[a] = stored[b]
    missing, unexpected = sorted(set(own) - set(stored)), sorted(set(stored) - set(own))
    mismatched = [f"{k}: file {stored[k]} vs config {own[k]}" for k in own if k in stored and stored[k] != own[k]]
    parts = [
        f"{what} {names[:5]}"
        for what, names in (("missing", missing), ("unexpected", unexpected), ("shape mismatch", mismatched))
        if names
    ]
    if parts:
        raise CheckpointError(f"{source} does not match its config.json: " + "; ".join(parts))


def checked_config(checkpoint: str | os.PathLike) -> GPTConfig:
    """A checkpoint's validated config, its weights checked against it from the safetensors header
    alone (a complete file holding exactly the model's tensors, by name and shape); no tensor is
    read. What loading would refuse for the files, but NaN/inf values and a tied pair stored
    twice with different values (those need the weights).
    Raises: CheckpointError as ``Checkpoint.load``."""
    return _config_checked(*checkpoint_files(checkpoint))


def _config_checked(config_path: Path, weights_path: Path) -> GPTConfig:
    """:func:`checked_config` of the two files. Raises: CheckpointError."""
    try:
        config = config_from_dict(read_json(config_path), str(config_path))
    except FileFormatError as e:
        raise CheckpointError(str(e)) from e
    _weights_match(_weights_header(weights_path), config, str(weights_path))
    return config


def default_device() -> str:
    """``"cuda"`` when a GPU is visible to torch, else ``"cpu"``."""
    import torch

    return "cuda" if torch.cuda.is_available() else "cpu"
