"""A GPT-style decoder whose position encoding is one config field.

Shapes follow TransformerLens' naming: ``[batch, pos, d_model]`` activations,
``[batch, head, query_pos, key_pos]`` attention. Read top to bottom like nanoGPT's model.py
(Karpathy), whose plainness this follows: pre-LayerNorm blocks, GELU MLP, tied embeddings,
causal attention through ``F.scaled_dot_product_attention`` with the position bias folded
into the mask (added after the 1/√d_head scaling, before masking).

Attention probabilities are handed out by the model itself: ``GPT.capture_attention`` (the
computation is ``fireviz.model.capture``; a capture records only its own thread's passes)
and ``GPT.attention_probs``, which stops the pass after the last layer it needs
(``GPT.hidden_states``). What defines a model is
``fireviz.model.config.GPTConfig``; reading a saved one back, and its weights, is checked by
``fireviz.model.state`` (``GPT.from_pretrained``).
"""

from __future__ import annotations

import math
import os
from contextlib import contextmanager, nullcontext
from pathlib import Path
from typing import Iterable, Iterator, cast

import torch
import torch.nn.functional as F
from huggingface_hub import PyTorchModelHubMixin
from torch import nn

from fireviz.core import is_int, reuse_mask_memory, sort_safetensors_metadata
from fireviz.encodings import PositionEncoding, build_encoding, encoding_spec
from fireviz.encodings.base import check_position_offset
from fireviz.model.attention import attention, causal_attention_mask
from fireviz.model.capture import CAPTURES, AttentionCapture, check_layers, check_logits, check_queries

# The model's public names, defined with what they belong to and importable from here too:
from fireviz.model.config import BOS_ID, BYTE_VOCAB_SIZE, GPTConfig  # noqa: F401
from fireviz.model.flex import FlexUnavailable, causal_flex
from fireviz.model.state import (
    ENCODING_METADATA_KEY,
    CheckpointError,  # noqa: F401  (public here: fireviz.model.gpt.CheckpointError)
    check_checkpoint_ref,
    check_load_options,
    encoding_record,
    folder_weights,
    load_checked,
)

#: devices on which a training pass builds a shared encoding's whole mask once, even with query
#: blocks (each block reads its slice): CUDA, where memory is plentiful and FIRE-S's bias costs a
#: step more than the mask's size (issue 49). Tests add "cpu" to check the slicing on a CPU.
WHOLE_MASK_DEVICES = {"cuda"}


