"""Published models' position encodings: a Hugging Face Hub id or a folder ``transformers`` wrote.

fireviz shows and fits the position bias of models it did not train. Only what is needed is
read: config.json, and for T5-family models the bias tables' bytes — the safetensors header
gives their offsets, and ranged reads fetch just those bytes (t5-11b's table is 32×128 floats
inside 45 GB), through ``model.safetensors.index.json`` for sharded weights. ALiBi and RoPE
models need config.json alone. Nothing here imports ``transformers``; nothing unpickles
(repositories with only ``pytorch_model.bin`` are refused).

This module finds and reads the files; what a config.json means is ``fireviz.checkpoints.hub_families``
(T5, mT5, ByT5, Flan-T5, LongT5 and UMT5 bias tables; ALiBi of BLOOM, MPT and Falcon; RoPE of
Llama, Mistral, Qwen, Gemma, Phi, GPT-NeoX, …, its frequencies in ``fireviz.checkpoints.hub_rope``), with
each family's semantics as the original implementations compute them.

Files come from a local folder, or from the Hub (``HF_ENDPOINT``, ``HF_TOKEN`` for gated
repos). Results are cached under ``<cache>/hub/<owner>--<name>/<commit>/`` and read from there
offline.
"""

from __future__ import annotations

import os
import re
import struct
from pathlib import Path

import torch

from fireviz.checkpoints.hub_families import STACKS, HubModelError, PublishedModel, build_published
from fireviz.core import FileFormatError, atomic_write, check_safetensors_header, parse_json, read_json
from fireviz.model import CheckpointError

_HUB_ID = re.compile(r"^[A-Za-z0-9][\w.-]*/[\w.-]+$")
#: Largest safetensors header read (bytes); real headers are well under 1 MB.
MAX_HEADER_BYTES = 100 << 20
_DTYPES = {"F32": torch.float32, "F16": torch.float16, "BF16": torch.bfloat16, "F64": torch.float64}


class NotPublishedModelError(HubModelError):
    """The config.json is not a transformers one (no ``model_type``): e.g. a fireviz checkpoint."""


def is_transformers_config(cfg: object) -> bool:
    """True for a config.json written by ``transformers`` (it names ``model_type``; a fireviz
    config names ``position_encoding`` instead)."""
    return isinstance(cfg, dict) and "model_type" in cfg and "position_encoding" not in cfg


def looks_like_hub_id(ref: str) -> bool:
    """``owner/name`` that is not a local path: neither it nor its first part (``owner``) exists
    here, so ``checkpoints/typo`` is a mistyped folder, not a Hub repo."""
    p = Path(ref or "").expanduser()
    return bool(_HUB_ID.match(ref or "")) and not p.exists() and not p.parent.is_dir()


def download_checkpoint(repo_id: str, allow_patterns: list[str], local_files_only: bool = False) -> Path:
    """A fireviz checkpoint repo's files (``allow_patterns``) fetched into the huggingface_hub
    cache with ``snapshot_download`` (``local_files_only``: from the cache alone) → the local folder.
    Raises: CheckpointError — no connection (with the offline fix) or any other Hub refusal
      (unknown or gated repo, rate limit), naming the repo and the reason."""
    from huggingface_hub import snapshot_download

    try:
        return Path(
            snapshot_download(repo_id=repo_id, allow_patterns=allow_patterns, local_files_only=local_files_only)
        )
    except Exception as e:  # offline, unknown repo, gated repo, rate limit: all end the same way
        kind = type(e).__name__
        msg = str(e).splitlines()[0] if str(e) else kind
        offline = "connect" in str(e).lower() or "internet" in str(e).lower()
        if offline or kind in ("LocalEntryNotFoundError", "ConnectionError", "ConnectError"):
            raise CheckpointError(
                f"cannot download {repo_id!r} from the Hugging Face Hub: no connection ({msg}). "
                "Connect to the internet, or download the repo elsewhere and give its local folder instead"
            ) from e
        raise CheckpointError(
            f"cannot download {repo_id!r} from the Hugging Face Hub ({kind}: {msg}); "
            "check the repo id and your access to it"
        ) from e


