"""The pool's slots for embedding models and rerankers (pool/build.py): each slot's kind is
read from its checkpoint (and its `task` setting) before anything loads; the memory rule
counts an embedder's vector cache, not the KV prefix budget it never uses; a `task` the
checkpoint cannot serve is a ConfigError naming the model."""

from __future__ import annotations

import pytest
from support import tiny_model

from gateway.config import CacheConfig, ConfigError, EngineConfig
from gateway.frontend.context import weights_bytes
from gateway.pool.build import model_slots
from gateway.pool_config import ModelSpec, PoolConfig


def _slots(*specs: ModelSpec) -> dict[str, object]:
    base = EngineConfig(model="unused", served_model_name="unused", cache=CacheConfig())
    slots = model_slots(PoolConfig(specs=specs), base, lambda _config: None)  # type: ignore[arg-type,return-value]
    return {s.name: s for s in slots}


def test_each_slot_knows_its_kind_before_loading() -> None:
    slots = _slots(
        ModelSpec("emb", str(tiny_model("qwen3_vl_embedding"))),
        ModelSpec("chat", str(tiny_model("qwen3"))),
        ModelSpec("rerank", str(tiny_model("qwen3_reranker")), settings=(("task", "rerank"),)),
    )
    assert {n: s.kind for n, s in slots.items()} == {  # type: ignore[attr-defined]
        "emb": "embed",
        "chat": "chat",
        "rerank": "rerank",
    }


def test_an_embedder_is_counted_without_a_kv_budget() -> None:
    path = str(tiny_model("qwen3_embedding"))
    (slot,) = _slots(ModelSpec("emb", path)).values()
    cache = CacheConfig()
    expected = weights_bytes(path) + cache.vision_capacity_bytes + cache.embedding_capacity_bytes
    assert slot.footprint == expected  # type: ignore[attr-defined]


def test_a_task_the_checkpoint_cannot_serve_names_the_model() -> None:
    spec = ModelSpec("bad", str(tiny_model("qwen2_vl")), settings=(("task", "rerank"),))
    with pytest.raises(ConfigError, match="model 'bad': --task rerank"):
        _slots(spec)
