"""The context a server runs with (gateway/frontend/context.py): the checkpoint's own by
default, read from the keys each family's config uses; bounded by the memory one row's KV
needs; `--max-context` overriding both with a warning above either."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import mlx.core as mx
import pytest
from support import tiny_model

from gateway.config import CacheConfig, EngineConfig
from gateway.engine.families import load_model
from gateway.engine.families.registry import read_config
from gateway.frontend.context import (
    FALLBACK_CONTEXT,
    checkpoint_context,
    choose,
    context_window,
    kv_bytes_per_token,
    memory_bound,
)
from gateway.offline_model.families import FAMILIES

# Each tiny checkpoint's own context: the real checkpoints' (config.json's own numbers).
OWN_CONTEXT = {
    "qwen2_vl": 32768,
    "qwen2_5_vl": 128000,
    "qwen3_vl": 262144,
    "gemma3": 131072,
    "smolvlm": 8192,
    "mistral3": 131072,
    "gemma4": 131072,
    "gemma3n": 32768,
    "lfm2_vl": 128000,
    "qwen3": 40960,
    "qwen3_5": 262144,
    "qwen3_5_moe": 262144,
    "llama": 131072,
    "qwen3_embedding": 40960,
    "qwen3_reranker": 40960,
    "qwen3_vl_embedding": 262144,
    "qwen3_vl_reranker": 262144,
}
# KV bytes per token at float32 where layers differ: gemma3 keeps full KV in 1 of its 6
# layers (5 sliding per global), gemma4 in 1 (its last 4 layers reuse earlier KV; full
# layers have head_dim 32), gemma3n in 1 of its 10 (4 sliding : 1 full, the last 4 share
# earlier KV; one KV head of 16), qwen3_5 in 1 of 4 (the rest recurrent), lfm2_vl in 1 of 4
# (the rest short convolutions; 2 KV heads of 16).
KV_PER_TOKEN = {
    "gemma3": 1 * 2 * 2 * 32 * 4,
    "gemma4": 1 * 2 * 1 * 32 * 4,
    "gemma3n": 1 * 2 * 1 * 16 * 4,
    "qwen3_5": 512,
    "lfm2_vl": 1 * 2 * 2 * 16 * 4,
}


@pytest.fixture(scope="module")
def configs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, tuple[dict, object]]:
    """Every buildable family's tiny config.json and its tokenizer's model_max_length."""
    out = {}
    for arch, family in FAMILIES.items():
        folder = tmp_path_factory.mktemp(arch)
        config = family.write_files(folder, "tiny", "float32")
        tokenizer = json.loads((folder / "tokenizer_config.json").read_text())
        out[arch] = (config, tokenizer.get("model_max_length"))
    return out


def test_every_family_covered() -> None:
    """Invariant: a family added to the builder gets its own context pinned here."""
    assert set(OWN_CONTEXT) == set(FAMILIES)


@pytest.mark.parametrize("arch", sorted(OWN_CONTEXT))
def test_the_default_context_is_the_checkpoints_own(arch: str, configs: dict) -> None:
    """Invariant: each family's config gives its own context (VLMs: `text_config` first);
    qwen3's tokenizer says 131072, its config 40960: the config wins."""
    config, tokenizer_max = configs[arch]
    own = checkpoint_context(config, tokenizer_max)
    assert own is not None and own[0] == OWN_CONTEXT[arch]
    assert own[1].endswith("max_position_embeddings")


@pytest.mark.parametrize("arch", sorted(KV_PER_TOKEN))
def test_only_layers_that_keep_every_tokens_kv_count(arch: str, configs: dict) -> None:
    assert kv_bytes_per_token(configs[arch][0], 4) == KV_PER_TOKEN[arch]


@pytest.mark.parametrize("arch", ["qwen2_vl", "qwen3", "llama"])
def test_kv_bytes_per_token_is_what_a_rows_cache_holds(arch: str) -> None:
    """Invariant: the memory rule's KV per token equals the bytes a real prefill leaves in
    the model's own cache per token."""
    model = load_model(str(tiny_model(arch)))
    cache = model.new_cache()
    model.text_core(mx.array([[1, 2, 3, 4, 5, 6, 7]]), cache=cache)
    held = sum(layer.used_nbytes() for layer in cache) / 7
    assert kv_bytes_per_token(read_config(model.path), model.embed_dtype.size) == held


