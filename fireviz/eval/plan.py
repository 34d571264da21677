"""The text of an evaluation: the documents (or task sequences) and, per length, the windows scored.

``plan_text(settings)`` loads the data once per evaluation and plans every length's windows
(``fireviz.eval.windows``: the same-text, context-use, non-overlapping and sliding protocols; a synthetic task's
fresh sequences) — a function of the data and the settings only, never of a checkpoint, so
every checkpoint is scored on the same windows. Loaded documents are kept per file state
(``load_eval_documents``) and planned windows per data fingerprint and settings: asking again
for an unchanged file costs a ``stat``, not a read, a hash or a plan. Units: tokens = bytes.
"""

from __future__ import annotations

import hashlib
import json
import os
import threading
from collections import OrderedDict
from dataclasses import dataclass, field
from pathlib import Path

from fireviz.data import (
    DATA_DIR,
    DOMAINS,
    DataError,
    Document,
    DocumentTokens,
    data_fingerprint,
    load_documents,
    split_documents,
    synthetic,
)
from fireviz.data.shards import is_shard_folder, shard_documents
from fireviz.eval.settings import SPLITS, EvalSettings
from fireviz.eval.windows import (
    ContextPlan,
    EvaluationError,
    SameTextPlan,
    Window,
    plan_context,
    plan_same_text,
    plan_shared_text,
    plan_windows,
)


@dataclass
class Plan:
    """The text of an evaluation: per length its windows (or why none), document ids and sizes,
    the data fingerprint, the same-text or context-use plan, and the documents' tokens on demand."""

    windows: dict[int, list[Window] | str]
    ids: list[str]
    sizes: list[int]
    fingerprint: str
    split: str
    documents: int
    same_text: SameTextPlan | None = None
    docs: list = field(default_factory=list)
    context: ContextPlan | None = None
    tokens: dict = field(default_factory=dict)
    #: a tokenizer's plan (``plan_tokenized``): document index → ``TokenizedDocument``
    encoded: dict | None = None
    #: BOS id written over every window's first position (bos ``"window"``), else None
    bos_window: int | None = None
    #: what the text depends on beyond the data and settings: "" for fireviz's bytes alone; else the
    #: shared text's byte spans (same_text) or the tokenizer (other modes), and the BOS convention;
    #: part of every cache key, and entries pair across tokenizers only on the same key
    text_key: str = ""

    def window_tokens(self, n: int) -> int:
        """Tokens in a window of evaluation length ``n``: ``n`` for text; ``n + 1`` for a task, whose
        sequences are built exactly as in training at seq_len = n (a window of seq_len + 1 tokens:
        the model reads n of them and every prediction is scored; the last token is a target only);
        for context length n (mode ``context``) its windows' ``n + s``, or ``M`` for full."""
        if self.context is not None:
            return self.context.window_tokens[n]
        return n + 1 if self.split == "synthetic" else n

    def work(self, n: int, windows: list[Window]) -> int:
        """Progress units (tokens) of ``windows`` at length ``n``: the targets they score; in mode
        context the tokens they read (its cost grows with c while its targets stay K per document)."""
        w = self.window_tokens(n)
        return len(windows) * w if self.context is not None else targets(windows, w)

    def read_tokens(self, n: int) -> int:
        """Tokens the model reads at once at evaluation length ``n`` (for the memory check, the
        attention path, RoPE scaling and absolute position embeddings): the window of a context
        length (mode ``context``), else ``n``."""
        return self.context.window_tokens[n] if self.context is not None else n

    def doc_tokens(self, i: int):
        """Document (or task sequence) ``i`` as ``[BOS]+bytes`` tokens, sliceable (``DocumentTokens``)."""
        if self.encoded is not None:
            return self.encoded[i].ids
        if i not in self.tokens:  # [BOS]+bytes at one byte per token; windows are copied out of it
            self.tokens[i] = DocumentTokens(self.docs[i])
        return self.tokens[i]

    def doc_bytes(self, i: int):
        """int64 ``[num_tokens]``: the bytes each token of document ``i`` covers, or None for
        fireviz's bytes (one per token, BOS none)."""
        return None if self.encoded is None else self.encoded[i].token_bytes()

    def prefix_tokens(self) -> int | None:
        """The prefix M (tokens) of the same-text or context-use protocol, or None for the others."""
        if self.context is not None:
            return self.context.prefix_tokens
        return self.same_text.prefix_tokens if self.same_text is not None else None


