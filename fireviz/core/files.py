"""Writing files so that nothing is lost, and hashing them.

Every file fireviz writes (checkpoints, trainer state, logs, results, cache entries) goes
through ``atomic_write``: a temp file in the same folder, fsync, ``os.replace``, fsync of the
folder. A crash or SIGKILL leaves either the old or the new file, never a torn one.
"""

from __future__ import annotations

import hashlib
import io
import json
import math
import os
import struct
from pathlib import Path
from typing import Any, Callable

from fireviz.core.bounded import (
    DECOMPRESSION_ERRORS,
    MAX_LOG_LINE_BYTES,
    FileFormatError,
    open_binary,
    read_bounded,
)

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


def file_state(path: str | os.PathLike) -> tuple | None:
    """What a reader's memo is keyed by: ``((name, size, mtime_ns, inode),)`` of a file, or that of
    every file directly in a folder (links followed; a dangling one by name alone), sorted; None
    when ``path`` does not exist or cannot be read. One ``stat`` per file (~20 µs): readers keep
    what they derived until it changes, instead of re-reading on a timer (issue #48)."""
    p = Path(path)
    try:
        if not p.is_dir():
            st = p.stat()
            return ((p.name, st.st_size, st.st_mtime_ns, st.st_ino),)
        state = []
        with os.scandir(p) as entries:
            for e in entries:
                try:
                    st = e.stat()
                except OSError:
                    state.append((e.name, -1, -1, -1))
                    continue
                if not e.is_dir():
                    state.append((e.name, st.st_size, st.st_mtime_ns, st.st_ino))
        return tuple(sorted(state))
    except OSError:
        return None


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


def sort_safetensors_metadata(path: str | os.PathLike) -> None:
    """Rewrite, in place, the header of the safetensors file ``path`` with its ``__metadata__`` keys
    in sorted order. safetensors writes them in the order of a Rust HashMap, which differs from one
    save to the next: two saves of the same tensors and metadata differed in bytes (a resumed run
    must write byte-identical checkpoints). The header keeps its length (padded with spaces, as
    safetensors pads it); nothing else changes. Raises: OSError; FileFormatError for a header that
    is not a JSON object."""
    with open(path, "r+b") as f:
        (n,) = struct.unpack("<Q", f.read(8))
        header = json.loads(f.read(n))
        if not isinstance(header, dict):
            raise FileFormatError(f"{path}: the safetensors header is not a JSON object")
        meta = header.pop("__metadata__", None)
        ordered = ({"__metadata__": dict(sorted(meta.items()))} if isinstance(meta, dict) else {}) | header
        raw = json.dumps(ordered, separators=(",", ":")).encode("utf-8")
        if len(raw) <= n:
            f.seek(8)
            f.write(raw + b" " * (n - len(raw)))


def read_safetensors(path: str | os.PathLike) -> tuple[dict, dict[str, str]]:
    """Every tensor of a safetensors file and its string metadata: ``(tensors, metadata)``.

    Tensors come back on CPU in their stored dtype. Never unpickles anything.
    Raises: safetensors' SafetensorError for a corrupt or truncated file, OSError if it
    cannot be read; callers turn these into their own error naming the fix.
    """
    from safetensors import safe_open

    with safe_open(str(path), framework="pt") as f:
        return {k: f.get_tensor(k) for k in f.keys()}, dict(f.metadata() or {})


# ---------------------------------------------------------------------------------------------
# Reading files fireviz did not just write: one reader, bounded, strict.


#: Largest JSON file read (bytes): results with per-document losses are ~1 MB; 64 MiB is far beyond.
MAX_JSON_BYTES = 64 << 20
#: Deepest nesting of arrays/objects accepted (fireviz's own files nest at most ~6 levels).
MAX_JSON_DEPTH = 64
#: Most values (objects, arrays, strings, numbers) a JSON file may parse into: the largest file
#: fireviz writes (a task group's results with per-sequence losses) holds ~43,000; parsing costs
#: ~60–100 bytes per value, so this bounds one file's parse to ~0.2 GB whatever its shape (issue #38).
MAX_JSON_VALUES = 2_000_000
_OPEN = {ord("["): 1, ord("{"): 1, ord("]"): -1, ord("}"): -1}


