"""`model_type` -> which family serves a checkpoint, from its config.json alone (no MLX).

The facts the HTTP process needs before anything loads (`checkpoint.check_checkpoint`) and
the engine's registry dispatches on (`engine/families/registry.FAMILIES` is built from
`VISION_FAMILIES`, so the two cannot drift):

- the vision-language families, each with its `model_type`s and, where quantized KV cannot
  serve it, why (its class's `kv_quant_off`; tests/gateway/processors/test_families.py pins
  each class against its row here);
- text models: any `model_type` mlx-lm has a model module for, when the config has no vision
  part. Whether it has one is read from mlx-lm's installed files without importing mlx-lm
  (which imports MLX), after mlx-lm's own renames (`MLX_LM_REMAPPING`, a copy of
  `mlx_lm.utils.MODEL_REMAPPING` at the pinned version, pinned equal by the same test).
"""

from __future__ import annotations

import importlib.util
from dataclasses import dataclass
from pathlib import Path
from typing import Any


@dataclass(frozen=True)
class FamilyFacts:
    """One family as known without loading it: `family` (its `ModelFamily.family` name),
    the `model_types` it serves (empty for text models: mlx-lm decides), `kv_quant_off`
    (why `--kv-bits` cannot serve it, a phrase after the model type; None: it can where its
    heads allow); `task`: what its models do ("chat", or "embed": /v1/embeddings only);
    `media`, the kinds of media parts it takes (what /v1/models says of a model not loaded
    yet); `audio`: it also takes audio when its config has an audio tower (`media_of`)."""

    family: str
    model_types: tuple[str, ...]
    kv_quant_off: str | None = None
    task: str = "chat"  # "chat" (generates) or "embed" (an embedding model)
    media: frozenset[str] = frozenset({"image"})  # the parts it takes (its class's `media`)
    audio: bool = False

    def media_of(self, config: dict[str, Any]) -> frozenset[str]:
        """The media a checkpoint of this family with this config.json takes."""
        return self.media | {"audio"} if self.audio and config.get("audio_config") else self.media


VISION_FAMILIES: tuple[FamilyFacts, ...] = (
    FamilyFacts(
        "qwen_vl", ("qwen2_vl", "qwen2_5_vl", "qwen3_vl"), media=frozenset({"image", "video"})
    ),
    FamilyFacts("mistral3", ("mistral3",)),
    FamilyFacts("smolvlm", ("smolvlm",)),
    FamilyFacts(
        "gemma3", ("gemma3",), "keeps sliding-window layers read in ring order by its own attention"
    ),
    FamilyFacts(
        "gemma4",
        ("gemma4",),
        "keeps sliding-window and KV-sharing layers under its own attention",
        audio=True,
    ),
    FamilyFacts(
        "gemma3n",
        ("gemma3n",),
        "keeps sliding-window and KV-sharing layers under its own attention",
        audio=True,
    ),
    FamilyFacts(
        "qwen3_5", ("qwen3_5", "qwen3_5_moe"), "keeps recurrent-state layers (a hybrid model)"
    ),
    FamilyFacts(
        "lfm2_vl", ("lfm2_vl", "lfm2-vl"), "keeps convolution-state layers (a hybrid model)"
    ),
)
TEXT = FamilyFacts("text", (), media=frozenset())
# Embedding models (engine/embed/): served by /v1/embeddings, never by the chat routes. A
# multimodal one by its model type; a text one is a text model type in the
# sentence-transformers layout (`modules.json` / `1_Pooling/`), as Qwen3-Embedding ships.
EMBEDDING_FAMILIES: tuple[FamilyFacts, ...] = (
    FamilyFacts("qwen3_vl_embedding", ("qwen3_vl_embedding",), task="embed"),
)
TEXT_EMBEDDING = FamilyFacts("text_embedding", ("qwen3",), task="embed", media=frozenset())
BY_MODEL_TYPE: dict[str, FamilyFacts] = {
    t: f for f in (*VISION_FAMILIES, *EMBEDDING_FAMILIES) for t in f.model_types
}
TEXT_EXAMPLES = ("qwen3", "llama")  # what docs and errors name; any mlx-lm text model loads
VISION_KEYS = ("vision_config", "vision_tower", "image_token_id", "image_token_index")