def targets(windows: list[Window], n: int) -> int:
    """Target tokens the ``windows`` of ``n`` tokens each score."""
    return sum(n - w.first_target for w in windows)


#: loaded evaluation documents per (source, split, file state); a few sources at a time
_DOCUMENTS: OrderedDict[tuple, tuple[list[Document], str, str]] = OrderedDict()
_DOCUMENTS_KEPT = 4
_DOCUMENTS_LOCK = threading.Lock()  # also guards _PLANS


def _file_state(data: str | os.PathLike) -> tuple | None:
    """What identifies the content of a data source without reading it: (path, size, mtime,
    inode) of the file — of every file under a folder — or None when it cannot be stat'ed
    (then the source is loaded, and fails, as usual)."""
    path = DATA_DIR / f"{data}.jsonl.xz" if isinstance(data, str) and data in DOMAINS else Path(data)
    try:
        files = sorted(p for p in path.rglob("*") if p.is_file()) if path.is_dir() else [path]
        return tuple((str(p.resolve()), st.st_size, st.st_mtime_ns, st.st_ino) for p in files for st in (p.stat(),))
    except OSError:
        return None


def load_eval_documents(data: str | os.PathLike, split: str | None) -> tuple[list[Document], str, str]:
    """The documents of ``data`` in ``split`` (default ``"validation"``; ``"all"`` keeps every
    one), the split's name and their data fingerprint (``data.data_fingerprint``).

    Memoized per file state (path, size, modification time, inode of each file): a changed
    file is read again, an unchanged one is not (nor hashed). The documents are shared:
    callers must not change them.
    Raises: EvaluationError for an unknown split; DataError as ``data.load_documents``, or an
      empty split (with a hint to use split 'all' for a file of one's own).
    """
    split = split or "validation"
    if split not in SPLITS:
        raise EvaluationError(f"split must be one of {', '.join(SPLITS)} (got {split!r})")
    state = _file_state(data)
    memo = (str(data), split, state)
    with _DOCUMENTS_LOCK:
        if state is not None and memo in _DOCUMENTS:
            _DOCUMENTS.move_to_end(memo)
            return _DOCUMENTS[memo]
    docs = shard_documents(data) if is_shard_folder(data) else load_documents(data)
    if split != "all":
        try:
            docs = split_documents(docs, split)
        except DataError as e:
            hint = (
                ""
                if isinstance(data, str) and data in DOMAINS
                else " — for a small file of your own use split='all' (--split all)"
            )
            raise DataError(f"{e}{hint}") from e
    out = docs, split, data_fingerprint(docs)
    if state is not None and state == _file_state(data):  # unchanged while it was read: keep it
        with _DOCUMENTS_LOCK:
            _DOCUMENTS[memo] = out
            while len(_DOCUMENTS) > _DOCUMENTS_KEPT:
                _DOCUMENTS.popitem(last=False)
    return out


def _plan_task(s: EvalSettings) -> Plan:
    task = synthetic.load_task(s.data)
    count = s.token_budget
    assert count is not None  # a task's budget is its sequence count (EvalSettings)
    windows: dict[int, list[Window] | str] = {}
    ids: list[str] = []
    tokens: dict = {}
    for n in s.lengths:
        try:
            first = task.split(n + 1)  # the training format at seq_len = n (see Plan.window_tokens)
        except DataError as e:
            windows[n] = str(e)
            continue
        seqs = task.sequences(n + 1, count, synthetic.evaluation_seed(n, s.seed))
        start = len(ids)
        for k in range(count):
            tokens[start + k] = seqs[k]
            ids.append(f"{task.name}/{n}/{k:05d}")
        windows[n] = [Window(start + k, 0, first) for k in range(count)]
    return Plan(windows, ids, [], task.fingerprint(), "synthetic", count, tokens=tokens)


