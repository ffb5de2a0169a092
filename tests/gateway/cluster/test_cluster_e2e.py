"""`vision-gateway cluster` end to end: 2 local Ray Serve replicas of the tiny model behind
one ingress, driven by the real SDKs over HTTP, next to a single `serve` for comparison.

Needs the `cluster` extra (Ray Serve); skipped without it. `.ci/run` installs it.
"""

from __future__ import annotations

import importlib.util
import json
import os
import signal
import threading
import time

import httpx
import pytest
from support import ServerProcess, data_uri, noise_png, tiny_model, wait_until

from bench.server import LocalServer

pytestmark = [
    pytest.mark.skipif(
        importlib.util.find_spec("ray") is None, reason="needs the cluster extra (Ray Serve)"
    ),
    pytest.mark.cluster,
]
KEY = "cluster-test-key"
AUTH = {"authorization": f"Bearer {KEY}"}
COMMON = ["--no-warmup", "--in-process-engine", "--kv-block-tokens", "8", "--api-key", KEY]


class ClusterProcess(LocalServer):
    def __init__(self, *args: str) -> None:
        model = ["--model", str(tiny_model()), "--served-model-name", "test"]
        super().__init__([*model, *args], command="cluster")


@pytest.fixture(scope="module")
def cluster():
    server = ClusterProcess("--replicas", "2", "--ray-object-store-mb", "128", *COMMON)
    yield server
    assert server.stop(), server.log()


@pytest.fixture(scope="module")
def single():
    server = ServerProcess(*COMMON)
    yield server
    server.stop()


def _stats(server) -> dict:
    return httpx.get(server.base_url + "/v1/cache/stats", headers=AUTH, timeout=30).json()


def _image_turn(image: str, text: str) -> dict:
    return {
        "role": "user",
        "content": [
            {"type": "image_url", "image_url": {"url": image}},
            {"type": "text", "text": text},
        ],
    }


def _routed(stats: dict) -> list[int]:
    return [s["routed"] for s in stats["router"]["slots"]]


def test_same_image_five_turns_lands_on_one_replica(cluster):
    """Five turns of a conversation about one image go to one replica (the router's count
    and that replica's own prefix-cache queries both move by 5, the other's by 0), and
    turns 2-5 read the earlier turns from that replica's cache."""
    client = cluster.client(api_key=KEY)
    image = data_uri(noise_png(11))
    before = _stats(cluster)
    messages = [_image_turn(image, "Describe the picture.")]
    cached = []
    for turn in range(5):
        r = client.chat.completions.create(
            model="test", messages=messages, max_tokens=4, temperature=0
        )
        cached.append(r.usage.prompt_tokens_details.cached_tokens)
        messages += [
            {"role": "assistant", "content": r.choices[0].message.content},
            {"role": "user", "content": f"And part {turn + 2}?"},
        ]
    after = _stats(cluster)
    moved = [b - a for a, b in zip(_routed(before), _routed(after), strict=True)]
    queries = [
        r2["caches"]["prefix"]["queries"] - r1["caches"]["prefix"]["queries"]
        for r1, r2 in zip(before["replicas"], after["replicas"], strict=True)
    ]
    assert sorted(moved) == [0, 5], moved
    assert queries == moved
    assert cached[0] == 0 and all(c > 0 for c in cached[1:]), cached


def _repeat_workload(server, seeds: list[int], questions: int) -> tuple[float, float]:
    """`questions` rounds over the images, caches emptied first: the share of requests that
    found their image's prompt in the cache (cached tokens > 0), and of prompt tokens."""
    httpx.post(server.base_url + "/v1/cache/clear", headers=AUTH, timeout=30)
    client = server.client(api_key=KEY)
    images = [data_uri(noise_png(seed, 112, 112)) for seed in seeds]
    hits = cached = prompt = 0
    for q in range(questions):
        for image in images:
            r = client.chat.completions.create(
                model="test",
                messages=[_image_turn(image, f"Question {q} about it?")],
                max_tokens=2,
                temperature=0,
            )
            hits += r.usage.prompt_tokens_details.cached_tokens > 0
            cached += r.usage.prompt_tokens_details.cached_tokens
            prompt += r.usage.prompt_tokens
    return hits / (questions * len(images)), cached / prompt


def test_repeat_image_hit_rate_two_replicas_vs_one(cluster, single):
    """Repeat questions over 6 images, 3 rounds: the 2-replica cluster's hit rate (requests
    and prompt tokens) is at least 0.9x the single server's (each image stays on one
    replica). Every repeat hits on one server: 12 of 18 requests."""
    seeds = list(range(200, 206))
    one = _repeat_workload(single, seeds, 3)
    two = _repeat_workload(cluster, seeds, 3)
    print(f"\nrepeat-image hit rate (requests, tokens): single {one}, 2 replicas {two}")
    assert one[0] == 12 / 18
    assert two[0] >= 0.9 * one[0] and two[1] >= 0.9 * one[1]


