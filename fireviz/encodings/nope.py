"""NoPE: no position encoding; order comes from the causal mask alone.
Source: Kazemnejad et al. 2023, "The Impact of Positional Encoding on Length
Generalization in Transformers"; Haviv et al. 2022."""

from __future__ import annotations

from fireviz.encodings.base import PositionEncoding


class NoPE(PositionEncoding):
    """The identity encoding: neither ``bias`` nor ``rotate`` (both raise TypeError)."""

    kind = "none"
