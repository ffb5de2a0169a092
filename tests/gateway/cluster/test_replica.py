"""An engine replica's body (gateway/cluster/replica.py) without Ray, on the tiny model.

Pinned: with `--step-trace FILE`, each replica traces to its own file (FILE with
`.replicaN` before the suffix), so replicas on one host never truncate or interleave each
other's traces, and the file is the engine's trace; a replica's warm-up uses the context
`serve` would decide.
"""

from __future__ import annotations

import logging
from pathlib import Path

import pytest
from support import tiny_model

from gateway.cluster.replica import EngineReplica
from gateway.config import CacheConfig, EngineConfig


def test_each_replica_traces_to_its_own_file(tmp_path: Path) -> None:
    config = EngineConfig(
        model=str(tiny_model("qwen2_vl")),
        served_model_name="test",
        warmup=False,
        cache=CacheConfig(cache_dir=None),
        step_trace=tmp_path / "steps.jsonl",
    )
    replica = EngineReplica(3, config, engine_process=False, log_level="warning")
    try:
        assert replica.engine._trace.path == tmp_path / "steps.replica3.jsonl"
        assert (tmp_path / "steps.replica3.jsonl").exists()
        assert not (tmp_path / "steps.jsonl").exists()
    finally:
        replica.engine.stop()


def test_a_replicas_warm_up_uses_the_context_serve_would(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Invariant: the replica decides its context as `serve` does (the checkpoint's own,
    bounded by memory; gateway/frontend/context.py) and logs it at start-up."""
    config = EngineConfig(
        model=str(tiny_model("qwen2_vl")),
        served_model_name="test",
        cache=CacheConfig(cache_dir=None),
        warmup_image_sizes=(32,),
    )
    with caplog.at_level(logging.INFO, logger="gateway.frontend.context"):
        replica = EngineReplica(0, config, engine_process=False, log_level="info")
    try:
        lines = [r.getMessage() for r in caplog.records if r.name == "gateway.frontend.context"]
        assert lines == [lines[0]] and lines[0].startswith("context: 32768 tokens (the checkpoint")
    finally:
        replica.engine.stop()
