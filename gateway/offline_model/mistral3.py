"""Mistral 3 (`--arch mistral3`: Mistral Small 3.1, Pixtral vision), loaded by mlx-vlm.

Structure kept from Mistral-Small-3.1-24B-Instruct-2503 at tiny sizes:
- image: mlx-vlm's Pixtral image processor scales an image down (never up) until its longest
  edge fits 224 px, then rounds each side up to whole 28 px cells (14 px patches merged
  2 x 2): variable resolution, so the token count follows the image's shape;
- vision: a Pixtral tower (2D RoPE over the patch grid) whose patches a learned merger
  combines 2 x 2 before a 2-layer projector;
- prompt: each `[IMG]` the template writes becomes one row of `[IMG]` per cell row, rows
  separated by `[IMG_BREAK]` and the image closed by `[IMG_END]`: a 448 x 448 image is
  8 x 8 = 64 `[IMG]` + 7 `[IMG_BREAK]` + 1 `[IMG_END]`, a 56 x 56 one 2 x 2 + 1 + 1;
- language model: Mistral (1D RoPE, theta 1e9, head_dim 32 != hidden / heads, full
  attention: one `KVCache` per layer);
- tokenizer: Tekken-style byte-level BPE with Mistral's control tokens at ids 0-19 (`<s>` 1,
  `</s>` 2, `[INST]` 3, `[IMG]` 10, `[IMG_BREAK]` 12, `[IMG_END]` 13, `[SYSTEM_PROMPT]` 17
  ...) and a post-processor that prepends `<s>` (the template writes it too);
- files: preprocessor_config.json sets the 224 px longest edge (without it the processor
  silently uses 1024 px and makes more `[IMG]` tokens than the tower's size allows);
  config.json records transformers 5 so transformers does not report Tekken's old split
  regex for this (already fixed) tokenizer.

Sizes: `tiny` as above; `small` keeps Mistral Small 3.1's image path (14 px patches up to a
1540 px edge) at CPU-benchmark cost (see its comment).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from .bpe import Special, TokenizerSpec, build_tokenizer
from .chat_templates import mistral3 as template
from .family import Family
from .tokenizer_files import dump_json, write_tokenizer_files

SPECIAL_TOKENS: tuple[str, ...] = (
    "<unk>",
    "<s>",
    "</s>",
    "[INST]",
    "[/INST]",
    "[AVAILABLE_TOOLS]",
    "[/AVAILABLE_TOOLS]",
    "[TOOL_RESULTS]",
    "[/TOOL_RESULTS]",
    "[TOOL_CALLS]",
    "[IMG]",
    "<pad>",
    "[IMG_BREAK]",
    "[IMG_END]",
    "[PREFIX]",
    "[MIDDLE]",
    "[SUFFIX]",
    "[SYSTEM_PROMPT]",
    "[/SYSTEM_PROMPT]",
    "[TOOL_CONTENT]",
)
VOCAB_SIZE = 2048  # the tokenizer's own size, as upstream's 131072 is
PATCH = 14
MERGE = 2
# The longest edge an image is scaled down to (never up), and the tower's image size (its 2D
# RoPE table): tiny at most 8 x 8 merged cells, small Mistral Small 3.1's.
LONGEST_EDGE = {"tiny": 224, "small": 1540}
_CLIP_MEAN = [0.48145466, 0.4578275, 0.40821073]
_CLIP_STD = [0.26862954, 0.26130258, 0.27577711]

_TEXT = {
    "tiny": dict(
        hidden_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=32,
        intermediate_size=128,
    ),
    # Mistral Small 3.1's image path at CPU speed, for benchmarks whose cold / warm ratio must
    # mean something: 14 px patches up to upstream's 1540 px edge, so a 448 px image is
    # 32 x 32 patches, 16 x 16 [IMG] + 15 [IMG_BREAK] + [IMG_END]. Upstream's language model
    # (24 B) costs ~27x its tower for such a prompt with the default system prompt (560
    # tokens, MACs): the prefill dominates a cold request. Here the tower is 1 layer of width
    # 16 (its floor) and the language model 3 layers of width 128 (6x MLP, as upstream's),
    # ~15x.
    "small": dict(
        hidden_size=128,
        num_hidden_layers=3,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=32,
        intermediate_size=768,
    ),
}
_VISION = {
    "tiny": dict(
        hidden_size=32,
        intermediate_size=64,
        num_attention_heads=2,
        head_dim=16,
        num_hidden_layers=2,
    ),
    "small": dict(
        hidden_size=16,
        intermediate_size=64,
        num_attention_heads=1,
        head_dim=16,
        num_hidden_layers=1,
    ),
}


def spec() -> TokenizerSpec:
    return TokenizerSpec(
        style="tekken",
        specials=tuple(Special(t) for t in SPECIAL_TOKENS),
        vocab_size=VOCAB_SIZE,
        trained=VOCAB_SIZE - len(SPECIAL_TOKENS),
        specials_first=True,
        bos="<s>",
        add_bos=True,
    )


def _write_tokenizer(out: Path) -> dict[str, int]:
    tok = build_tokenizer(spec())
    config = {
        "add_bos_token": True,
        "add_eos_token": False,
        "clean_up_tokenization_spaces": False,
        "legacy": True,
        "model_max_length": 131072,
        "processor_class": "PixtralProcessor",
        "tokenizer_class": "PreTrainedTokenizerFast",
    }
    named = {"bos_token": "<s>", "eos_token": "</s>", "pad_token": "<pad>", "unk_token": "<unk>"}
    write_tokenizer_files(out, tok, config, named, template.TEMPLATE)
    return {t: tok.token_to_id(t) for t in SPECIAL_TOKENS}


def write_files(out: Path, size: str, dtype: str) -> dict[str, Any]:
    """Tokenizer files, config.json, generation_config.json, preprocessor_config.json and
    processor_config.json; returns the config."""
    ids = _write_tokenizer(out)
    text = {
        "model_type": "mistral",
        **_TEXT[size],
        "vocab_size": VOCAB_SIZE,
        "hidden_act": "silu",
        "rms_norm_eps": 1e-5,
        "rope_theta": 1_000_000_000.0,
        "max_position_embeddings": 131072,
        "sliding_window": None,
        "attention_dropout": 0.0,
        "tie_word_embeddings": False,
        "use_cache": True,
    }
    vision = {
        "model_type": "pixtral",
        **_VISION[size],
        "image_size": LONGEST_EDGE[size],
        "patch_size": PATCH,
        "num_channels": 3,
        "hidden_act": "silu",
        "rope_theta": 10000.0,
        "attention_dropout": 0.0,
    }
    config = {
        "architectures": ["Mistral3ForConditionalGeneration"],
        "model_type": "mistral3",
        "image_token_index": ids["[IMG]"],
        "spatial_merge_size": MERGE,
        "multimodal_projector_bias": False,
        "projector_hidden_act": "gelu",
        "vision_feature_layer": -1,
        "text_config": text,
        "vision_config": vision,
        "torch_dtype": dtype,
        # transformers < 5 wrote Tekken tokenizers with a broken split regex; a checkpoint
        # written by transformers 5 is trusted (no "incorrect regex" warning on each load).
        "transformers_version": "5.0.0",
    }
    dump_json(out / "config.json", config)
    # Ids only: sampling defaults are left to the server.
    generation = {
        "bos_token_id": ids["<s>"],
        "eos_token_id": ids["</s>"],
        "pad_token_id": ids["<pad>"],
    }
    dump_json(out / "generation_config.json", generation)
    dump_json(
        out / "preprocessor_config.json",
        {
            "do_convert_rgb": True,
            "do_normalize": True,
            "do_rescale": True,
            "do_resize": True,
            "image_mean": _CLIP_MEAN,
            "image_processor_type": "PixtralImageProcessor",
            "image_std": _CLIP_STD,
            "patch_size": {"height": PATCH, "width": PATCH},
            "processor_class": "PixtralProcessor",
            "resample": 3,
            "rescale_factor": 1 / 255,
            "size": {"longest_edge": LONGEST_EDGE[size]},
        },
    )
    dump_json(
        out / "processor_config.json",
        {
            "image_break_token": "[IMG_BREAK]",
            "image_end_token": "[IMG_END]",
            "image_token": "[IMG]",
            "patch_size": PATCH,
            "processor_class": "PixtralProcessor",
            "spatial_merge_size": MERGE,
        },
    )
    return config


FAMILY = Family(
    "mistral3", "mlx-vlm", tuple(_TEXT), "Mistral 3, Pixtral vision (mlx-vlm)", write_files
)
