"""`vision-gateway cluster` with several models: each model has its own Ray Serve replicas
(one each here) behind the one ingress, which routes by `model`.

Pinned: both models are listed loaded; each answers a greedy request exactly as a single
`serve` of that model does (token ids and logprobs); /metrics carries each model's engine
series under a `model` label; the ingress took each model's prompt side from its replicas
and never mapped MLX's library.

Needs the `cluster` extra (Ray Serve); skipped without it. `.ci/run` installs it.
"""

from __future__ import annotations

import importlib.util
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from support import ServerProcess, tiny_model

from bench.server import LocalServer

pytestmark = [
    pytest.mark.skipif(
        importlib.util.find_spec("ray") is None, reason="needs the cluster extra (Ray Serve)"
    ),
    pytest.mark.cluster,
]
COMMON = ["--no-warmup", "--in-process-engine", "--kv-block-tokens", "8"]
FAMILIES = {"vision": "qwen2_vl", "text": "qwen3"}


@pytest.fixture(scope="module")
def cluster() -> Iterator[LocalServer]:
    models = [f"--model={name}={tiny_model(arch)}" for name, arch in FAMILIES.items()]
    server = LocalServer(
        [*models, "--replicas", "1", "--ray-object-store-mb", "128", *COMMON], command="cluster"
    )
    yield server
    assert server.stop(), server.log()


def _ask(base_url: str, model: str) -> list[tuple[str, float]]:
    body: dict[str, Any] = {
        "model": model,
        "messages": [{"role": "user", "content": "Name three colours."}],
        "max_tokens": 6,
        "temperature": 0,
        "logprobs": True,
    }
    reply = httpx.post(base_url + "/v1/chat/completions", json=body, timeout=300)
    assert reply.status_code == 200, reply.text
    content = reply.json()["choices"][0]["logprobs"]["content"]
    return [(t["token"], t["logprob"]) for t in content]


def test_each_model_has_its_replicas_and_answers_as_serve_does(cluster: LocalServer) -> None:
    cards = httpx.get(cluster.base_url + "/v1/models", timeout=10).json()["data"]
    assert {c["id"]: c["state"] for c in cards} == {"vision": "loaded", "text": "loaded"}
    answers = {name: _ask(cluster.base_url, name) for name in FAMILIES}
    for name, arch in FAMILIES.items():
        with ServerProcess(*COMMON, arch=arch) as alone:
            assert answers[name] == _ask(alone.base_url, "test"), name
    metrics = httpx.get(cluster.base_url + "/metrics", timeout=30).text
    for name in FAMILIES:
        assert f'model="{name}"' in metrics
    maps = Path(f"/proc/{cluster.proc.pid}/maps").read_text()
    assert "libmlx" not in maps
