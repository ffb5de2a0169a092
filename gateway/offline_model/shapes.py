"""The Qwen-VL archs' shapes: config.json, generation_config.json, preprocessor_config.json.

One table row per (arch, size). `tiny` is a few-MB float32 model for CPU tests and the
embedded demo; `7b` copies the upstream 7B/8B shapes (Qwen2-VL-7B, Qwen2.5-VL-7B, Qwen3-VL-8B)
in bfloat16 for GPU benchmarks, where speed depends on shapes and not on weights.

The configs follow the upstream HF layouts, which mlx-vlm 0.7.10 reads differently per arch:
Qwen2-VL and Qwen2.5-VL keep the text settings at the top level (their `ModelConfig.from_dict`
copies the top level into `text_config`, overwriting any nested one), Qwen3-VL nests them in
`text_config` (its `TextConfig` has required fields, so a flat config would be silently
ignored). `params.validate_config` checks every config with mlx-vlm's and transformers'
own classes.
"""

from __future__ import annotations

from typing import Any

from .tokenizer import VOCAB_SIZE, TokenIds

ARCHS: tuple[str, ...] = ("qwen2_vl", "qwen2_5_vl", "qwen3_vl")
SIZES: tuple[str, ...] = ("tiny", "7b")
DTYPES: tuple[str, ...] = ("float32", "bfloat16", "float16")
DEFAULT_DTYPE = {"tiny": "float32", "small": "float32", "7b": "bfloat16", "4b": "bfloat16"}

_ARCHITECTURES = {
    "qwen2_vl": "Qwen2VLForConditionalGeneration",
    "qwen2_5_vl": "Qwen2_5_VLForConditionalGeneration",
    "qwen3_vl": "Qwen3VLForConditionalGeneration",
}

# Text towers. Tiny: head_dim 16, so the mRoPE sections must cover 16 / 2 = 8 frequencies.
# vocab_size is the embedding/lm_head row count; the tokenizer is padded to exactly that
# (see `text_vocab_size` below). Tiny embeds just the trained tokenizer; 7b the upstream size.
_TEXT: dict[tuple[str, str], dict[str, Any]] = {
    ("qwen2_vl", "tiny"): dict(
        vocab_size=VOCAB_SIZE,
        hidden_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        intermediate_size=128,
        mrope=[2, 3, 3],
    ),
    ("qwen2_vl", "7b"): dict(
        hidden_size=3584,
        num_hidden_layers=28,
        num_attention_heads=28,
        num_key_value_heads=4,
        intermediate_size=18944,
        mrope=[16, 24, 24],
        vocab_size=152064,
    ),
    ("qwen3_vl", "tiny"): dict(
        vocab_size=VOCAB_SIZE,
        hidden_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=16,
        intermediate_size=128,
        mrope=[4, 2, 2],
    ),
    ("qwen3_vl", "7b"): dict(
        hidden_size=4096,
        num_hidden_layers=36,
        num_attention_heads=32,
        num_key_value_heads=8,
        head_dim=128,
        intermediate_size=12288,
        mrope=[24, 20, 20],
        vocab_size=151936,
    ),
}
_TEXT[("qwen2_5_vl", "tiny")] = _TEXT[("qwen2_vl", "tiny")]
_TEXT[("qwen2_5_vl", "7b")] = _TEXT[("qwen2_vl", "7b")]

# Vision towers, in each arch's own field names (out_hidden_size/hidden_size = text width).
_VISION: dict[tuple[str, str], dict[str, Any]] = {
    ("qwen2_vl", "tiny"): dict(depth=2, embed_dim=32, num_heads=4, mlp_ratio=2),
    ("qwen2_vl", "7b"): dict(depth=32, embed_dim=1280, num_heads=16, mlp_ratio=4),
    # Window attention in block 0, full attention in block 1: both code paths run in tests.
    ("qwen2_5_vl", "tiny"): dict(
        depth=2, hidden_size=32, intermediate_size=64, num_heads=4, fullatt_block_indexes=[1]
    ),
    ("qwen2_5_vl", "7b"): dict(
        depth=32,
        hidden_size=1280,
        intermediate_size=3420,
        num_heads=16,
        fullatt_block_indexes=[7, 15, 23, 31],
    ),
    # Two deepstack levels, so code that carries deepstack features must carry a list.
    ("qwen3_vl", "tiny"): dict(
        depth=2,
        hidden_size=32,
        intermediate_size=64,
        num_heads=4,
        num_position_embeddings=256,
        deepstack_visual_indexes=[0, 1],
    ),
    ("qwen3_vl", "7b"): dict(
        depth=27,
        hidden_size=1152,
        intermediate_size=4304,
        num_heads=16,
        num_position_embeddings=2304,
        deepstack_visual_indexes=[8, 16, 24],
    ),
}

