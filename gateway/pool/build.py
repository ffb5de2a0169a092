"""The pool's slots from the configs (`model_slots`), and what /v1/models says a loaded model
can do (`capabilities`). No MLX: a checkpoint's weight bytes are its files' sizes.
"""

from __future__ import annotations

from typing import Any

from gateway.config import ConfigError, EngineConfig
from gateway.frontend.context import weights_bytes
from gateway.frontend.prompt import PromptBuilder
from gateway.pool.slot import EngineFactory, ModelSlot
from gateway.pool_config import ModelSpec, PoolConfig, engine_config_for
from gateway.processors.checkpoint import serving_task


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
        slots.append(ModelSlot(spec, config, keep, size, make_engine, kind))
    return slots


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
            "tools": prompts.tool_format is not None,
            "thinking": prompts.reasoning is not None,
            "structured": True,
        }
    }
