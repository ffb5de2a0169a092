"""Tenants end to end: real `vision-gateway serve` processes on 127.0.0.1 with a keys file
and an admin key, driven through the `openai` and `anthropic` SDKs.

Pinned: tenant B's request identical to tenant A's is a miss (x-cache, usage) while A's
repeat is a hit, in memory and after a restart from the disk tier, with the same answer;
a different `cache_salt` is a miss and the same salt a hit, in all three APIs; a tenant's key
gets 403 on cache clear, the dashboard's data, /metrics and other tenants' entries, and
sees only its own entries and stats; SIGHUP swaps the keys without dropping a stream.
"""

from __future__ import annotations

import os
import signal
from collections.abc import Iterator
from pathlib import Path

import anthropic
import httpx
import pytest
from support import ServerProcess, data_uri, noise_png, wait_until

KEYS = {"alice": "sk-alice-1111", "bob": "sk-bob-2222", "carol": "sk-carol-3333"}
ADMIN = "sk-admin-9999"
QUESTION = "Describe the picture."


def _keys_file(folder: Path, *names: str) -> Path:
    path = folder / "keys"
    path.write_text("".join(f"{n} {KEYS[n]}\n" for n in names))
    path.chmod(0o600)
    return path


def _server(folder: Path, *extra: str) -> ServerProcess:
    keys = _keys_file(folder, "alice", "bob", "carol")
    return ServerProcess(
        "--api-keys-file", str(keys), "--admin-api-key", ADMIN,
        "--kv-block-tokens", "8", "--no-warmup", *extra,
    )  # fmt: skip


def _x_cache(headers: object) -> dict[str, int]:
    fields = dict(item.strip().split("=") for item in headers["x-cache"].split(";"))  # type: ignore[index]
    return {k: int(v) for k, v in fields.items()}


def _image(seed: int) -> str:
    return data_uri(noise_png(seed, 84, 56))


def _openai(server: ServerProcess, tenant: str, seed: int, salt: str | None = None):  # noqa: ANN202
    """(x-cache fields, usage's cached tokens, (token, logprob) pairs) of one question."""
    image = {"type": "image_url", "image_url": {"url": _image(seed)}}
    raw = server.client(api_key=KEYS[tenant]).chat.completions.with_raw_response.create(
        model="test",
        messages=[{"role": "user", "content": [image, {"type": "text", "text": QUESTION}]}],
        max_tokens=6,
        temperature=0,
        logprobs=True,
        extra_body={"cache_salt": salt} if salt else None,
    )
    answer = raw.parse()
    cached = answer.usage.prompt_tokens_details.cached_tokens
    tokens = [(t.token, t.logprob) for t in answer.choices[0].logprobs.content]
    return _x_cache(raw.headers), cached, tokens


def _anthropic(server: ServerProcess, tenant: str, seed: int, salt: str | None) -> int:
    """Cached prompt tokens of one Messages question (x-cache and usage agree)."""
    client = anthropic.Anthropic(
        base_url=server.base_url, api_key=KEYS[tenant], max_retries=0, timeout=120
    )
    source = {"type": "base64", "media_type": "image/png", "data": _image(seed).split(",")[1]}
    raw = client.messages.with_raw_response.create(
        model="test",
        max_tokens=4,
        messages=[
            {
                "role": "user",
                "content": [
                    {"type": "image", "source": source},
                    {"type": "text", "text": QUESTION},
                ],
            }
        ],
        extra_body={"cache_salt": salt} if salt else None,
    )
    cached = raw.parse().usage.cache_read_input_tokens
    assert cached == _x_cache(raw.headers)["cached-tokens"]
    return cached


def _responses(server: ServerProcess, tenant: str, seed: int, salt: str | None) -> int:
    """Cached prompt tokens of one Responses question (x-cache and usage agree)."""
    content = [
        {"type": "input_image", "image_url": _image(seed)},
        {"type": "input_text", "text": QUESTION},
    ]
    raw = server.client(api_key=KEYS[tenant]).responses.with_raw_response.create(
        model="test",
        input=[{"role": "user", "content": content}],
        max_output_tokens=4,
        temperature=0,
        store=False,
        extra_body={"cache_salt": salt} if salt else None,
    )
    cached = raw.parse().usage.input_tokens_details.cached_tokens
    assert cached == _x_cache(raw.headers)["cached-tokens"]
    return cached


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    proc = _server(tmp_path_factory.mktemp("tenants"))
    yield proc
    assert proc.stop(), proc.log()


