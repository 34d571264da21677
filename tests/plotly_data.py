"""Decode plotly 7 figure data for tests: arrays are stored as ``{"dtype", "bdata", "shape"}``
(base64 of little-endian bytes) in ``fig.to_dict()``; plain lists stay lists."""

from __future__ import annotations

import base64

import numpy as np


def decode(value) -> np.ndarray:
    """A trace property from ``fig.to_dict()`` → numpy array (bdata decoded, reshaped)."""
    if isinstance(value, dict) and "bdata" in value:
        arr = np.frombuffer(base64.b64decode(value["bdata"]), dtype=np.dtype(value["dtype"]).newbyteorder("<"))
        if "shape" in value:
            arr = arr.reshape([int(s) for s in str(value["shape"]).split(",")])
        return arr
    return np.array(value, dtype=np.float64 if _has_none(value) else None)


def _has_none(v) -> bool:
    if isinstance(v, (list, tuple)):
        return any(_has_none(x) for x in v)
    return v is None


def traces(fig) -> list[dict]:
    """``fig.to_dict()["data"]`` with x, y, z and error_y.array decoded to numpy."""
    out = []
    for tr in fig.to_dict()["data"]:
        t = dict(tr)
        for key in ("x", "y", "z"):
            if key in t:
                t[key] = decode(t[key])
        if "error_y" in t and "array" in t["error_y"]:
            t["error_y"] = dict(t["error_y"], array=decode(t["error_y"]["array"]))
        out.append(t)
    return out


def shapes(fig, name: str) -> list[dict]:
    """Layout shapes with the given ``name`` (e.g. "training length")."""
    return [s for s in fig.to_dict()["layout"].get("shapes", []) if s.get("name") == name]
