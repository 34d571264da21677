"""A GPT-style decoder whose position encoding is one config field.

Shapes follow TransformerLens' naming: ``[batch, pos, d_model]`` activations,
``[batch, head, query_pos, key_pos]`` attention. Read top to bottom like nanoGPT's model.py
(Karpathy), whose plainness this follows: pre-LayerNorm blocks, GELU MLP, tied embeddings,
causal attention through ``F.scaled_dot_product_attention`` with the position bias folded
into the mask (added after the 1/√d_head scaling, before masking).
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass, field, fields
from pathlib import Path

import torch
import torch.nn.functional as F
from huggingface_hub import PyTorchModelHubMixin
from torch import nn

from .attention import attention
from .files import FileFormatError, read_json
from .encodings import PositionEncoding, build_encoding, encoding_names, encoding_options, encoding_spec
from .encodings.base import check_position_offset

BOS_ID = 256  # byte-level vocabulary: ids 0..255 are bytes, 256 marks the start of a document
BYTE_VOCAB_SIZE = 257


class CheckpointError(RuntimeError):
    """A checkpoint folder is missing, corrupt, truncated or disagrees with its config."""


#: Format of the config.json fireviz writes: 2 = ``encoding_options`` complete (every option of
#: the encoding named, defaults included); files without the field are format 1.
CONFIG_FORMAT = 2

#: Largest value of each size field of ``GPTConfig`` (far beyond any model fireviz trains; a
#: config.json past them is refused before anything is allocated).
CONFIG_LIMITS = {
    "n_layer": 1024,
    "n_head": 1024,
    "d_model": 1 << 16,
    "seq_len": 1 << 24,
    "vocab_size": 1 << 20,
    "attn_query_block": 1 << 20,
}
#: Most parameters a ``GPT`` may have (≈ 68B: nothing fireviz trains comes near).
MAX_PARAMETERS = 1 << 36


@dataclass
class GPTConfig:
    """Everything that defines a model (saved as config.json next to the weights).

    Attributes:
      n_layer, n_head, d_model: transformer shape; d_model divisible by n_head.
      seq_len: training length in tokens (bytes); FIRE's default init_L is seq_len/4.
      vocab_size: 257 = 256 bytes + BOS.
      dropout: residual/attention dropout probability during training.
      position_encoding: a registered encoding (``fireviz.encodings.encoding_names()``).
      encoding_options: keyword options for ``build_encoding`` (e.g. ``{"init_L": 128}``).
      absolute_position_embedding: add a learned absolute embedding (max seq_len positions).
      attn_query_block: queries per attention call; longer inputs go block by block so a
        forward pass needs memory ∝ block × length (tokens).
      training: provenance written by the trainer (settings, data, tokens seen); not used
        by the model itself.
      config_format: 2 for a config.json the trainer writes (``to_json_dict``: ``encoding_options``
        names every option, see ``complete_encoding_options``); 1 (or absent) for older files and
        ``save_pretrained``, whose unset options take their defaults.
    Raises (``validate``): ValueError naming the bad field.
    """

    n_layer: int = 4
    n_head: int = 4
    d_model: int = 128
    seq_len: int = 512
    vocab_size: int = BYTE_VOCAB_SIZE
    dropout: float = 0.0
    position_encoding: str = "fire"
    encoding_options: dict = field(default_factory=dict)
    absolute_position_embedding: bool = False
    attn_query_block: int = 1024
    training: dict = field(default_factory=dict)
    config_format: int = 1

    def validate(self) -> "GPTConfig":
        """Check every field; returns self. Raises ValueError with the field and the fix.

        Sizes are bounded (``CONFIG_LIMITS``; at most ``MAX_PARAMETERS`` parameters) before
        anything is built, so a config.json with absurd sizes is refused, not allocated."""
        for name in ("n_layer", "n_head", "d_model", "seq_len", "vocab_size", "attn_query_block"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int):
                raise ValueError(f"GPTConfig.{name} must be an integer (got {v!r} of type {type(v).__name__})")
            if v < 1:
                raise ValueError(f"GPTConfig.{name} must be >= 1 (got {v})")
            if v > CONFIG_LIMITS[name]:
                raise ValueError(f"GPTConfig.{name} = {v} is more than fireviz takes ({CONFIG_LIMITS[name]:,})")
        n_params = 12 * self.n_layer * self.d_model**2 + self.vocab_size * self.d_model
        if n_params > MAX_PARAMETERS:
            raise ValueError(
                f"this config has ~{n_params:,} parameters, more than the {MAX_PARAMETERS:,} fireviz builds "
                "(n_layer, d_model or vocab_size is far too large)"
            )
        if not isinstance(self.absolute_position_embedding, bool):
            raise ValueError(
                f"GPTConfig.absolute_position_embedding must be true or false "
                f"(got {self.absolute_position_embedding!r})"
            )
        if not isinstance(self.encoding_options, dict) or not isinstance(self.training, dict):
            raise ValueError(
                "GPTConfig.encoding_options and .training must be dicts (JSON objects); "
                f"got {type(self.encoding_options).__name__} and {type(self.training).__name__}"
            )
        if not isinstance(self.position_encoding, str):
            raise ValueError(f"GPTConfig.position_encoding must be a name (got {self.position_encoding!r})")
        if isinstance(self.dropout, bool) or not isinstance(self.dropout, (int, float)):
            raise ValueError(f"GPTConfig.dropout must be a number in [0, 1) (got {self.dropout!r})")
        if self.d_model % self.n_head:
            raise ValueError(f"d_model={self.d_model} is not divisible by n_head={self.n_head}")
        if self.position_encoding not in encoding_names():
            raise ValueError(
                f"unknown position_encoding {self.position_encoding!r}; choose one of {', '.join(encoding_names())}"
            )
        bad = set(self.encoding_options) - encoding_options(self.position_encoding)
        if bad:
            raise ValueError(
                f"position_encoding {self.position_encoding!r} does not take option(s) "
                f"{sorted(bad)}; allowed: {sorted(encoding_options(self.position_encoding))}"
            )
        if not 0.0 <= self.dropout < 1.0:
            raise ValueError(f"dropout must be in [0, 1) (got {self.dropout})")
        try:  # option *values* are checked by the encoding itself; a throwaway build (small), RNG untouched
            with torch.random.fork_rng(devices=[]):
                build_encoding(
                    self.position_encoding, self.n_head, self.d_model // self.n_head, **self.resolved_encoding_options()
                )
        except (TypeError, ValueError, RuntimeError, OverflowError, MemoryError) as e:
            raise ValueError(
                f"encoding_options {self.encoding_options} are invalid for {self.position_encoding!r}: {e}"
            ) from None
        return self

    @property
    def head_dim(self) -> int:
        """Channels per attention head: d_model // n_head (validate() requires divisibility)."""
        return self.d_model // self.n_head

    def complete_encoding_options(self) -> dict:
        """Every option of the encoding with the value this model uses: its spec's defaults,
        then the training-length ones (``resolved_encoding_options``). What config.json holds."""
        return {**encoding_spec(self.position_encoding).defaults, **self.resolved_encoding_options()}

    def to_json_dict(self) -> dict:
        """The config as written to config.json: every field, ``encoding_options`` complete,
        ``config_format = CONFIG_FORMAT``."""
        from dataclasses import asdict

        return {**asdict(self), "encoding_options": self.complete_encoding_options(), "config_format": CONFIG_FORMAT}

    def resolved_encoding_options(self) -> dict:
        """``encoding_options`` plus fireviz's defaults tied to the training length.

        From the encoding's spec (``EncodingSpec.defaults_from_seq_len``): FIRE ``init_L =
        seq_len / 4`` (the paper's 512 at 2048); YaRN ``original_max_position_embeddings = seq_len``.
        """
        opts = dict(self.encoding_options)
        spec = encoding_spec(self.position_encoding)
        if spec.defaults_from_seq_len is not None:  # e.g. FIRE's init_L, YaRN's training length
            for k, v in spec.defaults_from_seq_len(self.seq_len).items():
                opts.setdefault(k, v)
        return opts


