"""Several models behind one `serve` (gateway.pool), end to end: tiny checkpoints of three
families (Qwen2-VL, Gemma 3, a Qwen3 text model) and one that cannot load, served by one
process with `--max-loaded-models 2`, the real OpenAI SDK as the client.

Pinned, as issue 37 asks: each model's greedy answer (token ids and logprobs) equals a
single-model server's for the same request; using all three evicts the least recently used,
with two engine processes serving models and one spare (imports done, no model) alive: an
unloaded model's process has exited, and each load took the spare; a burst of
8 concurrent requests to an unloaded model loads it once (the metric); a model whose
checkpoint cannot load gives a 503 naming it while the others answer; a reloaded model
answers its earlier image from the disk tier (cached tokens > 0); the HTTP process never
mapped MLX's library; /v1/models shows every model's state; the Anthropic and Responses APIs
route by model too; an unknown name is a 404 listing the served ones; the admin endpoint
unloads a model.
"""

from __future__ import annotations

import concurrent.futures
import shutil
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest
from support import ServerProcess, data_uri, noise_png, tiny_model, wait_until

from bench.server import LocalServer, _process_tree

FAMILIES = {"qwen": "qwen2_vl", "gemma": "gemma3", "text": "qwen3"}
IMAGE = data_uri(noise_png(7))


def _question(model: str, image: bool) -> dict[str, Any]:
    content: list[dict[str, Any]] = [{"type": "text", "text": "What is in the picture?"}]
    if image:
        content.insert(0, {"type": "image_url", "image_url": {"url": IMAGE}})
    return {
        "model": model,
        "messages": [{"role": "user", "content": content}],
        "max_tokens": 6,
        "temperature": 0,
        "logprobs": True,
    }


def _ask(client: openai.OpenAI, model: str, image: bool) -> tuple[list, int]:
    """((token, logprob) per answer token, cached prompt tokens) of the greedy answer."""
    reply = client.chat.completions.create(**_question(model, image))
    assert reply.choices[0].logprobs is not None and reply.usage is not None
    tokens = [(t.token, t.logprob) for t in reply.choices[0].logprobs.content or []]
    details = reply.usage.prompt_tokens_details
    return tokens, (details.cached_tokens or 0) if details else 0


def _engines(server: LocalServer) -> list[int]:
    """The server's engine processes (multiprocessing's spawned children)."""
    found = []
    for pid in _process_tree(server.proc.pid)[1:]:
        try:
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
        except OSError:
            continue
        if b"spawn_main" in cmdline:
            found.append(pid)
    return found


def _other_apis(server: LocalServer) -> dict[str, str]:
    """The model each of the other two APIs reports answering: Anthropic's Messages to
    `text`, the Responses API to `gemma` (both real SDKs)."""
    import anthropic

    messages = anthropic.Anthropic(base_url=server.base_url, api_key="unused", max_retries=0)
    said = messages.messages.create(
        model="text", max_tokens=4, messages=[{"role": "user", "content": "Hello"}]
    )
    responses = server.client().responses.create(
        model="gemma", input="Hello", max_output_tokens=4, temperature=0
    )
    return {"anthropic": said.model, "responses": responses.model}


def _written(server: LocalServer, model: str) -> None:
    """Wait until `model` has written its KV blocks to the disk tier (in the background: a
    response can arrive before its entry is on disk)."""

    def done() -> bool | None:
        url = f"{server.base_url}/v1/cache/stats?model={model}"
        disk = httpx.get(url, timeout=10).json()["disk"]
        return (disk["prefix"]["writes"] > 0 and disk["pending_bytes"] == 0) or None

    wait_until(done, 30.0, message=lambda: f"{model} wrote nothing to disk")


def _states(server: LocalServer) -> dict[str, str]:
    cards = httpx.get(server.base_url + "/v1/models", timeout=10).json()["data"]
    return {card["id"]: card["state"] for card in cards}