def hub_file(repo_id: str, name: str, revision: str | None = None, required: bool = True) -> Path | None:
    """One file of a Hub repo in huggingface_hub's cache (``hf_hub_download``; ``HF_ENDPOINT`` as set
    now) → its local path; None for an optional file the repo lacks.
    Raises: HubModelError as :func:`_hub_error` (offline and not cached, no such repo, gated, missing)."""
    from huggingface_hub import hf_hub_download

    try:
        return Path(hf_hub_download(repo_id, name, revision=revision, endpoint=os.environ.get("HF_ENDPOINT") or None))
    except Exception as e:  # huggingface_hub's errors, said as the rest of fireviz says them
        missing = ("EntryNotFoundError", "RemoteEntryNotFoundError", "LocalEntryNotFoundError")
        if not required and type(e).__name__ in missing:  # (Local…: a lack the cache remembers)
            return None
        raise _hub_error(repo_id, name, e) from None


def hub_has_file(repo_id: str, name: str, revision: str | None = None) -> bool:
    """Whether a Hub repo holds ``name`` (asked, never downloaded); False when it cannot be asked."""
    from huggingface_hub import HfApi

    try:
        return bool(HfApi(endpoint=os.environ.get("HF_ENDPOINT") or None).file_exists(repo_id, name, revision=revision))
    except Exception:  # offline, gated: not known, so not claimed
        return False


def default_cache_dir() -> Path:
    """``$FIREVIZ_CACHE_DIR/hub`` if set, else ``~/.cache/fireviz/hub``."""
    env = os.environ.get("FIREVIZ_CACHE_DIR")
    return (Path(env).expanduser() if env else Path.home() / ".cache" / "fireviz") / "hub"


# -- where the files come from ------------------------------------------------------------------
class _Folder:
    """A local folder written by transformers."""

    def __init__(self, path: Path):
        self.path, self.source, self.revision, self.bytes_read = path, str(path), None, 0

    def config(self) -> dict:
        try:
            return read_json(self.path / "config.json", expect=dict)
        except FileFormatError as e:
            raise HubModelError(str(e)) from e

    def exists(self, name: str) -> bool:
        return (self.path / name).is_file()

    def size(self, name: str) -> int | None:
        return (self.path / name).stat().st_size

    def read_json(self, name: str) -> dict:
        try:
            return read_json(self.path / name, expect=dict)
        except FileFormatError as e:
            raise HubModelError(str(e)) from e

    def read_range(self, name: str, start: int, stop: int) -> bytes:
        with open(self.path / name, "rb") as f:
            f.seek(start)
            data = f.read(stop - start)
        self.bytes_read += len(data)
        if len(data) != stop - start:
            raise HubModelError(f"{self.path / name} is truncated (wanted bytes {start}–{stop})")
        return data


