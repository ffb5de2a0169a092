"""LFM2-VL (`--arch lfm2_vl`, Liquid AI's LFM2-VL 450M / 1.6B / 3B), loaded by mlx-vlm: shapes,
tokenizer, processor files.

Structure kept from LFM2-VL-450M at tiny sizes:
- language model: LFM2, a hybrid of short gated-convolution layers (`conv`: a causal depthwise
  convolution over `conv_L_cache` = 3 positions, whose cache is the last 2 positions' inputs)
  and full-attention layers (KV, 1D RoPE, q/k RMSNorm), in upstream's order (conv, conv,
  attention, ...); tied embeddings;
- vision: a SigLIP2 NaFlex tower (packed patches of `encoder_patch_size` px, position
  embeddings resized to each view's patch grid), pixel-unshuffled by `downsample_factor` 2
  and projected (layer norm, two linears);
- image processor (mlx-vlm's NumPy LFM2-VL processor, which always applies the official
  tiling: min 2, max 10 tiles, thumbnail on): an image whose smart-resized size exceeds
  `max_pixels_tolerance` x `max_image_tokens` tokens is resized to a grid of `tile_size` px
  tiles plus a thumbnail; a smaller one is smart-resized to a multiple of 16 px per side
  between `min_image_tokens` and `max_image_tokens` tokens. Tiny: 8 px patches, 64 px tiles
  (16 tokens each), at most 16 tokens for a single view: a 448 x 448 image is 3 x 3 tiles
  + a 64 px thumbnail = 160 image tokens; a 48 x 40 one a single 48 x 48 view of 9 tokens;
- prompt: each `<image>` becomes `<|image_start|>`, per tile `<|img_row_R_col_C|>` + 16 x
  `<image>`, then `<|img_thumbnail|>` + the thumbnail's `<image>` run, then `<|image_end|>`;
  an untiled image is `<|image_start|>` + its run + `<|image_end|>`;
- tokenizer: byte-level BPE with LFM2's control tokens at the low ids (`<|pad|>`,
  `<|startoftext|>` the BOS, `<|im_start|>`, `<|im_end|>` the end of a turn) and the image
  tokens (the `<|img_row_R_col_C|>` markers for every grid up to 10 x 10).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .bpe import Special, TokenizerSpec, build_tokenizer
from .chat_templates import lfm2_vl as template
from .family import Family
from .tokenizer_files import dump_json, write_tokenizer_files

MAX_GRID = 10  # the processor's max_tiles: a grid side is at most 10 tiles
ROWS_COLS = tuple(
    f"<|img_row_{r}_col_{c}|>" for r in range(1, MAX_GRID + 1) for c in range(1, MAX_GRID + 1)
)
SPECIAL_TOKENS: tuple[str, ...] = (
    "<|pad|>",
    "<|startoftext|>",
    "<|endoftext|>",
    "<|im_start|>",
    "<|im_end|>",
    "<image>",
    "<|image_start|>",
    "<|image_end|>",
    "<|img_thumbnail|>",
    *ROWS_COLS,
)
IMAGE_TOKENS = {
    "image_token": "<image>",
    "image_start_token": "<|image_start|>",
    "image_end_token": "<|image_end|>",
    "image_thumbnail": "<|img_thumbnail|>",
}
VOCAB_SIZE = 2048  # the tokenizer's own size: no filler words


@dataclass(frozen=True)
class Shape:
    """One size's shapes: the text tower (LFM2 config fields, `layer_types` included), the
    vision tower, the patch side and tile side in px and the image token budget."""

    text: dict[str, Any]
    vision: dict[str, Any]
    patch: int
    tile: int
    min_image_tokens: int
    max_image_tokens: int


SHAPES: dict[str, Shape] = {
    "tiny": Shape(
        text=dict(
            hidden_size=64,
            num_hidden_layers=4,
            num_attention_heads=4,
            num_key_value_heads=2,
            block_ff_dim=128,
            block_multiple_of=32,
            layer_types=["conv", "conv", "full_attention", "conv"],
        ),
        vision=dict(
            hidden_size=32,
            intermediate_size=64,
            num_attention_heads=2,
            num_hidden_layers=2,
            num_patches=64,  # an 8 x 8 grid of position embeddings, resized per view
        ),
        patch=8,
        tile=64,
        min_image_tokens=4,
        max_image_tokens=16,
    ),
}
SIZES: tuple[str, ...] = tuple(SHAPES)


def spec() -> TokenizerSpec:
    return TokenizerSpec(
        style="gpt2",
        specials=tuple(Special(t) for t in SPECIAL_TOKENS),
        vocab_size=VOCAB_SIZE,
        trained=VOCAB_SIZE - len(SPECIAL_TOKENS),
        specials_first=True,
    )


def _write_tokenizer(out: Path) -> dict[str, int]:
    tok = build_tokenizer(spec())
    config = {
        "add_bos_token": False,
        "add_eos_token": False,
        "additional_special_tokens": list(SPECIAL_TOKENS[5:]),
        "clean_up_tokenization_spaces": False,
        "extra_special_tokens": IMAGE_TOKENS,
        "legacy": False,
        "model_max_length": 32768,
        "processor_class": "Lfm2VlProcessor",
        "tokenizer_class": "PreTrainedTokenizerFast",
    }
    named = {
        "bos_token": "<|startoftext|>",
        "eos_token": "<|im_end|>",
        "pad_token": "<|pad|>",
        "unk_token": None,
    }
    write_tokenizer_files(out, tok, config, named, template.TEMPLATE)
    return {t: tok.token_to_id(t) for t in SPECIAL_TOKENS[:9]}


def write_files(out: Path, size: str, dtype: str) -> dict[str, Any]:
    """Tokenizer files, config.json, generation_config.json, preprocessor_config.json and
    processor_config.json; returns the config."""
    shape = SHAPES[size]
    ids = _write_tokenizer(out)
    end = ids["<|im_end|>"]
    text = {
        "model_type": "lfm2",
        **shape.text,
        "vocab_size": VOCAB_SIZE,
        "block_dim": shape.text["hidden_size"],
        "conv_dim": shape.text["hidden_size"],
        "conv_dim_out": shape.text["hidden_size"],
        "block_auto_adjust_ff_dim": True,
        "block_ffn_dim_multiplier": 1.0,
        "conv_L_cache": 3,
        "conv_bias": False,
        "norm_eps": 1e-5,
        "rope_theta": 1000000.0,
        "max_position_embeddings": 128000,  # LFM2-VL-450M's
        "num_heads": shape.text["num_attention_heads"],
        "eos_token_id": end,
        "tie_word_embeddings": True,
    }
    vision = {
        "model_type": "siglip2_vision_model",
        **shape.vision,
        "patch_size": shape.patch,
        "num_channels": 3,
        "layer_norm_eps": 1e-6,
        "hidden_act": "gelu_pytorch_tanh",
        "vision_use_head": False,
    }
    processor = {
        "do_image_splitting": True,
        "downsample_factor": 2,
        "encoder_patch_size": shape.patch,
        "max_image_tokens": shape.max_image_tokens,
        "max_num_patches": shape.max_image_tokens * 4,
        "max_pixels_tolerance": 2.0,
        "max_tiles": MAX_GRID,
        "min_image_tokens": shape.min_image_tokens,
        "min_tiles": 2,
        "tile_size": shape.tile,
        "use_thumbnail": True,
    }
    config = {
        "architectures": ["Lfm2VlForConditionalGeneration"],
        "model_type": "lfm2_vl",
        **processor,
        "image_token_id": ids["<image>"],
        "projector_bias": True,
        "projector_hidden_act": "gelu",
        "projector_hidden_size": 64,
        "projector_use_layernorm": True,
        "use_image_special_tokens": True,
        "vision_feature_layer": -1,
        "eos_token_id": end,
        "text_config": text,
        "vision_config": vision,
        "torch_dtype": dtype,
    }
    dump_json(out / "config.json", config)
    generation = {"bos_token_id": ids["<|startoftext|>"], "eos_token_id": end, "pad_token_id": 0}
    dump_json(out / "generation_config.json", generation)
    dump_json(
        out / "preprocessor_config.json",
        {
            **processor,
            "do_normalize": True,
            "do_rescale": True,
            "do_resize": True,
            "image_mean": [0.5, 0.5, 0.5],
            "image_processor_type": "Lfm2VlImageProcessor",
            "image_std": [0.5, 0.5, 0.5],
            "processor_class": "Lfm2VlProcessor",
            "resample": 3,
            "rescale_factor": 1 / 255,
        },
    )
    dump_json(
        out / "processor_config.json",
        {"processor_class": "Lfm2VlProcessor", "use_image_special_tokens": True},
    )
    return config


FAMILY = Family(
    "lfm2_vl", "mlx-vlm", SIZES, "LFM2-VL, hybrid conv + attention (mlx-vlm)", write_files
)
