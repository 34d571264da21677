"""The one interface every position encoding answers, so the model, analysis and fitting treat them alike.

Three kinds:
  * ``additive`` – ``bias(q_len, k_len, q_offset)`` returns float32 logits
    ``[num_heads, q_len, k_len]`` added to ``q·k/√d_head`` before masking and softmax.
  * ``rotary``   – ``rotate(x, positions)`` rotates queries or keys at absolute positions.
  * ``none``     – NoPE: the causal mask is the only source of order.
"""

from __future__ import annotations

import torch
from torch import nn

from fireviz.core import is_int, mask_output

#: Query rows computed at once by the default blocked ``bias``; keeps peak memory near
#: the size of the output even for encodings with per-pair intermediates (FIRE's MLP).
BIAS_QUERY_BLOCK = 512


def query_positions(q_len: int, k_len: int, q_offset: int | None) -> tuple[int, int]:
    """Validate a ``bias`` request and return ``(q_offset, k_len)``.

    Queries sit at absolute positions ``q_offset … q_offset + q_len − 1`` (tokens); keys at
    ``0 … k_len − 1``. The default ``q_offset = k_len − q_len`` aligns queries bottom-right,
    as with a KV cache (x-transformers' convention).

    Raises: ValueError for lengths or an offset that are not integers (bools and floats
    included), non-positive lengths or a negative offset.
    """
    for name, v in (("q_len", q_len), ("k_len", k_len), ("q_offset", q_offset)):
        if v is not None and not is_int(v):
            raise ValueError(f"{name} must be an integer number of tokens (got {v!r})")
    if q_len < 1 or k_len < 1:
        raise ValueError(f"q_len and k_len must be >= 1 (got q_len={q_len}, k_len={k_len})")
    if q_offset is None:
        if q_len > k_len:
            raise ValueError(
                f"q_len={q_len} > k_len={k_len}: the default bottom-right alignment puts queries "
                "before the first key; pass an explicit q_offset >= 0 (queries at absolute "
                "positions q_offset…)"
            )
        q_offset = k_len - q_len
    if q_offset < 0:
        raise ValueError(
            f"q_offset={q_offset} is negative; queries sit at absolute positions q_offset… so it must be >= 0"
        )
    return int(q_offset), int(k_len)


def check_position_offset(position_offset) -> int:
    """``position_offset`` (tokens, the absolute start of a window) as an int >= 0.

    Raises: ValueError for a negative, fractional or bool offset."""
    if isinstance(position_offset, bool) or int(position_offset) != position_offset or position_offset < 0:
        raise ValueError(f"position_offset must be an integer number of tokens >= 0 (got {position_offset!r})")
    return int(position_offset)


def relative_distance(q_len: int, k_len: int, q_offset: int, device=None) -> torch.Tensor:
    """Query-minus-key distance ``i − j`` in tokens, int64 ``[q_len, k_len]``.

    Positive below the diagonal (past keys), negative at masked future keys.
    """
    i = torch.arange(q_offset, q_offset + q_len, device=device)[:, None]
    j = torch.arange(k_len, device=device)[None, :]
    return i - j


def _grid_positions(q_positions, k_positions) -> tuple[torch.Tensor, torch.Tensor]:
    """int64 CPU vectors of grid positions. Raises: ValueError for a negative one."""
    qs = torch.as_tensor(list(q_positions) if not torch.is_tensor(q_positions) else q_positions, dtype=torch.long)
    ks = torch.as_tensor(list(k_positions) if not torch.is_tensor(k_positions) else k_positions, dtype=torch.long)
    qs, ks = qs.flatten().cpu(), ks.flatten().cpu()
    if (qs.numel() and int(qs.min()) < 0) or (ks.numel() and int(ks.min()) < 0):
        raise ValueError("positions must be >= 0 tokens")
    return qs, ks