class _Hub:
    """A Hub repo: config via hf_hub_download (cached by commit), weights by ranged GETs."""

    def __init__(self, repo_id: str, revision: str | None, token: str | None, local_files_only: bool):
        from huggingface_hub import constants

        self.repo_id, self.token, self.local_files_only = repo_id, token, local_files_only
        self.endpoint = os.environ.get("HF_ENDPOINT", constants.ENDPOINT).rstrip("/")
        self.source, self.bytes_read, self._rev = repo_id, 0, revision
        self.revision: str | None = None
        self._sizes: dict[str, int] = {}

    def _download(self, name: str) -> Path:
        from huggingface_hub import hf_hub_download

        if not self.local_files_only and not _reachable(self.endpoint):
            self.local_files_only = True  # no network: the caches answer at once, not after retries
        try:
            path = Path(
                hf_hub_download(
                    self.repo_id,
                    name,
                    revision=self._rev,
                    token=self.token,
                    endpoint=self.endpoint,
                    local_files_only=self.local_files_only,
                )
            )
        except Exception as e:  # offline, gated, unknown repo or file: one message each
            raise _hub_error(self.repo_id, name, e) from e
        if path.parent.parent.name == "snapshots":  # …/snapshots/<commit>/<file>
            self.revision = path.parent.name
        return path

    def config(self) -> dict:
        path = self._download("config.json")
        try:
            return read_json(path, expect=dict)
        except FileFormatError as e:
            raise HubModelError(str(e)) from e

    def size(self, name: str) -> int | None:
        """Total size of ``name`` from the last ranged answer's Content-Range (None if unknown)."""
        return self._sizes.get(name)

    def exists(self, name: str) -> bool:
        try:
            self._get(name, 0, 1)
            return True
        except HubModelError as e:
            if "404" in str(e) or "not found" in str(e).lower():
                return False
            raise

    def read_json(self, name: str) -> dict:
        try:
            return read_json(self._download(name), expect=dict)
        except FileFormatError as e:
            raise HubModelError(str(e)) from e

    def _get(self, name: str, start: int, stop: int) -> bytes:
        from huggingface_hub import hf_hub_url
        from huggingface_hub.utils import build_hf_headers, get_session

        url = hf_hub_url(self.repo_id, name, revision=self.revision or self._rev or "main", endpoint=self.endpoint)
        headers = build_hf_headers(token=self.token)
        headers["Range"] = f"bytes={start}-{stop - 1}"
        try:
            r = get_session().get(url, headers=headers, follow_redirects=True, timeout=30)
        except Exception as e:
            raise _hub_error(self.repo_id, name, e) from e
        if r.status_code in (401, 403):
            raise HubModelError(
                f"{self.repo_id} is gated or private ({r.status_code}); accept its license on the Hub "
                "and set HF_TOKEN (or pass token=…)"
            )
        if r.status_code == 404:
            raise HubModelError(f"{self.repo_id} has no file {name} (404)")
        if r.status_code not in (200, 206):
            raise HubModelError(f"the Hub answered {r.status_code} for {self.repo_id}/{name}")
        data = r.content
        if r.status_code == 200:  # a server without Range support sent the whole file
            self._sizes[name] = len(data)
            data = data[start:stop]
        else:
            m = re.match(r"bytes \d+-\d+/(\d+)", r.headers.get("Content-Range", ""))
            if m:
                self._sizes[name] = int(m.group(1))
        self.bytes_read += len(r.content)
        if len(data) != stop - start:
            raise HubModelError(f"{self.repo_id}/{name} is shorter than its header says (wanted bytes {start}–{stop})")
        return data

    def read_range(self, name: str, start: int, stop: int) -> bytes:
        if self.local_files_only:
            raise HubModelError(
                f"{self.repo_id}: its position tensors are not in the cache and the Hub is off "
                "(offline); connect once to fetch them"
            )
        return self._get(name, start, stop)


_REACHABLE: dict[str, tuple[float, bool]] = {}


def _reachable(endpoint: str, timeout: float = 2.0) -> bool:
    """Whether ``endpoint``'s host accepts a TCP connection (checked once a minute): without a
    network, huggingface_hub retries for ~25 s before failing; this answers in ``timeout``."""
    import socket
    import time
    from urllib.parse import urlparse

    now = time.monotonic()
    if endpoint in _REACHABLE and now - _REACHABLE[endpoint][0] < 60:
        return _REACHABLE[endpoint][1]
    u = urlparse(endpoint)
    try:
        with socket.create_connection((u.hostname, u.port or (443 if u.scheme == "https" else 80)), timeout=timeout):
            ok = True
    except OSError:
        ok = False
    _REACHABLE[endpoint] = (now, ok)
    return ok


def _hub_error(repo_id: str, name: str, e: Exception) -> HubModelError:
    kind, msg = type(e).__name__, (str(e).splitlines() or [type(e).__name__])[0]
    text = f"{kind}: {msg}".lower()
    if "gated" in text or "401" in text or "403" in text:
        return HubModelError(f"{repo_id} is gated or private ({msg}); accept its license on the Hub and set HF_TOKEN")
    if kind in ("LocalEntryNotFoundError", "OfflineModeIsEnabled") or "connect" in text or "offline" in text:
        return HubModelError(
            f"cannot reach the Hugging Face Hub for {repo_id} and it is not in the cache ({msg}); "
            "connect to the internet once, or give a local folder"
        )
    if kind in ("RepositoryNotFoundError",) or "repository not found" in text:
        return HubModelError(f"{repo_id} is not a repository on the Hub ({msg}); check the id (owner/name)")
    if kind in ("EntryNotFoundError", "RemoteEntryNotFoundError") or "404" in text:
        return HubModelError(f"{repo_id} has no file {name} ({msg})")
    return HubModelError(f"cannot read {name} of {repo_id} ({kind}: {msg})")


