"""`model_type` -> model family: which `ModelFamily` serves a checkpoint, and loading it.

A checkpoint's family is chosen by its `config.json` `model_type`: the vision-language
families by name (`FAMILIES`), then any type mlx-lm has a model class for, as a text model,
when the config has no vision part. Adding a family: write its module (one class, a
`ModelFamily`), add its model types here, and list it in README's supported models.
"""

from __future__ import annotations

import importlib.util
import os
from pathlib import Path
from typing import Any

from gateway.engine.families.family import ModelFamily
from gateway.engine.families.gemma3 import MODEL_TYPES as GEMMA3_TYPES
from gateway.engine.families.gemma3 import Gemma3
from gateway.engine.families.gemma4 import MODEL_TYPES as GEMMA4_TYPES
from gateway.engine.families.gemma4 import Gemma4
from gateway.engine.families.mistral3 import MODEL_TYPES as MISTRAL3_TYPES
from gateway.engine.families.mistral3 import Mistral3
from gateway.engine.families.qwen3_5 import MODEL_TYPES as QWEN3_5_TYPES
from gateway.engine.families.qwen3_5 import Qwen35
from gateway.engine.families.qwen_vl import MODEL_TYPES as QWEN_VL_TYPES
from gateway.engine.families.qwen_vl import QwenVL
from gateway.engine.families.smolvlm import MODEL_TYPES as SMOLVLM_TYPES
from gateway.engine.families.smolvlm import SmolVLM
from gateway.engine.families.text import TextModel
from gateway.engine.model.kv_check import kv_quant_refusal
from gateway.processors.checkpoint import read_config

# Vision-language families by model_type (text models are found through mlx-lm below).
FAMILIES: dict[str, type[ModelFamily]] = {t: QwenVL for t in QWEN_VL_TYPES}
FAMILIES.update({t: Mistral3 for t in MISTRAL3_TYPES})
FAMILIES.update({t: SmolVLM for t in SMOLVLM_TYPES})
FAMILIES.update({t: Gemma3 for t in GEMMA3_TYPES})
FAMILIES.update({t: Gemma4 for t in GEMMA4_TYPES})
FAMILIES.update({t: Qwen35 for t in QWEN3_5_TYPES})
TEXT_EXAMPLES = ("qwen3", "llama")  # what docs and errors name; any mlx-lm text model loads
_VISION_KEYS = ("vision_config", "vision_tower", "image_token_id", "image_token_index")


class UnsupportedModel(ValueError):
    """No family serves this checkpoint's `model_type`; the message names those that do."""


def supported_families() -> str:
    """One line naming what the gateway serves (for errors and `--help`)."""
    return (
        f"vision-language: {', '.join(FAMILIES)}; text (through mlx-lm): "
        f"{', '.join(TEXT_EXAMPLES)} and any mlx-lm model whose layers keep full-attention KV"
    )


def family_for(config: dict[str, Any]) -> type[ModelFamily]:
    """The family class for a checkpoint's config; `UnsupportedModel` if there is none."""
    model_type = str(config.get("model_type", ""))
    if model_type in FAMILIES:
        return FAMILIES[model_type]
    if not any(key in config for key in _VISION_KEYS) and _mlx_lm_has(model_type):
        return TextModel
    raise UnsupportedModel(
        f"unsupported model type {model_type!r}; this gateway serves {supported_families()}"
    )


def check_checkpoint(model: str, kv_bits: int = 0) -> None:
    """Before anything loads: is `model` (a directory or hub id) a checkpoint this gateway can
    serve (with `--kv-bits kv_bits`)? ValueError (`UnsupportedModel` for its type) with a
    message saying what is wrong: a folder without config.json or weights, a config.json
    that is not a JSON object, a hub id that is malformed or, offline, not readable from the
    local cache, a family quantized KV does not cover. What only loading can tell is left
    to it."""
    folder = Path(model).expanduser()
    if folder.is_file():
        raise ValueError(f"{folder} is a file; pass the checkpoint's folder (or a hub id)")
    if folder.is_dir():
        if not (folder / "config.json").is_file():
            raise ValueError(f"{folder} holds no config.json: not a model checkpoint folder")
        _check_family(_config(model, f"{folder}/config.json"), kv_bits)
        if not any(folder.glob("*.safetensors")):
            raise ValueError(f"{folder} holds no *.safetensors weights")
        return
    from huggingface_hub.errors import HFValidationError
    from huggingface_hub.utils import validate_repo_id

    try:
        validate_repo_id(model)
    except HFValidationError:
        raise ValueError(
            "not a local folder, nor a hub id of the form owner/name "
            "(such as mlx-community/Qwen2.5-VL-7B-Instruct-4bit)"
        ) from None
    _check_family(_config(model, "its config.json"), kv_bits)


def _check_family(config: dict[str, Any], kv_bits: int) -> None:
    """The config's family exists and can hold KV at `kv_bits` (ValueError: why not)."""
    refusal = kv_quant_refusal(family_for(config), str(config.get("model_type")), kv_bits)
    if refusal is not None:
        raise ValueError(refusal)


def _config(model: str, what: str) -> dict[str, Any]:
    """`read_config(model)`, its failures as ValueErrors naming `what` was read."""
    try:
        config = read_config(model)
    except (ValueError, UnicodeDecodeError) as exc:  # json.JSONDecodeError is a ValueError
        raise ValueError(f"{what} is not valid JSON: {exc}") from None
    except Exception as exc:  # unreadable, not cached while offline, no such repo, no network
        offline = os.environ.get("HF_HUB_OFFLINE", "").lower() in ("1", "true", "yes", "on")
        hint = " (the hub is offline: HF_HUB_OFFLINE; download it once with the hub on)"
        raise ValueError(f"could not read {what}: {exc}{hint if offline else ''}") from None
    if not isinstance(config, dict):
        raise ValueError(f"{what} is not a JSON object")
    return config


def load_model(path: str, lazy: bool = False) -> ModelFamily:
    """Load the checkpoint at `path` (a directory or hub id) with its family. Call on the
    thread that will own MLX; `lazy`: weights unread (prompt side only)."""
    return family_for(read_config(path))(path, lazy=lazy)  # type: ignore[call-arg]


def _mlx_lm_has(model_type: str) -> bool:
    """mlx-lm has a model class for `model_type` (after its own renames)."""
    if not model_type:
        return False
    from mlx_lm.utils import MODEL_REMAPPING

    name = MODEL_REMAPPING.get(model_type, model_type)
    return importlib.util.find_spec(f"mlx_lm.models.{name}") is not None