class PositionEncoding(nn.Module):
    """Base class. Subclasses set ``kind`` and implement ``bias`` or ``rotate``.

    Attributes:
      kind: ``"additive" | "rotary" | "none"``.
      num_heads: heads the encoding serves.
    """

    kind: str = "none"

    def __init__(self, num_heads: int):
        super().__init__()
        if num_heads < 1:
            raise ValueError(f"num_heads must be >= 1 (got {num_heads})")
        self.num_heads = num_heads

    def bias(self, q_len: int, k_len: int, q_offset: int | None = None, position_offset: int = 0) -> torch.Tensor:
        """Additive logits ``[num_heads, q_len, k_len]`` (float32). Additive kinds only.

        ``position_offset`` (tokens, >= 0) shifts every position: queries sit at
        ``position_offset + q_offset …``, keys at ``position_offset + 0 …`` (a window that
        starts deep inside a long sequence; randomized positions, Ruoss et al. 2023). A bias
        of i − j alone ignores it; FIRE's normalizer ψ(max(L, i)) does not.
        Raises: TypeError for a rotary or NoPE encoding.
        """
        raise TypeError(f"{type(self).__name__} is a {self.kind} encoding and has no bias()")

    def masked_bias(
        self, q_len: int, k_len: int, q_offset: int | None = None, position_offset: int = 0
    ) -> torch.Tensor:
        """``bias`` with −inf at future keys (j > i), float32 ``[num_heads, q_len, k_len]``:
        the additive causal mask attention uses. Subclasses may fuse the two (same values).

        Raises: TypeError for a rotary or NoPE encoding; ValueError for bad lengths/offset.
        """
        q_offset, k_len = query_positions(q_len, k_len, q_offset)
        b = self.bias(q_len, k_len, q_offset, position_offset)
        return b.masked_fill(relative_distance(q_len, k_len, q_offset, b.device) < 0, float("-inf"))

    @torch.no_grad()
    def bias_at(self, q_positions, k_positions) -> torch.Tensor:
        """The bias on a query × key grid of absolute positions (tokens, 0-based, any order).

        Returns: float32 ``[num_heads, len(q_positions), len(k_positions)]`` logits on the CPU,
          NaN where the key is in the future (j > i) unless the encoding is ``bidirectional``
          (a T5 encoder stack). This base version asks ``bias`` for one query row (i + 1 keys)
          at a time; subclasses evaluate their formula on the pairs only (memory ∝ the grid).
        Raises: TypeError for a rotary or NoPE encoding; ValueError for negative positions.
        """
        qs, ks = _grid_positions(q_positions, k_positions)
        out = torch.full((self.num_heads, qs.numel(), ks.numel()), float("nan"))
        for r, i in enumerate(qs.tolist()):
            row = self.bias(1, i + 1, i)[:, 0].float().cpu()  # [H, keys 0..i]
            ok = ks <= i
            out[:, r, ok] = row[:, ks[ok]]
        return out

    def rotate(self, x: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        """Rotate ``x [..., T, head_dim]`` at absolute ``positions [T]``. Rotary kinds only.

        Raises: TypeError for a non-rotary encoding.
        """
        raise TypeError(f"{type(self).__name__} is a {self.kind} encoding and has no rotate()")

    @torch.no_grad()
    def project_(self) -> None:
        """Project learnable parameters back onto their constraint set, in place.

        Called by the trainer after every optimizer step (projected gradient descent, as the
        KERPLE reference code does). No-op for encodings without constrained parameters.
        """

    def position_parameters(self) -> dict[str, list[float]]:
        """The encoding's scalar position parameters as used in the forward pass, per head
        where they are per head: e.g. FIRE's ``{"c": [c], "L": [L tokens]}``, Kerple's
        ``{"r1": [...], "r2": [...]}``. Empty for encodings without such parameters. The
        trainer logs them at every validation point (``train_log.jsonl``)."""
        return {}


def _toeplitz_rows(table: torch.Tensor, q_len: int, k_len: int, reuse: bool = False) -> torch.Tensor:
    """``out[h, i, j] = table[h, i − j + k_len − 1]``: float ``[H, q_len, k_len]``, row-major,
    from a per-distance table ``[H, q_len + k_len − 1]`` (index 0: distance −(k_len − 1)
    relative to the first query). ``reuse``: no graph keeps the result, which may then go into
    the blocked forward's reused mask memory (``fireviz.core.scratch``)."""
    rows = table.flip(-1).unfold(-1, k_len, 1)  # row r: the last query's row minus r
    # Gather the rows in query order, which writes a row-major mask. (rows.flip(1) gives the
    # same values but, for q_len ≠ k_len, in the view's transposed layout, and SDPA reads
    # such a mask ~4× slower: benchmarks/README.md, eval at 8192.)
    order = torch.arange(q_len - 1, -1, -1, device=rows.device)
    if not reuse or table.dtype != torch.float32:
        return rows[:, order]
    out = mask_output((rows.shape[0], q_len, k_len), rows.device)
    # the same gather into ``out`` (index_select(out=) copies the overlapping view first: 5× slower)
    return torch.ops.aten.index.Tensor_out(rows, [None, order], out=out)


class _ToeplitzRows(torch.autograd.Function):
    """``_toeplitz_rows`` with a direct backward: the table's gradient is the sum of the output
    gradient along each diagonal (i − j constant), read through one strided view of the
    gradient padded by q_len zeros on both sides — instead of autograd's scatter-add through
    the gather and the unfold (index_put, ~1.5× slower at [4, 512, 512])."""

    @staticmethod
    def forward(ctx, table, q_len, k_len):
        ctx.lengths = (q_len, k_len)
        return _toeplitz_rows(table, q_len, k_len)

    @staticmethod
    def backward(ctx, grad):
        Q, K = ctx.lengths
        H, width = grad.shape[0], K + 2 * Q
        padded = torch.nn.functional.pad(grad, (Q, Q)).contiguous()  # [H, Q, K + 2Q]
        # diagonal[h, i, c] = padded[h, i, i + c] = grad[h, i, i + c − Q]: distance i − j = Q − c
        diagonal = padded.as_strided((H, Q, Q + K), (Q * width, width + 1, 1))
        return diagonal.sum(1)[:, 1:].flip(-1), None, None  # distances Q − 1 … −(K − 1), reversed


class ToeplitzBias(PositionEncoding):
    """An additive bias that depends only on the distance ``d = i − j``: b_h(i, j) = g_h(d).

    Subclasses implement ``bias_by_distance(d) -> [num_heads, *d.shape]`` (float32, finite
    for every integer d including negative, i.e. masked future, distances). ``bias`` then
    evaluates g once per distinct distance (q_len + k_len − 1 values) and gathers, so the
    cost is one read of the output whatever g costs.
    """

    kind = "additive"

    def bias_by_distance(self, d: torch.Tensor) -> torch.Tensor:  # pragma: no cover - abstract
        """g(d): logits ``[num_heads, *d.shape]`` (float32) for integer distances ``d = i − j``
        in tokens, negative (future) ones included. Subclasses implement it."""
        raise NotImplementedError

    @torch.no_grad()
    def bias_at(self, q_positions, k_positions) -> torch.Tensor:
        """See :meth:`PositionEncoding.bias_at`: one table over the grid's distances, gathered."""
        qs, ks = _grid_positions(q_positions, k_positions)
        if qs.numel() == 0 or ks.numel() == 0:
            return torch.full((self.num_heads, qs.numel(), ks.numel()), float("nan"))
        d = qs[:, None] - ks[None, :]
        two_sided = bool(getattr(self, "bidirectional", False))
        lo, hi = (int(d.min()), int(d.max())) if two_sided else (0, max(int(d.max()), 0))
        table = self.bias_by_distance(torch.arange(lo, hi + 1, device=self.device)).float().cpu()  # [H, D]
        out = table[:, d.clamp(lo, hi) - lo]
        if not two_sided:
            out[:, d < 0] = float("nan")
        return out

    def bias(self, q_len: int, k_len: int, q_offset: int | None = None, position_offset: int = 0) -> torch.Tensor:
        """Bias logits, float32 ``[num_heads, q_len, k_len]``; see :class:`PositionEncoding`
        (``position_offset`` changes nothing: the bias depends on i − j only).

        Raises: ValueError for bad lengths/offset (see :func:`query_positions`).
        """
        q_offset, k_len = query_positions(q_len, k_len, q_offset)
        device = self.device
        d_min = q_offset - (k_len - 1)
        d_max = q_offset + q_len - 1
        table = self.bias_by_distance(torch.arange(d_min, d_max + 1, device=device)).float()  # [H, D]
        # Rows are sliding windows of the reversed table: one copy forward, a strided sum back.
        return table.flip(-1).unfold(-1, k_len, 1).flip(1)

    def masked_bias(
        self, q_len: int, k_len: int, q_offset: int | None = None, position_offset: int = 0
    ) -> torch.Tensor:
        """``bias`` with −inf at future keys (j > i), float32 ``[num_heads, q_len, k_len]``
        (``position_offset`` changes nothing: the bias depends on i − j only).

        The −inf goes into the per-distance table (d < 0), so the mask costs no extra pass
        over ``[num_heads, q_len, k_len]``; equal to ``bias(...).masked_fill(j > i, −inf)``.
        Always row-major (contiguous), the layout SDPA reads fastest.
        Raises: ValueError for bad lengths/offset.
        """
        q_offset, k_len = query_positions(q_len, k_len, q_offset)
        d = torch.arange(q_offset - (k_len - 1), q_offset + q_len, device=self.device)
        table = self.bias_by_distance(d).float().masked_fill(d < 0, float("-inf"))  # [H, D]
        if table.requires_grad:
            return _ToeplitzRows.apply(table, q_len, k_len)
        return _toeplitz_rows(table, q_len, k_len, reuse=not torch.is_grad_enabled())

    @property
    def device(self) -> torch.device:
        """Device of the encoding's parameters/buffers (CPU when it has none)."""
        for t in list(self.parameters()) + list(self.buffers()):
            return t.device
        return torch.device("cpu")