# -- safetensors: the header, then only the bytes of the tensors asked for ------------------------
def _read_header(src, name: str) -> tuple[int, dict]:
    head = src.read_range(name, 0, 8)
    (n,) = struct.unpack("<Q", head)
    if not 2 <= n <= MAX_HEADER_BYTES:
        raise HubModelError(f"{src.source}/{name}: safetensors header of {n} bytes is implausible; the file is corrupt")
    try:
        header = parse_json(src.read_range(name, 8, 8 + n).decode("utf-8"), f"{src.source}/{name} header")
    except (FileFormatError, UnicodeDecodeError) as e:
        raise HubModelError(f"{src.source}/{name}: unreadable safetensors header ({e})") from e
    try:
        check_safetensors_header(
            header, src.size(name) - 8 - n if src.size(name) is not None else None, f"{src.source}/{name}"
        )
    except FileFormatError as e:
        raise HubModelError(str(e)) from e
    return 8 + n, header


def read_tensors(src, names: list[str]) -> dict[str, torch.Tensor]:
    """The tensors ``names`` from ``src``'s safetensors weights, reading only their bytes.

    Single ``model.safetensors`` or shards through ``model.safetensors.index.json``.
    Raises: HubModelError if there are no safetensors weights (only ``*.bin``), a name is
      missing, or a file is corrupt.
    """
    if src.exists("model.safetensors"):
        where = {n: "model.safetensors" for n in names}
    elif src.exists("model.safetensors.index.json"):
        wmap = src.read_json("model.safetensors.index.json").get("weight_map")
        if not isinstance(wmap, dict):
            raise HubModelError(f"{src.source}: model.safetensors.index.json has no weight_map")
        missing = [n for n in names if n not in wmap]
        if missing:
            raise HubModelError(
                f"{src.source} has no tensor {missing[0]} (its weight_map lists "
                f"{len(wmap)} tensors); is this the model type its config says?"
            )
        where = {n: str(wmap[n]) for n in names}
        for f in set(where.values()):  # a shard is a file of the repo itself, never a path elsewhere
            if Path(f).name != f or f.startswith(".") or not f.endswith(".safetensors"):
                raise HubModelError(
                    f"{src.source}: model.safetensors.index.json names shard {f[:80]!r}, not a "
                    ".safetensors file of this repo"
                )
    else:
        raise HubModelError(
            f"{src.source} has no safetensors weights (model.safetensors or its index); fireviz never "
            "loads pickled pytorch_model.bin files — use a revision with safetensors"
        )
    out = {}
    headers: dict[str, tuple[int, dict]] = {}
    for n in names:
        f = where[n]
        if f not in headers:
            headers[f] = _read_header(src, f)
        base, header = headers[f]
        info = header.get(n)
        if not isinstance(info, dict):
            raise HubModelError(f"{src.source}/{f} has no tensor {n}; is this the model type its config says?")
        if info["dtype"] not in _DTYPES:
            raise HubModelError(f"{src.source}/{f}: {n} is stored as {info['dtype']}, not a float type")
        dtype, shape = _DTYPES[info["dtype"]], info["shape"]
        a, b = info["data_offsets"]
        raw = src.read_range(f, base + a, base + b)
        out[n] = torch.frombuffer(bytearray(raw), dtype=dtype).reshape(shape).float().clone()
    return out


