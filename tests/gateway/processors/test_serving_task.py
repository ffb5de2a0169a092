"""What a checkpoint serves, read without MLX (processors/checkpoint.serving_task and
families.family_facts): `--task auto` tells an embedding model (by model type, or a text
model in the sentence-transformers layout) from a chat one; `rerank` takes only a Qwen3
text checkpoint; `chat` / `embed` must agree with the checkpoint; a sentence-transformers
checkpoint of a type no embedder serves is refused naming the types that are."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from support import tiny_model

from gateway.processors.checkpoint import check_checkpoint, serving_task
from gateway.processors.families import UnsupportedModel


def test_auto_reads_the_checkpoint() -> None:
    assert serving_task(str(tiny_model("qwen3_vl_embedding"))) == "embed"
    assert serving_task(str(tiny_model("qwen3_embedding"))) == "embed"
    assert serving_task(str(tiny_model("qwen3"))) == "chat"
    assert serving_task(str(tiny_model("qwen2_vl"))) == "chat"


def test_rerank_needs_a_qwen3_text_checkpoint() -> None:
    assert serving_task(str(tiny_model("qwen3_reranker")), "rerank") == "rerank"
    for arch in ("qwen2_vl", "llama"):
        with pytest.raises(ValueError, match="--task rerank"):
            serving_task(str(tiny_model(arch)), "rerank")


def test_an_explicit_task_must_agree() -> None:
    with pytest.raises(ValueError, match="--task embed: the checkpoint is a chat model"):
        serving_task(str(tiny_model("qwen3")), "embed")
    with pytest.raises(ValueError, match="--task chat: the checkpoint is an embedding model"):
        serving_task(str(tiny_model("qwen3_embedding")), "chat")


def test_unknown_sentence_transformers_type_is_refused(tmp_path: Path) -> None:
    source = tiny_model("llama")
    for name in ("config.json", "model.safetensors"):
        shutil.copy(source / name, tmp_path / name)
    (tmp_path / "modules.json").write_text(json.dumps([]))
    with pytest.raises(UnsupportedModel, match="embeds with qwen3"):
        check_checkpoint(str(tmp_path))


def test_the_chat_registry_names_an_embedding_model() -> None:
    """The chat engine (and so the cluster's replicas) refuses an embedding checkpoint
    saying what it is and where it is served, not with a KeyError."""
    from gateway.engine.families.registry import family_for
    from gateway.processors.checkpoint import read_config

    config = read_config(str(tiny_model("qwen3_vl_embedding")))
    with pytest.raises(UnsupportedModel, match="is an embedding model"):
        family_for(config)