def _regular_size(path: Path) -> int:
    """Size of ``path`` if it is a regular file (links followed); FileFormatError for a FIFO,
    device, socket or folder, which ``open`` could block on or misread."""
    import stat as stat_

    st = os.stat(path)
    if not stat_.S_ISREG(st.st_mode):
        raise FileFormatError(f"{path} is not a regular file (a folder, pipe or device); fireviz reads only files")
    return st.st_size


def json_depth(text: str) -> int:
    """Deepest nesting of ``[``/``{`` in JSON ``text``, ignoring brackets inside strings.

    Linear time and no recursion (so a ``'[' * 10**6`` file cannot exhaust the stack).
    """
    return _json_shape(text)[0]


def json_values(text: str) -> int:
    """An upper bound on the values (objects, arrays, strings, numbers…) JSON ``text`` parses into:
    one plus its ``,``, ``[`` and ``{`` outside strings. What parsing costs in memory follows it
    (~60–100 bytes per value), not the text's length: 60 MB of ``[{},{},…]`` took 1.3 GB."""
    return _json_shape(text)[1]


#: bytes of JSON text scanned at once by :func:`_json_shape` (its memory: ~60 times this)
_SCAN_CHUNK = 1 << 18


def _json_shape(text: str) -> tuple[int, int]:
    """(deepest nesting, :func:`json_values`) of JSON ``text``, outside strings; linear time, no
    recursion, memory: the text's UTF-8 bytes plus ~60 × ``_SCAN_CHUNK`` whatever the text holds.

    Strings are found the way a JSON parser finds them: a ``"`` opens or closes one unless an odd
    run of backslashes precedes it. (A regular expression that replaced every string kept one
    object per string, ~1.3 GB for 64 MB of ``"",``; before that a per-character alternation kept
    ~100 bytes of state per character, issue #38.) Where the text is not valid JSON the parser
    stops at the first error, before any position this scan could misread.
    """
    import numpy as np

    raw_all = text.encode("utf-8", "surrogatepass")
    if b"[" not in raw_all and b"{" not in raw_all:
        return 0, 1
    step = np.zeros(256, dtype=np.int8)
    for k, v in _OPEN.items():
        step[k] = v
    counted = np.zeros(256, dtype=np.bool_)
    counted[[ord(","), ord("["), ord("{")]] = True
    depth = deepest = 0
    values = 1
    in_string, backslashes = False, 0  # carried from one piece to the next
    for start in range(0, len(raw_all), _SCAN_CHUNK):
        raw = np.frombuffer(raw_all, dtype=np.uint8, count=min(_SCAN_CHUNK, len(raw_all) - start), offset=start)
        pos = np.arange(raw.size, dtype=np.int64)
        # index of the last byte that is not a backslash, at or before each position
        last = np.maximum.accumulate(np.where(raw != 92, pos, -1 - backslashes))
        run_before = pos - 1 - np.concatenate(([-1 - backslashes], last[:-1]))  # backslashes just before
        quote = (raw == 34) & (run_before % 2 == 0)
        toggles = np.cumsum(quote, dtype=np.int64) + int(in_string)
        outside = (toggles % 2 == 0) & ~quote
        levels = np.cumsum(np.where(outside, step[raw], 0), dtype=np.int64) + depth
        deepest = max(deepest, int(levels.max(initial=depth)))
        depth = int(levels[-1])
        values += int(np.count_nonzero(outside & counted[raw]))
        in_string = bool(toggles[-1] % 2)
        backslashes = int(raw.size - 1 - last[-1])
    return deepest, values


def _within_shape(text: str, max_depth: int, max_values: int) -> bool:
    """Whether ``text``'s bracket and comma counts alone prove it within ``max_depth`` and
    ``max_values`` (:func:`_json_shape`'s two numbers can only be smaller: they skip what lies inside
    strings). Three ``str.count`` calls, ~1 µs for a log line: the numpy scan is paid only by text
    that could break a limit (issue #48: a scan per train-log line cost 22 of a page's 27 s)."""
    opens = text.count("[") + text.count("{")
    return opens <= max_depth and 1 + opens + text.count(",") <= max_values


