"""Llama 3 text models (`--arch llama`), loaded by mlx-lm: shapes, tokenizer and config files.

Structure kept from Llama-3.1-8B-Instruct at tiny sizes: grouped-query attention, the `llama3`
RoPE scaling (factor 8 over an 8192-token original context, theta 500000), untied embeddings.
The tokenizer is Llama 3's kind: byte-level BPE with the cl100k split regex, no normaliser,
its control tokens after the trained vocabulary (as upstream's 128000 ...), a post-processor
that prepends `<|begin_of_text|>` when special tokens are added, no pad token, and
`clean_up_tokenization_spaces: true` (transformers' `decode` then drops the space before
punctuation, which the streaming detokenizers do not). `<|eot_id|>` ends a turn; config.json
lists all three of Llama 3.1's end ids. The chat template is Llama 3.1's own.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from .bpe import Special, TokenizerSpec, build_tokenizer
from .chat_templates import llama3 as template
from .family import Family
from .tokenizer_files import dump_json, write_tokenizer_files

# Llama 3's first control tokens, in its id order (128000 ... 128010 upstream).
SPECIAL_TOKENS: tuple[str, ...] = (
    "<|begin_of_text|>",
    "<|end_of_text|>",
    "<|reserved_special_token_0|>",
    "<|reserved_special_token_1|>",
    "<|finetune_right_pad_id|>",
    "<|reserved_special_token_2|>",
    "<|start_header_id|>",
    "<|end_header_id|>",
    "<|eom_id|>",
    "<|eot_id|>",
    "<|python_tag|>",
)
VOCAB_SIZE = 2048  # the tokenizer's own size, as upstream's 128256 is
END_TOKENS = ("<|end_of_text|>", "<|eom_id|>", "<|eot_id|>")

_TEXT = {
    "tiny": dict(
        hidden_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        intermediate_size=128,
    )
}


def spec() -> TokenizerSpec:
    return TokenizerSpec(
        style="llama3",
        specials=tuple(Special(t) for t in SPECIAL_TOKENS),
        vocab_size=VOCAB_SIZE,
        trained=VOCAB_SIZE - len(SPECIAL_TOKENS),
        bos="<|begin_of_text|>",
        add_bos=True,
    )


def write_files(out: Path, size: str, dtype: str) -> dict[str, Any]:
    """tokenizer files, config.json and generation_config.json; returns the config."""
    tok = build_tokenizer(spec())
    config = {
        "clean_up_tokenization_spaces": True,
        "model_input_names": ["input_ids", "attention_mask"],
        "model_max_length": 131072,
        "tokenizer_class": "PreTrainedTokenizerFast",
    }
    named: dict[str, str | None] = {"bos_token": "<|begin_of_text|>", "eos_token": "<|eot_id|>"}
    write_tokenizer_files(out, tok, config, named, template.TEMPLATE)
    bos = tok.token_to_id("<|begin_of_text|>")
    ends = [tok.token_to_id(t) for t in END_TOKENS]
    model = {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        **_TEXT[size],
        "vocab_size": VOCAB_SIZE,
        "hidden_act": "silu",
        "rms_norm_eps": 1e-5,
        "rope_theta": 500000.0,
        "rope_scaling": {
            "factor": 8.0,
            "low_freq_factor": 1.0,
            "high_freq_factor": 4.0,
            "original_max_position_embeddings": 8192,
            "rope_type": "llama3",
        },
        "max_position_embeddings": 131072,
        "attention_bias": False,
        "attention_dropout": 0.0,
        "mlp_bias": False,
        "pretraining_tp": 1,
        "initializer_range": 0.02,
        "tie_word_embeddings": False,
        "use_cache": True,
        "bos_token_id": bos,
        "eos_token_id": ends,
        "torch_dtype": dtype,
    }
    dump_json(out / "config.json", model)
    # Ids only: mlx-lm reads eos from here; sampling defaults are left to the server.
    dump_json(out / "generation_config.json", {"bos_token_id": bos, "eos_token_id": ends})
    return model


FAMILY = Family("llama", "mlx-lm", tuple(_TEXT), "Llama 3 text (mlx-lm)", write_files)
