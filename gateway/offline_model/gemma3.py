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

Sizes (`SHAPES`): `tiny` as above; `small` keeps 4B's image path (896 px, 256 soft tokens,
window 1024) at CPU-benchmark cost; `4b` is gemma-3-4b-it's shapes in bfloat16 for GPU
benchmarks (262208 embedding rows: the tokenizer is padded with filler words).
"""

from __future__ import annotations

from dataclasses import dataclass
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
IMAGE_PATCH = 14


@dataclass(frozen=True)
class Shape:
    """One size's shapes: the text and vision towers (config.json fields), the tower's square
    image side in px, the soft tokens per image after pooling, the sliding window (tokens)
    and the embedding rows (the tokenizer is padded to them with filler words)."""

    text: dict[str, Any]
    vision: dict[str, Any]
    image_size: int
    tokens_per_image: int
    sliding_window: int
    vocab_size: int


SHAPES: dict[str, Shape] = {
    # Structure at CPU-test sizes: 16 x 16 patches pooled 2 x 2, a window shorter than an
    # image's span so that it wraps.
    "tiny": Shape(
        text=dict(
            hidden_size=64,
            num_hidden_layers=6,
            num_attention_heads=4,
            num_key_value_heads=2,
            head_dim=32,
            query_pre_attn_scalar=32,
            intermediate_size=128,
        ),
        vision=dict(
            hidden_size=32, intermediate_size=64, num_attention_heads=2, num_hidden_layers=2
        ),
        image_size=224,
        tokens_per_image=64,
        sliding_window=48,
        vocab_size=2112,
    ),
    # gemma-3-4b-it's image path at CPU speed, for benchmarks whose cold / warm ratio must
    # mean something: the tower sees 896 px as upstream (64 x 64 patches, pooled 4 x 4 to 256
    # soft tokens), the window is upstream's 1024. At 4096 patches per image the tower's
    # attention is the cost floor, so the tower is 1 layer of width 16 (one head); the
    # language model (tiny's, with an MLP 4x its width as upstream's) is sized so that the
    # tower costs ~3x the prefill of the image prompt, as 4B's does in MACs
    # (docs/benchmarks.md).
    "small": Shape(
        text=dict(
            hidden_size=64,
            num_hidden_layers=6,
            num_attention_heads=4,
            num_key_value_heads=2,
            head_dim=32,
            query_pre_attn_scalar=32,
            intermediate_size=256,
        ),
        vision=dict(
            hidden_size=16, intermediate_size=64, num_attention_heads=1, num_hidden_layers=1
        ),
        image_size=896,
        tokens_per_image=256,
        sliding_window=1024,
        vocab_size=2112,
    ),
    # google/gemma-3-4b-it's shapes (random weights, bfloat16: GPU benchmarks).
    "4b": Shape(
        text=dict(
            hidden_size=2560,
            num_hidden_layers=34,
            num_attention_heads=8,
            num_key_value_heads=4,
            head_dim=256,
            query_pre_attn_scalar=256,
            intermediate_size=10240,
        ),
        vision=dict(
            hidden_size=1152, intermediate_size=4304, num_attention_heads=16, num_hidden_layers=27
        ),
        image_size=896,
        tokens_per_image=256,
        sliding_window=1024,
        vocab_size=262208,
    ),
}
SIZES: tuple[str, ...] = tuple(SHAPES)


def special_ids() -> dict[str, int]:
    """Each control token's id: they come first, in `SPECIAL_TOKENS` order (`bpe`'s layout)."""
    return {t: i for i, t in enumerate(SPECIAL_TOKENS)}


def spec(size: str = "tiny") -> TokenizerSpec:
    return TokenizerSpec(
        style="gemma",
        specials=tuple(Special(t) for t in SPECIAL_TOKENS),
        vocab_size=SHAPES[size].vocab_size,
        trained=2048 - len(SPECIAL_TOKENS),
        specials_first=True,
        bos="<bos>",
        add_bos=True,
    )


def _write_tokenizer(out: Path, size: str) -> None:
    tok = build_tokenizer(spec(size))
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
    if {t: tok.token_to_id(t) for t in SPECIAL_TOKENS} != special_ids():
        raise AssertionError("gemma3's control tokens are not at the ids config.json names")


def model_config(size: str, dtype: str) -> dict[str, Any]:
    """config.json for `size` (KeyError for an unknown size); needs no tokenizer, so the 4b
    config can be checked without training its 262k-id vocabulary."""
    shape, ids = SHAPES[size], special_ids()
    text = {
        "model_type": "gemma3_text",
        **shape.text,
        "vocab_size": shape.vocab_size,
        "hidden_activation": "gelu_pytorch_tanh",
        "rms_norm_eps": 1e-6,
        "sliding_window": shape.sliding_window,
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
        "mm_tokens_per_image": shape.tokens_per_image,
        "initializer_range": 0.02,
        "use_cache": True,
    }
    vision = {
        "model_type": "siglip_vision_model",
        **shape.vision,
        "image_size": shape.image_size,
        "patch_size": IMAGE_PATCH,
        "num_channels": 3,
        "hidden_act": "gelu_pytorch_tanh",
        "layer_norm_eps": 1e-6,
        "attention_dropout": 0.0,
        "vision_use_head": False,
    }
    return {
        "architectures": ["Gemma3ForConditionalGeneration"],
        "model_type": "gemma3",
        "boi_token_index": ids["<start_of_image>"],
        "eoi_token_index": ids["<end_of_image>"],
        "image_token_index": ids["<image_soft_token>"],
        "mm_tokens_per_image": shape.tokens_per_image,
        "eos_token_id": [ids["<eos>"], ids["<end_of_turn>"]],
        "pad_token_id": ids["<pad>"],
        "initializer_range": 0.02,
        "text_config": text,
        "vision_config": vision,
        "torch_dtype": dtype,
    }


def write_files(out: Path, size: str, dtype: str) -> dict[str, Any]:
    """Tokenizer files, config.json, generation_config.json, preprocessor_config.json and
    processor_config.json; returns the config."""
    _write_tokenizer(out, size)
    config = model_config(size, dtype)
    shape, ids = SHAPES[size], special_ids()
    ends = config["eos_token_id"]
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
            "image_seq_length": shape.tokens_per_image,
            "image_std": [0.5, 0.5, 0.5],
            "pan_and_scan_max_num_crops": None,
            "pan_and_scan_min_crop_size": None,
            "pan_and_scan_min_ratio_to_activate": None,
            "processor_class": "Gemma3Processor",
            "resample": 2,
            "rescale_factor": 1 / 255,
            "size": {"height": shape.image_size, "width": shape.image_size},
        },
    )
    dump_json(
        out / "processor_config.json",
        {"image_seq_length": shape.tokens_per_image, "processor_class": "Gemma3Processor"},
    )
    return config


FAMILY = Family("gemma3", "mlx-vlm", SIZES, "Gemma 3 (mlx-vlm)", write_files)