def _finite_float(s: str) -> float:
    v = float(s)
    if v != v or v in (float("inf"), float("-inf")):
        raise ValueError(f"number {s} is out of float range")
    return v


def parse_json(
    text: str,
    source: str = "JSON",
    *,
    max_depth: int = MAX_JSON_DEPTH,
    allow_nonfinite: bool = False,
    max_values: int = MAX_JSON_VALUES,
) -> Any:
    """``json.loads(text)`` with fireviz's limits.

    Args:
      text: the JSON text; ``source`` names it in errors (a path, ``path:line``).
      max_depth: deepest array/object nesting accepted.
      max_values: most values the text may parse into (:func:`json_values`; memory follows it).
      allow_nonfinite: accept ``NaN``/``Infinity`` (train logs record a diverged loss as NaN);
        otherwise they, and numbers that overflow a float (``1e999``), are refused.
    Returns: the parsed value (dict, list, str, int, float, bool or None).
    Raises: FileFormatError naming ``source`` and the problem.
    """
    depth, values = (0, 0) if _within_shape(text, max_depth, max_values) else _json_shape(text)
    if depth > max_depth:
        raise FileFormatError(
            f"{source} nests {depth} levels deep (at most {max_depth} are read); it is not a "
            "file fireviz wrote — restore or delete it"
        )
    if values > max_values:
        raise FileFormatError(
            f"{source} holds up to {values:,} JSON values (at most {max_values:,} are read: parsing costs memory per "
            "value); it is not a file fireviz wrote — restore or delete it"
        )
    kwargs: dict = {}
    if not allow_nonfinite:

        def refuse(c):
            raise ValueError(f"non-finite number {c}")

        kwargs = {"parse_constant": refuse, "parse_float": _finite_float}
    try:
        return json.loads(text, **kwargs)
    except (ValueError, RecursionError) as e:  # JSONDecodeError is a ValueError
        raise FileFormatError(f"{source} is not valid JSON ({e}); restore or delete it") from e


def read_json(
    path: str | os.PathLike,
    *,
    max_bytes: int = MAX_JSON_BYTES,
    max_depth: int = MAX_JSON_DEPTH,
    allow_nonfinite: bool = False,
    expect: type | tuple | None = None,
) -> Any:
    """Read a JSON file fireviz did not just write: size-bounded, depth-bounded, finite.

    Args:
      path: the file. max_bytes: largest size read. max_depth, allow_nonfinite: see
        :func:`parse_json`. expect: a type (or tuple) the top-level value must be, e.g. dict.
    Returns: the parsed value.
    Raises: FileFormatError (unreadable, not UTF-8, larger than ``max_bytes``, too deep, not
      JSON, a non-finite number, or not of type ``expect``). The file is left as it is.
    """
    path = Path(path)
    try:
        size = _regular_size(path)
        if size > max_bytes:
            raise FileFormatError(
                f"{path} is {size:,} bytes, more than the {max_bytes:,} read for a JSON file; "
                "it is not a file fireviz wrote — restore or delete it"
            )
        with open(path, "rb") as f:
            raw = f.read(min(size, max_bytes) + 1)  # not max_bytes: read(n) allocates n bytes up front
        text = raw.decode("utf-8")
    except FileFormatError:
        raise
    except (OSError, UnicodeDecodeError) as e:
        raise FileFormatError(f"cannot read {path}: {e}") from e
    obj = parse_json(text, str(path), max_depth=max_depth, allow_nonfinite=allow_nonfinite)
    if expect is not None and (
        not isinstance(obj, expect)
        or isinstance(obj, bool)
        and bool not in (expect if isinstance(expect, tuple) else (expect,))
    ):
        names = " or ".join(t.__name__ for t in (expect if isinstance(expect, tuple) else (expect,)))
        raise FileFormatError(
            f"{path} holds a JSON {type(obj).__name__}, not the {names} fireviz expects there; restore or delete it"
        )
    return obj