class KVCache:
    """Keys and values seen so far, per layer: ``[batch, head, key_pos, head_dim]`` each.

    Keys are stored already rotated (rotary encodings), so a new query at absolute
    position ``length`` attends exactly as in the full forward pass.
    """

    def __init__(self, n_layer: int):
        self.keys: list[torch.Tensor | None] = [None] * n_layer
        self.values: list[torch.Tensor | None] = [None] * n_layer
        self.length = 0  # tokens already in the cache

    def append(self, layer: int, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Append new keys/values ``[batch, heads, new, head_dim]`` of ``layer`` to the cache;
        returns all of that layer's keys and values so far ``[batch, heads, length + new, head_dim]``.
        (``length`` itself is advanced by the model after the last layer.)"""
        prev_k, prev_v = self.keys[layer], self.values[layer]
        if prev_k is not None:
            assert prev_v is not None  # keys and values are stored together
            k = torch.cat([prev_k, k], dim=2)
            v = torch.cat([prev_v, v], dim=2)
        self.keys[layer], self.values[layer] = k, v
        return k, v


class CausalSelfAttention(nn.Module):
    """Multi-head causal self-attention; the position encoding is passed in per call.

    Under a ``GPT.capture_attention`` block each call of the thread that opened it hands the
    block's ``AttentionCapture`` its queries, keys and mask (``fireviz.model.capture``;
    ``capture`` is that thread's, else None); the output is the same either way.
    """

    def __init__(self, config: GPTConfig):
        super().__init__()
        self.n_head, self.head_dim = config.n_head, config.head_dim
        self.qkv = nn.Linear(config.d_model, 3 * config.d_model, bias=False)
        self.proj = nn.Linear(config.d_model, config.d_model, bias=False)
        self.dropout = config.dropout
        self.query_block = config.attn_query_block
        self.backend = "sdpa"  # or "flex" (GPT.set_attention_backend): the bias inside FlexAttention

    @property
    def capture(self) -> AttentionCapture | None:
        """The capture recording this module's calls in the calling thread (``GPT.capture_attention``), or None."""
        return CAPTURES.lookup(self)

    def _dropout_in_call(self, position_offset: int) -> float:
        """The attention dropout probability a call applies now (0 in eval mode and on the flex path)."""
        flex = self.backend == "flex" and not torch.is_grad_enabled() and not position_offset
        return self.dropout if self.training and not flex else 0.0

    def _flex_now(self, q: torch.Tensor, position_offset: int, cache) -> bool:
        """Whether this call goes through FlexAttention: backend ``"flex"``, no position offset, no
        KV cache (each decoding step's new key length would compile the kernel again), and either
        nothing to differentiate (any device) or CUDA without attention dropout in training
        (PyTorch has FlexAttention's backward on CUDA only; it has no dropout). Elsewhere SDPA."""
        if self.backend != "flex" or position_offset or cache is not None:
            return False
        if not (torch.is_grad_enabled() and q.requires_grad):
            return True
        return q.device.type == "cuda" and (not self.training or self.dropout == 0.0)

    def forward(
        self,
        x: torch.Tensor,
        encoding: PositionEncoding,
        q_offset: int,
        cache: KVCache | None = None,
        layer: int = 0,
        mask: torch.Tensor | None = None,
        position_offset: int = 0,
    ) -> torch.Tensor:
        """``x [batch, pos, d_model]`` at absolute positions ``position_offset + q_offset…`` → same shape.

        ``mask``: a precomputed ``causal_attention_mask`` for this call's queries and keys (with
        query blocks each block reads its slice).
        Under a capture of the calling thread (``self.capture``) the probabilities of this call are recorded too.
        """
        B, T, _ = x.shape
        q, k, v = self.qkv(x).view(B, T, 3, self.n_head, self.head_dim).permute(2, 0, 3, 1, 4)
        if encoding.kind == "rotary":
            pos = torch.arange(q_offset, q_offset + T, device=x.device) + position_offset
            q, k = encoding.rotate(q, pos), encoding.rotate(k, pos)
        if cache is not None:
            k, v = cache.append(layer, k, v)
        if CAPTURES.active:  # some thread is in GPT.capture_attention: is it this one, for this module?
            capture = CAPTURES.lookup(self)
            if capture is not None:  # the probabilities from these q, k and mask
                capture.record(
                    layer, q, k, encoding, q_offset, mask, position_offset, self._dropout_in_call(position_offset)
                )
        k_len = k.shape[2]
        dropout = self.dropout if self.training else 0.0
        if self._flex_now(q, position_offset, cache):
            try:
                y = causal_flex(q, k, v, encoding if encoding.kind == "additive" else None, q_offset)
                return self.proj(y.transpose(1, 2).reshape(B, T, -1))
            except FlexUnavailable:  # no fused form of this bias (FIRE with mlp_depth 2): the SDPA path
                pass
        if T <= self.query_block:
            y = self._attend(q, k, v, encoding, q_offset, k_len, dropout, mask, position_offset)
        else:
            # Query blocks: each block sees only the keys it may attend to (causal), so
            # memory is ∝ block × length and the masked half is never computed.
            # Without autograd (or a capture, which keeps masks) the blocks' masks share one
            # buffer: its pages are touched once per layer, not once per block (fireviz.scratch).
            reuse = not torch.is_grad_enabled() and encoding.kind == "additive" and self.capture is None
            size = self.n_head * self.query_block * (q_offset + T) if reuse else 0
            outs = []
            with reuse_mask_memory(size, q.device) if reuse else nullcontext():
                for start in range(0, T, self.query_block):
                    stop = min(start + self.query_block, T)
                    keys = q_offset + stop
                    outs.append(
                        self._attend(
                            q[:, :, start:stop],
                            k[:, :, :keys],
                            v[:, :, :keys],
                            encoding,
                            q_offset + start,
                            keys,
                            dropout,
                            None if mask is None else mask[:, start:stop, :keys],
                            position_offset,
                        )
                    )
            y = torch.cat(outs, dim=2)
        return self.proj(y.transpose(1, 2).reshape(B, T, -1))

    @staticmethod
    def _attend(q, k, v, encoding, q_offset, k_len, dropout, mask, position_offset=0):
        q_len = q.shape[2]
        if mask is None and not (encoding.kind != "additive" and q_len == k_len):
            mask = causal_attention_mask(encoding, q_len, k_len, q_offset, q.device, position_offset)
        return attention(q, k, v, mask, dropout, causal=True)  # causal_attention_mask: −inf after each query


class Block(nn.Module):
    """Pre-LayerNorm transformer block: x + attn(ln(x)), then x + mlp(ln(x)) (GELU, 4×)."""

    def __init__(self, config: GPTConfig):
        super().__init__()
        self.ln_1 = nn.LayerNorm(config.d_model)
        self.attn = CausalSelfAttention(config)
        self.ln_2 = nn.LayerNorm(config.d_model)
        self.mlp = nn.Sequential(
            nn.Linear(config.d_model, 4 * config.d_model, bias=False),
            nn.GELU(),
            nn.Linear(4 * config.d_model, config.d_model, bias=False),
            nn.Dropout(config.dropout),
        )
        self.drop = nn.Dropout(config.dropout)

    def forward(self, x, encoding, q_offset, cache=None, layer=0, mask=None, position_offset=0):
        """Pre-LN residual block: x + attn(ln(x)), then + mlp(ln(x)); x ``[batch, T, d_model]``."""
        x = x + self.drop(self.attn(self.ln_1(x), encoding, q_offset, cache, layer, mask, position_offset))
        return x + self.mlp(self.ln_2(x))


def _check_token_ids(idx) -> None:
    """Raises ValueError unless ``idx`` is a non-empty int64 / int32 tensor ``[batch, pos]`` of token ids."""
    if not torch.is_tensor(idx):
        raise ValueError(f"idx must be token ids, an int64 tensor [batch, pos] (got {type(idx).__name__})")
    if idx.dim() != 2 or idx.dtype not in (torch.int64, torch.int32):
        raise ValueError(
            f"idx must be token ids, an int64 tensor [batch, pos] (got a {idx.dim()}-D {idx.dtype} tensor of "
            f"shape {tuple(idx.shape)}); for one sequence pass idx[None], for floats idx.long()"
        )
    if idx.numel() == 0:
        raise ValueError(f"idx holds no tokens (shape {tuple(idx.shape)}); give at least one sequence of >= 1 token")


class GPT(
    nn.Module,
    PyTorchModelHubMixin,
    library_name="fireviz",
    repo_url="https://github.com/fireviz/fireviz",
    tags=["position-encoding", "fire", "length-generalization"],
):
    """Decoder-only language model over bytes. ``model(idx) -> logits [batch, pos, vocab]``.

    ``save_pretrained(dir)`` writes config.json + model.safetensors (Hugging Face layout);
    ``GPT.from_pretrained(dir_or_repo_id)`` loads them through safetensors only, always
    strictly (every tensor present, none extra, shapes equal; ``strict=False`` is refused).
    Raises: ValueError for a bad config (see ``GPTConfig.validate``); ``from_pretrained``:
    CheckpointError for a folder without model.safetensors or config.json, an unknown or
    invalid config field, corrupt/truncated weights or weights that do not match the config;
    for a Hub repo id, huggingface_hub's errors (e.g. RepositoryNotFoundError,
    EntryNotFoundError, or LocalEntryNotFoundError when offline).
    """

    def __init__(self, config: GPTConfig):
        super().__init__()
        if isinstance(config, dict):
            try:
                config = GPTConfig(**config)
            except TypeError as e:
                raise ValueError(f"GPT config has a field GPTConfig does not know: {e}") from None
        if not isinstance(config, GPTConfig):
            raise ValueError(f"GPT needs a GPTConfig or a dict of its fields (got {type(config).__name__})")
        self.config = config.validate()
        c = config
        self.wte = nn.Embedding(c.vocab_size, c.d_model)
        self.wpe = nn.Embedding(c.seq_len, c.d_model) if c.absolute_position_embedding else None
        self.drop = nn.Dropout(c.dropout)
        self.blocks = nn.ModuleList(Block(c) for _ in range(c.n_layer))
        self.ln_f = nn.LayerNorm(c.d_model)
        self.lm_head = nn.Linear(c.d_model, c.vocab_size, bias=False)
        self.lm_head.weight = self.wte.weight  # tied embeddings
        self._init_transformer_weights()
        n_enc = 1 if encoding_spec(c.position_encoding).one_module else c.n_layer
        opts = c.resolved_encoding_options()
        self.encodings = nn.ModuleList(
            build_encoding(c.position_encoding, c.n_head, c.head_dim, **opts) for _ in range(n_enc)
        )

    def _init_transformer_weights(self) -> None:
        # nanoGPT/GPT-2 init; encodings keep their own (FIRE's MLP, T5's table, Kerple's r).
        for name, p in self.named_parameters():
            if p.dim() == 2:
                std = (
                    0.02 / math.sqrt(2 * self.config.n_layer)
                    if name.endswith(("proj.weight", "mlp.2.weight"))
                    else 0.02
                )
                nn.init.normal_(p, mean=0.0, std=std)

    def set_attention_backend(self, backend: str) -> "GPT":
        """``"sdpa"`` (default: the bias as an SDPA mask, query blocks) or ``"flex"`` (the bias
        computed inside compiled FlexAttention, ``fireviz.model.flex``; no [heads, q, k] tensor, for
        long contexts on a GPU): used for inference on any device and for training on CUDA (no
        attention dropout, no position offset; elsewhere those calls take the SDPA path). Returns
        self. Raises: ValueError for another name."""
        if backend not in ("sdpa", "flex"):
            raise ValueError(f"attention backend must be 'sdpa' or 'flex' (got {backend!r})")
        for block in self.blocks:
            cast(Block, block).attn.backend = backend
        return self

    def encoding(self, layer: int) -> PositionEncoding:
        """The position-encoding module used by ``layer`` (shared modules repeat)."""
        return cast(PositionEncoding, self.encodings[layer if len(self.encodings) > 1 else 0])

    def num_parameters(self, include_embeddings: bool = True) -> int:
        """Parameter count (tied embeddings counted once)."""
        n = sum(p.numel() for p in self.parameters())
        return n if include_embeddings else n - self.wte.weight.numel()

    def forward(self, idx: torch.Tensor, cache: KVCache | None = None, position_offset: int = 0) -> torch.Tensor:
        """Next-token logits ``[batch, pos, vocab]`` for token ids ``idx [batch, pos]`` (int64).

        With ``cache`` the tokens continue the cached ones (absolute positions start at
        ``cache.length``) and the cache is extended. ``position_offset`` (tokens, >= 0)
        places the whole input at absolute positions ``position_offset …`` — a window taken
        from deep inside a long sequence (``train.random_position_offset``); encodings of
        i − j alone are unchanged by it (RoPE's q·k too, up to rounding); FIRE's normalizer
        ψ(max(L, i)) sees it.
        Raises: ValueError if ids are out of the vocabulary, absolute embeddings would be
        asked for a position past seq_len, or for a negative / non-integer offset or an
        offset together with a cache.
        """
        x = self._residual_stream(idx, cache, position_offset, len(self.blocks))
        if cache is not None:
            cache.length += idx.shape[1]
        return self.lm_head(self.ln_f(x))

    def hidden_states(self, idx: torch.Tensor, upto_layer: int | None = None, position_offset: int = 0) -> torch.Tensor:
        """The residual stream ``[batch, pos, d_model]`` after block ``upto_layer`` (default the last,
        before the final LayerNorm) for token ids ``idx [batch, pos]`` (int64); the blocks after
        it, ``ln_f`` and ``lm_head`` are not run. Same numbers as inside ``forward`` (no KV cache).

        Raises: ValueError as ``forward``, for ``upto_layer`` not a block index, or for ``idx`` not
        a non-empty integer tensor ``[batch, pos]``.
        """
        _check_token_ids(idx)
        n = len(self.blocks)
        if upto_layer is None:
            upto_layer = n - 1
        if not is_int(upto_layer) or not 0 <= upto_layer < n:
            raise ValueError(f"upto_layer must be a block index in 0..{n - 1} (got {upto_layer!r})")
        return self._residual_stream(idx, None, position_offset, int(upto_layer) + 1)

    def _residual_stream(
        self, idx: torch.Tensor, cache: KVCache | None, position_offset: int, n_blocks: int
    ) -> torch.Tensor:
        """Embeddings, then blocks ``0 … n_blocks − 1``: ``[batch, pos, d_model]``. Raises: see ``forward``."""
        B, T = idx.shape
        position_offset = check_position_offset(position_offset)
        if position_offset and cache is not None:
            raise ValueError(
                "position_offset cannot be combined with a KV cache (the cache already places the "
                "tokens); use one or the other"
            )
        q_offset = cache.length if cache is not None else 0
        if idx.numel() and (int(idx.min()) < 0 or int(idx.max()) >= self.config.vocab_size):
            raise ValueError(
                f"token ids must lie in [0, {self.config.vocab_size}); got {int(idx.min())}..{int(idx.max())}"
            )
        x = self.wte(idx)
        if self.wpe is not None:
            start = q_offset + position_offset
            if start + T > self.config.seq_len:
                raise ValueError(
                    f"absolute position embeddings cover {self.config.seq_len} tokens; got "
                    f"{start + T}. Use a relative encoding to go longer."
                )
            x = x + self.wpe(torch.arange(start, start + T, device=idx.device))
        x = self.drop(x)
        # One mask per distinct encoding module when the whole input is one attention call:
        # shared encodings (ALiBi, Sandwich, fire_s) then compute their bias once per pass. On
        # CUDA in training a shared encoding's whole [heads, T, T] mask is built once per pass
        # even when the queries go in blocks (each block reads its slice): FIRE-S's bias once per
        # step, not once per layer and block (issue 49). Elsewhere blocks bound memory as before.
        masks: dict[int, torch.Tensor | None] = {}
        single_block = T <= self.config.attn_query_block
        whole = single_block or (
            idx.device.type in WHOLE_MASK_DEVICES
            and torch.is_grad_enabled()
            and len(self.encodings) == 1
            and n_blocks > 1
        )
        for layer in range(n_blocks):
            enc = self.encoding(layer)
            mask = None
            if whole and enc.kind == "additive":
                if id(enc) not in masks:
                    masks[id(enc)] = causal_attention_mask(enc, T, q_offset + T, q_offset, idx.device, position_offset)
                mask = masks[id(enc)]
            x = self.blocks[layer](x, enc, q_offset, cache, layer, mask, position_offset)
        return x

    @contextmanager
    def capture_attention(
        self,
        layers: Iterable[int] | int | None = None,
        queries: Iterable[int] | int | torch.Tensor | None = None,
        logits: bool = False,
    ) -> Iterator[AttentionCapture]:
        """Record the attention probabilities of ``layers`` in the forward passes run inside the block.

        ``with model.capture_attention(layers=[1]) as cap: model(idx)``, then ``cap[1].probs`` is
        float32 ``[batch, heads, queries, keys]``: softmax(q·kᵀ/√d_head + bias + causal mask)
        from the very q, k and mask layer 1 attended with (``fireviz.model.capture``).
        Args:
          layers: block indices: an int, or a list, tuple, range, set or 1-D integer tensor /
            array of them (default all).
          queries: query positions to record (tokens, 0-based, a KV cache's tokens counted; an int
            or the forms ``layers`` takes; default every query of each pass); every pass through
            a recorded layer must hold them.
          logits: True to also record the content logits q·kᵀ/√d_head and the additive mask
            (``AttentionRecord.content``, ``.bias``).
        Yields: the :class:`~fireviz.model.capture.AttentionCapture`; its ``records`` (the
          latest pass per layer) stay readable after the block. The forward's output is the
          same, bit for bit, with and without a capture. The capture ends with the block, by
          an exception too. In training mode with dropout > 0 the records hold the
          probabilities before attention dropout (``AttentionRecord.dropout``: the rate applied).
        Threads: only the passes run by the thread that opened the block are recorded; other
          threads may run or capture the same model meanwhile, unaffected.
        Raises: ValueError for a bad layer, query position or ``logits`` not a bool (at once)
          and, during a pass, for a query position the pass does not hold; RuntimeError if
          this thread is already capturing this model (captures of one model do not nest).
        """
        cap = AttentionCapture(check_layers(layers, len(self.blocks)), check_queries(queries), check_logits(logits))
        modules = [block.attn for block in self.blocks]
        with CAPTURES.open(cap, [modules[layer] for layer in cap.layers], modules):
            yield cap

    @torch.no_grad()
    def attention_probs(
        self,
        idx: torch.Tensor,
        layers: Iterable[int] | int | None = None,
        queries: Iterable[int] | int | torch.Tensor | None = None,
        logits: bool = False,
        position_offset: int = 0,
    ) -> AttentionCapture:
        """One pass over token ids ``idx [batch, pos]`` (int64) recording ``layers``' attention.

        As ``capture_attention`` (same arguments), run in eval mode (dropout off) without
        gradients, and stopped after the last layer asked for (``hidden_states(idx,
        max(layers))``). A model in training mode is switched to eval mode for the pass and back
        after (which other threads' passes at that moment would see: share models in eval mode,
        as the app does; one in eval mode is left untouched). Thread-safe otherwise.
        Returns: the capture; ``cap[layer].probs`` float32 ``[batch, heads, queries, keys]``.
        Raises: ValueError as ``capture_attention`` and ``forward``, or for ``idx`` not a
          non-empty integer tensor ``[batch, pos]``.
        """
        _check_token_ids(idx)
        was_training = self.training
        switch = any(m.training for m in self.modules())  # a model wholly in eval mode is not touched
        if switch:
            self.eval()
        try:
            with self.capture_attention(layers, queries, logits) as cap:
                self.hidden_states(idx, cap.layers[-1], position_offset)
        finally:
            if switch:
                self.train(was_training)
        return cap

    @torch.no_grad()
    def generate(
        self,
        idx: torch.Tensor,
        max_new_tokens: int,
        temperature: float = 1.0,
        top_k: int | None = None,
        generator: torch.Generator | None = None,
    ) -> torch.Tensor:
        """Sample ``max_new_tokens`` continuation tokens with a KV cache.

        ``idx [batch, pos]`` int64 prompt → ``[batch, pos + max_new_tokens]``.
        temperature 0 means greedy decoding; ``top_k`` keeps the k most likely tokens.
        Raises: ValueError for a negative or non-finite temperature, top_k not an integer >= 1,
          max_new_tokens < 0, a prompt that is not int64 [batch, pos], or (checked before
          sampling) prompt + max_new_tokens past ``seq_len`` with absolute embeddings.
        """
        if (
            not (math.isfinite(temperature) and temperature >= 0)
            or max_new_tokens < 0
            or (top_k is not None and (isinstance(top_k, bool) or not isinstance(top_k, int) or top_k < 1))
        ):
            raise ValueError(
                f"generate needs a finite temperature >= 0, an integer top_k >= 1 and max_new_tokens >= 0 "
                f"(got temperature={temperature}, top_k={top_k}, max_new_tokens={max_new_tokens})"
            )
        if idx.dim() != 2 or idx.dtype != torch.long:
            raise ValueError(
                f"generate needs an int64 prompt [batch, pos] (got {idx.dtype} {tuple(idx.shape)}); "
                "for one prompt use idx[None]"
            )
        if self.config.absolute_position_embedding and idx.shape[1] + max_new_tokens > self.config.seq_len:
            raise ValueError(
                f"prompt ({idx.shape[1]}) + max_new_tokens ({max_new_tokens}) exceeds seq_len="
                f"{self.config.seq_len}, the most an absolute position embedding can place; "
                "generate fewer tokens"
            )
        cache = KVCache(self.config.n_layer)
        logits = self(idx, cache)[:, -1]
        out = [idx]
        for _ in range(max_new_tokens):
            if temperature == 0:
                nxt = logits.argmax(-1, keepdim=True)
            else:
                logits = logits / temperature
                if top_k is not None:
                    kth = torch.topk(logits, min(top_k, logits.shape[-1])).values[:, -1:]
                    logits = logits.masked_fill(logits < kth, float("-inf"))
                nxt = torch.multinomial(F.softmax(logits.float(), -1), 1, generator=generator)
            out.append(nxt)
            logits = self(nxt, cache)[:, -1]
        return torch.cat(out, dim=1)

    # -- checkpoints: safetensors only --------------------------------------------------------
    @classmethod
    def from_pretrained(cls, pretrained_model_name_or_path: str | os.PathLike, **kwargs) -> "GPT":
        """Load a checkpoint folder or a Hugging Face Hub repo id (config.json + model.safetensors).

        A local folder's config.json is checked here first (readable, a JSON object); a path
        that can only be local (absolute, ``./``, ``../``, ``~``, or more than one ``/``) and
        does not exist is refused instead of being tried as a Hub repo id. Keyword arguments
        are huggingface_hub's (``revision``, ``cache_dir``, ``token``, ``local_files_only``,
        ``map_location``, …); model settings come from config.json only.
        Raises: CheckpointError (see the class docstring), ValueError for a model keyword
          such as ``n_layer=…`` or a ``map_location`` that is not a usable device.
        """
        check_checkpoint_ref(pretrained_model_name_or_path)
        # huggingface_hub takes str | Path but str()s it: any PathLike works
        return super().from_pretrained(pretrained_model_name_or_path, **kwargs)  # type: ignore[arg-type]

    def _save_pretrained(self, save_directory: Path) -> None:
        """Write model.safetensors (huggingface_hub calls this from ``save_pretrained``) with the
        encoding recorded in its metadata (``fireviz.model.state.encoding_record``), compared with
        config.json whenever it is loaded."""
        from safetensors.torch import save_model

        path = Path(save_directory) / "model.safetensors"
        save_model(self, str(path), metadata={"format": "pt", ENCODING_METADATA_KEY: encoding_record(self.config)})
        sort_safetensors_metadata(path)  # the same model writes the same bytes

    @classmethod
    def _from_pretrained(
        cls,
        *,
        model_id: str,
        revision=None,
        cache_dir=None,
        force_download=False,
        local_files_only=False,
        token=None,
        map_location: str = "cpu",
        strict: bool = True,
        **model_kwargs,
    ):
        """Load config.json + model.safetensors (huggingface_hub calls this); never pickle.

        Raises: ValueError for the options ``check_load_options`` refuses; CheckpointError
        (``fireviz.model.state``); huggingface_hub's errors for a Hub repo id."""
        check_load_options(strict, model_kwargs, map_location)
        if os.path.isdir(model_id):
            weights = folder_weights(model_id)
        else:
            from huggingface_hub import hf_hub_download

            weights = hf_hub_download(
                repo_id=model_id,
                filename="model.safetensors",
                revision=revision,
                cache_dir=cache_dir,
                force_download=force_download,
                token=token,
                local_files_only=local_files_only,
            )
        return load_checked(cls, model_kwargs.get("config"), weights, model_id, map_location)
