"""Writing files so that nothing is lost, and hashing them.

Every file fireviz writes (checkpoints, trainer state, logs, results, cache entries) goes
through ``atomic_write``: a temp file in the same folder, fsync, ``os.replace``, fsync of the
folder. A crash or SIGKILL leaves either the old or the new file, never a torn one.
"""
from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path
from typing import Callable

_UMASK = os.umask(0)
os.umask(_UMASK)


def _fsync_dir(path: Path) -> None:
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def atomic_write(path: str | os.PathLike, write: Callable[[Path], object]) -> None:
    """Write ``path`` atomically: ``write(tmp_path)`` fills a temp file in the same folder,
    which is fsynced and renamed over ``path``; the folder is then fsynced.

    Creates the parent folder if needed. On any error the temp file is removed and ``path``
    is untouched. Raises whatever ``write`` or the file system raises.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.parent / f".{path.name}.tmp-{os.getpid()}"
    try:
        write(tmp)
        with open(tmp, "rb+") as f:
            os.fsync(f.fileno())
        os.chmod(tmp, 0o666 & ~_UMASK)  # as an ordinary open() would create it
        os.replace(tmp, path)
    finally:
        if tmp.exists():
            tmp.unlink()
    _fsync_dir(path.parent)


def atomic_write_text(path: str | os.PathLike, text: str) -> None:
    """``atomic_write`` of UTF-8 text: a reader sees the old file or the whole new one, never
    a partial write (temp file in the same folder, fsync, rename). Raises: OSError."""
    atomic_write(path, lambda p: Path(p).write_text(text, encoding="utf-8"))


def write_json_atomic(path: str | os.PathLike, obj: object) -> None:
    """``atomic_write`` of ``obj`` as indented JSON (NaN/Inf refused: ValueError)."""
    atomic_write_text(path, json.dumps(obj, indent=1, allow_nan=False) + "\n")


def sha256_files(*paths: str | os.PathLike) -> str:
    """Hex sha256 of the concatenated bytes of ``paths``, read in 1 MiB chunks.

    Raises: OSError if a file cannot be read.
    """
    h = hashlib.sha256()
    for path in paths:
        with open(path, "rb") as f:
            for chunk in iter(lambda: f.read(1 << 20), b""):
                h.update(chunk)
    return h.hexdigest()


def read_safetensors(path: str | os.PathLike) -> tuple[dict, dict[str, str]]:
    """Every tensor of a safetensors file and its string metadata: ``(tensors, metadata)``.

    Tensors come back on CPU in their stored dtype. Never unpickles anything.
    Raises: safetensors' SafetensorError for a corrupt or truncated file, OSError if it
    cannot be read; callers turn these into their own error naming the fix.
    """
    from safetensors import safe_open

    with safe_open(str(path), framework="pt") as f:
        return {k: f.get_tensor(k) for k in f.keys()}, dict(f.metadata() or {})