def test_context_keys_scaling_and_fallbacks() -> None:
    """Invariant: the first context key found wins (text_config before the top level);
    YaRN multiplies the original context; the tokenizer's model_max_length is the last
    resort, its 'unset' value (~1e30) ignored; sliding_window is no context."""
    nested = {"max_position_embeddings": 4096, "text_config": {"max_position_embeddings": 8192}}
    assert checkpoint_context(nested) == (8192, "text_config.max_position_embeddings")
    assert checkpoint_context({"seq_length": 2048}) == (2048, "seq_length")
    yarn = {"type": "yarn", "factor": 4.0, "original_max_position_embeddings": 32768}
    scaled = checkpoint_context({"max_position_embeddings": 40960, "rope_scaling": yarn})
    assert scaled == (131072, "max_position_embeddings with YaRN x4")
    llama3 = {"rope_type": "llama3", "factor": 8.0, "original_max_position_embeddings": 8192}
    assert checkpoint_context({"max_position_embeddings": 131072, "rope_scaling": llama3}) == (
        131072,
        "max_position_embeddings",
    )
    window_only = {"sliding_window": 4096, "max_position_embeddings": True}
    assert checkpoint_context(window_only) is None
    assert checkpoint_context(window_only, 10**30) is None
    assert checkpoint_context({}, 16384) == (16384, "tokenizer_config.json model_max_length")


def test_the_memory_bound_is_one_full_row_after_weights_and_caches() -> None:
    gib = 2**30
    assert memory_bound(1024, 10 * gib, 2 * gib, 2 * gib) == 6 * gib // 1024
    assert memory_bound(1024, 4 * gib, 3 * gib, 2 * gib) is None  # nothing left
    assert memory_bound(None, 10 * gib, 0, 0) is None and memory_bound(1024, None, 0, 0) is None


def test_the_choice_and_its_warnings() -> None:
    """Invariant: the checkpoint's own context unless memory holds less; 32768 with a
    warning when no key says; --max-context wins, warned about above either bound."""
    own = (40960, "max_position_embeddings")
    window, warnings = choose(0, own, None)
    assert (window.tokens, window.chosen_by, warnings) == (40960, "checkpoint", [])
    window, warnings = choose(0, own, 10_000)
    assert (window.tokens, window.chosen_by, warnings) == (10_000, "memory", [])
    window, warnings = choose(0, None, None)
    assert (window.tokens, window.chosen_by) == (FALLBACK_CONTEXT, "default")
    assert len(warnings) == 1 and "--max-context" in warnings[0]
    window, warnings = choose(200_000, own, 100_000)
    assert (window.tokens, window.chosen_by) == (200_000, "--max-context")
    assert len(warnings) == 2
    assert "checkpoint's own context (40960" in warnings[0] and "(100000 tokens)" in warnings[1]
    window, warnings = choose(1024, own, 100_000)
    assert (window.tokens, warnings) == (1024, [])


def _config(max_context: int = 0) -> EngineConfig:
    return EngineConfig(model="m", served_model_name="m", max_context_tokens=max_context)


def test_the_start_up_reads_the_checkpoint_and_logs_one_line(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Invariant: the tiny qwen3 serves 40960 (its config's) on a device that reports no
    memory, a memory that holds 1000 tokens of one row's KV after weights and cache budgets
    bounds it to 1000, and --max-context 64 is served as given; each start-up logs one
    `context:` line."""
    model = load_model(str(tiny_model("qwen3")), lazy=True)
    with caplog.at_level(logging.INFO, logger="gateway.frontend.context"):
        assert context_window(model, _config(), None).tokens == 40960
        weights = sum(f.stat().st_size for f in Path(model.path).glob("*.safetensors"))
        reserved = CacheConfig().kv_capacity_bytes + CacheConfig().vision_capacity_bytes
        memory = weights + reserved + 1000 * 1024 + 5  # qwen3 tiny: 1 KiB of KV per token
        window = context_window(model, _config(), memory)
        assert (window.tokens, window.chosen_by) == (1000, "memory")
        assert context_window(model, _config(64), memory).tokens == 64
    lines = [r.getMessage() for r in caplog.records if r.getMessage().startswith("context:")]
    assert lines[0].startswith("context: 40960 tokens (the checkpoint's own; checkpoint: 40960")
    assert lines[0].endswith("memory: no bound, the device reports no memory size)")
    assert lines[1].startswith("context: 1000 tokens (bounded by memory")
    assert lines[2].startswith("context: 64 tokens (--max-context")
    assert len(lines) == 3
