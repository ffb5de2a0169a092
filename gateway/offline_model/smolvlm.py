"""SmolVLM (`--arch smolvlm`, Idefics3-style), loaded by mlx-vlm: shapes, tokenizer, processor.

Structure kept from SmolVLM-256M-Instruct at tiny sizes:
- image: the Idefics3 image processor resizes the longest edge to at most 192 px (3 tiles),
  rounds each side up to whole 64 px tiles, cuts them out and adds the whole image resized
  to 64 px as a global image; a 448 x 448 image is 3 x 3 tiles + 1 global;
- vision: a SigLIP tower over 64 px tiles in 8 px patches (8 x 8 = 64 patches), pixel-shuffled
  by `scale_factor` 2 into `image_seq_len` = 16 tokens per tile;
- prompt: each `<image>` becomes, per tile row, `<fake_token_around_image><row_r_col_c>` +
  16 x `<image>` for each column, a newline after each row, then `\\n<fake_token_around_image>
  <global-img>` + 16 x `<image>` + `<fake_token_around_image>`: 10 x 16 = 160 image tokens and
  their separators for a 448 px image, 6 x 16 for a 640 x 360 one (3 x 2 tiles);
- language model: Llama-style (SmolLM2) with 1D RoPE; it has no `make_cache`, so the prompt
  cache is one `KVCache` per layer;
- tokenizer: byte-level BPE (GPT-2 split) with SmolLM2's control tokens at the low ids and the
  image tokens (`<image>`, `<fake_token_around_image>`, `<global-img>`, `<row_1_col_1>` ...
  `<row_6_col_6>`, `<end_of_utterance>`) with them; bos `<|im_start|>` comes from the
  template only, `<end_of_utterance>` ends a turn;
- files: processor_config.json carries `image_seq_len` (the processor's default, 169, would
  not match the tower), preprocessor_config.json the tiling sizes.

Sizes (`SHAPES`): `tiny` as above; `small` keeps upstream's 512 px tiles, 16 px patches and
64 tokens per tile at CPU-benchmark cost (see its comment).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .bpe import Special, TokenizerSpec, build_tokenizer
from .chat_templates import smolvlm as template
from .family import Family
from .tokenizer_files import dump_json, write_tokenizer_files

ROWS_COLS = tuple(f"<row_{r}_col_{c}>" for r in range(1, 7) for c in range(1, 7))
SPECIAL_TOKENS: tuple[str, ...] = (
    "<|endoftext|>",
    "<|im_start|>",
    "<|im_end|>",
    "<fake_token_around_image>",
    "<image>",
    "<end_of_utterance>",
    "<global-img>",
    *ROWS_COLS,
)
IMAGE_TOKENS = {
    "end_of_utterance_token": "<end_of_utterance>",
    "fake_image_token": "<fake_token_around_image>",
    "global_image_token": "<global-img>",
    "image_token": "<image>",
}
VOCAB_SIZE = 2048  # the tokenizer's own size: no filler words
TILE_TINY = 64


@dataclass(frozen=True)
class Shape:
    """One size's shapes: the text and vision towers (config.json fields, the tower's layer
    count included), the tile side in px (the tower's image size: every tile and the global
    image), the longest edge an image is resized to (tiles per side = max_edge / tile), the
    patch side in px and the pixel-shuffle factor."""

    text: dict[str, Any]
    vision: dict[str, Any]
    tile: int
    max_edge: int
    patch: int
    scale_factor: int

    @property
    def tokens_per_tile(self) -> int:
        """`image_seq_len`: one tile's patches after the pixel shuffle."""
        return (self.tile // self.patch) ** 2 // self.scale_factor**2


SHAPES: dict[str, Shape] = {
    # Structure at CPU-test sizes: 64 px tiles of 8 px patches, up to 3 x 3 tiles.
    "tiny": Shape(
        text=dict(
            hidden_size=64,
            num_hidden_layers=2,
            num_attention_heads=4,
            num_key_value_heads=2,
            intermediate_size=128,
        ),
        vision=dict(
            hidden_size=32, intermediate_size=64, num_attention_heads=2, num_hidden_layers=2
        ),
        tile=TILE_TINY,
        max_edge=3 * TILE_TINY,
        patch=8,
        scale_factor=2,
    ),
    # SmolVLM-256M's tiling at CPU speed, for benchmarks whose cold / warm ratio must mean
    # something: upstream's 512 px tiles of 16 px patches, pixel-shuffled by 4 to 64 tokens
    # each; the longest edge 1024 px (2 x 2 tiles + global: 5 tiles, 320 image tokens) where
    # upstream's is 2048 (17 tiles), whose tower costs ~2.4 s on the 2-core CI machine even
    # at one layer. Both towers shrunk so that the tower dominates a cold request as it does
    # upstream: 256M's tower costs ~12x its prefill of the image prompt in MACs; here the
    # tower is 1 layer of width 16 (attention over 1024 patches per tile is the floor) and the
    # language model 2 layers of width 32, ~5x on the CI machine (docs/benchmarks.md).
    "small": Shape(
        text=dict(
            hidden_size=32,
            num_hidden_layers=2,
            num_attention_heads=2,
            num_key_value_heads=1,
            intermediate_size=64,
        ),
        vision=dict(
            hidden_size=16, intermediate_size=64, num_attention_heads=1, num_hidden_layers=1
        ),
        tile=512,
        max_edge=1024,
        patch=16,
        scale_factor=4,
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
        "add_prefix_space": False,
        "additional_special_tokens": list(SPECIAL_TOKENS[3:]),
        "clean_up_tokenization_spaces": False,
        "extra_special_tokens": IMAGE_TOKENS,
        "legacy": False,
        "model_max_length": 8192,
        "processor_class": "SmolVLMProcessor",
        "tokenizer_class": "GPT2Tokenizer",
        "truncation_side": "left",
    }
    named = {
        "bos_token": "<|im_start|>",
        "eos_token": "<end_of_utterance>",
        "pad_token": "<|im_end|>",
        "unk_token": "<|endoftext|>",
    }
    write_tokenizer_files(out, tok, config, named, template.TEMPLATE)
    return {t: tok.token_to_id(t) for t in SPECIAL_TOKENS[:7]}


def write_files(out: Path, size: str, dtype: str) -> dict[str, Any]:
    """Tokenizer files, config.json, generation_config.json, preprocessor_config.json and
    processor_config.json; returns the config."""
    shape = SHAPES[size]
    ids = _write_tokenizer(out)
    ends = [ids["<|im_end|>"], ids["<end_of_utterance>"]]
    text = {
        "model_type": "llama",
        **shape.text,
        "vocab_size": VOCAB_SIZE,
        "hidden_act": "silu",
        "rms_norm_eps": 1e-5,
        "rope_theta": 100000.0,
        "max_position_embeddings": 8192,
        "tie_word_embeddings": False,
        "pad_token_id": ids["<|im_end|>"],
    }
    vision = {
        "model_type": "smolvlm_vision",
        **shape.vision,
        "image_size": shape.tile,
        "patch_size": shape.patch,
        "num_channels": 3,
        "layer_norm_eps": 1e-6,
        "hidden_act": "gelu_pytorch_tanh",
    }
    config = {
        "architectures": ["SmolVLMForConditionalGeneration"],
        "model_type": "smolvlm",
        "image_token_id": ids["<image>"],
        "scale_factor": shape.scale_factor,
        "vocab_size": VOCAB_SIZE,
        "eos_token_id": ends,
        "pad_token_id": ids["<|im_end|>"],
        "text_config": text,
        "vision_config": vision,
        "tie_word_embeddings": False,
        "use_cache": True,
        "torch_dtype": dtype,
    }
    dump_json(out / "config.json", config)
    # Ids only: sampling defaults are left to the server.
    generation = {
        "bos_token_id": ids["<|im_start|>"],
        "eos_token_id": ends,
        "pad_token_id": ends[0],
    }
    dump_json(out / "generation_config.json", generation)
    dump_json(
        out / "preprocessor_config.json",
        {
            "do_convert_rgb": True,
            "do_image_splitting": True,
            "do_normalize": True,
            "do_pad": True,
            "do_rescale": True,
            "do_resize": True,
            "image_mean": [0.5, 0.5, 0.5],
            "image_processor_type": "Idefics3ImageProcessor",
            "image_std": [0.5, 0.5, 0.5],
            "max_image_size": {"longest_edge": shape.tile},
            "processor_class": "SmolVLMProcessor",
            "resample": 1,
            "rescale_factor": 1 / 255,
            "size": {"longest_edge": shape.max_edge},
        },
    )
    dump_json(
        out / "processor_config.json",
        {"image_seq_len": shape.tokens_per_tile, "processor_class": "SmolVLMProcessor"},
    )
    return config


FAMILY = Family("smolvlm", "mlx-vlm", SIZES, "SmolVLM, Idefics3-style (mlx-vlm)", write_files)
