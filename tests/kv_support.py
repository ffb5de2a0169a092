"""Checkpoints for the quantized-KV tests (`--kv-bits`).

MLX quantizes groups of 32, 64 or 128 channels, and the tiny Qwen-VL checkpoints have heads of
16 channels: their KV cannot be quantized at all. `wide_heads` serves the same weights as
heads twice as wide: 2 query heads and 1 KV head of 32 channels instead of 4 and 2 of 16 (every
projection keeps its shape), with the mRoPE sections rescaled to the 16 frequencies of a
32-wide head. Random weights either way; the model is as tiny as before.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

from support import tiny_model

# Per arch: the config fields that make its heads 32 wide (Qwen2/2.5-VL keep text settings
# at the top level of config.json).
_WIDE = {
    "qwen2_vl": {"num_attention_heads": 2, "num_key_value_heads": 1, "mrope_section": [4, 6, 6]},
    "qwen2_5_vl": {"num_attention_heads": 2, "num_key_value_heads": 1, "mrope_section": [4, 6, 6]},
}


def wide_heads(arch: str = "qwen2_vl", weights: str = "float32") -> Path:
    """The tiny `arch` checkpoint with 32-channel heads (module doc): a copy of its files with
    the config changed and the weights linked, made once next to the original."""
    source = tiny_model(arch, weights)
    out = source.parent / f"{source.name}-wide-heads"
    if (out / "config.json").exists():
        return out
    scratch = source.parent / f"{out.name}.{os.getpid()}"
    scratch.mkdir(parents=True, exist_ok=True)
    for item in source.iterdir():
        if item.suffix == ".safetensors":
            (scratch / item.name).symlink_to(item)
        elif item.is_file():
            shutil.copy(item, scratch / item.name)
    config = json.loads((scratch / "config.json").read_text())
    wide = dict(_WIDE[arch])
    config["rope_scaling"]["mrope_section"] = wide.pop("mrope_section")
    config.update(wide)
    (scratch / "config.json").write_text(json.dumps(config, indent=2))
    try:
        os.rename(scratch, out)
    except OSError:  # another process made it first
        shutil.rmtree(scratch, ignore_errors=True)
    return out
