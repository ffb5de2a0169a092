"""A checkpoint's `config.json`, read without loading anything else (no MLX), and whether
this gateway can serve the checkpoint (`check_checkpoint`, run by the HTTP process before
the engine loads anything)."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from gateway.processors.families import family_facts, kv_quant_refusal


def read_config(path: str) -> dict[str, Any]:
    """The checkpoint's config.json: from the directory, else from the Hugging Face cache or
    hub (the loaders fetch the rest)."""
    local = Path(path).expanduser() / "config.json"
    if local.is_file():
        return json.loads(local.read_text())
    from huggingface_hub import hf_hub_download  # slow import: hub ids only

    return json.loads(Path(hf_hub_download(path, "config.json")).read_text())


def check_checkpoint(model: str, kv_bits: int = 0) -> None:
    """Before anything loads: is `model` (a directory or hub id) a checkpoint this gateway can
    serve (with `--kv-bits kv_bits`)? ValueError (`families.UnsupportedModel` for its type)
    with a message saying what is wrong: a folder without config.json or weights, a
    config.json that is not a JSON object, a hub id that is malformed or, offline, not
    readable from the local cache, a family quantized KV does not cover. What only loading
    can tell is left to it. Imports no MLX."""
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
    facts = family_facts(config)
    refusal = kv_quant_refusal(str(config.get("model_type")), facts.kv_quant_off, kv_bits)
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
