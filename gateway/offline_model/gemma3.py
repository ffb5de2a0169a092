"""Gemma 3 (`--arch gemma3`), loaded by mlx-vlm: shapes, tokenizer and processor files.

Structure kept from gemma-3-4b-it at tiny sizes:
- language model: 6 layers, 5 sliding-window layers (`RotatingKVCache`) per global one
  (`KVCache`), a 48-token window, shorter than one image's 66-token span, so an image prompt
  always wraps the window; 1D RoPE with a local base (10000) on sliding layers and a global
  base (1e6) with linear scaling (factor 8) on global ones; head_dim 32 != hidden / heads,
  query_pre_attn_scalar = head_dim; Gemma's (1 + weight) RMSNorms, scaled embeddings;
- vision: a SigLIP tower (224 px, 14 px patches: 16 x 16 patches) average-pooled 2 x 2 to
  `mm_tokens_per_image` = 64 soft tokens per image, whatever the image's size (the processor
  resizes to 224 x 224; pan-and-scan stays off, as upstream's default);
- prompt: each `<start_of_image>` the template writes becomes
  `\\n\\n<start_of_image>` + 64 x `<image_soft_token>` + `<end_of_image>\\n\\n`;
- tokenizer: SentencePiece-style BPE with byte fallback as transformers' GemmaTokenizer
  rebuilds it (spaces are "▁"), control tokens at the low ids (`<pad>` 0, `<eos>` 1, `<bos>` 2,
  ...), `<bos>` added by the post-processor, `<end_of_turn>` ends a turn (config.json's
  eos_token_id lists `<eos>` and it);
- files: processor_config.json carries `image_seq_length` (without it mlx-vlm's processor
  expands 256 tokens) and the tokenizer config names boi/eoi/image tokens (without them the
  processor falls back to transformers' and fails).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from .bpe import Special, TokenizerSpec, build_tokenizer
from .chat_templates import gemma3 as template
from .family import Family
from .tokenizer_files import dump_json, write_tokenizer_files

SPECIAL_TOKENS: tuple[str, ...] = (
    "<pad>",
    "<eos>",
    "<bos>",
    "<unk>",
    "<mask>",
    "[multimodal]",
    "<start_of_turn>",
    "<end_of_turn>",
    "<start_of_image>",
    "<end_of_image>",
    "<image_soft_token>",
)
IMAGE_TOKENS = {
    "boi_token": "<start_of_image>",
    "eoi_token": "<end_of_image>",
    "image_token": "<image_soft_token>",
}
VOCAB_SIZE = 2112  # embedding rows; the tokenizer's 2048 real ids then filler words
IMAGE_SIZE = 224
TOKENS_PER_IMAGE = 64  # 16 x 16 patches pooled 2 x 2
SLIDING_WINDOW = 48

_TEXT = {
    "tiny": dict(
        hidden_size=64,
        num_hidden_layers=6,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=32,
        query_pre_attn_scalar=32,
        intermediate_size=128,
    )
}
_VISION = {
    "tiny": dict(
        hidden_size=32,
        intermediate_size=64,
        num_attention_heads=2,
        num_hidden_layers=2,
    )
}


def spec() -> TokenizerSpec:
    return TokenizerSpec(
        style="gemma",
        specials=tuple(Special(t) for t in SPECIAL_TOKENS),
        vocab_size=VOCAB_SIZE,
        trained=2048 - len(SPECIAL_TOKENS),
        specials_first=True,
        bos="<bos>",
        add_bos=True,
    )


def _write_tokenizer(out: Path) -> dict[str, int]:
    tok = build_tokenizer(spec())
    config = {
        "add_bos_token": True,
        "add_eos_token": False,
        "clean_up_tokenization_spaces": False,
        "extra_special_tokens": IMAGE_TOKENS,
        **IMAGE_TOKENS,
        "model_max_length": 131072,
        "padding_side": "left",
        "processor_class": "Gemma3Processor",
        "spaces_between_special_tokens": False,
        "tokenizer_class": "GemmaTokenizer",
        "use_default_system_prompt": False,
    }
    named = {"bos_token": "<bos>", "eos_token": "<eos>", "pad_token": "<pad>", "unk_token": "<unk>"}
    write_tokenizer_files(out, tok, config, named, template.TEMPLATE)
    return {t: tok.token_to_id(t) for t in SPECIAL_TOKENS}


def write_files(out: Path, size: str, dtype: str) -> dict[str, Any]:
    """Tokenizer files, config.json, generation_config.json, preprocessor_config.json and
    processor_config.json; returns the config."""
    ids = _write_tokenizer(out)
    ends = [ids["<eos>"], ids["<end_of_turn>"]]
    text = {
        "model_type": "gemma3_text",
        **_TEXT[size],
        "vocab_size": VOCAB_SIZE,
        "hidden_activation": "gelu_pytorch_tanh",
        "rms_norm_eps": 1e-6,
        "sliding_window": SLIDING_WINDOW,
        "sliding_window_pattern": 6,
        "rope_local_base_freq": 10000.0,
        "rope_theta": 1_000_000.0,
        "rope_scaling": {"factor": 8.0, "rope_type": "linear"},
        "max_position_embeddings": 131072,
        "attention_bias": False,
        "attention_dropout": 0.0,
        "attn_logit_softcapping": None,
        "final_logit_softcapping": None,
        "cache_implementation": "hybrid",
        # mlx-vlm reads the pooling size from here (upstream relies on its default, 256).
        "mm_tokens_per_image": TOKENS_PER_IMAGE,
        "initializer_range": 0.02,
        "use_cache": True,
    }
    vision = {
        "model_type": "siglip_vision_model",
        **_VISION[size],
        "image_size": IMAGE_SIZE,
        "patch_size": 14,
        "num_channels": 3,
        "hidden_act": "gelu_pytorch_tanh",
        "layer_norm_eps": 1e-6,
        "attention_dropout": 0.0,
        "vision_use_head": False,
    }
    config = {
        "architectures": ["Gemma3ForConditionalGeneration"],
        "model_type": "gemma3",
        "boi_token_index": ids["<start_of_image>"],
        "eoi_token_index": ids["<end_of_image>"],
        "image_token_index": ids["<image_soft_token>"],
        "mm_tokens_per_image": TOKENS_PER_IMAGE,
        "eos_token_id": ends,
        "pad_token_id": ids["<pad>"],
        "initializer_range": 0.02,
        "text_config": text,
        "vision_config": vision,
        "torch_dtype": dtype,
    }
    dump_json(out / "config.json", config)
    # Ids only: sampling defaults are left to the server.
    generation = {"bos_token_id": ids["<bos>"], "eos_token_id": ends, "pad_token_id": ids["<pad>"]}
    dump_json(out / "generation_config.json", generation)
    dump_json(
        out / "preprocessor_config.json",
        {
            "do_convert_rgb": None,
            "do_normalize": True,
            "do_pan_and_scan": None,
            "do_rescale": True,
            "do_resize": True,
            "image_mean": [0.5, 0.5, 0.5],
            "image_processor_type": "Gemma3ImageProcessor",
            "image_seq_length": TOKENS_PER_IMAGE,
            "image_std": [0.5, 0.5, 0.5],
            "pan_and_scan_max_num_crops": None,
            "pan_and_scan_min_crop_size": None,
            "pan_and_scan_min_ratio_to_activate": None,
            "processor_class": "Gemma3Processor",
            "resample": 2,
            "rescale_factor": 1 / 255,
            "size": {"height": IMAGE_SIZE, "width": IMAGE_SIZE},
        },
    )
    dump_json(
        out / "processor_config.json",
        {"image_seq_length": TOKENS_PER_IMAGE, "processor_class": "Gemma3Processor"},
    )
    return config


FAMILY = Family("gemma3", "mlx-vlm", tuple(_TEXT), "Gemma 3 (mlx-vlm)", write_files)
