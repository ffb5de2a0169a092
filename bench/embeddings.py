"""`bench embeddings`: embeddings per second through a served embedding model, and what a
repeated image saves.

One server offers the model (`emb`); every request goes through the `openai` client's
`embeddings.create` (base64, the SDK's default), one request at a time, so each figure is a
whole request: HTTP, the media loader, the engine's batch (the request's inputs in
forwards of up to --max-batch rows), the answer.

- throughput: for text and for images, at batch sizes (inputs per request) 1, 16, 64:
  inputs per second = batch / the request's seconds, median over rounds. Every input is new
  (a fresh salt per text, fresh pixels per image), so no cache answers any of it;
- concurrent: `clients` clients at once, each sending one-text requests back to back:
  inputs per second over all, and how many inputs the engine computed per forward (its
  metrics: rows / forwards), which is the batching across requests;
- repeated image: one image's request cold (a tower pass and a forward), the same image
  in a new input (a caption: the vision cache gives the features, the forward runs), and the
  identical input again (the embedding cache answers; no forward): milliseconds, medians
  over rounds, each round with its own image.
"""

from __future__ import annotations

import statistics
import time
from dataclasses import dataclass, field
from typing import Any

from bench.report import fmt
from bench.server import LocalServer
from bench.workload import image_uri, words

BATCHES = (1, 16, 64)
REPEAT_STEPS = (
    ("cold: new image (tower pass + forward)", "cold"),
    ("same pixels, new caption (vision cache + forward)", "vision_hit"),
    ("identical input again (embedding cache)", "embedding_hit"),
)


@dataclass
class Result:
    text_per_s: dict[int, float] = field(default_factory=dict)
    image_per_s: dict[int, float] = field(default_factory=dict)
    repeat_ms: dict[str, float] = field(default_factory=dict)
    tower_passes: float = 0.0
    concurrent_per_s: float = 0.0
    rows_per_forward: float = 0.0
    clients: int = 0


def _image(uri: str, caption: str | None = None) -> Any:
    part = {"type": "image_url", "image_url": {"url": uri}}
    return [{"type": "text", "text": caption}, part] if caption else part


def _seconds(server: LocalServer, inputs: list[Any], client: Any = None) -> float:
    client = client or server.client()
    began = time.perf_counter()
    reply = client.embeddings.create(model="emb", input=inputs)
    assert len(reply.data) == len(inputs)
    return time.perf_counter() - began


def run(
    model: str,
    rounds: int,
    image_size: int,
    batches: tuple[int, ...] = BATCHES,
    server_args: list[str] | None = None,
    clients: int = 16,
) -> Result:
    """Measure `model` served alone (see the module doc)."""
    result = Result()
    # (a request's images are bounded by --max-images-per-request, 16 by default)
    most = str(max(batches))
    args = [f"--model=emb={model}", "--no-warmup", "--max-images-per-request", most]
    args += server_args or []
    with LocalServer(args) as server:
        seed = 0
        _seconds(server, ["warm the forward up"])  # first-call costs are not the figures
        _seconds(server, [_image(image_uri(image_size, 10**6))])
        for batch in batches:
            times = []
            for r in range(rounds):
                texts = [words(24, salt=f"t{batch}-{r}-{i}") for i in range(batch)]
                times.append(_seconds(server, texts))
            result.text_per_s[batch] = batch / statistics.median(times)
            times = []
            for _ in range(rounds):
                images = [_image(image_uri(image_size, seed + i)) for i in range(batch)]
                seed += batch
                times.append(_seconds(server, images))
            result.image_per_s[batch] = batch / statistics.median(times)
        _concurrent(server, result, clients, rounds)
        steps: dict[str, list[float]] = {key: [] for _, key in REPEAT_STEPS}
        for r in range(rounds):
            uri = image_uri(image_size, 10**7 + r)
            steps["cold"].append(_seconds(server, [_image(uri)]))
            steps["vision_hit"].append(_seconds(server, [_image(uri, f"caption {r}")]))
            steps["embedding_hit"].append(_seconds(server, [_image(uri)]))
        result.repeat_ms = {k: 1000 * statistics.median(v) for k, v in steps.items()}
        result.tower_passes = server.metrics().get("vision_gateway_embedding_tower_passes_total", 0)
    return result


def _concurrent(server: LocalServer, result: Result, clients: int, rounds: int) -> None:
    """`clients` threads, each sending `4 * rounds` one-text requests back to back."""
    import concurrent.futures

    def counters() -> tuple[float, float]:
        m = server.metrics()
        return m["vision_gateway_embedding_rows_total"], m[
            "vision_gateway_embedding_forwards_total"
        ]

    def client(c: int) -> None:
        own = server.client()  # one connection per client, as a real one keeps
        for r in range(4 * rounds):
            _seconds(server, [words(24, salt=f"c{c}-{r}")], own)

    rows, forwards = counters()
    began = time.perf_counter()
    with concurrent.futures.ThreadPoolExecutor(clients) as pool:
        list(pool.map(client, range(clients)))
    seconds = time.perf_counter() - began
    rows2, forwards2 = counters()
    result.clients = clients
    result.concurrent_per_s = clients * 4 * rounds / seconds
    result.rows_per_forward = (rows2 - rows) / max(1.0, forwards2 - forwards)


def table(result: Result, image_size: int) -> str:
    """The two markdown tables."""
    lines = [
        f"| inputs per request | text inputs/s | images/s ({image_size}x{image_size}) |",
        "|---:|---:|---:|",
    ]
    for batch in result.text_per_s:
        lines.append(
            f"| {batch} | {fmt(result.text_per_s[batch])} | {fmt(result.image_per_s[batch])} |"
        )
    lines += [
        "",
        f"{result.clients} clients at once, one text per request: "
        f"{fmt(result.concurrent_per_s)} inputs/s, {fmt(result.rows_per_forward)} inputs per "
        "forward (batched across requests)",
    ]
    cold = result.repeat_ms["cold"]
    lines += ["", "| one image's request | ms (median) | speed-up over cold |", "|---|---:|---:|"]
    for label, key in REPEAT_STEPS:
        ms = result.repeat_ms[key]
        lines.append(f"| {label} | {fmt(ms)} | {fmt(cold / ms)}x |")
    return "\n".join(lines)


def quick(result: Result) -> dict[str, Any]:
    """The JSON payload's figures."""
    return {
        "text_inputs_per_s": result.text_per_s,
        "images_per_s": result.image_per_s,
        "repeat_image_ms": result.repeat_ms,
        "tower_passes": result.tower_passes,
        "concurrent": {
            "clients": result.clients,
            "inputs_per_s": result.concurrent_per_s,
            "inputs_per_forward": result.rows_per_forward,
        },
    }
