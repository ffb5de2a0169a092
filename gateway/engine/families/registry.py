"""`model_type` -> model family: which `ModelFamily` serves a checkpoint, and loading it.

A checkpoint's family is chosen by its `config.json` `model_type`, by the MLX-free facts of
`gateway.processors.families` (which the HTTP process checks a checkpoint against before
anything loads: `check_checkpoint`): the vision-language families by name (`FAMILIES`, built
from `VISION_FAMILIES`), then any type mlx-lm has a model class for, as a text model, when
the config has no vision part. Adding a family: write its module (one class, a
`ModelFamily`), add its row to `processors/families.VISION_FAMILIES` and its class to
`_CLASSES` here, and list it in README's supported models.
"""

from __future__ import annotations

from typing import Any

from gateway.engine.families.family import ModelFamily
from gateway.engine.families.gemma3 import Gemma3
from gateway.engine.families.gemma3n import Gemma3n
from gateway.engine.families.gemma4 import Gemma4
from gateway.engine.families.lfm2_vl import Lfm2VL
from gateway.engine.families.mistral3 import Mistral3
from gateway.engine.families.qwen3_5 import Qwen35
from gateway.engine.families.qwen_vl import QwenVL
from gateway.engine.families.smolvlm import SmolVLM
from gateway.engine.families.text import TextModel
from gateway.processors.checkpoint import check_checkpoint, read_config
from gateway.processors.families import (
    TEXT_EXAMPLES,
    VISION_FAMILIES,
    FamilyFacts,
    UnsupportedModel,
    family_facts,
    supported_families,
)

__all__ = [
    "FAMILIES",
    "TEXT_EXAMPLES",
    "UnsupportedModel",
    "check_checkpoint",
    "class_of",
    "family_for",
    "load_model",
    "read_config",
    "supported_families",
]

# Each family's class by its name (`ModelFamily.family`, `FamilyFacts.family`).
_CLASSES: dict[str, type[ModelFamily]] = {
    c.family: c
    for c in (
        QwenVL,
        Mistral3,
        SmolVLM,
        Gemma3,
        Gemma3n,
        Gemma4,
        Qwen35,
        Lfm2VL,
        TextModel,
    )
}


def class_of(facts: FamilyFacts) -> type[ModelFamily]:
    """The class serving the family `facts` describe."""
    return _CLASSES[facts.family]


# Vision-language families by model_type (text models are found through mlx-lm).
FAMILIES: dict[str, type[ModelFamily]] = {
    t: class_of(f) for f in VISION_FAMILIES for t in f.model_types
}


def family_for(config: dict[str, Any]) -> type[ModelFamily]:
    """The family class for a checkpoint's config; `UnsupportedModel` if there is none (an
    embedding model has no chat family: `engine/embed` serves it, under `serve` only)."""
    facts = family_facts(config)
    if facts.task != "chat":
        raise UnsupportedModel(
            f"model type {config.get('model_type')!r} is an embedding model: `vision-gateway "
            "serve` serves it on /v1/embeddings (the chat engine and the cluster do not)"
        )
    return class_of(facts)


def load_model(path: str, lazy: bool = False) -> ModelFamily:
    """Load the checkpoint at `path` (a directory or hub id) with its family. Call on the
    thread that will own MLX; `lazy`: weights unread (prompt side only)."""
    return family_for(read_config(path))(path, lazy=lazy)  # type: ignore[call-arg]
