"""A model family the builder can make: what it is called, who loads it, how its files are made.

Every family is one `Family` value in `families.FAMILIES`. The builder writes a checkpoint as:
`write_files(out_dir, size, dtype)` (tokenizer, config.json and every other non-weight file,
returning the config.json dict), then the weights: the parameter names and shapes are read
off the model the family's `runtime` builds from that config (`params.validate_config`) and
filled with deterministic random values (`checkpoint.write_weights`).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

WriteFiles = Callable[[Path, str, str], dict[str, Any]]


@dataclass(frozen=True)
class Family:
    """One buildable family.

    `arch` is config.json's `model_type` (the `make-model --arch` name); `runtime` is the
    package whose `load` reads the checkpoint and whose model classes name its tensors
    ("mlx-vlm" for vision-language families, "mlx-lm" for text-only ones); `sizes` the shape
    tables it has (`tiny` always); `summary` a few words for `--help`; `write_files(out_dir,
    size, dtype)` writes everything but the weights into the existing dir `out_dir` and returns
    the config.json dict. It must be a pure function of its arguments (byte-identical files).
    """

    arch: str
    runtime: str
    sizes: tuple[str, ...]
    summary: str
    write_files: WriteFiles
