"""Synthetic sequence tasks whose useful attention lies far back, generated on the fly.

Prose at fireviz's scale teaches only local heads (the bias falls with distance), so there is
nothing anti-local for FIRE to show. A copy task needs the opposite: to reproduce a random
string, each query must attend to one key about n tokens back — further back the longer the
string. Length generalization is then a clear question: trained on strings of one length,
does the model copy strings 8× longer?

``copy`` (the one task so far): a sequence of L tokens is

    [BOS] s_1 … s_n [SEP] s_1 … s_m        n = (L − 2) // 2 + (L − 2) % 2, m = L − 2 − n

with the symbols s drawn uniformly from ``COPY_ALPHABET`` (64 printable bytes) and SEP the
byte ``|`` (not in the alphabet). The answer positions are the m copied symbols (window
positions n + 2 … L − 1): they are exactly predictable from the first half; everything before
them is random and scores ln 64 nats at best. Token ids are bytes, as in fireviz's corpora,
with BOS = 256, so a task model is an ordinary fireviz checkpoint.

Training (``train.data = "synthetic:copy"``): every window of seq_len + 1 tokens is one fresh
sequence, drawn from a generator seeded by the window's start value (itself drawn from the
run's seed and step: ``fireviz.train.schedule.window_starts``), so runs are reproducible and resume
exactly. Validation and evaluation sequences come from disjoint seeds (``VALIDATION_SEED``,
``EVALUATION_SEED``). Nothing is read from or written to disk.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass

import numpy as np
import torch

from fireviz.data.corpus import BOS_ID, DataError

#: ``train.data`` / ``--data`` values that name a synthetic task start with this
PREFIX = "synthetic:"
TASKS = ("copy",)
#: the 64 symbols of the copy task: digits, lower and upper case letters, '-' and '_'
COPY_ALPHABET = np.frombuffer(b"0123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ-_", dtype=np.uint8)
SEP_ID = ord("|")
#: seeds of the validation sequences (during training) and of evaluation sequences
VALIDATION_SEED = 1_000_003
EVALUATION_SEED = 2_000_003
#: a synthetic stream's nominal size: window starts (= per-window seeds) are drawn below it
STREAM_TOKENS = 1 << 40


def evaluation_seed(length: int, seed: int = 0) -> int:
    """The base seed of the evaluation sequences of ``length`` tokens under evaluation ``seed``
    (``eval --seed``): ``EVALUATION_SEED + length`` for seed 0 (the published sequences), another
    base for each other seed, so ``--seed N`` draws a fresh set of sequences. Every sequence's own
    seed is then hashed from this base (``SyntheticTask.sequences``)."""
    return EVALUATION_SEED + length + int(seed) * STREAM_TOKENS


def is_synthetic(data: object) -> bool:
    """Whether a ``--data`` / ``train.data`` value names a synthetic task."""
    return isinstance(data, str) and data.startswith(PREFIX)


@dataclass(frozen=True)
class CopyTask:
    """The copy task (module docstring). ``name`` is the ``--data`` value."""

    name: str = PREFIX + "copy"
    #: answer accuracy of a uniform guess over the alphabet (1/64)
    chance_accuracy: float = 1.0 / len(COPY_ALPHABET)

    def split(self, length: int) -> int:
        """Window position of the first answer token (n + 2) for a sequence of ``length``."""
        if length < 4:
            raise DataError(f"a copy sequence needs at least 4 tokens ([BOS], a symbol, [SEP], its copy); got {length}")
        n = (length - 2) // 2 + (length - 2) % 2
        return n + 2

    def sequence(self, length: int, seed: int) -> torch.Tensor:
        """One sequence of ``length`` tokens, int64 ``[length]``, from ``seed`` alone."""
        first = self.split(length)
        n = first - 2
        rng = np.random.default_rng(int(seed))
        s = COPY_ALPHABET[rng.integers(0, len(COPY_ALPHABET), size=n)].astype(np.int64)
        seq = np.concatenate([[BOS_ID], s, [SEP_ID], s[: length - first]])
        return torch.from_numpy(seq.astype(np.int64))

    def batch(self, seeds, length: int) -> torch.Tensor:
        """Sequences for the given seeds → int64 ``[len(seeds), length]``."""
        return torch.stack([self.sequence(length, int(s)) for s in seeds])

    def sequences(self, length: int, count: int, seed: int) -> torch.Tensor:
        """``count`` sequences of ``length`` tokens from a base ``seed`` (sequence k uses
        seed ``hash(seed, k)``) → int64 ``[count, length]``."""
        return self.batch([_sub_seed(seed, k) for k in range(count)], length)

    def fingerprint(self) -> str:
        """sha256 (hex) naming the task's definition: the data fingerprint of its runs."""
        spec = {
            "task": self.name,
            "alphabet": COPY_ALPHABET.tobytes().decode(),
            "sep": SEP_ID,
            "bos": BOS_ID,
            "format": 1,
        }
        return hashlib.sha256(json.dumps(spec, sort_keys=True).encode()).hexdigest()


def _sub_seed(seed: int, k: int) -> int:
    return int.from_bytes(hashlib.sha256(f"{seed}:{k}".encode()).digest()[:8], "big") >> 1


def load_task(data: str) -> CopyTask:
    """The task named by ``"synthetic:<task>"``. Raises: DataError naming the known tasks."""
    name = data[len(PREFIX) :] if is_synthetic(data) else data
    if name == "copy":
        return CopyTask()
    raise DataError(f"unknown synthetic task {data!r}; known: " + ", ".join(PREFIX + t for t in TASKS))


class SyntheticStream:
    """Training windows of a task, in the interface of ``fireviz.data.corpus.TokenStream``:
    ``batch(starts, length)`` gives one fresh sequence per start (the start is its seed)."""

    def __init__(self, task: CopyTask):
        self.task = task

    @property
    def num_tokens(self) -> int:
        """A nominal size (``STREAM_TOKENS``): starts drawn below it act as per-window seeds."""
        return STREAM_TOKENS

    def batch(self, starts: torch.Tensor, length: int) -> torch.Tensor:
        """int64 ``[batch, length]``: sequence k from seed ``starts[k]``."""
        return self.task.batch(starts.tolist(), length)


def validation_sequences(task: CopyTask, length: int, count: int) -> torch.Tensor:
    """The fixed validation windows of a synthetic run: ``count`` sequences of ``length`` tokens
    from ``VALIDATION_SEED`` → int64 ``[count, length]``."""
    return task.sequences(length, count, VALIDATION_SEED + length)