#: config.json fields that change what a model computes: a saved config must name every one
#: (a missing ``seq_len`` would silently move FIRE's threshold, a missing
#: ``position_encoding`` would load as FIRE). ``dropout``, ``attn_query_block`` and
#: ``training`` do not change the numbers and may be absent (defaults apply).
REQUIRED_CONFIG_FIELDS = (
    "n_layer",
    "n_head",
    "d_model",
    "seq_len",
    "vocab_size",
    "position_encoding",
    "encoding_options",
    "absolute_position_embedding",
)


def config_from_dict(data: object, source: str = "config.json") -> GPTConfig:
    """A validated :class:`GPTConfig` from a saved config.json's parsed JSON.

    Args: ``data`` the parsed JSON; ``source`` names it in errors.
    Returns: the config (``validate`` passed).
    Raises: CheckpointError naming the problem: not an object, an unknown field, a missing
      field of ``REQUIRED_CONFIG_FIELDS``, or a bad value.
    """
    if not isinstance(data, dict):
        raise CheckpointError(
            f"{source} is not a JSON object (it holds a {type(data).__name__}); a config.json "
            "maps GPTConfig fields to values — restore it or train the checkpoint again"
        )
    known = {f.name for f in fields(GPTConfig)}
    unknown = sorted(set(data) - known)
    if unknown:
        raise CheckpointError(
            f"{source} has unknown field(s) {unknown}; a fireviz config.json holds only {sorted(known)}"
        )
    missing = [k for k in REQUIRED_CONFIG_FIELDS if k not in data]
    if missing:
        raise CheckpointError(
            f"{source} does not name {', '.join(missing)}, which decide what the model computes; "
            "add the value(s) the model was trained with (see GPTConfig) or train it again"
        )
    fmt = data.get("config_format", 1)
    if fmt not in (1, CONFIG_FORMAT) or isinstance(fmt, bool):
        raise CheckpointError(f"{source} has config_format {fmt!r}; this fireviz reads formats 1 and {CONFIG_FORMAT}")
    if (
        fmt == CONFIG_FORMAT
        and isinstance(data.get("encoding_options"), dict)
        and isinstance(data.get("position_encoding"), str)
        and data["position_encoding"] in encoding_names()
    ):
        absent = sorted(set(encoding_spec(data["position_encoding"]).defaults) - set(data["encoding_options"]))
        if absent:  # format 2 names every option: a missing one was deleted, not defaulted
            raise CheckpointError(
                f"{source} does not name encoding option(s) {', '.join(absent)} of "
                f"{data['position_encoding']} (config_format {CONFIG_FORMAT} lists every option, "
                "as trained); restore them or train the checkpoint again"
            )
    try:
        return GPTConfig(**data).validate()
    except (TypeError, ValueError) as e:
        raise CheckpointError(f"{source} is invalid: {e}") from None


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
        if self.keys[layer] is not None:
            k = torch.cat([self.keys[layer], k], dim=2)
            v = torch.cat([self.values[layer], v], dim=2)
        self.keys[layer], self.values[layer] = k, v
        return k, v