@pytest.fixture(scope="module")
def broken(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A checkpoint that passes the start-up checks (a config, a weights file) but cannot
    load: its weights are not safetensors."""
    folder = tmp_path_factory.mktemp("broken")
    shutil.copy(tiny_model("qwen3") / "config.json", folder / "config.json")
    (folder / "model.safetensors").write_bytes(b"not a safetensors file")
    return folder


@pytest.fixture(scope="module")
def pool_run(broken: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """One pool server taken through the whole scenario; what it saw, for the tests."""
    models = [f"--model={name}={tiny_model(arch)}" for name, arch in FAMILIES.items()]
    models.append(f"--model=broken={broken}")
    cache = tmp_path_factory.mktemp("disk")
    args = [*models, "--max-loaded-models", "2", "--no-warmup", "--cache-dir", str(cache)]
    args += ["--kv-block-tokens", "8"]  # (the short prompts fill whole blocks)
    seen: dict[str, Any] = {}
    with LocalServer(args) as server:
        client = server.client()
        seen["start"] = _states(server)
        seen["start_cards"] = httpx.get(server.base_url + "/v1/models", timeout=10).json()["data"]
        seen["qwen"] = _ask(client, "qwen", image=True)
        _written(server, "qwen")
        seen["gemma"] = _ask(client, "gemma", image=True)
        seen["two"] = len(_engines(server))
        with concurrent.futures.ThreadPoolExecutor(8) as pool:
            burst = list(pool.map(lambda _: _ask(client, "text", False), range(8)))
        seen["text"], seen["burst"] = burst[0], burst
        seen["after_burst"] = _states(server)
        seen["engines_after_burst"] = len(_engines(server))
        with pytest.raises(openai.APIStatusError) as refused:
            _ask(client, "broken", image=False)
        seen["broken"] = refused.value
        seen["text_after_broken"] = _ask(client, "text", False)
        seen["qwen_again"] = _ask(client, "qwen", image=True)
        seen["other_apis"] = _other_apis(server)
        with pytest.raises(openai.NotFoundError) as unknown:
            _ask(client, "nope", image=False)
        seen["unknown"] = unknown.value
        unload = httpx.post(server.base_url + "/v1/models/text/unload", timeout=60)
        seen["unload"] = (unload.status_code, unload.json(), _states(server)["text"])
        seen["metrics"] = server.metrics()
        maps = Path(f"/proc/{server.proc.pid}/maps").read_text()
        seen["http_maps_mlx"] = "libmlx" in maps or "/mlx/" in maps
    return seen


def test_every_model_answers_as_a_single_model_server_would(pool_run: dict) -> None:
    """Invariant: the pool's greedy answer of each model equals a single-model server's for
    the same request (token ids and logprobs)."""
    for name, arch in FAMILIES.items():
        with ServerProcess("--no-warmup", "--kv-block-tokens", "8", arch=arch) as alone:
            expected = _ask(alone.client(), "test", image=name != "text")
        assert pool_run[name][0] == expected[0], name
        assert len(expected[0]) > 0


def test_the_least_recently_used_model_is_evicted_and_its_process_exits(pool_run: dict) -> None:
    assert pool_run["start"] == {
        "qwen": "loaded",
        "gemma": "unloaded",
        "text": "unloaded",
        "broken": "unloaded",
    }
    assert pool_run["two"] == 3  # qwen, gemma and the spare for the next load
    after = pool_run["after_burst"]
    assert (after["qwen"], after["gemma"], after["text"]) == ("unloaded", "loaded", "loaded")
    assert pool_run["engines_after_burst"] == 3  # gemma, text (was the spare), a new spare


def test_a_burst_loads_an_unloaded_model_once(pool_run: dict) -> None:
    metrics = pool_run["metrics"]
    assert metrics['vision_gateway_model_loads_total{model="text"}'] == 1
    assert all(answer == pool_run["text"] for answer in pool_run["burst"])


def test_a_model_that_cannot_load_is_a_503_naming_it(pool_run: dict) -> None:
    error = pool_run["broken"]
    assert error.status_code == 503 and "Retry-After" in error.response.headers
    body = error.body
    assert body["code"] == "model_unavailable" and "`broken`" in body["message"]
    assert pool_run["text_after_broken"][0] == pool_run["text"][0]  # the others answer
    assert pool_run["metrics"]['vision_gateway_model_load_failures_total{model="broken"}'] == 1


def test_a_reloaded_model_answers_its_image_from_the_disk_tier(pool_run: dict) -> None:
    tokens, cached = pool_run["qwen_again"]
    assert tokens == pool_run["qwen"][0] and cached > 0
    assert pool_run["metrics"]['vision_gateway_model_loads_total{model="qwen"}'] == 2


def test_the_http_process_never_maps_mlx(pool_run: dict) -> None:
    assert pool_run["http_maps_mlx"] is False


def test_every_api_routes_by_model(pool_run: dict) -> None:
    assert pool_run["other_apis"] == {"anthropic": "text", "responses": "gemma"}


def test_an_unknown_model_is_a_404_listing_the_served_names(pool_run: dict) -> None:
    body = pool_run["unknown"].body
    assert body["code"] == "model_not_found" and body["param"] == "model"
    assert all(f"`{name}`" in body["message"] for name in ("qwen", "gemma", "text", "broken"))


def test_the_admin_unloads_a_model(pool_run: dict) -> None:
    status, body, state = pool_run["unload"]
    assert status == 200 and body["unloaded"] is True and state == "unloaded"


def test_models_not_loaded_yet_are_described_from_their_config(pool_run: dict) -> None:
    """Invariant: /v1/models tells a client what a model takes before it first loads (its
    family, vision or not, its checkpoint's context), and the loaded one its capabilities."""
    cards = {card["id"]: card for card in pool_run["start_cards"]}
    gemma, text, qwen = cards["gemma"], cards["text"], cards["qwen"]
    assert gemma["state"] == "unloaded" and gemma["family"] == "gemma3"
    assert gemma["capabilities"]["vision"] and not gemma["capabilities"]["video"]
    assert not text["capabilities"]["vision"] and text["family"] == "text"
    assert all(isinstance(c["context_length"], int) for c in (gemma, text, qwen))
    assert qwen["state"] == "loaded" and qwen["capabilities"]["video"]
    assert set(qwen["capabilities"]) == {"vision", "video", "tools", "thinking", "structured"}
