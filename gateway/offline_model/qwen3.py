"""Qwen3 text models (`--arch qwen3`), loaded by mlx-lm: shapes, tokenizer and config files.

Structure kept from Qwen3-0.6B at tiny sizes: q/k RMSNorm, a head_dim (32) that is not
hidden_size / heads (16), grouped-query attention (4 query heads over 2 KV heads), tied
embeddings, rope_theta 1e6. The tokenizer is the Qwen-VL one plus Qwen3's twelve added tokens,
in Qwen3's order and with its flags: `<think>`, `</think>`, `<tool_call>`, ... are added tokens
that are NOT special (decoding with skip_special_tokens keeps them), so a reasoning block
streams as text. The embedding (2112 rows) is larger than the tokenizer's 2060 real ids, like
upstream's 151936 over 151669; the gap holds filler words. The chat template is Qwen3's own.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from . import tokenizer as qwen_vl_tokenizer
from .bpe import Special, TokenizerSpec, build_tokenizer
from .chat_templates import qwen3 as template
from .family import Family
from .tokenizer_files import dump_json, write_tokenizer_files

# After Qwen2-VL's 14 (151657 ... 151668 upstream), none of them special.
ADDED_TOKENS: tuple[str, ...] = (
    "<tool_call>",
    "</tool_call>",
    "<|fim_prefix|>",
    "<|fim_middle|>",
    "<|fim_suffix|>",
    "<|fim_pad|>",
    "<|repo_name|>",
    "<|file_sep|>",
    "<tool_response>",
    "</tool_response>",
    "<think>",
    "</think>",
)
VOCAB_SIZE = 2112  # embedding rows: 2060 tokenizer ids rounded up to a multiple of 64

_TEXT = {
    "tiny": dict(
        hidden_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=32,
        intermediate_size=128,
    )
}


def spec(words: tuple[str, ...] = ()) -> TokenizerSpec:
    """Qwen3's tokenizer spec; `words` are more added (not special) tokens after Qwen3's,
    each one id (the reranker's "yes" and "no", which a real vocabulary holds whole)."""
    base = qwen_vl_tokenizer.spec(VOCAB_SIZE)
    extra = tuple(Special(t, special=False) for t in (*ADDED_TOKENS, *words))
    return TokenizerSpec(
        style=base.style,
        specials=base.specials + extra,
        vocab_size=VOCAB_SIZE,
        trained=base.trained,
    )


def write_tokenizer(
    out: Path, chat_template: str, max_length: int, words: tuple[str, ...] = ()
) -> Any:
    """Write the Qwen-style tokenizer files (ChatML, `<|im_end|>` ends a turn) with
    `chat_template` (and `words` added: `spec`); returns the built tokenizer. Qwen3.5 writes
    the same with its own."""
    tok = build_tokenizer(spec(words))
    config = {
        "add_bos_token": False,
        "add_prefix_space": False,
        "additional_special_tokens": list(qwen_vl_tokenizer.SPECIAL_TOKENS[1:]),
        "clean_up_tokenization_spaces": False,
        "errors": "replace",
        "model_max_length": max_length,
        "split_special_tokens": False,
        "tokenizer_class": "Qwen2Tokenizer",
    }
    named = {
        "bos_token": None,
        "eos_token": "<|im_end|>",
        "pad_token": "<|endoftext|>",
        "unk_token": None,
    }
    write_tokenizer_files(out, tok, config, named, chat_template, vocab_merges=True)
    return tok


def write_files(out: Path, size: str, dtype: str, words: tuple[str, ...] = ()) -> dict[str, Any]:
    """tokenizer files (with `words` added: `spec`), config.json and generation_config.json;
    returns the config."""
    tok = write_tokenizer(out, template.TEMPLATE, 131072, words)
    endoftext, im_end = tok.token_to_id("<|endoftext|>"), tok.token_to_id("<|im_end|>")
    model = {
        "architectures": ["Qwen3ForCausalLM"],
        "model_type": "qwen3",
        **_TEXT[size],
        "vocab_size": VOCAB_SIZE,
        "hidden_act": "silu",
        "rms_norm_eps": 1e-6,
        "rope_theta": 1_000_000.0,
        "rope_scaling": None,
        "max_position_embeddings": 40960,
        "attention_bias": False,
        "attention_dropout": 0.0,
        "use_sliding_window": False,
        "sliding_window": None,
        "max_window_layers": _TEXT[size]["num_hidden_layers"],
        "initializer_range": 0.02,
        "tie_word_embeddings": True,
        "use_cache": True,
        "bos_token_id": endoftext,
        "eos_token_id": im_end,
        "torch_dtype": dtype,
    }
    dump_json(out / "config.json", model)
    # Ids only: mlx-lm reads eos from here; sampling defaults are left to the server.
    generation = {
        "bos_token_id": endoftext,
        "eos_token_id": [im_end, endoftext],
        "pad_token_id": endoftext,
    }
    dump_json(out / "generation_config.json", generation)
    return model


def use_thinking_template(out: Path) -> None:
    """Make the checkpoint at `out` a Thinking one (Qwen3-*-Thinking-2507): Qwen3's template
    with the generation prompt opening `<think>\n`, in tokenizer_config.json and
    chat_template.jinja. The weights and tokenizer are unchanged."""
    config_path = out / "tokenizer_config.json"
    config = json.loads(config_path.read_text(encoding="utf-8"))
    config["chat_template"] = template.THINKING_TEMPLATE
    dump_json(config_path, config)
    (out / "chat_template.jinja").write_text(template.THINKING_TEMPLATE, encoding="utf-8")


FAMILY = Family("qwen3", "mlx-lm", tuple(_TEXT), "Qwen3 text (mlx-lm)", write_files)
