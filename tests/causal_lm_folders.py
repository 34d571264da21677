"""Tiny random published causal LMs written by ``transformers`` itself, each with a BPE tokenizer
the tests train on bundled text (no internet): Llama (with or without BOS, RoPE scaling types),
GPT-NeoX with partial rotary, Mistral with a sliding window, BLOOM (ALiBi), GPT-2 (learned positions)."""

from __future__ import annotations

import functools
from pathlib import Path

import torch

from fireviz.data import load_documents

VOCAB = 300


@functools.lru_cache(maxsize=1)
def _tokenizer_json() -> str:
    """A byte-level BPE tokenizer (vocab 300, with <s> and </s>) trained on the bundled prose."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB,
        special_tokens=["<s>", "</s>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    docs = load_documents("prose")[:30]
    tok.train_from_iterator([d.text for d in docs], trainer)
    return tok.to_str()


def save_tokenizer(folder: Path, add_bos: bool = True) -> None:
    """The trained BPE tokenizer saved with transformers (BOS ``<s>`` added when ``add_bos``)."""
    from tokenizers import Tokenizer, processors
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer.from_str(_tokenizer_json())
    if add_bos:
        tok.post_processor = processors.TemplateProcessing(
            single="<s> $A", pair="<s> $A <s> $B", special_tokens=[("<s>", tok.token_to_id("<s>"))]
        )
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<s>", eos_token="</s>")
    fast.save_pretrained(folder)


def write_causal_lm(folder: Path, kind: str = "llama", seed: int = 0, add_bos: bool = True, **config) -> Path:
    """A tiny random ``kind`` model (llama, neox, mistral, bloom, gpt2) saved as safetensors with
    its tokenizer into ``folder``; ``config`` overrides the model config's fields."""
    import transformers as tf

    torch.manual_seed(seed)
    common = dict(vocab_size=VOCAB, bos_token_id=0, eos_token_id=1)
    if kind == "llama":
        cfg = tf.LlamaConfig(
            hidden_size=32,
            intermediate_size=64,
            num_hidden_layers=2,
            num_attention_heads=4,
            num_key_value_heads=2,
            max_position_embeddings=64,
            **common,
            **config,
        )
        model = tf.LlamaForCausalLM(cfg)
    elif kind == "neox":
        cfg = tf.GPTNeoXConfig(
            hidden_size=32,
            intermediate_size=64,
            num_hidden_layers=2,
            num_attention_heads=4,
            max_position_embeddings=64,
            rotary_pct=0.25,
            **common,
            **config,
        )
        model = tf.GPTNeoXForCausalLM(cfg)
    elif kind == "mistral":
        cfg = tf.MistralConfig(
            hidden_size=32,
            intermediate_size=64,
            num_hidden_layers=2,
            num_attention_heads=4,
            num_key_value_heads=2,
            max_position_embeddings=64,
            sliding_window=16,
            **common,
            **config,
        )
        model = tf.MistralForCausalLM(cfg)
    elif kind == "bloom":
        cfg = tf.BloomConfig(hidden_size=32, n_layer=2, n_head=4, **common, **config)
        model = tf.BloomForCausalLM(cfg)
    elif kind == "gpt2":
        cfg = tf.GPT2Config(n_embd=32, n_layer=2, n_head=4, n_positions=64, **common, **config)
        model = tf.GPT2LMHeadModel(cfg)
    else:
        raise ValueError(kind)
    folder.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(folder, safe_serialization=True)
    save_tokenizer(folder, add_bos=add_bos)
    return folder