def causal_attention_mask(
    encoding: PositionEncoding, q_len: int, k_len: int, q_offset: int, device: torch.device, position_offset: int = 0
) -> torch.Tensor | None:
    """The additive mask for queries at ``q_offset…`` over keys ``0…k_len−1`` (all shifted
    by ``position_offset`` tokens, see ``PositionEncoding.bias``).

    Returns float32 ``[heads, q_len, k_len]`` (bias, −inf above the causal diagonal) for
    additive encodings, on the encoding's device; bool ``[q_len, k_len]`` (True = may
    attend) on ``device`` otherwise.
    Raises: ValueError for bad lengths/offset (``query_positions``).
    """
    if encoding.kind == "additive":
        if position_offset:
            return encoding.masked_bias(q_len, k_len, q_offset, position_offset)
        return encoding.masked_bias(q_len, k_len, q_offset)  # bias and −inf in as few passes as it can
    i = torch.arange(q_offset, q_offset + q_len, device=device)[:, None]
    return torch.arange(k_len, device=device)[None, :] <= i


class CausalSelfAttention(nn.Module):
    """Multi-head causal self-attention; the position encoding is passed in per call."""

    def __init__(self, config: GPTConfig):
        super().__init__()
        self.n_head, self.head_dim = config.n_head, config.head_dim
        self.qkv = nn.Linear(config.d_model, 3 * config.d_model, bias=False)
        self.proj = nn.Linear(config.d_model, config.d_model, bias=False)
        self.dropout = config.dropout
        self.query_block = config.attn_query_block
        self.backend = "sdpa"  # or "flex" (GPT.set_attention_backend): the bias inside FlexAttention

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

        ``mask``: a precomputed ``causal_attention_mask`` for this call (single block).
        """
        B, T, _ = x.shape
        q, k, v = self.qkv(x).view(B, T, 3, self.n_head, self.head_dim).permute(2, 0, 3, 1, 4)
        if encoding.kind == "rotary":
            pos = torch.arange(q_offset, q_offset + T, device=x.device) + position_offset
            q, k = encoding.rotate(q, pos), encoding.rotate(k, pos)
        if cache is not None:
            k, v = cache.append(layer, k, v)
        k_len = k.shape[2]
        dropout = self.dropout if self.training else 0.0
        if self.backend == "flex" and not (self.training and torch.is_grad_enabled()) and not position_offset:
            from .flex import causal_flex  # no [heads, q, k] bias: computed inside the attention kernel

            y = causal_flex(q, k, v, encoding if encoding.kind == "additive" else None, q_offset)
            return self.proj(y.transpose(1, 2).reshape(B, T, -1))
        if T <= self.query_block:
            y = self._attend(q, k, v, encoding, q_offset, k_len, dropout, mask, position_offset)
        else:
            # Query blocks: each block sees only the keys it may attend to (causal), so
            # memory is ∝ block × length and the masked half is never computed.
            outs = []
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
                        None,
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
        return attention(q, k, v, mask, dropout)


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
        """``"sdpa"`` (default: the bias as an SDPA mask, query blocks) or ``"flex"`` (inference:
        the bias computed inside compiled FlexAttention, ``fireviz.flex``; no [heads, q, k]
        tensor, for long contexts on a GPU). Returns self. Raises: ValueError for another name."""
        if backend not in ("sdpa", "flex"):
            raise ValueError(f"attention backend must be 'sdpa' or 'flex' (got {backend!r})")
        for block in self.blocks:
            block.attn.backend = backend
        return self

    def encoding(self, layer: int) -> PositionEncoding:
        """The position-encoding module used by ``layer`` (shared modules repeat)."""
        return self.encodings[layer if len(self.encodings) > 1 else 0]

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
        # shared encodings (ALiBi, Sandwich, fire_s) then compute their bias once per pass.
        masks: dict[int, torch.Tensor | None] = {}
        single_block = T <= self.config.attn_query_block
        for layer, block in enumerate(self.blocks):
            enc = self.encoding(layer)
            mask = None
            if single_block and enc.kind == "additive":
                if id(enc) not in masks:
                    masks[id(enc)] = causal_attention_mask(enc, T, q_offset + T, q_offset, idx.device, position_offset)
                mask = masks[id(enc)]
            x = block(x, enc, q_offset, cache, layer, mask, position_offset)
        if cache is not None:
            cache.length += T
        return self.lm_head(self.ln_f(x))

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
        path = os.fspath(pretrained_model_name_or_path)
        if os.path.isdir(path):
            cfg = Path(path) / "config.json"
            if (cfg.is_symlink() or cfg.exists()) and not cfg.is_file():
                raise CheckpointError(
                    f"{path}: config.json is a broken link or not a file; restore it or train the checkpoint again"
                )
            if cfg.exists():
                try:
                    data = read_json(cfg)
                except FileFormatError as e:
                    raise CheckpointError(str(e)) from e
                config_from_dict(data, str(cfg))
        elif os.path.isabs(path) or path.startswith((".", "~")) or path.count("/") > 1 or os.path.exists(path):
            raise CheckpointError(
                f"{path} is not a checkpoint folder (no such directory); give a folder "
                "with config.json and model.safetensors, or a Hub repo id 'owner/name'"
            )
        return super().from_pretrained(pretrained_model_name_or_path, **kwargs)

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
        """Load config.json + model.safetensors; never pickle. Raises CheckpointError."""
        if not strict:
            raise ValueError(
                "fireviz checkpoints load strictly only (strict=False would leave weights "
                "at their random init without a word); drop strict=False"
            )
        extra = sorted(set(model_kwargs) - {"config"})
        if extra:
            raise ValueError(
                f"from_pretrained takes no model settings ({', '.join(extra)}): the model is what "
                "config.json says; build GPT(GPTConfig(...)) for another shape"
            )
        try:
            device = torch.device(map_location)
        except (RuntimeError, TypeError) as e:
            raise ValueError(f"map_location={map_location!r} is not a device ({e}); use 'cpu' or 'cuda'") from None
        if device.type == "cuda" and not torch.cuda.is_available():
            raise ValueError(f"map_location={map_location!r} but this torch has no CUDA device; use 'cpu'")
        from huggingface_hub import hf_hub_download
        from safetensors import SafetensorError
        from safetensors.torch import load_file

        if os.path.isdir(model_id):
            weights = os.path.join(model_id, "model.safetensors")
            if not os.path.exists(weights):
                raise CheckpointError(
                    f"{model_id} has no model.safetensors: not a fireviz checkpoint folder "
                    "(save one with GPT.save_pretrained or `python -m fireviz train`)"
                )
        else:
            weights = hf_hub_download(
                repo_id=model_id,
                filename="model.safetensors",
                revision=revision,
                cache_dir=cache_dir,
                force_download=force_download,
                token=token,
                local_files_only=local_files_only,
            )
        config = model_kwargs.pop("config", None)
        if isinstance(config, dict):
            config = config_from_dict(config, f"config.json of {model_id}")
        if config is None:
            raise CheckpointError(f"{model_id} has no config.json")
        try:
            model = cls(config)
        except (TypeError, ValueError) as e:
            raise CheckpointError(f"config.json of {model_id} is invalid: {e}") from e
        except (RuntimeError, MemoryError) as e:  # the allocator: a model too large for this machine
            raise CheckpointError(
                f"the model of {model_id} does not fit in memory ({str(e).splitlines()[0][:200]})"
            ) from e
        try:
            state = load_file(weights, device=str(map_location))
        except (SafetensorError, OSError, ValueError) as e:
            raise CheckpointError(
                f"{weights} is corrupt or truncated ({e}); it was left untouched — restore it or retrain"
            ) from e
        load_state_checked(model, state, source=weights)
        return model


def nonfinite_parameters(model: nn.Module) -> list[str]:
    """Names of ``model``'s parameters and buffers holding NaN or ±inf (state_dict order); [] if none."""
    return [k for k, t in model.state_dict().items() if t.is_floating_point() and not torch.isfinite(t).all()]


