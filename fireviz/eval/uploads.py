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
#: Largest text a compressed upload may expand to (MB): the upload cap bounds the compressed
#: bytes only, and a 1 MB .gz can hold gigabytes of zeros (issue #38).
MAX_UNCOMPRESSED_MB = 128
#: Most documents an upload may hold: the check that reads it keeps each as an object (~250 bytes
#: whatever its text), and 252 KB of gzip held ~10 million one-character documents (1.96 GB in the
#: app server, issue #50); counted while the file streams, so a refusal costs this many at most.
MAX_UPLOAD_DOCUMENTS = 200_000
#: Longest stored file name (ASCII characters = bytes, extension included): the temporary name of
#: an atomic write adds to it, and most file systems stop at 255 bytes.
MAX_NAME_CHARS = 100


def _stored_name(name: str) -> str:
    """A file name safe to store: ASCII letters, digits and ``._-`` (anything else becomes ``_``, so
    characters are bytes), no leading dot, at most ``MAX_NAME_CHARS`` with the extensions
    (``.jsonl.gz``) kept."""
    safe = (
        "".join(c if (c.isascii() and c.isalnum()) or c in "._-" else "_" for c in Path(name).name).lstrip(".")
        or "upload.txt"
    )
    if len(safe) <= MAX_NAME_CHARS:
        return safe
    suffix = "".join(Path(safe).suffixes[-2:])[-20:]
    return safe[: MAX_NAME_CHARS - len(suffix)] + suffix


def _check_uncompressed_size(name: str, data: bytes) -> None:
    """Raises DataError if ``data`` (gzip or xz, by name or magic bytes; every member or stream)
    expands to more than ``MAX_UNCOMPRESSED_MB``; decompresses in 1 MB pieces that are counted and
    dropped, so checking costs no more memory than one piece."""
    import lzma
    import zlib

    if name.endswith(".gz") or data[:2] == b"\x1f\x8b":
        gz = True
    elif name.endswith(".xz") or data[:6] == b"\xfd7zXZ\x00":
        gz = False
    else:
        return
    limit, total, piece, buf = MAX_UNCOMPRESSED_MB << 20, 0, 1 << 20, data
    try:
        while buf.strip(b"\0") and total <= limit:  # one gzip member / xz stream per turn
            if gz:
                z = zlib.decompressobj(wbits=31)
                while not z.eof and total <= limit:
                    out = z.decompress(buf, piece)  # output still pending comes with b"" input
                    total, buf = total + len(out), z.unconsumed_tail
                    if not out and not buf:
                        break
                done, buf = z.eof, z.unused_data
            else:
                x = lzma.LZMADecompressor()
                total += len(x.decompress(buf, max_length=piece))
                while not x.eof and not x.needs_input and total <= limit:
                    total += len(x.decompress(b"", max_length=piece))
                done, buf = x.eof, x.unused_data
            if not done:
                break  # truncated: load_documents says so
    except (zlib.error, lzma.LZMAError, EOFError) as e:
        raise DataError(f"{name} is not a readable compressed file ({e}); upload it again or uncompressed") from e
    if total > limit:
        raise DataError(
            f"{name} expands to more than {MAX_UNCOMPRESSED_MB} MB of text; an upload may hold at most that "
            "much: evaluate a larger file from the command line (python -m fireviz eval ... --data FILE)"
        )


def save_upload(name: str, data: bytes) -> Path:
    """Store an uploaded text/JSONL file under the evaluation cache (``<cache>/uploads/<sha>/``)
    and check that ``fireviz.data.corpus.load_documents`` reads it.

    The folder is named by the content's sha256, so the same file is the same data source
    (and the same cached results) in every tab and after a restart.
    Returns: the stored file's path.
    A file that is refused (too large compressed or expanded, more than ``MAX_UPLOAD_DOCUMENTS``
    documents, a line past ``fireviz.core.bounded.MAX_LINE_BYTES``, no text, a bad JSONL line, an
    unsupported type) is deleted again; every bound is checked while the file streams. Text that is not UTF-8 is taken as its raw bytes (byte-level tokenizer).
    Raises: fireviz.data.corpus.DataError naming the problem.
    """
    import hashlib
    import warnings

    safe = _stored_name(name)
    if not data:
        raise DataError(
            f'{name} is empty; upload a .txt file or a .jsonl file with one {{"text": ...}} object per line'
        )
    if len(data) > MAX_UPLOAD_MB << 20:
        raise DataError(
            f"{name} is {len(data) / 2**20:.1f} MB, more than the {MAX_UPLOAD_MB} MB an upload may be; "
            "evaluate a larger file from the command line (python -m fireviz eval ... --data FILE)"
        )

    _check_uncompressed_size(safe, data)
    folder = default_cache_dir() / "uploads" / hashlib.sha256(data).hexdigest()[:16]
    path = folder / safe
    try:
        existed = path.exists()
        if not existed:
            atomic_write(path, lambda p: Path(p).write_bytes(data))
    except OSError as e:  # e.g. a full disk: said without the server's paths
        raise DataError(
            f"cannot store the uploaded file {name} on the server ({e.strerror or type(e).__name__}); "
            "try again later or evaluate it from the command line"
        ) from e
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", RawBytesWarning)  # raw bytes are fine; said in the docstring
            load_documents(path, max_documents=MAX_UPLOAD_DOCUMENTS)  # DataError with the line and the fix
    except Exception as e:
        if not existed:
            path.unlink(missing_ok=True)
            try:
                folder.rmdir()
            except OSError:
                pass
        if isinstance(e, DataError):  # said with the file's own name, not the server's path
            raise DataError(str(e).replace(str(path), name)) from e
        raise DataError(f"cannot read the uploaded file {name}: {type(e).__name__}: {e}") from e
    return path
