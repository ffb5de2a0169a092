"""The Qwen2-VL, Qwen2.5-VL and Qwen3-VL families (the gateway's first three): their files.

The shapes are `shapes`' tables, the tokenizer `tokenizer`'s; this module only puts them
together as `Family` values.
"""

from __future__ import annotations

import functools
from pathlib import Path
from typing import Any

from .family import Family
from .shapes import (
    ARCHS,
    SIZES,
    generation_config,
    model_config,
    preprocessor_config,
    text_vocab_size,
)
from .tokenizer import train_tokenizer, write_tokenizer_files
from .tokenizer_files import dump_json


def write_files(arch: str, out: Path, size: str, dtype: str) -> dict[str, Any]:
    """Tokenizer (padded to the embedding size, so every id the model can sample decodes to
    text), config.json, generation_config.json, preprocessor_config.json; returns the config."""
    ids = write_tokenizer_files(out, train_tokenizer(text_vocab_size(arch, size)))
    config = model_config(arch, size, ids, dtype)
    dump_json(out / "config.json", config)
    dump_json(out / "generation_config.json", generation_config(ids))
    dump_json(out / "preprocessor_config.json", preprocessor_config(arch, size))
    return config


_SUMMARY = {
    "qwen2_vl": "Qwen2-VL (mlx-vlm)",
    "qwen2_5_vl": "Qwen2.5-VL (mlx-vlm)",
    "qwen3_vl": "Qwen3-VL (mlx-vlm)",
}
FAMILIES: tuple[Family, ...] = tuple(
    Family(arch, "mlx-vlm", SIZES, _SUMMARY[arch], functools.partial(write_files, arch))
    for arch in ARCHS
)