def load_state_checked(model: nn.Module, state: dict[str, torch.Tensor], source: str = "weights") -> None:
    """Strictly load ``state`` into ``model``, tolerating the tied ``lm_head.weight`` alias.

    Raises: CheckpointError naming missing/unexpected keys or mismatched shapes.
    """
    own = model.state_dict()
    state = dict(state)
    for a, b in (("lm_head.weight", "wte.weight"), ("wte.weight", "lm_head.weight")):
        if a not in state and b in state:  # safetensors keeps one name of a tied pair
            state[a] = state[b]
    tied = ("wte.weight", "lm_head.weight")
    if (
        all(k in state for k in tied)
        and all(k in own for k in tied)
        and own[tied[0]].data_ptr() == own[tied[1]].data_ptr()
    ):
        a, b = state[tied[0]], state[tied[1]]
        same = (
            a.shape == b.shape
            and a.dtype == b.dtype
            and torch.equal(  # bit for bit: NaN equals itself
                a.contiguous().view(torch.uint8), b.contiguous().view(torch.uint8)
            )
        )
        if not same:
            raise CheckpointError(
                f"{source} holds wte.weight and lm_head.weight with different values, but the model "
                "ties them (one matrix); keep one of the two tensors in the file or train again"
            )
    missing = sorted(set(own) - set(state))
    unexpected = sorted(set(state) - set(own))
    mismatched = [
        f"{k}: file {tuple(state[k].shape)} vs config {tuple(own[k].shape)}"
        for k in own
        if k in state and state[k].shape != own[k].shape
    ]
    if missing or unexpected or mismatched:
        parts = []
        if missing:
            parts.append(f"missing {missing[:5]}")
        if unexpected:
            parts.append(f"unexpected {unexpected[:5]}")
        if mismatched:
            parts.append(f"shape mismatch {mismatched[:5]}")
        raise CheckpointError(f"{source} does not match its config.json: " + "; ".join(parts))
    model.load_state_dict(state, strict=True)
