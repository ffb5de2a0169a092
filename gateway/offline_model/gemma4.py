"""Gemma 4 (`--arch gemma4`, E2B-style), loaded by mlx-vlm: shapes, tokenizer, processor.

Structure kept from the small Gemma 4 checkpoints at tiny sizes:
- language model: 10 layers in Gemma 4's 4 sliding : 1 full pattern, of which the last 4
  reuse the KV of earlier layers of their type (`num_kv_shared_layers`), so `make_cache()`
  gives 6 caches for 10 layers: `RotatingKVCache(48)` x4, `KVCache`, `RotatingKVCache(48)`;
  per-layer input embeddings (`hidden_size_per_layer_input`); sliding layers use head_dim 16
  and RoPE base 1e4, full layers head_dim 32 with proportional RoPE (base 1e6) over a quarter
  of each head; final logit soft-capping 30; tied embeddings;
- bidirectional attention inside each image (`use_bidirectional_attention: "vision"`): the
  KV of every image token depends on the whole image, and the 48-token window is shorter
  than a 64-token image, so an image can only be prefilled in one piece;
- vision: a Gemma 4 tower (16 px patches, 2D RoPE over the patch grid, 3 x 3 pooling to soft
  tokens) with a token budget (`max_soft_tokens`, 70 here, one of upstream's 70 / 140 / 280 /
  560 / 1120): the image is resized, aspect ratio kept, to the largest multiple of 48 px per
  side within 70 x 9 patches, so 448 x 448 (and 56 x 56, scaled up) give 8 x 8 = 64 soft
  tokens and 640 x 360 gives 6 x 11 = 66;
- prompt: an image part renders as `\\n\\n<|image|>\\n\\n` and `<|image|>` becomes `<|image>`
  + one `<|image|>` per soft token + `<image|>`;
- tokenizer: SentencePiece-style BPE with byte fallback (GemmaTokenizer), Gemma 4's control
  tokens (turns, image/audio/video markers, thought channel, tool-call tokens) at the low
  ids, `<bos>` added by the post-processor, `<turn|>` ends a turn;
- files: processor_config.json's `image_processor.max_soft_tokens` sets the budget (it
  belongs in any cache key: another budget means other pixels and another token count).
- audio: a Gemma 4 (USM Conformer) audio tower at tiny widths, with the processor's own
  feature extractor settings (`processor_config.json`'s `feature_extractor`: 16 kHz, 128 mel
  bins, 10 ms hop; one soft token per 40 ms, at most 750, i.e. 30 s a clip): an audio part
  renders as `<|audio|>`, which becomes `<|audio>` + one `<|audio|>` per 40 ms + `<audio|>`.
  The clip bounds of its clippable linears are written as +-inf (no clipping), their default.

Sizes: `tiny` as above; `small` keeps E2B's image path (the default 280-token budget, its
512-token window) at CPU-benchmark cost (see its comment).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from .bpe import Special, TokenizerSpec, build_tokenizer
from .chat_templates import gemma4 as template
from .family import Family
from .tokenizer_files import dump_json, write_tokenizer_files

SPECIAL_TOKENS: tuple[str, ...] = (
    "<pad>",
    "<eos>",
    "<bos>",
    "<unk>",
    "<mask>",
    "<|turn>",
    "<turn|>",
    "<|image>",
    "<image|>",
    "<|image|>",
    "<|audio>",
    "<audio|>",
    "<|audio|>",
    "<|video|>",
    "<|channel>",
    "<channel|>",
    "<|think|>",
    "<|tool>",
    "<tool|>",
    "<|tool_call>",
    "<tool_call|>",
    "<|tool_response>",
    "<tool_response|>",
    '<|"|>',
)
MEDIA_TOKENS = {
    "boi_token": "<|image>",
    "eoi_token": "<image|>",
    "image_token": "<|image|>",
    "boa_token": "<|audio>",
    "eoa_token": "<audio|>",
    "audio_token": "<|audio|>",
    "video_token": "<|video|>",
}
VOCAB_SIZE = 2112  # embedding rows; the tokenizer's 2048 real ids then filler words
# The image token budget: tiny upstream's smallest, small upstream's default.
SOFT_TOKENS = {"tiny": 70, "small": 280}
PATCH = 16
POOLING = 3
SLIDING_WINDOW = {"tiny": 48, "small": 512}  # small: E2B's
LAYER_TYPES = (["sliding_attention"] * 4 + ["full_attention"]) * 2

_TEXT = {
    "tiny": dict(
        hidden_size=64,
        num_hidden_layers=len(LAYER_TYPES),
        num_kv_shared_layers=4,
        intermediate_size=128,
        num_attention_heads=4,
        num_key_value_heads=1,
        head_dim=16,
        global_head_dim=32,
        hidden_size_per_layer_input=16,
    ),
    # Gemma 4 E2B's image path at CPU speed, for benchmarks whose cold / warm ratio must mean
    # something: the default budget (280: a 448 px image is scaled up to 768 px, 48 x 48
    # patches pooled 3 x 3 to 256 soft tokens) and E2B's 512-token window. At 2304 patches the
    # tower's attention is the cost floor, so the tower is 1 layer of width 16; the language
    # model is tiny's with a 4x MLP, so that the tower costs about what E2B's costs next to
    # its prefill of the image prompt in MACs (~1.4x; docs/benchmarks.md).
    "small": dict(
        hidden_size=64,
        num_hidden_layers=len(LAYER_TYPES),
        num_kv_shared_layers=4,
        intermediate_size=256,
        num_attention_heads=4,
        num_key_value_heads=1,
        head_dim=16,
        global_head_dim=32,
        hidden_size_per_layer_input=16,
    ),
}
_AUDIO = dict(
    hidden_size=32,
    num_hidden_layers=2,
    num_attention_heads=2,
    hidden_act="silu",
    subsampling_conv_channels=[8, 4],
    conv_kernel_size=5,
    residual_weight=0.5,
    attention_chunk_size=12,
    attention_context_left=13,
    attention_context_right=0,
    attention_logit_cap=50.0,
    attention_invalid_logits_value=-1e9,
    use_clipped_linears=True,
    rms_norm_eps=1e-6,
    gradient_clipping=1e10,
    output_proj_dims=48,
)
# Gemma 4's USM front end (mlx-vlm's `Gemma4AudioFeatureExtractor` defaults, written out).
FEATURE_EXTRACTOR = {
    "feature_extractor_type": "Gemma4AudioFeatureExtractor",
    "feature_size": 128,
    "sampling_rate": 16000,
    "padding_value": 0.0,
    "frame_length_ms": 20.0,
    "hop_length_ms": 10.0,
    "min_frequency": 0.0,
    "max_frequency": 8000.0,
    "preemphasis": 0.0,
    "preemphasis_htk_flavor": True,
    "fft_overdrive": False,
    "dither": 0.0,
    "input_scale_factor": 1.0,
    "mel_floor": 0.001,
}
AUDIO_SEQ_LENGTH = 750  # soft tokens a clip may take (30 s at 40 ms each)
AUDIO_MS_PER_TOKEN = 40
_VISION = {
    "tiny": dict(
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=2,
        head_dim=16,
        global_head_dim=16,
        position_embedding_size=256,  # > the longest side in patches any image gets
    ),
    "small": dict(
        hidden_size=16,
        intermediate_size=64,
        num_hidden_layers=1,
        num_attention_heads=1,
        num_key_value_heads=1,
        head_dim=16,
        global_head_dim=16,
        position_embedding_size=1024,  # > the longest side in patches any image gets
    ),
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
        "extra_special_tokens": MEDIA_TOKENS,
        **MEDIA_TOKENS,
        "model_max_length": 131072,
        "padding_side": "left",
        "processor_class": "Gemma4Processor",
        "spaces_between_special_tokens": False,
        "tokenizer_class": "GemmaTokenizer",
    }
    named = {"bos_token": "<bos>", "eos_token": "<eos>", "pad_token": "<pad>", "unk_token": "<unk>"}
    write_tokenizer_files(out, tok, config, named, template.TEMPLATE)
    return {t: tok.token_to_id(t) for t in SPECIAL_TOKENS}


def _image_processor(size: str) -> dict[str, Any]:
    return {
        "image_processor_type": "Gemma4ImageProcessor",
        "do_convert_rgb": True,
        "do_normalize": False,
        "do_rescale": True,
        "do_resize": True,
        "image_mean": [0.5, 0.5, 0.5],
        "image_std": [0.5, 0.5, 0.5],
        "max_soft_tokens": SOFT_TOKENS[size],
        "patch_size": PATCH,
        "pooling_kernel_size": POOLING,
        "resample": 3,
        "rescale_factor": 1 / 255,
    }


def write_files(out: Path, size: str, dtype: str) -> dict[str, Any]:
    """Tokenizer files, config.json, generation_config.json and processor_config.json;
    returns the config."""
    ids = _write_tokenizer(out)
    ends = [ids["<eos>"], ids["<turn|>"]]
    text = {
        "model_type": "gemma4_text",
        **_TEXT[size],
        "vocab_size": VOCAB_SIZE,
        "vocab_size_per_layer_input": VOCAB_SIZE,
        "layer_types": LAYER_TYPES,
        "sliding_window": SLIDING_WINDOW[size],
        "rope_parameters": {
            "full_attention": {
                "partial_rotary_factor": 0.25,
                "rope_theta": 1_000_000.0,
                "rope_type": "proportional",
            },
            "sliding_attention": {"rope_theta": 10000.0, "rope_type": "default"},
        },
        "global_partial_rotary_factor": 0.25,
        "use_bidirectional_attention": "vision",
        "use_double_wide_mlp": True,
        "final_logit_softcapping": 30.0,
        "hidden_activation": "gelu_pytorch_tanh",
        "rms_norm_eps": 1e-6,
        "max_position_embeddings": 131072,
        "attention_bias": False,
        "attention_dropout": 0.0,
        "attention_k_eq_v": False,
        "enable_moe_block": False,
        "tie_word_embeddings": True,
        "pad_token_id": ids["<pad>"],
    }
    vision = {
        "model_type": "gemma4_vision",
        **_VISION[size],
        "patch_size": PATCH,
        "pooling_kernel_size": POOLING,
        "default_output_length": SOFT_TOKENS[size],
        "rope_parameters": {"rope_theta": 100.0, "rope_type": "default"},
        "use_bidirectional_attention": "vision",
        "hidden_activation": "gelu_pytorch_tanh",
        "rms_norm_eps": 1e-6,
        "standardize": False,
        "use_clipped_linears": False,
    }
    config = {
        "architectures": ["Gemma4ForConditionalGeneration"],
        "model_type": "gemma4",
        "image_token_id": ids["<|image|>"],
        "boi_token_id": ids["<|image>"],
        "eoi_token_id": ids["<image|>"],
        "audio_token_id": ids["<|audio|>"],
        "boa_token_id": ids["<|audio>"],
        "eoa_token_id": ids["<audio|>"],
        "video_token_id": ids["<|video|>"],
        "vision_soft_tokens_per_image": SOFT_TOKENS[size],
        "eos_token_id": ends,
        "pad_token_id": ids["<pad>"],
        "tie_word_embeddings": True,
        "initializer_range": 0.02,
        "text_config": text,
        "vision_config": vision,
        "audio_config": {"model_type": "gemma4_audio", **_AUDIO},
        "torch_dtype": dtype,
    }
    dump_json(out / "config.json", config)
    # Ids only: sampling defaults are left to the server.
    generation = {"bos_token_id": ids["<bos>"], "eos_token_id": ends, "pad_token_id": ids["<pad>"]}
    dump_json(out / "generation_config.json", generation)
    dump_json(
        out / "processor_config.json",
        {
            "image_processor": _image_processor(size),
            "image_seq_length": SOFT_TOKENS[size],
            "feature_extractor": FEATURE_EXTRACTOR,
            "audio_seq_length": AUDIO_SEQ_LENGTH,
            "audio_ms_per_token": AUDIO_MS_PER_TOKEN,
            "processor_class": "Gemma4Processor",
        },
    )
    return config


FAMILY = Family("gemma4", "mlx-vlm", tuple(_TEXT), "Gemma 4, E2B-style (mlx-vlm)", write_files)
