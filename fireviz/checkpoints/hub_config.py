"""Reading a published model's config.json: its error, its size bounds, checked numbers.

Shared by the family readers (``hub_families``) and the RoPE frequencies (``hub_rope``).
"""

from __future__ import annotations

import math

from fireviz.model import CheckpointError


class HubModelError(CheckpointError):
    """A published model cannot be read: not found, offline without a cache, gated, an unknown
    or unsupported architecture, a missing tensor, or pickled weights only."""


#: Bounds on the sizes read from a published config.json (beyond every published model).
MAX_LAYERS, MAX_HEADS, MAX_SIZE = 1024, 1024, 1 << 24


def config_int(cfg: dict, *keys, default=None, lo: int = 1, hi: int = MAX_SIZE):
    """The first of ``keys`` that config.json names, as an integer in [lo, hi]."""
    for k in keys:
        if k in cfg and cfg[k] is not None:
            v = cfg[k]
            if not (isinstance(v, int) and not isinstance(v, bool)):
                raise HubModelError(f"config.json field {k} = {str(v)[:40]!r} is not an integer")
            if not lo <= v <= hi:
                raise HubModelError(
                    f"config.json field {k} = {v} is outside {lo}..{hi:,}; the config is not a working model's"
                )
            return v
    if default is None:
        raise HubModelError(f"config.json names none of {', '.join(keys)}; is it a complete transformers config?")
    return default


def config_number(
    d: dict, key: str, default: float, lo: float = 0.0, strict: bool = True, where: str = "config.json"
) -> float:
    """``d[key]`` (or ``default`` when absent/null) as a finite float > lo (>= lo if not strict)."""
    v = d.get(key)
    if v is None:
        return float(default)
    if not (
        isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) and (v > lo if strict else v >= lo)
    ):
        raise HubModelError(
            f"{where} field {key} = {str(v)[:40]!r} must be a finite number {'>' if strict else '>='} {lo:g}"
        )
    return float(v)
