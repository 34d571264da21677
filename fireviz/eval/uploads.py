"""Uploaded data files: stored by content hash under the evaluation cache, checked, refused ones deleted."""

from __future__ import annotations

from pathlib import Path

from fireviz.core import atomic_write
from fireviz.data import DataError, RawBytesWarning, load_documents
from fireviz.eval.cache import default_cache_dir

#: File types the app's uploaders take.
UPLOAD_TYPES = ["txt", "jsonl", "gz", "xz", "md"]
#: Largest upload (MB), as ``server.maxUploadSize`` in .streamlit/config.toml.
MAX_UPLOAD_MB = 32


def save_upload(name: str, data: bytes) -> Path:
    """Store an uploaded text/JSONL file under the evaluation cache (``<cache>/uploads/<sha>/``)
    and check that ``fireviz.data.corpus.load_documents`` reads it.

    The folder is named by the content's sha256, so the same file is the same data source
    (and the same cached results) in every tab and after a restart.
    Returns: the stored file's path.
    A file that is refused (too large, no text, a bad JSONL line, an unsupported type) is
    deleted again. Text that is not UTF-8 is taken as its raw bytes (byte-level tokenizer).
    Raises: fireviz.data.corpus.DataError naming the problem.
    """
    import hashlib
    import warnings

    safe = "".join(c if c.isalnum() or c in "._-" else "_" for c in Path(name).name).lstrip(".") or "upload.txt"
    if not data:
        raise DataError(
            f'{name} is empty; upload a .txt file or a .jsonl file with one {{"text": ...}} object per line'
        )
    if len(data) > MAX_UPLOAD_MB << 20:
        raise DataError(
            f"{name} is {len(data) / 2**20:.1f} MB, more than the {MAX_UPLOAD_MB} MB an upload may be; "
            "evaluate a larger file from the command line (python -m fireviz eval ... --data FILE)"
        )

    folder = default_cache_dir() / "uploads" / hashlib.sha256(data).hexdigest()[:16]
    path = folder / safe
    existed = path.exists()
    if not existed:
        atomic_write(path, lambda p: Path(p).write_bytes(data))
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", RawBytesWarning)  # raw bytes are fine; said in the docstring
            load_documents(path)  # raises DataError with the line and the fix
    except Exception as e:
        if not existed:
            path.unlink(missing_ok=True)
            try:
                folder.rmdir()
            except OSError:
                pass
        if isinstance(e, DataError):
            raise
        raise DataError(f"cannot read the uploaded file {name}: {type(e).__name__}: {e}") from e
    return path