#: planned windows per (data fingerprint, settings that choose them); a few plans at a time
_PLANS: OrderedDict[tuple, tuple[dict, SameTextPlan | None, ContextPlan | None]] = OrderedDict()
_PLANS_KEPT = 8


def _windows_for(s: EvalSettings, ids: list[str], sizes: list[int]):
    """``(windows per length, same-text plan or None, context plan or None)`` of documents of these
    ``sizes`` (tokens, in whatever tokenizer) under ``s``; a length without windows holds why."""
    same_text, context, windows = None, None, {}
    if s.mode == "context":
        assert s.prefix_tokens is not None and s.context_targets is not None and s.stride is not None  # by make
        context = plan_context(
            ids,
            sizes,
            list(s.lengths),
            prefix_tokens=s.prefix_tokens,
            targets=s.context_targets,
            stride=s.stride,
            token_budget=s.token_budget,
            seed=s.seed,
        )
        windows = dict(context.windows)
    elif s.mode == "same_text":
        same_text = plan_same_text(
            ids, sizes, list(s.lengths), token_budget=s.token_budget, seed=s.seed, prefix_tokens=s.prefix_tokens
        )
        windows = dict(same_text.windows)
    else:
        for n in s.lengths:
            try:
                windows[n] = plan_windows(
                    ids, sizes, n, mode=s.mode, stride=s.stride, token_budget=s.token_budget, seed=s.seed
                )
            except EvaluationError as e:
                windows[n] = str(e)
    return windows, same_text, context


def _plan_windows(s: EvalSettings, ids: list[str], sizes: list[int], fingerprint: str):
    """``(windows per length, same-text plan or None, context plan or None)`` for these documents:
    a pure function of their ids and sizes (fixed by ``fingerprint``) and the settings, so it is
    planned once."""
    memo = (fingerprint, s.mode, s.stride, s.token_budget, s.seed, s.lengths, s.prefix_tokens, s.context_targets)
    with _DOCUMENTS_LOCK:
        if memo in _PLANS:
            _PLANS.move_to_end(memo)
            return _PLANS[memo]
    windows, same_text, context = _windows_for(s, ids, sizes)
    with _DOCUMENTS_LOCK:
        _PLANS[memo] = windows, same_text, context
        while len(_PLANS) > _PLANS_KEPT:
            _PLANS.popitem(last=False)
    return windows, same_text, context


def plan_text(s: EvalSettings) -> Plan:
    """The data of ``s`` loaded (or a task's sequences built) and every length's windows planned;
    a length that has none (longer than every document, a stride larger than it) holds the
    reason (a str) instead. The plan's ``windows`` dict is the caller's to change; the window
    lists in it are shared with later plans of the same data and settings (never change them).
    Raises: DataError, EvaluationError as :func:`load_eval_documents` (and ``plan_same_text``
    when no length can be evaluated)."""
    if s.mode == "synthetic":
        return _plan_task(s)
    docs, split, fingerprint = load_eval_documents(s.data, s.split)
    ids, sizes = [d.id for d in docs], [d.num_tokens for d in docs]
    windows, same_text, context = _plan_windows(s, ids, sizes, fingerprint)
    return Plan(
        dict(windows), ids, sizes, fingerprint, split, len(docs), same_text=same_text, docs=docs, context=context
    )


#: tokenized documents per (data fingerprint, tokenizer identity, BOS convention); a few at a time
_ENCODED: OrderedDict[tuple, list] = OrderedDict()
_ENCODED_KEPT = 8


