"""The evaluation cache: where a finished length is kept, and the shipped results read like it.

A result is stored under ``<cache>/<key>.json`` (``default_cache_dir``: ``$FIREVIZ_CACHE_DIR/eval``
or ``~/.cache/fireviz/eval``), the key the sha256 of the checkpoint's identity
(``checkpoints.checkpoint_sha256``), the data fingerprint and every setting that decides the
numbers (``eval_settings.EvalSettings.length_settings``). A checkpoint folder's own
``results.json`` (the shipped numbers) is read as a read-only cache under the same key. An
entry that is not what fireviz writes (wrong types, non-finite numbers, missing fields) is
ignored, never shown.

Each entry carries ``mac``: HMAC-SHA256 of its key and result under a secret of this user
(:func:`cache_secret_path`: ``$FIREVIZ_CACHE_KEY_FILE``, else
``$XDG_CONFIG_HOME/fireviz/eval-cache.key`` or ``~/.config/fireviz/eval-cache.key``; 32 random
bytes made on first use, readable by its owner only, kept outside the cache folder). An entry
whose mac does not verify (edited by hand however consistently, written under another secret,
or before fireviz signed entries) is computed again, never served (issue #50). Whoever can read
the secret can forge entries: the mac guards a cache folder that others may write (a shared
``--cache-dir``), not one whose owner's account is compromised.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import math
import os
from dataclasses import dataclass
from pathlib import Path

from fireviz.core import FileFormatError, read_json
from fireviz.eval import stats
from fireviz.eval.windows import EvaluationError

_PER_LENGTH_FIELDS = (
    "length",
    "nats_per_token",
    "perplexity",
    "bits_per_byte",
    "tokens_scored",
    "windows",
    "loss_by_position",
)
#: fields added after the first round of results: checked when present, required in same_text
_PER_DOCUMENT_FIELDS = ("doc", "nats", "tokens")


@dataclass(frozen=True)
class EvalCache:
    """Where an evaluation keeps and finds finished lengths.

    ``folder``: the cache folder (None: :func:`default_cache_dir`); ``enabled``: False neither
    reads nor writes it; ``use_published``: also read a checkpoint's own ``results.json`` (same
    weights sha256, data fingerprint and every cache-key setting; read each time, never copied
    into the cache — scripts/publish_results.py, which rewrites those files, may turn it off);
    ``require_intervals``: an entry made before fireviz kept per-document losses (no interval, no
    pairing) counts as not computed (True, :func:`evaluate`'s default) or is shown as it is
    (False, a lookup's default: :meth:`for_lookup`)."""

    folder: str | os.PathLike | None = None
    enabled: bool = True
    use_published: bool = True
    require_intervals: bool = True

    def checked_root(self, write: bool = True) -> Path:
        """The cache folder, checked before any work (nothing is created).
        Raises: EvaluationError if it is a file or lies under one, or (``write``) if it cannot be
        written or created: a result is never computed only to fail when it is stored."""
        root = Path(self.folder) if self.folder is not None else default_cache_dir()
        if not self.enabled:
            return root
        existing = next((p for p in (root, *root.parents) if p.exists()), None)
        if existing is not None and not existing.is_dir():
            why = "is a file" if existing == root else f"lies under {existing}, which is a file"
        elif write and existing is not None and not os.access(existing, os.W_OK | os.X_OK):
            why = "is not writable" if existing == root else f"cannot be created: {existing} is not writable"
        else:
            return root
        raise EvaluationError(f"the cache folder {root} {why}; give a folder you can write (--cache-dir) or --no-cache")

    @classmethod
    def for_lookup(cls, folder: str | os.PathLike | None = None) -> "EvalCache":
        """The cache as a lookup reads it: entries without per-document losses shown as they are."""
        return cls(folder, require_intervals=False)


def default_cache_dir() -> Path:
    """``$FIREVIZ_CACHE_DIR/eval`` if the variable is set, else ``~/.cache/fireviz/eval``: the
    variable names fireviz's cache root, as for the Hub cache (``<root>/hub``)."""
    env = os.environ.get("FIREVIZ_CACHE_DIR")
    return (Path(env).expanduser() if env else Path.home() / ".cache" / "fireviz") / "eval"


def cache_key(sha256: str, data_fingerprint: str, length_settings: dict) -> str:
    """sha256 (hex) of the checkpoint's identity (``Checkpoint.sha256``), the data fingerprint and
    the canonical settings JSON."""
    blob = json.dumps(
        {"checkpoint_sha256": sha256, "data_fingerprint": data_fingerprint, "settings": length_settings},
        sort_keys=True,
        separators=(",", ":"),
    )
    return hashlib.sha256(blob.encode("utf-8")).hexdigest()


#: environment variable naming the file of the secret the cache's entries are signed with
CACHE_KEY_ENV = "FIREVIZ_CACHE_KEY_FILE"
_SECRET: dict[Path, bytes | None] = {}


def cache_secret_path() -> Path:
    """Where the cache's signing secret lives: ``$FIREVIZ_CACHE_KEY_FILE``, else
    ``$XDG_CONFIG_HOME/fireviz/eval-cache.key`` (``~/.config`` when that is unset)."""
    env = os.environ.get(CACHE_KEY_ENV)
    if env:
        return Path(env).expanduser()
    base = os.environ.get("XDG_CONFIG_HOME") or str(Path.home() / ".config")
    return Path(base).expanduser() / "fireviz" / "eval-cache.key"


def _secret() -> bytes | None:
    """The signing secret (made on first use: 32 random bytes, mode 0600, created exclusively so two
    processes agree); None when it can neither be read nor made (then the cache is not read,
    said once by a RuntimeWarning)."""
    path = cache_secret_path()
    if path in _SECRET:
        return _SECRET[path]
    secret: bytes | None = None
    try:
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
            try:
                os.write(fd, os.urandom(32))
                os.fsync(fd)
            finally:
                os.close(fd)
        except FileExistsError:
            pass
        with open(path, "rb") as f:
            secret = f.read(4096)
        if len(secret) < 16:
            raise OSError(f"{path} holds {len(secret)} bytes, too few for a secret; delete it to make a new one")
    except OSError as e:
        import warnings

        warnings.warn(
            f"the evaluation cache's signing secret {path} cannot be read or made ({e}); cached results are not "
            f"used (each is computed again): set {CACHE_KEY_ENV} to a file you can write",
            RuntimeWarning,
            stacklevel=3,
        )
        secret = None
    _SECRET[path] = secret
    return secret


def entry_mac(key: str, result: dict) -> str | None:
    """HMAC-SHA256 (hex) of a cache entry's key and result (canonical JSON) under :func:`_secret`;
    None without a secret."""
    secret = _secret()
    if secret is None:
        return None
    blob = json.dumps({"key": key, "result": result}, sort_keys=True, separators=(",", ":"), allow_nan=False)
    return hmac.new(secret, blob.encode("utf-8"), hashlib.sha256).hexdigest()


def _number(v: object) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


def _valid_entry(entry: object, length: int) -> bool:
    # what summarize() writes, checked deep enough that a damaged cache entry or results.json
    # is recomputed (or ignored) rather than shown or crashing a figure
    if not isinstance(entry, dict) or any(k not in entry for k in _PER_LENGTH_FIELDS) or entry["length"] != length:
        return False
    nats, ppl, bpb = (entry[k] for k in ("nats_per_token", "perplexity", "bits_per_byte"))
    if not (_number(nats) and _number(ppl) and _number(bpb) and nats >= 0):
        return False
    if not all(
        isinstance(entry[k], int) and not isinstance(entry[k], bool) and entry[k] > 0
        for k in ("tokens_scored", "windows")
    ):
        return False
    per_byte = nats / math.log(2)  # one token is one byte
    if "bytes_scored" in entry:  # a tokenizer of its own: bits per byte over the bytes its targets cover
        scored = entry["bytes_scored"]
        if not (isinstance(scored, int) and not isinstance(scored, bool) and scored > 0):
            return False
        per_byte = nats * entry["tokens_scored"] / scored / math.log(2)
        if not (
            _number(entry.get("tokens_per_byte"))
            and math.isclose(entry["tokens_per_byte"], entry["tokens_scored"] / scored, rel_tol=1e-9)
        ):
            return False
    if not (math.isclose(ppl, math.exp(nats), rel_tol=1e-6) and math.isclose(bpb, per_byte, rel_tol=1e-6)):
        return False
    if "seconds" in entry and not _number(entry["seconds"]):
        return False
    if ("per_document" in entry or "ci95" in entry) and not _valid_per_document(entry):
        return False
    lbp = entry["loss_by_position"]
    if not (
        isinstance(lbp, dict)
        and all(isinstance(lbp.get(k), list) for k in ("bucket_starts", "bucket_ends", "nats", "tokens"))
    ):
        return False
    return all(v is None or _number(v) for v in lbp["nats"]) and all(
        _number(v) for k in ("bucket_starts", "bucket_ends", "tokens") for v in lbp[k]
    )


def _valid_per_document(entry: dict) -> bool:
    # the per-document losses add up to the entry's own numbers (the mean is theirs, to rounding),
    # and its interval holds its value: a hand-edited number is not served
    pd, ci = entry.get("per_document"), entry.get("ci95")
    if not (
        isinstance(pd, dict)
        and all(isinstance(pd.get(k), list) for k in _PER_DOCUMENT_FIELDS)
        and len({len(pd[k]) for k in _PER_DOCUMENT_FIELDS}) == 1
        and pd["doc"]
        and all(isinstance(v, str) for v in pd["doc"])
        and all(_number(v) for v in pd["nats"])
        and all(isinstance(v, int) and not isinstance(v, bool) and v > 0 for v in pd["tokens"])
        and sum(pd["tokens"]) == entry["tokens_scored"]
        and entry.get("documents") == len(pd["doc"])
    ):
        return False
    if ("bytes" in pd or "bytes_scored" in entry) and not (
        isinstance(pd.get("bytes"), list)
        and len(pd["bytes"]) == len(pd["doc"])
        and all(isinstance(v, int) and not isinstance(v, bool) and v >= 0 for v in pd["bytes"])
        and sum(pd["bytes"]) == entry.get("bytes_scored")
    ):
        return False
    mean = math.fsum(pd["nats"]) / sum(pd["tokens"])
    if not (math.isfinite(mean) and math.isclose(entry["nats_per_token"], mean, rel_tol=1e-6, abs_tol=1e-12)):
        return False
    if ci is None and len(pd["doc"]) < stats.MIN_INTERVAL_DOCUMENTS:
        return True  # too few documents: no interval
    if not (isinstance(ci, list) and len(ci) == 2 and all(_number(v) for v in ci) and ci[0] <= ci[1]):
        return False
    bpb = entry["bits_per_byte"]
    slack = 1e-6 * abs(bpb) + 1e-12  # the interval's percentiles and the mean are summed in other orders
    return ci[0] - slack <= bpb <= ci[1] + slack


#: A checkpoint folder's published evaluations (scripts/publish_results.py writes them).
PUBLISHED_RESULTS = "results.json"


def published_results(folder: str | os.PathLike, sha256: str, data_fingerprint: str) -> list[dict]:
    """The results in ``<folder>/results.json`` computed on exactly these weights and data.

    Args: ``folder`` the checkpoint's folder, ``sha256`` its identity (``Checkpoint.sha256``),
      ``data_fingerprint`` the data's. Returns: the matching result dicts (as ``evaluate_many`` returns them); []
      when the file is missing, unreadable or made from other weights/data. A shipped
      checkpoint's numbers thus show without recomputing on a fresh machine, and a stale
      results.json (weights retrained, corpus changed) is never used. Raises nothing.
    """
    try:
        obj = read_json(Path(folder) / PUBLISHED_RESULTS, expect=(dict, list))
    except FileFormatError:
        return []
    items = obj if isinstance(obj, list) else [obj]
    return [
        r
        for r in items
        if isinstance(r, dict)
        and r.get("checkpoint_sha256") == sha256
        and r.get("data_fingerprint") == data_fingerprint
        and isinstance(r.get("settings"), dict)
        and isinstance(r.get("per_length"), list)
    ]


def _published_read(published: list[dict], length_settings: dict, length: int) -> dict | None:
    # every setting that is part of the cache key must match, the format version included
    for r in published:
        s = r["settings"]
        if any(s.get(k) != v for k, v in length_settings.items() if k not in ("length", "normalizer_cap")):
            continue
        # the cap in effect for this checkpoint (None for a plain FIRE row and for every non-FIRE one)
        if r.get("normalizer_cap") != length_settings.get("normalizer_cap"):
            continue
        for e in r["per_length"]:
            if isinstance(e, dict) and e.get("length") == length and _valid_entry(e, length):
                return {k: v for k, v in e.items() if k not in ("cached", "source")}
    return None


def _cache_read(path: Path, key: str, length: int) -> dict | None:
    try:
        obj = read_json(path, expect=dict)
    except FileFormatError:
        return None
    if not isinstance(obj, dict) or obj.get("key") != key or not _valid_entry(obj.get("result"), length):
        return None
    mac, want = obj.get("mac"), entry_mac(key, obj["result"])
    if not (isinstance(mac, str) and want is not None and hmac.compare_digest(mac, want)):
        return None  # edited, signed under another secret, or unsigned: computed again
    return obj["result"]


# ---------------------------------------------------------------------------------------------
# Public API
# ---------------------------------------------------------------------------------------------


def _lookup(
    entry_path: Path,
    key: str,
    n: int,
    length_settings: dict,
    published: list[dict],
    use_cache: bool,
    require_intervals: bool,
) -> dict | None:
    """A finished result for these settings: the cache first, then the checkpoint's results.json."""
    cached = _cache_read(entry_path, key, n) if use_cache else None
    source = "cache"
    if cached is None and published:
        # read from results.json every time, never copied into the cache: a corrected
        # results.json takes effect at once, and a read-only cache does not matter
        cached, source = _published_read(published, length_settings, n), PUBLISHED_RESULTS
    if cached is not None and require_intervals and "per_document" not in cached:
        return None  # made before per-document losses were kept: no interval, no pairing
    return None if cached is None else {**cached, "cached": True, "source": source}