# Image processor. 7b: the upstream values. Tiny: the upstream minimum (a 56x56 image is 4
# tokens) but a 448x448-ish maximum (at most 256 image tokens), so the CPU demo stays fast.
_MEAN_CLIP = [0.48145466, 0.4578275, 0.40821073]
_STD_CLIP = [0.26862954, 0.26130258, 0.27577711]


def resolve_dtype(size: str, dtype: str | None) -> str:
    """`dtype`, or the size's default when None. ValueError for an unknown dtype."""
    dtype = dtype or DEFAULT_DTYPE[size]
    if dtype not in DTYPES:
        raise ValueError(f"unknown dtype {dtype!r}; expected one of {', '.join(DTYPES)}")
    return dtype


def check_arch_size(arch: str, size: str, dtype: str | None = None) -> str:
    """Validate the Qwen-VL names this module shapes; return the dtype (`resolve_dtype`).
    ValueError if bad. (Every family's names: `offline_model.families.check_arch_size`.)"""
    if arch not in ARCHS:
        raise ValueError(f"unknown arch {arch!r}; expected one of {', '.join(ARCHS)}")
    if size not in SIZES:
        raise ValueError(f"unknown size {size!r}; expected one of {', '.join(SIZES)}")
    return resolve_dtype(size, dtype)


def text_vocab_size(arch: str, size: str) -> int:
    """Rows of the text embedding (and lm_head) for (arch, size): the ids the model can
    sample, so the size `tokenizer.train_tokenizer` must pad the tokenizer to."""
    check_arch_size(arch, size)
    return int(_TEXT[(arch, size)]["vocab_size"])


