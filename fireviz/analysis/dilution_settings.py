"""What decides an attention-dilution measurement's numbers: one frozen ``DilutionSettings``.

``fireviz.analysis.text_attention.attention_dilution(model, tokens, …)`` measures, per layer and head, the
attention on the ``near`` nearest keys at growing query positions, each averaged over ``rows``
query rows, optionally with FIRE's normalizer capped. These settings are checked once, on
construction (``DilutionSettings.make`` or ``DilutionSettings(...)``), before a checkpoint is
read; :meth:`DilutionSettings.describe` is their JSON description (a cache or job key: positions
sorted and unique, so the same measurement has one key). Positions in tokens, 0-based.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Iterable

from fireviz.analysis.biases import DEFAULT_DILUTION_MULTIPLES, _check_positions, default_query_positions
from fireviz.core import as_int
from fireviz.encodings import check_normalizer_cap

#: Keys counted as near by default (the app's and the CLI's ``--near``).
DEFAULT_NEAR = 16
#: Consecutive query rows averaged per position by default.
DEFAULT_ROWS = 8


@dataclass(frozen=True)
class DilutionSettings:
    """Everything that decides an attention-dilution measurement's numbers.

    Fields: ``query_positions`` (sorted, unique integers >= 0, tokens; None = m·seq_len − 1 for
    m = 1, 2, 4, 8, 16, filled in per model by :meth:`resolve`), ``near`` (keys j with
    0 <= i − j < near count as near, an integer >= 1), ``rows`` (consecutive query rows
    averaged per position, an integer >= 1), ``normalizer_cap`` (FIRE only: measure with
    ψ(min(max(L, i), cap)), tokens in 1 … MAX_NORMALIZER_CAP, or None). Integers are ints or
    numpy ints, never bools, floats or strings (text goes through ``analysis.parse_positions``).
    """

    query_positions: tuple[int, ...] | None = None
    near: int = DEFAULT_NEAR
    rows: int = DEFAULT_ROWS
    normalizer_cap: int | None = None

    @classmethod
    def make(
        cls,
        query_positions: Iterable[int] | None = None,
        *,
        near: int = DEFAULT_NEAR,
        rows: int = DEFAULT_ROWS,
        normalizer_cap: int | None = None,
    ) -> "DilutionSettings":
        """Validated settings. Raises: ValueError naming the argument for query positions that are
        not a non-empty list of integers >= 0, ``near`` or ``rows`` not an integer >= 1, or a
        normalizer cap outside 1 … MAX_NORMALIZER_CAP."""
        # __post_init__ validates the positions and turns them into a sorted tuple
        return cls(query_positions, near, rows, normalizer_cap)  # type: ignore[arg-type]

    def __post_init__(self):
        positions = self.query_positions
        checked = {
            "query_positions": None if positions is None else tuple(_check_positions(positions, "query_positions")),
            "near": as_int(self.near, "near", 1, hint="keys counted as near, the query's own included (e.g. 16)"),
            "rows": as_int(self.rows, "rows", 1, hint="query rows averaged per position (e.g. 8)"),
            "normalizer_cap": check_normalizer_cap(self.normalizer_cap),
        }
        for name, value in checked.items():  # frozen: the checked values replace what was given
            object.__setattr__(self, name, value)

    def resolve(self, seq_len: int) -> "DilutionSettings":
        """The settings for a model of training length ``seq_len`` (tokens): the default query
        positions filled in. Raises: ValueError for seq_len < 1."""
        if self.query_positions is not None:
            return self
        return dataclasses.replace(
            self, query_positions=tuple(default_query_positions(seq_len, DEFAULT_DILUTION_MULTIPLES))
        )

    def tokens_needed(self, seq_len: int) -> int:
        """Tokens a text must hold for these settings on a model of training length ``seq_len``:
        the largest query position + 1."""
        positions = self.resolve(seq_len).query_positions
        assert positions is not None  # resolved
        return positions[-1] + 1

    def describe(self) -> dict:
        """The settings as JSON: ``query_positions`` (a sorted list or null), ``near``, ``rows``,
        ``normalizer_cap`` (a cache or job key's settings)."""
        return {
            "query_positions": None if self.query_positions is None else list(self.query_positions),
            "near": self.near,
            "rows": self.rows,
            "normalizer_cap": self.normalizer_cap,
        }
