"""The registry of buildable families, keyed by `--arch` (config.json's `model_type`).

`family(arch)` returns the `Family` (ValueError naming the supported archs if unknown);
`check_arch_size(arch, size, dtype)` validates the names and returns the dtype.
"""

from __future__ import annotations

from . import (
    embedders,
    gemma3,
    gemma3n,
    gemma4,
    lfm2_vl,
    llama,
    mistral3,
    qwen3,
    qwen3_5,
    qwen_vl,
    smolvlm,
)
from .family import Family
from .shapes import resolve_dtype

FAMILIES: dict[str, Family] = {
    f.arch: f
    for f in (
        *qwen_vl.FAMILIES,
        gemma3.FAMILY,
        smolvlm.FAMILY,
        mistral3.FAMILY,
        gemma4.FAMILY,
        gemma3n.FAMILY,
        lfm2_vl.FAMILY,
        qwen3.FAMILY,
        *qwen3_5.FAMILIES,
        llama.FAMILY,
        embedders.TEXT_FAMILY,
        embedders.VL_FAMILY,
        embedders.RERANKER_FAMILY,
        embedders.VL_RERANKER_FAMILY,
    )
}
ARCHS: tuple[str, ...] = tuple(FAMILIES)


def family(arch: str) -> Family:
    """The family `arch` names. Raises ValueError listing every supported arch."""
    try:
        return FAMILIES[arch]
    except KeyError:
        raise ValueError(f"unknown arch {arch!r}; expected one of {', '.join(ARCHS)}") from None


def check_arch_size(arch: str, size: str, dtype: str | None = None) -> str:
    """Validate the names; return the dtype (the size's default when None). ValueError if bad."""
    sizes = family(arch).sizes
    if size not in sizes:
        raise ValueError(f"unknown size {size!r} for {arch}; expected one of {', '.join(sizes)}")
    return resolve_dtype(size, dtype)
