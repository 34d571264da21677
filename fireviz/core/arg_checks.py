"""Checks of the numbers a caller gives: each returns the value as a plain ``int`` / ``float`` or
raises one ``ValueError`` naming the argument, the range it takes and the value given.

Integers are ``int`` or numpy integers — never a bool, a float (10.7 is not truncated to 10), a
string ("4" is not parsed: text is parsed where it is read, e.g. ``analysis.parse_positions``)
or a tensor. Real numbers are ints or floats (numpy's too), never a bool or a string, and
finite. Used by the settings objects (``analysis.BiasSettings``, ``fit.FitSettings``, the fit
targets), so every door gives the same message for the same mistake. Never imports torch.
"""

from __future__ import annotations

import math
import numbers
from typing import TypeGuard

#: largest seed accepted (torch.Generator.manual_seed takes 0 … 2⁶⁴ − 1)
MAX_SEED = 2**64 - 1


def _range_text(lo, hi, lo_open: bool = False) -> str:
    if lo is not None and hi is not None and not lo_open:
        return f" in {lo}..{hi}"
    parts = []
    if lo is not None:
        parts.append(f"{'>' if lo_open else '>='} {lo}")
    if hi is not None:
        parts.append(f"<= {hi}")
    return (" " + " and ".join(parts)) if parts else ""


def _fail(what: str, kind: str, value, lo, hi, hint: str, lo_open: bool = False):
    raise ValueError(
        f"{what} must be {kind}{_range_text(lo, hi, lo_open)} (got {value!r})" + (f"; {hint}" if hint else "")
    )


def is_int(value) -> TypeGuard[int]:
    """``value`` is an integer that is not a bool (``int`` or a numpy integer, which types as ``int``)."""
    return isinstance(value, numbers.Integral) and not isinstance(value, bool)


def as_int(value, what: str, lo: int | None = None, hi: int | None = None, hint: str = "") -> int:
    """``value`` as an ``int`` in ``lo … hi`` (either bound may be None).

    Raises: ValueError ``"<what> must be an integer >= lo (got …); <hint>"`` for a bool, a float,
      a string, anything else that is not an integer, or one out of range."""
    if not is_int(value) or (lo is not None and value < lo) or (hi is not None and value > hi):
        _fail(what, "an integer", value, lo, hi, hint)
    return int(value)


def as_float(
    value, what: str, lo: float | None = None, hi: float | None = None, *, lo_open: bool = False, hint: str = ""
) -> float:
    """``value`` as a finite ``float`` with ``value >= lo`` (``> lo`` when ``lo_open``) and ``<= hi``.

    Raises: ValueError ``"<what> must be a finite number > lo (got …); <hint>"`` for a bool, a
      string, NaN, ±inf, anything that is not a real number, or one out of range."""
    ok = isinstance(value, numbers.Real) and not isinstance(value, bool)
    v = float(value) if ok else math.nan
    if not math.isfinite(v) or (lo is not None and (v <= lo if lo_open else v < lo)) or (hi is not None and v > hi):
        _fail(what, "a finite number", value, lo, hi, hint, lo_open)
    return v


def as_seed(value, what: str = "seed") -> int:
    """A seed as an ``int`` in 0 … ``MAX_SEED``. Raises: ValueError as :func:`as_int`."""
    return as_int(value, what, 0, MAX_SEED, "seeds are integers that torch.Generator.manual_seed takes")
