"""Qwen3.5 / Qwen3.6 (`--arch qwen3_5`; `qwen3_5_moe` with expert MLPs), loaded by mlx-vlm:
shapes, tokenizer and config files.

Structure kept from the upstream releases at tiny sizes: a hybrid text tower whose layers
are gated-delta (linear attention, a fixed-size recurrent state plus a short convolution
state) except every `full_attention_interval`-th one, which keeps ordinary KV with gated
output and partial (1/4) interleaved mRoPE; a Qwen3-VL vision tower without deepstack; the
Qwen-VL placeholders (`<|vision_start|><|image_pad|><|vision_end|>`). The tokenizer is the
Qwen3 one (Qwen-VL specials plus `<think>`, `<tool_call>`, ... as added, non-special tokens);
the chat template is the checkpoints' own (`chat_templates/qwen3_5.py`), whose generation
prompt opens a `<think>` block. A top-level `eos_token_id` is set: without it mlx-vlm's
config falls back to the real vocabulary's `<|im_end|>` id (248046).
"""

from __future__ import annotations

import functools
from pathlib import Path
from typing import Any

from . import qwen3
from .chat_templates import qwen3_5 as template
from .family import Family
from .shapes import preprocessor_config
from .tokenizer_files import dump_json

# 3 gated-delta layers then 1 full-attention layer (upstream's 3:1), twice over.
_TEXT = {
    "tiny": dict(
        hidden_size=64,
        num_hidden_layers=4,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=32,  # x 0.25 rotary = 8 dims: 4 frequencies = mrope [2, 1, 1]
        intermediate_size=128,
        linear_num_value_heads=4,
        linear_num_key_heads=2,
        linear_key_head_dim=16,
        linear_value_head_dim=16,
        linear_conv_kernel_dim=4,
        full_attention_interval=4,
        mrope=[2, 1, 1],
    )
}
# qwen3_5_moe: every MLP is 4 routed experts (2 per token) plus a shared expert.
_MOE = {
    "tiny": dict(
        num_experts=4,
        num_experts_per_tok=2,
        moe_intermediate_size=64,
        shared_expert_intermediate_size=64,
        norm_topk_prob=True,
    )
}
_ARCHITECTURES = {
    "qwen3_5": "Qwen3_5ForConditionalGeneration",
    "qwen3_5_moe": "Qwen3_5MoeForConditionalGeneration",
}
_VISION = {
    "tiny": dict(
        depth=2,
        hidden_size=32,
        intermediate_size=64,
        num_heads=4,
        num_position_embeddings=256,
        deepstack_visual_indexes=[],
    )
}


def write_files(arch: str, out: Path, size: str, dtype: str) -> dict[str, Any]:
    """Tokenizer files, config.json, generation_config.json, preprocessor_config.json."""
    tok = qwen3.write_tokenizer(out, template.TEMPLATE, 262144)
    model = model_config(arch, size, dtype, tok.token_to_id)
    dump_json(out / "config.json", model)
    endoftext, im_end = tok.token_to_id("<|endoftext|>"), tok.token_to_id("<|im_end|>")
    generation = {
        "bos_token_id": endoftext,
        "eos_token_id": [im_end, endoftext],
        "pad_token_id": endoftext,
    }
    dump_json(out / "generation_config.json", generation)
    processor = preprocessor_config("qwen3_vl", "tiny")
    processor["processor_class"] = "Qwen3VLProcessor"
    dump_json(out / "preprocessor_config.json", processor)
    return model


def model_config(arch: str, size: str, dtype: str, tid: Any) -> dict[str, Any]:
    """config.json in the upstream nested layout (`text_config`, `vision_config`); the MoE
    arch's MLPs are routed experts plus a shared expert."""
    t = dict(_TEXT[size])
    mrope = t.pop("mrope")
    if arch == "qwen3_5_moe":
        del t["intermediate_size"]
        t.update(_MOE[size])
    text = {
        **t,
        "model_type": f"{arch}_text",
        "vocab_size": qwen3.VOCAB_SIZE,
        "hidden_act": "silu",
        "rms_norm_eps": 1e-6,
        "max_position_embeddings": 262144,
        "attention_bias": False,
        "attention_dropout": 0.0,
        "tie_word_embeddings": False,
        "initializer_range": 0.02,
        "use_cache": True,
        "dtype": dtype,
        "eos_token_id": tid("<|im_end|>"),
        "rope_parameters": {
            "rope_type": "default",
            "mrope_section": mrope,
            "mrope_interleaved": True,
            "rope_theta": 10_000_000.0,
            "partial_rotary_factor": 0.25,
        },
    }
    vision = {
        **_VISION[size],
        "model_type": arch,
        "in_channels": 3,
        "spatial_merge_size": 2,
        "temporal_patch_size": 2,
        "patch_size": 16,
        "out_hidden_size": t["hidden_size"],
        "hidden_act": "gelu_pytorch_tanh",
        "initializer_range": 0.02,
    }
    return {
        "architectures": [_ARCHITECTURES[arch]],
        "model_type": arch,
        "image_token_id": tid("<|image_pad|>"),
        "video_token_id": tid("<|video_pad|>"),
        "vision_start_token_id": tid("<|vision_start|>"),
        "vision_end_token_id": tid("<|vision_end|>"),
        "text_config": text,
        "vision_config": vision,
        "tie_word_embeddings": False,
        "vocab_size": qwen3.VOCAB_SIZE,
        "torch_dtype": dtype,
        "eos_token_id": tid("<|im_end|>"),
    }


FAMILIES = tuple(
    Family(arch, "mlx-vlm", tuple(_TEXT), summary, functools.partial(write_files, arch))
    for arch, summary in (
        ("qwen3_5", "Qwen3.5/3.6 hybrid (mlx-vlm)"),
        ("qwen3_5_moe", "Qwen3.5/3.6 hybrid MoE (mlx-vlm)"),
    )
)
