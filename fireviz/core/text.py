"""Small text formats shared by every stage's progress lines."""

from __future__ import annotations


def duration(seconds: float) -> str:
    """``"42 s"``, ``"3 min 05 s"`` or ``"2 h 07 min"`` (rounded to whole seconds, >= 0)."""
    seconds = max(0, int(round(seconds)))
    if seconds < 60:
        return f"{seconds} s"
    if seconds < 3600:
        return f"{seconds // 60} min {seconds % 60:02d} s"
    return f"{seconds // 3600} h {seconds % 3600 // 60:02d} min"
