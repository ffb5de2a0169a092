"""Quantized variants of the offline checkpoints, through the runtime's own converter.

    quantize_checkpoint(src, out, bits, group_size, runtime)

The quantization is mlx-vlm's (`mlx_vlm.convert(..., quantize=True)`) for vision-language
families and mlx-lm's (`mlx_lm.convert`) for text ones: the code that makes the mlx-community
4-bit and 8-bit checkpoints. The language model's linear layers and embedding become affine
`bits`-bit weights with per-`group_size` scales and biases; the vision tower is left
unquantized, as mlx-vlm does for every multimodal checkpoint. We never quantize weights
ourselves, so a test on such a checkpoint exercises exactly the layers (QuantizedLinear,
QuantizedEmbedding) a user's quantized model has. (mlx-lm's converter re-saves the tokenizer
through transformers, as the mlx-community text checkpoints are.)
"""

from __future__ import annotations

import contextlib
import io
import os
from pathlib import Path

BITS: tuple[int, ...] = (4, 8)
DEFAULT_GROUP_SIZE = 64  # mlx-vlm's and mlx-lm's default (and the mlx-community checkpoints')


def check_quantize(bits: int | None, group_size: int) -> None:
    """ValueError unless `bits` is None or one of BITS and `group_size` one MLX supports."""
    if bits is not None and bits not in BITS:
        raise ValueError(f"quantize bits must be one of {BITS}, got {bits!r}")
    if group_size not in (32, 64, 128):
        raise ValueError(f"quantization group size must be 32, 64 or 128, got {group_size!r}")


def quantize_checkpoint(
    src: Path, out: Path, bits: int, group_size: int, runtime: str = "mlx-vlm"
) -> None:
    """Write a `bits`-bit copy of the checkpoint `src` into the directory `out` (which may
    exist and be empty) with `runtime`'s converter ("mlx-vlm" or "mlx-lm"). The converters'
    progress lines are swallowed."""
    check_quantize(bits, group_size)
    with contextlib.redirect_stdout(io.StringIO()):
        if runtime == "mlx-lm":
            from mlx_lm import convert as lm_convert

            # mlx-lm refuses an existing dir: convert next to it, then move the files in.
            staging = out / "quantized"
            lm_convert(str(src), str(staging), quantize=True, q_bits=bits, q_group_size=group_size)
            for f in sorted(staging.iterdir()):
                os.rename(f, out / f.name)
            staging.rmdir()
        else:
            from mlx_vlm import convert  # slow import: only when a quantized model is built

            convert(str(src), str(out), quantize=True, q_bits=bits, q_group_size=group_size)
    (out / "README.md").unlink(missing_ok=True)  # a hub model card: not part of our build