def test_another_tenants_identical_request_misses_in_memory_and_after_a_restart(
    tmp_path: Path,
) -> None:
    """Invariant: B's request identical to A's is a miss (no cached tokens, the image
    encoded again) while A's repeat hits; after SIGTERM and a restart on the same folder a
    third tenant still misses (nothing from disk) while A's repeat is served from disk; every
    answer is the same."""
    folder = tmp_path / "cache"
    first = _server(tmp_path, "--cache-dir", str(folder))
    try:
        a_cold, a_cold_cached, answer = _openai(first, "alice", 5)
        a_warm, a_warm_cached, a_again = _openai(first, "alice", 5)
        b_cache, b_cached, b_answer = _openai(first, "bob", 5)
    finally:
        assert first.stop(), first.log()
    assert a_cold["cached-tokens"] == a_cold_cached == 0 and a_cold["vision-misses"] == 1
    assert a_warm["cached-tokens"] == a_warm_cached > 0
    assert b_cache["cached-tokens"] == b_cached == 0 and b_cache["vision-misses"] == 1
    assert a_again == answer and b_answer == answer

    second = _server(tmp_path, "--cache-dir", str(folder))
    try:
        c_cache, c_cached, c_answer = _openai(second, "carol", 5)
        a_disk, a_disk_cached, a_disk_answer = _openai(second, "alice", 5)
    finally:
        assert second.stop(), second.log()
    assert c_cached == c_cache["disk-cached-tokens"] == c_cache["vision-disk-hits"] == 0
    assert c_cache["vision-misses"] == 1
    assert a_disk["disk-cached-tokens"] > 0 and a_disk_cached == a_disk["cached-tokens"] > 0
    assert c_answer == answer and a_disk_answer == answer


@pytest.mark.parametrize("api", ["openai", "anthropic", "responses"])
def test_cache_salt_scopes_reuse_in_every_api(server: ServerProcess, api: str) -> None:
    """Invariant: within one tenant, a request with another `cache_salt` (or none) is a miss,
    one with the same salt a hit."""
    seed = {"openai": 20, "anthropic": 21, "responses": 22}[api]

    def cached(salt: str | None) -> int:
        if api == "openai":
            return _openai(server, "alice", seed, salt)[1]
        ask = _anthropic if api == "anthropic" else _responses
        return ask(server, "alice", seed, salt)

    assert cached(None) == 0
    assert cached(None) > 0
    assert cached("team-x") == 0
    assert cached("team-x") > 0
    assert cached("team-y") == 0
    bad = httpx.post(
        server.base_url + "/v1/chat/completions",
        headers={"authorization": f"Bearer {KEYS['alice']}"},
        json={"model": "test", "messages": [{"role": "user", "content": "hi"}], "cache_salt": 7},
        timeout=30,
    )
    assert bad.status_code == 400 and bad.json()["error"]["param"] == "cache_salt"


def _get(server: ServerProcess, path: str, key: str, method: str = "GET") -> httpx.Response:
    headers = {"authorization": f"Bearer {key}"}
    return httpx.request(method, server.base_url + path, headers=headers, timeout=30)


def test_only_the_admin_clears_and_sees_everything(server: ServerProcess) -> None:
    """Invariant: a tenant key gets 403 on clear, the dashboard's data, /metrics and another
    tenant's entries, and sees only its own entries and per-tenant stats; the admin key sees
    every tenant but cannot chat."""
    _openai(server, "alice", 30)
    _openai(server, "bob", 31)
    for path, method in [
        ("/v1/cache/clear", "POST"),
        ("/v1/dashboard", "GET"),
        ("/metrics", "GET"),
        ("/v1/cache/entries?tenant=alice", "GET"),
    ]:
        refused = _get(server, path, KEYS["bob"], method)
        assert refused.status_code == 403, (path, refused.text)
        assert "--admin-api-key" in refused.json()["error"]["message"]
    own = _get(server, "/v1/cache/entries?limit=100", KEYS["bob"]).json()
    assert {e["tenant"] for e in own["largest"]} == {"bob"} and own["counts"]["vision"] >= 1
    every = _get(server, "/v1/cache/entries?limit=100", ADMIN).json()
    assert {"alice", "bob"} <= {e["tenant"] for e in every["largest"]}
    assert set(_get(server, "/v1/cache/stats", KEYS["bob"]).json()["tenants"]) == {"bob"}
    assert {"alice", "bob"} <= set(_get(server, "/v1/cache/stats", ADMIN).json()["tenants"])
    assert _get(server, "/metrics", ADMIN).status_code == 200
    assert _get(server, "/v1/dashboard", ADMIN).status_code == 200
    chat = httpx.post(
        server.base_url + "/v1/chat/completions",
        headers={"authorization": f"Bearer {ADMIN}"},
        json={"model": "test", "messages": [{"role": "user", "content": "hi"}]},
        timeout=30,
    )
    assert chat.status_code == 401
    assert _get(server, "/v1/cache/clear", ADMIN, "POST").json()["cleared"] is True


def test_sighup_swaps_the_keys_without_dropping_a_stream(tmp_path: Path) -> None:
    """Invariant: after the keys file changes and SIGHUP arrives, a new key works and a
    removed one gets 401, while a stream that was running finishes normally."""
    proc = _server(tmp_path)
    try:
        stream = proc.client(api_key=KEYS["alice"]).chat.completions.create(
            model="test",
            messages=[{"role": "user", "content": "count"}],
            max_tokens=48,
            temperature=0,
            stream=True,
            extra_body={"ignore_eos": True},
        )
        chunks = iter(stream)
        next(chunks)
        _keys_file(tmp_path, "alice", "carol")
        os.kill(proc.proc.pid, signal.SIGHUP)
        wait_until(
            lambda: _get(proc, "/v1/models", KEYS["bob"]).status_code == 401,
            30,
            message=proc.log,
        )
        assert _get(proc, "/v1/models", KEYS["carol"]).status_code == 200
        rest = list(chunks)
        assert rest[-1].choices[0].finish_reason == "length"
    finally:
        assert proc.stop(), proc.log()
    assert "API keys reloaded" in proc.log(50_000)