def read_jsonl(
    path: str | os.PathLike,
    *,
    max_bytes: int = 1 << 30,
    max_depth: int = MAX_JSON_DEPTH,
    allow_nonfinite: bool = False,
    tolerate_torn_tail: bool = True,
    max_values: int = MAX_JSON_VALUES,
) -> list[dict]:
    """The JSON objects of a JSON-lines file (plain, gzip or xz), one per non-empty line, in order.

    Decompressed as a stream whose lines, brackets and commas are counted piece by piece before
    anything is parsed: a line longer than ``fireviz.core.bounded.MAX_LOG_LINE_BYTES`` (a 245 KB
    ``.gz`` of 240 MiB of spaces) is refused after that many bytes, 100 MB of ``{}`` lines after
    ``max_values`` of them, and a file of only whitespace is refused, not read as an empty log.

    Args: as :func:`read_json`; ``tolerate_torn_tail``: a last line that does not parse (a
      writer still appending, or killed mid-line) is dropped rather than refused; ``max_values``:
      most lines and JSON values in the whole file (memory: ~100 bytes each once parsed);
      ``max_bytes``: most bytes after decompression.
    Returns: the objects. Raises: FileFormatError naming ``path:line`` for any other bad line
      (not JSON, too deep, too long, non-finite where refused, not an object), an oversized file
      (bytes after decompression, or lines and values), or one that holds bytes but no record.
    """
    path = Path(path)
    line_limit = MAX_LOG_LINE_BYTES.value

    def too_many(n: int) -> FileFormatError:
        return FileFormatError(
            f"{path} holds more than {max_values:,} JSON lines or values ({n:,}), more than fireviz reads "
            "from one JSON-lines file (a training log holds ~8 per logged step); restore or delete it"
        )

    try:
        size = _regular_size(path)
        if size > max_bytes:
            raise FileFormatError(
                f"{path} is {size:,} bytes, more than the {max_bytes:,} read for a JSON-lines file; restore or delete it"
            )
        parts, cheap = _jsonl_count(path, max_bytes, max_values, too_many)

        def stream():
            if parts is not None:
                yield from enumerate(io.BytesIO(b"".join(parts)), 1)
                return
            with open_binary(path) as g:
                yield from enumerate(iter(lambda: g.readline(line_limit + 1), b""), 1)

        if cheap > max_values:  # the cheap counts do not prove it within: count outside strings, no parse
            n_values = 0
            for _, raw in stream():
                line = raw.decode("utf-8", errors="replace")
                n_values += _json_shape(line)[1] if line.strip() else 1
                if n_values > max_values:
                    raise too_many(n_values)
        out, torn = _jsonl_parse(stream(), path, max_depth, allow_nonfinite)
    except FileFormatError:
        raise
    except DECOMPRESSION_ERRORS as e:
        raise FileFormatError(f"cannot read {path}: {e}; restore or delete it") from e
    if torn is not None and not tolerate_torn_tail:
        raise torn
    return out