def model_config(arch: str, size: str, ids: TokenIds, dtype: str | None = None) -> dict[str, Any]:
    """The config.json dict for (arch, size), with token ids taken from the tokenizer.

    Raises ValueError unless the tokenizer has exactly `text_vocab_size(arch, size)` ids: with
    fewer, the ids above the tokenizer's would decode to "" when the model samples them;
    with more, the tokenizer could produce ids the embedding has no row for.
    """
    dtype = check_arch_size(arch, size, dtype)
    t = dict(_TEXT[(arch, size)])
    mrope = t.pop("mrope")
    vocab_size = t.pop("vocab_size")
    head_dim = t.get("head_dim") or t["hidden_size"] // t["num_attention_heads"]
    if 2 * sum(mrope) != head_dim:  # mRoPE rotates every frequency of a head exactly once
        raise ValueError(f"mrope_section {mrope} does not cover head_dim {head_dim}")
    if ids.vocab_size != vocab_size:
        raise ValueError(
            f"the tokenizer has {ids.vocab_size} ids but {arch} {size} embeds {vocab_size}; "
            f"build it with train_tokenizer({vocab_size})"
        )
    text: dict[str, Any] = dict(
        **t,
        vocab_size=vocab_size,
        hidden_act="silu",
        rms_norm_eps=1e-6,
        initializer_range=0.02,
        attention_dropout=0.0,
        use_cache=True,
        tie_word_embeddings=False,
        bos_token_id=ids.endoftext,
        eos_token_id=ids.im_end,
    )
    vision = dict(
        _VISION[(arch, size)],
        model_type=arch,
        in_channels=3,
        spatial_merge_size=2,
        temporal_patch_size=2,
    )
    tokens = dict(
        image_token_id=ids.image_pad,
        video_token_id=ids.video_pad,
        vision_start_token_id=ids.vision_start,
        vision_end_token_id=ids.vision_end,
        vision_token_id=ids.vision_pad,
    )
    head = {"architectures": [_ARCHITECTURES[arch]], "model_type": arch}
    if arch == "qwen3_vl":
        text.update(
            model_type="qwen3_vl_text",
            rope_theta=5_000_000.0,
            attention_bias=False,
            max_position_embeddings=262144,
            dtype=dtype,
            rope_scaling={
                "rope_type": "default",
                "mrope_section": mrope,
                "mrope_interleaved": True,
            },
        )
        vision.update(
            patch_size=16,
            out_hidden_size=t["hidden_size"],
            hidden_act="gelu_pytorch_tanh",
            initializer_range=0.02,
        )
        return {
            **head,
            **tokens,
            "text_config": text,
            "vision_config": vision,
            "tie_word_embeddings": False,
            "vocab_size": vocab_size,
            "torch_dtype": dtype,
            "eos_token_id": ids.im_end,
        }
    text.update(
        model_type=arch,
        rope_theta=1_000_000.0,
        sliding_window=32768,
        use_sliding_window=False,
        max_window_layers=t["num_hidden_layers"],
        max_position_embeddings=32768 if arch == "qwen2_vl" else 128000,
        rope_scaling={"type": "mrope", "mrope_section": mrope},
    )
    vision.update(patch_size=14, spatial_patch_size=14)
    if arch == "qwen2_vl":
        vision.update(hidden_size=t["hidden_size"], hidden_act="quick_gelu")
    else:
        vision.update(
            out_hidden_size=t["hidden_size"],
            window_size=112,
            tokens_per_second=2,
            hidden_act="silu",
        )
    return {**head, **tokens, **text, "vision_config": vision, "torch_dtype": dtype}


def generation_config(ids: TokenIds) -> dict[str, Any]:
    """generation_config.json: ids only. mlx-vlm copies eos/temperature/top_p/top_k/do_sample
    from this file into the model config, so sampling defaults are left to the server."""
    return {
        "bos_token_id": ids.endoftext,
        "eos_token_id": [ids.im_end, ids.endoftext],
        "pad_token_id": ids.endoftext,
    }


def preprocessor_config(arch: str, size: str) -> dict[str, Any]:
    """preprocessor_config.json in the upstream Qwen2-VL layout.

    mlx-vlm 0.7.10 never instantiates the transformers image processor for these archs: its
    patched `AutoProcessor` builds its numpy `Qwen3VLImageProcessor` from patch_size,
    merge_size, temporal_patch_size, min/max_pixels (or size.shortest/longest_edge) and
    mean/std, so torch/torchvision are not needed.
    """
    check_arch_size(arch, size)
    patch = 16 if arch == "qwen3_vl" else 14
    factor = patch * 2
    if size == "7b":
        min_px, max_px = (65536, 16777216) if arch == "qwen3_vl" else (3136, 12845056)
    else:
        min_px, max_px = 56 * 56, (16 * factor) ** 2  # <= 16x16 merged tokens
    mean, std = ([0.5] * 3, [0.5] * 3) if arch == "qwen3_vl" else (_MEAN_CLIP, _STD_CLIP)
    return {
        "do_convert_rgb": True,
        "do_normalize": True,
        "do_rescale": True,
        "do_resize": True,
        "image_mean": mean,
        "image_std": std,
        "image_processor_type": "Qwen2VLImageProcessor",
        "max_pixels": max_px,
        "merge_size": 2,
        "min_pixels": min_px,
        "patch_size": patch,
        "processor_class": {
            "qwen2_vl": "Qwen2VLProcessor",
            "qwen2_5_vl": "Qwen2_5_VLProcessor",
            "qwen3_vl": "Qwen3VLProcessor",
        }[arch],
        "resample": 3,
        "rescale_factor": 1 / 255,
        "size": {"longest_edge": max_px, "shortest_edge": min_px},
        "temporal_patch_size": 2,
    }