def _encoded(docs: list[Document], fingerprint: str, tokenizer, bos: str | None) -> list:
    memo = (fingerprint, tokenizer.key, bos)
    with _DOCUMENTS_LOCK:
        if memo in _ENCODED:
            _ENCODED.move_to_end(memo)
            return _ENCODED[memo]
    out = [tokenizer.encode(d, bos) for d in docs]
    with _DOCUMENTS_LOCK:
        _ENCODED[memo] = out
        while len(_ENCODED) > _ENCODED_KEPT:
            _ENCODED.popitem(last=False)
    return out


def plan_tokenized(s: EvalSettings, tokenizers: list) -> dict[str, Plan]:
    """The text of an evaluation whose checkpoints do not all read fireviz's bytes: one
    :class:`Plan` per tokenizer (its ``key``; ``fireviz.data.tokenizers``), lengths in that tokenizer's
    tokens. Mode ``same_text``: one text per document in bytes for all of them
    (``windows.plan_shared_text``), so they pair per document in bits per byte. Modes
    ``nonoverlapping`` and ``sliding``: each tokenizer's own windows (not paired across tokenizers).
    Mode ``context``: the context-use protocol (``windows.plan_context``) in the tokens of the one
    tokenizer all the checkpoints share. ``s.bos_mode`` decides BOS (``fireviz.data.tokenizers.BOS_MODES``;
    None: each model's own).
    Raises: EvaluationError for a task (byte sequences) or mode ``context`` across tokenizers;
      DataError as :func:`load_eval_documents` and for a BOS the tokenizer lacks."""
    if s.mode == "synthetic":
        raise EvaluationError(
            f"{s.data} is a task of byte sequences, scored as in training: only fireviz's byte-level checkpoints "
            "read it, with no BOS convention to change (drop --bos); evaluate a published model on text"
        )
    unique = {t.key: t for t in tokenizers}
    if s.mode == "context" and len(unique) > 1:
        raise EvaluationError(
            "mode context measures each checkpoint against its own full context, in its own tokens: give "
            "checkpoints that share one tokenizer (byte-level fireviz checkpoints together; a model with a tokenizer of its own in a run of its own)"
        )
    docs, split, fingerprint = load_eval_documents(s.data, s.split)
    ids = [d.id for d in docs]
    encoded = {k: _encoded(docs, fingerprint, t, s.bos_mode) for k, t in unique.items()}
    out = {}
    keys: dict[str, str] = {}
    if s.mode == "same_text":
        plans, spans = plan_shared_text(
            ids,
            {k: [e.byte_ends for e in enc] for k, enc in encoded.items()},
            list(s.lengths),
            token_budget=s.token_budget,
            seed=s.seed,
            prefix_tokens=s.prefix_tokens,
        )
        # the text is the byte span of each scored document: one key for every tokenizer reading it
        text = hashlib.sha256(json.dumps([[ids[d], spans[d]] for d in range(len(ids)) if spans[d]]).encode())
        for k, same in plans.items():
            sizes = [len(e) for e in encoded[k]]
            out[k] = Plan(dict(same.windows), ids, sizes, fingerprint, split, len(docs), same_text=same, docs=docs)
            keys[k] = f"bytes:{text.hexdigest()[:16]}|bos={s.bos_mode}"
    else:  # context use (one tokenizer, refused above otherwise) and random windows: each tokenizer's own
        for k, enc in encoded.items():
            sizes = [len(e) for e in enc]
            windows, _, context = _windows_for(s, ids, sizes)
            out[k] = Plan(windows, ids, sizes, fingerprint, split, len(docs), docs=docs, context=context)
            keys[k] = f"tokens:{k}|bos={s.bos_mode}"  # each tokenizer's own windows: paired within it only
    for k, plan in out.items():
        plan.encoded = dict(enumerate(encoded[k]))
        plan.text_key = keys[k]
        if s.bos_mode == "window":
            plan.bos_window = unique[k].bos_token_id
    return out