def _jsonl_count(path: Path, max_bytes: int, max_values: int, too_many) -> tuple[list[bytes] | None, int]:
    """:func:`read_jsonl`'s first, streamed pass: lines, brackets and commas counted per 1 MiB piece
    (``bytes.count``) and the longest line, refused as soon as a bound is crossed, before any byte
    becomes an object — what parsing costs follows the lines and values, not the bytes (100 MB of
    ``{}`` lines is 35 million dicts, > 4 GB), and a line of 240 MiB of spaces is refused after
    ``MAX_LOG_LINE_BYTES``. Returns ``(the decompressed pieces, or None past _KEEP_BYTES; an upper
    bound on the values)``. Raises: FileFormatError (and the stream's decompression errors)."""
    line_limit = MAX_LOG_LINE_BYTES.value
    parts: list[bytes] | None = []  # the decompressed bytes, kept for the parse when small
    lines, cheap, run, total, content = 1, 1, 0, 0, False
    with open_binary(path) as f:
        for piece in read_bounded(f, max_bytes, f"{path} (a JSON-lines file)"):
            total += len(piece)
            if parts is not None:
                parts.append(piece)
                if total > _KEEP_BYTES:
                    parts = None  # parsed from a second stream: memory stays one line
            nl = piece.count(b"\n")
            first = piece.find(b"\n") if nl else len(piece)
            if run + first > line_limit or (nl and len(piece) - piece.rfind(b"\n") - 1 > line_limit):
                raise FileFormatError(
                    f"{path}:{lines} is a line longer than {MAX_LOG_LINE_BYTES.said()}, more than a JSON-lines "
                    "file fireviz writes holds; restore or delete it"
                )
            run = len(piece) - piece.rfind(b"\n") - 1 if nl else run + len(piece)
            lines += nl
            if lines > max_values:
                raise too_many(lines)
            content = content or bool(piece.strip())
            if not content and total > line_limit:
                break  # refused below: more than a line of nothing but whitespace
            cheap += nl + piece.count(b"[") + piece.count(b"{") + piece.count(b",")
    if not content and total:
        raise FileFormatError(
            f"{path} holds {'more than ' if total > line_limit else ''}{total:,} bytes of whitespace and no JSON "
            "record; restore or delete it"
        )
    return parts, cheap


def _jsonl_parse(numbered_lines, path: Path, max_depth: int, allow_nonfinite: bool):
    """:func:`read_jsonl`'s parse of ``(number, bytes)`` lines: ``(objects, the last bad line's error
    or None)``; a bad line followed by a record, too deep a line or a line that is not an object
    raise FileFormatError at once."""
    out: list[dict] = []
    torn: FileFormatError | None = None  # a bad line, forgiven only if no record follows it
    for n, raw in numbered_lines:
        line = raw.decode("utf-8", errors="replace")
        if not line.strip():
            continue
        if torn is not None:
            raise torn
        try:
            obj = parse_json(line, f"{path}:{n}", max_depth=max_depth, allow_nonfinite=allow_nonfinite)
        except FileFormatError as e:
            if json_depth(line) > max_depth:  # too deep is never a torn write: refused even last
                raise
            torn = e
            continue
        if not isinstance(obj, dict):
            raise FileFormatError(
                f"{path}:{n} is a JSON {type(obj).__name__}, not an object; restore or delete the file"
            )
        out.append(obj)
    return out, torn


#: decompressed bytes of a JSON-lines file kept in memory between :func:`read_jsonl`'s count and its
#: parse (a larger file is decompressed a second time, line by line)
_KEEP_BYTES = 64 << 20


#: Bytes per element of each safetensors dtype (the format's own list).
SAFETENSORS_ITEMSIZE = {
    "F64": 8,
    "F32": 4,
    "F16": 2,
    "BF16": 2,
    "I64": 8,
    "I32": 4,
    "I16": 2,
    "I8": 1,
    "U64": 8,
    "U32": 4,
    "U16": 2,
    "U8": 1,
    "BOOL": 1,
    "F8_E4M3": 1,
    "F8_E5M2": 1,
}