# mlx_lm.utils.MODEL_REMAPPING of mlx-lm 0.32.2 (that module imports MLX): model types mlx-lm
# loads with another type's module.
MLX_LM_REMAPPING: dict[str, str] = {
    "mistral": "llama",
    "llava": "mistral3",
    "phi-msft": "phixtral",
    "falcon_mamba": "mamba",
    "joyai_llm_flash": "deepseek_v3",
    "kimi_k2": "deepseek_v3",
    "qwen2_5_vl": "qwen2_vl",
    "minimax_m2": "minimax",
    "iquestcoder": "llama",
    "xverse": "llama",
    "gemma4_unified": "gemma4",
    "deepseek_v41_text": "deepseek_v41",
}


class UnsupportedModel(ValueError):
    """No family serves this checkpoint's `model_type`; the message names those that do."""


def supported_families() -> str:
    """One line naming what the gateway serves (for errors and `--help`)."""
    vision = (t for f in VISION_FAMILIES for t in f.model_types)
    embedding = (t for f in EMBEDDING_FAMILIES for t in f.model_types)
    return (
        f"vision-language: {', '.join(vision)}; text (through mlx-lm): "
        f"{', '.join(TEXT_EXAMPLES)} and any mlx-lm model whose layers keep full-attention KV; "
        f"embeddings: {', '.join(embedding)} and sentence-transformers "
        f"{', '.join(TEXT_EMBEDDING.model_types)} checkpoints"
    )


def family_facts(config: dict[str, Any], sentence_transformers: bool = False) -> FamilyFacts:
    """The family serving a checkpoint's config (`TEXT` for a text model);
    `UnsupportedModel` if there is none. `sentence_transformers`: the checkpoint holds the
    sentence-transformers files (`checkpoint.is_sentence_transformers`), so a text model
    type is an embedding model (`TEXT_EMBEDDING` serves qwen3 only)."""
    model_type = str(config.get("model_type", ""))
    if sentence_transformers and model_type not in BY_MODEL_TYPE:
        if model_type in TEXT_EMBEDDING.model_types:
            return TEXT_EMBEDDING
        raise UnsupportedModel(
            f"a sentence-transformers embedding checkpoint of model type {model_type!r}; this "
            f"gateway embeds with {', '.join(TEXT_EMBEDDING.model_types)} (text) and "
            f"{', '.join(t for f in EMBEDDING_FAMILIES for t in f.model_types)}"
        )
    if model_type in BY_MODEL_TYPE:
        return BY_MODEL_TYPE[model_type]
    if not any(key in config for key in VISION_KEYS) and mlx_lm_has(model_type):
        return TEXT
    raise UnsupportedModel(
        f"unsupported model type {model_type!r}; this gateway serves {supported_families()}"
    )


def mlx_lm_has(model_type: str) -> bool:
    """mlx-lm has a model module for `model_type` (after its own renames), found among its
    installed files: nothing is imported (`find_spec` of a top-level package only locates it)."""
    if not model_type:
        return False
    name = MLX_LM_REMAPPING.get(model_type, model_type)
    if any(c in name for c in "./\\"):  # a package path or a path out of models/, no module
        return False
    spec = importlib.util.find_spec("mlx_lm")
    for root in (spec.submodule_search_locations or []) if spec is not None else []:
        models = Path(root) / "models"
        if (models / f"{name}.py").is_file() or (models / name / "__init__.py").is_file():
            return True
    return False


def kv_quant_refusal(model_type: str, reason: str | None, bits: int) -> str | None:
    """The sentence refusing `--kv-bits bits` for a `model_type` whose family says why
    quantized KV cannot serve it (`reason`: its `kv_quant_off`), or None (no bits, no
    reason)."""
    if not bits or reason is None:
        return None
    return (
        f"--kv-bits {bits}: {model_type} {reason}, which quantized KV does not cover yet; "
        "serve this model without --kv-bits"
    )