def test_same_api_errors_and_auth_as_one_server(cluster, single):
    """Auth, error objects and the Anthropic and Responses APIs behave as on `serve`: the
    same status and body for a missing key and for an unknown model, and both SDKs work."""
    for path, body in (("/v1/models", None), ("/v1/chat/completions", {"model": "nope"})):
        got = [
            httpx.request("POST" if body else "GET", s.base_url + path, json=body, timeout=30)
            for s in (cluster, single)
        ]
        assert got[0].status_code == got[1].status_code == 401
        assert got[0].json() == got[1].json()
    bad = {"model": "nope", "messages": [{"role": "user", "content": "hi"}]}
    got = [
        httpx.post(s.base_url + "/v1/chat/completions", json=bad, headers=AUTH, timeout=30)
        for s in (cluster, single)
    ]
    assert got[0].status_code == got[1].status_code == 404
    assert got[0].json() == got[1].json()
    assert httpx.get(cluster.base_url + "/health", timeout=10).json()["status"] == "ok"

    import anthropic

    claude = anthropic.Anthropic(base_url=cluster.base_url, api_key=KEY, max_retries=0)
    message = claude.messages.create(
        model="test", max_tokens=4, messages=[{"role": "user", "content": "hello"}]
    )
    assert message.usage.output_tokens == 4 or message.stop_reason == "end_turn"
    with claude.messages.stream(
        model="test", max_tokens=4, messages=[{"role": "user", "content": "hello"}]
    ) as stream:
        assert stream.get_final_message().usage.input_tokens > 0
    client = cluster.client(api_key=KEY)
    first = client.responses.create(model="test", input="Remember this.", max_output_tokens=4)
    follow = client.responses.create(
        model="test", input="And now?", previous_response_id=first.id, max_output_tokens=4
    )
    assert follow.status in ("completed", "incomplete")
    assert follow.usage.input_tokens_details.cached_tokens > 0  # the same replica's KV


def test_stream_cancelled_on_disconnect(cluster):
    """A streaming client that disconnects frees its replica's batch row: running goes back
    to 0 on every replica within seconds."""
    body = {
        "model": "test",
        "messages": [{"role": "user", "content": "Talk for a long time."}],
        "max_tokens": 4000,
        "ignore_eos": True,
        "stream": True,
    }
    with httpx.stream(
        "POST", cluster.base_url + "/v1/chat/completions", json=body, headers=AUTH, timeout=60
    ) as response:
        chunks = 0
        for line in response.iter_lines():
            chunks += line.startswith("data:")
            if chunks >= 5:
                break

    def idle() -> bool:
        return all(r["running"] == 0 and r["waiting"] == 0 for r in _stats(cluster)["replicas"])

    left = "the replica kept decoding after the client left"
    wait_until(idle, 20, 0.2, lambda: f"{left}: {_stats(cluster)['replicas']}")


def test_metrics_aggregated_and_per_replica(cluster):
    """/metrics: each total equals the sum of the per-replica series, for both replicas."""
    text = httpx.get(cluster.base_url + "/metrics", headers=AUTH, timeout=30).text
    samples = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            name, _, value = line.rpartition(" ")
            samples[name] = float(value)
    total = samples['vision_gateway_requests_total{status="ok"}']
    each = [
        samples.get(f'vision_gateway_requests_total{{status="ok",replica="{s}"}}', 0.0)
        for s in (0, 1)
    ]
    assert total == sum(each) and all(n > 0 for n in each), (total, each)
    entries = httpx.get(cluster.base_url + "/v1/cache/entries", headers=AUTH, timeout=30).json()
    assert {e["replica"] for e in entries["largest"]} == {0, 1}
    dashboard = httpx.get(cluster.base_url + "/v1/dashboard", headers=AUTH, timeout=30)
    assert dashboard.status_code == 200 and dashboard.json()["caches"]["prefix"]["queries"] > 0


def _serving_replica(cluster, running: int) -> dict:
    """The replica running `running` requests, once the ingress has seen them admitted too
    (a request the ingress has seen nothing of would be sent elsewhere, not failed)."""

    def serving() -> dict | None:
        busy = [r for r in _stats(cluster)["replicas"] if r["running"] >= running]
        health = httpx.get(cluster.base_url + "/health", timeout=10).json()
        return busy[0] if busy and health["running"] >= running else None

    return wait_until(serving, 20, message=f"no replica is running {running} requests")