# -- the door -------------------------------------------------------------------------------------
def load_published(
    ref: str,
    stack: str = "decoder",
    revision: str | None = None,
    token: str | None = None,
    cache_dir: str | os.PathLike | None = None,
    local_files_only: bool | None = None,
) -> PublishedModel:
    """The position encodings of a published model: a local folder with a transformers
    config.json, or a Hub repo id.

    Args:
      ref: folder path or ``owner/name``.
      stack: ``"decoder"`` (default) or ``"encoder"`` for encoder–decoder (T5-family) models.
      revision: branch, tag or commit on the Hub (default main). token: for gated repos
        (default ``HF_TOKEN``).
      cache_dir: where position tensors read from the Hub are kept, by repo and commit
        (default :func:`default_cache_dir`); a later call, offline too, reads them from there.
      local_files_only: use only the caches (default: ``HF_HUB_OFFLINE``).
    Returns: a :class:`PublishedModel`; its ``bytes_read`` counts the weight-file bytes read
      (0 when served from the cache).
    Raises: HubModelError with the problem and the fix (see the class).
    """
    ref = (ref or "").strip()
    if stack not in STACKS:
        raise HubModelError(f"stack must be one of {', '.join(STACKS)} (got {stack!r})")
    local = Path(ref).expanduser()
    src: _Folder | _Hub
    if local.is_dir():
        src = _Folder(local.resolve())
    elif looks_like_hub_id(ref):
        if local_files_only is None:
            from huggingface_hub import constants

            local_files_only = bool(constants.HF_HUB_OFFLINE)
        src = _Hub(ref, revision, token or os.environ.get("HF_TOKEN"), bool(local_files_only))
    else:
        raise HubModelError(f"{ref!r} is neither a folder nor a Hugging Face repo id of the form owner/name")
    cfg = src.config()
    if not is_transformers_config(cfg):
        raise NotPublishedModelError(
            f"{src.source}: config.json has no model_type, so it is not a transformers model config "
            "(a fireviz checkpoint is opened as a checkpoint instead)"
        )
    read = (lambda names: read_tensors(src, names)) if isinstance(src, _Folder) else _cached_reader(src, cache_dir)
    try:
        model = build_published(cfg, src, read, stack)
    except HubModelError:
        raise
    except (ValueError, TypeError, ArithmeticError, RuntimeError, IndexError, KeyError, MemoryError, OSError) as e:
        # anything a malformed config or weights file can still provoke: one error, naming it
        raise HubModelError(
            f"{src.source}: cannot read its position encoding ({type(e).__name__}: "
            f"{(str(e).splitlines() or [''])[0][:200]}); the config.json or weights are malformed"
        ) from e
    model.bytes_read = src.bytes_read
    archs = cfg.get("architectures")
    archs = archs if isinstance(archs, list) else []
    # a whole causal LM (…ForCausalLM): fireviz.checkpoints.causal_lm can evaluate it, not only read its bias
    model.causal_lm = any(isinstance(a, str) and a.endswith(("ForCausalLM", "LMHeadModel")) for a in archs)
    return model


def _cached_reader(src: _Hub, cache_dir):
    """``read(names)`` for a Hub repo: tensors from ``<cache>/<owner>--<name>/<commit>/`` when
    there, else ranged reads whose result is added to the cache (atomically)."""
    from safetensors.torch import load_file, save_file

    root = Path(cache_dir) if cache_dir is not None else default_cache_dir()
    path = root / src.repo_id.replace("/", "--") / (src.revision or "unknown") / "position_tensors.safetensors"

    def read(names: list[str]) -> dict[str, torch.Tensor]:
        cached: dict[str, torch.Tensor] = {}
        if path.is_file():
            try:
                cached = load_file(str(path))
            except Exception:  # a damaged entry is read again and replaced
                cached = {}
        if all(n in cached for n in names):
            return {n: cached[n] for n in names}
        if src.revision is None and src.local_files_only:
            raise HubModelError(f"{src.repo_id} is not in the cache and the Hub is off (offline)")
        got = read_tensors(src, [n for n in names if n not in cached])
        merged = {**cached, **got}
        atomic_write(
            path,
            lambda p: save_file(
                {k: v.contiguous() for k, v in merged.items()},
                str(p),
                metadata={"repo_id": src.repo_id, "revision": src.revision or ""},
            ),
        )
        return {n: merged[n] for n in names}

    return read
