"""A checkpoint's `config.json`, read without loading anything else (no MLX), and whether
this gateway can serve the checkpoint (`check_checkpoint`, run by the HTTP process before
the engine loads anything)."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from gateway.processors.families import FamilyFacts, family_facts, kv_quant_refusal

# Model types a reranker may be (scored by its yes/no logits, as mlx-vlm's reranker does).
RERANK_TYPES = ("qwen3", "qwen3_vl")
# Files that make a checkpoint a sentence-transformers model (an embedder).
SENTENCE_TRANSFORMERS_FILES = ("modules.json", "1_Pooling/config.json")


def read_config(path: str) -> dict[str, Any]:
    """The checkpoint's config.json: from the directory, else from the Hugging Face cache or
    hub (the loaders fetch the rest)."""
    local = Path(path).expanduser() / "config.json"
    if local.is_file():
        return json.loads(local.read_text())
    from huggingface_hub import hf_hub_download  # slow import: hub ids only

    return json.loads(Path(hf_hub_download(path, "config.json")).read_text())


def is_sentence_transformers(path: str) -> bool:
    """The checkpoint at `path` (a folder, or a hub id read from the cache or hub) holds the
    sentence-transformers files: it is an embedding model, whatever its model type."""
    folder = Path(path).expanduser()
    if folder.is_dir():
        return any((folder / name).is_file() for name in SENTENCE_TRANSFORMERS_FILES)
    from huggingface_hub import hf_hub_download  # slow import: hub ids only

    for name in SENTENCE_TRANSFORMERS_FILES:
        try:
            hf_hub_download(path, name)
            return True
        except Exception:  # noqa: BLE001 - absent, offline or no such repo: not one
            continue
    return False


def checkpoint_facts(path: str) -> FamilyFacts:
    """The family serving the checkpoint at `path` (`families.family_facts` with its
    sentence-transformers files looked for). Raises what `read_config` and `family_facts`
    raise."""
    return family_facts(read_config(path), is_sentence_transformers(path))


def serving_task(path: str, requested: str = "auto") -> str:
    """What the checkpoint at `path` serves: "chat", "embed" or "rerank". `requested` (the
    model's --task) "auto" reads it off the checkpoint (its family's task); "rerank" needs a
    Qwen3 or Qwen3-VL chat checkpoint (scored as Qwen3-Reranker / Qwen3-VL-Reranker are);
    "chat" and "embed" must agree with the checkpoint. ValueError naming the mismatch; what
    cannot be read counts as chat (its load then says what is wrong)."""
    try:
        facts = checkpoint_facts(path)
        model_type = str(read_config(path).get("model_type", ""))
    except Exception:  # noqa: BLE001 - the load reports it
        return "chat" if requested == "auto" else requested
    if requested == "auto":
        return facts.task
    if requested == "rerank":
        if model_type not in RERANK_TYPES or facts.task != "chat":
            raise ValueError(
                f"--task rerank: the checkpoint is a {model_type!r} {facts.family} model; a "
                f"reranker is a {' or '.join(RERANK_TYPES)} checkpoint (as Qwen3-Reranker, "
                "Qwen3-VL-Reranker)"
            )
        return "rerank"
    if requested != facts.task:
        does = "an embedding model" if facts.task == "embed" else "a chat model"
        raise ValueError(f"--task {requested}: the checkpoint is {does} ({model_type!r})")
    return requested


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
        _check_family(_config(model, f"{folder}/config.json"), kv_bits, model)
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
    try:
        config = _config(model, "its config.json")
    except ValueError as exc:
        if "/" in model:
            raise
        # A bare name is far more often a mistyped local folder than a hub model of that name
        raise ValueError(
            f"no folder {model!r} here ({Path.cwd()}), and {exc}; check the folder's name, "
            "or give a hub id as owner/name"
        ) from None
    _check_family(config, kv_bits, model)


def _check_family(config: dict[str, Any], kv_bits: int, model: str) -> None:
    """The config's family exists and can hold KV at `kv_bits` (ValueError: why not)."""
    facts = family_facts(config, is_sentence_transformers(model))
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
