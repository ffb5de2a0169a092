"""The pool's slots from the configs (`model_slots`), and what /v1/models says a loaded model
can do (`capabilities`). No MLX: a checkpoint's weight bytes are its files' sizes.
"""

from __future__ import annotations

from typing import Any

from gateway.config import ConfigError, EngineConfig
from gateway.frontend.context import checkpoint_context, weights_bytes
from gateway.frontend.prompt import PromptBuilder
from gateway.pool.slot import EngineFactory, ModelSlot
from gateway.pool_config import ModelSpec, PoolConfig, engine_config_for
from gateway.processors.checkpoint import read_config, serving_task
from gateway.processors.families import family_facts


def model_slots(
    pool: PoolConfig, engine: EngineConfig, make_engine: EngineFactory
) -> list[ModelSlot]:
    """One slot per model `pool` names, each with `engine` (the server's settings) made its
    own (`engine_config_for`); without named models, `engine.model` alone, pinned (the
    single-model server). ConfigError for a model that alone exceeds --models-memory-gb."""
    specs = pool.specs or (ModelSpec(engine.served_model_name, engine.model, pinned=True),)
    slots = []
    for spec in specs:
        config = engine_config_for(spec, engine) if pool.specs else engine
        try:
            kind = serving_task(config.model, config.task)
        except ValueError as exc:
            raise ConfigError(f"model {spec.name!r}: {exc}") from None
        size = footprint(config, kind)
        budget = pool.memory_bytes
        if budget and size > budget:
            raise ConfigError(
                f"model {spec.name!r} needs {size / 2**30:.2f} GiB (weights and cache budgets), "
                f"more than --models-memory-gb {pool.memory_gb:g} allows"
            )
        keep = pool.keep_alive_of(spec)
        slot = ModelSlot(spec, config, keep, size, make_engine, kind)
        slot.card, slot.context_length = preview(config.model)
        slots.append(slot)
    return slots


def preview(path: str) -> tuple[dict[str, Any], int | None]:
    """What /v1/models says of a model before it first loads, from its config.json alone:
    its family, media and capabilities as far as they are known without its template, and
    the checkpoint's own context (the served one, bounded by memory, replaces it once
    loaded). Empty when the config cannot be read (a hub id not downloaded yet)."""
    try:
        config = read_config(path)
        facts = family_facts(config) if isinstance(config, dict) else None
    except Exception:  # noqa: BLE001 - unreadable or unsupported: loading will say why
        return {}, None
    if facts is None:
        return {}, None
    own = checkpoint_context(config)
    media = facts.media_of(config)
    card = {
        "family": facts.family,
        "model_type": str(config.get("model_type", "")),
        "media": sorted(media),
        "capabilities": {
            "vision": "image" in media,
            "video": "video" in media,
            "audio": "audio" in media,
            "structured": True,
        },
    }
    return card, None if own is None else own[0]


def footprint(config: EngineConfig, kind: str = "chat") -> int:
    """Bytes a model takes loaded as the memory rule counts it: its checkpoint's weight
    files plus its memory cache budgets (vision features and KV prefix; an embedding model
    or reranker (`kind`) keeps no KV prefix cache, its vectors instead)."""
    cache = config.cache
    caches = cache.vision_capacity_bytes
    caches += cache.kv_capacity_bytes if kind == "chat" else cache.embedding_capacity_bytes
    return weights_bytes(config.model) + caches


def capabilities(model: Any, prompts: PromptBuilder) -> dict[str, Any]:
    """What clients look for in a model card (Cherry Studio, Kilo Code): which inputs it
    takes and which features its template supports."""
    media = set(model.media)
    return {
        "capabilities": {
            "vision": "image" in media,
            "video": "video" in media,
            "audio": "audio" in media,
            "tools": prompts.tool_format is not None,
            "thinking": prompts.reasoning is not None,
            "structured": True,
        }
    }