def check_safetensors_header(header: object, data_len: int | None, source: str) -> dict[str, dict]:
    """Validate a parsed safetensors header as the format requires, before any tensor is read.

    Every entry but ``__metadata__`` needs a known ``dtype``, a ``shape`` of integers >= 0 and
    ``data_offsets`` [begin, end] of integers with ``end − begin`` = elements × itemsize; the
    entries must tile the data buffer exactly (no gap, no overlap) and, when ``data_len`` (bytes
    after the header) is known, end at it.
    Returns: ``{name: entry}``. Raises: FileFormatError naming ``source`` and the bad entry
    (a truncated file says so).
    """
    if not isinstance(header, dict):
        raise FileFormatError(f"{source}: the safetensors header is not a JSON object")
    entries = {k: v for k, v in header.items() if k != "__metadata__"}
    spans = []
    for name, e in entries.items():

        def bad(why: str, name: str = name):
            raise FileFormatError(f"{source}: tensor {name!r} has {why}; the file is corrupt")

        if not isinstance(e, dict):
            bad("a header entry that is not an object")
        if e.get("dtype") not in SAFETENSORS_ITEMSIZE:
            bad(f"an unknown dtype {str(e.get('dtype'))[:20]!r}")
        shape, offs = e.get("shape"), e.get("data_offsets")
        if not (
            isinstance(shape, list) and all(isinstance(d, int) and not isinstance(d, bool) and d >= 0 for d in shape)
        ):
            bad("a shape that is not a list of integers >= 0")
        if not (
            isinstance(offs, list)
            and len(offs) == 2
            and all(isinstance(o, int) and not isinstance(o, bool) and o >= 0 for o in offs)
            and offs[0] <= offs[1]
        ):
            bad("data_offsets that are not two integers 0 <= begin <= end")
        if offs[1] - offs[0] != math.prod(shape) * SAFETENSORS_ITEMSIZE[e["dtype"]]:
            bad(f"data_offsets {offs} that do not hold its shape {shape} of {e['dtype']}")
        spans.append((offs[0], offs[1], name))
    spans.sort()
    at = 0
    for a, b, name in spans:
        if a != at:
            raise FileFormatError(
                f"{source}: tensor {name!r} starts at byte {a}, not {at}: the tensors do not tile the "
                "data (a gap or an overlap); the file is corrupt"
            )
        at = b
    if data_len is not None and at != data_len:
        what = "truncated" if at > data_len else "longer than its header says"
        raise FileFormatError(f"{source} is {what} ({data_len:,} bytes of tensor data; the header needs {at:,})")
    return entries


def output_path_problem(out: str | os.PathLike, flag: str = "--out", example: str = "results.json") -> str | None:
    """Why the file ``out`` (given as ``flag``) cannot be written — it is a folder, or lies under a
    file — or None (missing parent folders are made). Checked by the CLIs before any work, so a
    bad path costs nothing. Returns one sentence naming the path and the fix."""
    if not str(out).strip():
        return f"{flag} is empty; give a file path such as {example}"
    if str(out).endswith(("/", os.sep)):  # Path() would drop the slash and write a file of that name
        return f"{flag} {out} names a folder (it ends in /); give a file path such as {out}{example}"
    out = Path(out)
    blocker = next((p for p in out.parents if p.exists() and not p.is_dir()), None)
    if out.is_dir():
        return f"{flag} {out} is a folder; give a file path such as {out / example}"
    if blocker is not None:
        return f"{flag} {out} lies under {blocker}, which is a file; give a file path such as {example}"
    return None


def check_json_shape(
    text: str,
    source: str,
    error: type[Exception] = FileFormatError,
    max_values: int | None = None,
    max_depth: int | None = MAX_JSON_DEPTH,
    fix: str = "fix or remove that line",
) -> None:
    """Refuse (``error``, one line ending in ``fix``) JSON ``text`` that would parse into more than ``max_values``
    values (default ``MAX_JSON_VALUES``: ~0.2 GB of objects) or nest deeper than ``max_depth``
    (None: not checked — a caller that catches the parser's RecursionError, whose depth costs
    no memory), before it is parsed. Costs three ``str.count`` calls for text the counts prove
    within (without ``max_depth``: any text of fewer brackets and commas than ``max_values``, a
    corpus document's line whatever its braces); a linear scan otherwise."""
    cap = MAX_JSON_VALUES if max_values is None else max_values
    if max_depth is None:
        if 1 + text.count("[") + text.count("{") + text.count(",") <= cap:
            return
    elif _within_shape(text, max_depth, cap):
        return
    depth, values = _json_shape(text)
    if max_depth is not None and depth > max_depth:
        raise error(f"{source} nests {depth} levels deep (at most {max_depth} are read); {fix}")
    if values > cap:
        raise error(
            f"{source} holds up to {values:,} JSON values (at most {cap:,} are read: parsing costs memory per "
            f"value); {fix}"
        )