def test_killed_replica_is_replaced_and_its_request_fails_cleanly(cluster):
    """SIGKILL the replica serving a stream and a plain request about one image mid-answer:
    the stream ends within seconds with the API's error event ('unavailable', says to
    retry) and the plain request with a 503 error object, not a hang; requests sent
    meanwhile are served; Serve replaces the dead replica (a new pid) and the router sends
    the image's requests to it again."""
    image = data_uri(noise_png(31))
    body = {
        "model": "test",
        "messages": [_image_turn(image, "Talk for a long time.")],
        "max_tokens": 4000,
        "ignore_eos": True,
        "stream": True,
    }
    plain: list[httpx.Response] = []
    waiter = threading.Thread(
        target=lambda: plain.append(
            httpx.post(
                cluster.base_url + "/v1/chat/completions",
                json={**body, "stream": False},
                headers=AUTH,
                timeout=60,
            )
        )
    )
    events: list[dict] = []
    with httpx.stream(
        "POST", cluster.base_url + "/v1/chat/completions", json=body, headers=AUTH, timeout=60
    ) as response:
        lines = response.iter_lines()
        for line in lines:
            if line.startswith("data:"):
                events.append(json.loads(line[5:]))
                if len(events) == 3:
                    break
        waiter.start()
        victim = _serving_replica(cluster, running=2)
        os.kill(victim["pid"], signal.SIGKILL)
        killed = time.monotonic()
        for line in lines:
            if line.startswith("data:") and line[5:].strip() != "[DONE]":
                events.append(json.loads(line[5:]))
        ended = time.monotonic() - killed
    waiter.join(15)
    print(
        f"\nkilled replica {victim['slot']} (pid {victim['pid']}); stream ended {ended:.2f} s later"
    )
    assert ended < 15
    error = events[-1]["error"]
    assert error["code"] == "unavailable" and "retry" in error["message"], error
    assert plain and plain[0].status_code == 503, plain
    assert plain[0].json()["error"]["code"] == "unavailable"

    client = cluster.client(api_key=KEY)
    for i in range(3):  # meanwhile: served (by the other replica, or the replacement)
        r = client.chat.completions.create(
            model="test", messages=[{"role": "user", "content": f"hi {i}"}], max_tokens=2
        )
        assert r.choices[0].finish_reason in ("stop", "length")

    def replaced() -> dict | None:
        back = _stats(cluster)["replicas"][victim["slot"]]
        return back if back.get("up") and back.get("pid") not in (None, victim["pid"]) else None

    not_back = f"replica {victim['slot']} was not replaced"
    back = wait_until(replaced, 120, 0.5, lambda: f"{not_back}: {_stats(cluster)['replicas']}")
    print(f"replaced after {time.monotonic() - killed:.1f} s by pid {back['pid']}")
    before = _routed(_stats(cluster))
    body.update(stream=False, max_tokens=2)
    assert (
        httpx.post(
            cluster.base_url + "/v1/chat/completions", json=body, headers=AUTH, timeout=60
        ).status_code
        == 200
    )
    after = _routed(_stats(cluster))
    assert after[victim["slot"]] == before[victim["slot"]] + 1  # the image's home again


def _x_cache(headers: httpx.Headers) -> dict[str, int]:
    return {k.strip(): int(v) for k, v in (f.split("=") for f in headers["x-cache"].split(";"))}


def _ask_images(server, images: list[str]) -> httpx.Response:
    content = [{"type": "image_url", "image_url": {"url": i}} for i in images]
    message = {"role": "user", "content": [*content, {"type": "text", "text": "Hi"}]}
    body = {"model": "test", "max_tokens": 2, "temperature": 0, "messages": [message]}
    r = httpx.post(server.base_url + "/v1/chat/completions", json=body, headers=AUTH, timeout=120)
    assert r.status_code == 200, r.text
    return r


def test_replicas_share_the_disk_tier(tmp_path_factory):
    """Replicas on one host share `--cache-dir`: an image encoded by one replica is a disk
    hit (its features read from the folder, `vision-disk-hits` in x-cache) on the other, and
    the merged stats count the shared folder once."""
    folder = tmp_path_factory.mktemp("shared-disk")
    server = ClusterProcess(
        "--replicas", "2", "--ray-object-store-mb", "128", *COMMON, "--cache-dir", str(folder)
    )
    try:
        image = data_uri(noise_png(21))
        _ask_images(server, [image])  # its home replica encodes it and writes the features
        wait_until(
            lambda: _stats(server)["disk"]["vision"]["writes"] >= 1,
            30,
            interval=0.2,
            message="the image's features were not written to the folder",
        )
        # A request keyed by another image first reaches the other replica for some of these
        # (the ring is deterministic), which finds `image` on disk, not in its memory.
        hits = [
            _x_cache(_ask_images(server, [data_uri(noise_png(seed)), image]).headers)
            for seed in range(30, 42)
        ]
        assert any(h["vision-disk-hits"] == 1 for h in hits), hits
        stats = _stats(server)
        assert len(stats["disk"]["paths"]) == 1
        each = [r["caches"]["disk"]["bytes"] for r in stats["replicas"]]
        assert stats["disk"]["bytes"] == max(each) > 0  # one folder, counted once
    finally:
        assert server.stop(), server.log()
