"""`bench model-load`: what a request pays when its model is not loaded (several models behind
one server, gateway.pool), and what the disk tier gives back after a reload.

One server offers two models, `a` (a vision model) and `b`, with `--max-loaded-models 1` and a
fresh `--cache-dir`, so every switch unloads one model and loads the other. Each round:
1. `a`, a question about the round's image, twice: cold, then warm (memory caches);
2. `b`, one text question: the first token includes loading `b` (and unloading `a`);
3. `a` again, the same image: the first token includes loading `a` again, then its prompt
   comes from the disk tier (cached tokens > 0);
4. `a`, a new image: the load again, then a cold prefill (what step 3 saved).
Every figure is a first-token time through the `openai` client (streamed); the server's own
load seconds (its metric) are reported beside them. Medians over the rounds. Between two
models' requests the bench pauses (`--pause-s`, 2 s: a user switching models), so the
server's spare engine process (`--no-spare-engine` turns it off) has done its imports.
"""

from __future__ import annotations

import statistics
import tempfile
import time
from dataclasses import dataclass, field
from typing import Any

from bench.report import fmt
from bench.server import LocalServer
from bench.timing import image_message, timed_stream
from bench.workload import image_uri

_LOAD = "vision_gateway_model_load_seconds"
STEPS = (
    ("a warm (loaded, memory caches)", "warm"),
    ("b, not loaded (load + text prompt)", "load_b"),
    ("a reloaded, same image (load + disk tier)", "reload_disk"),
    ("a reloaded, new image (load + cold prefill)", "reload_cold"),
    ("a cold, loaded (cold prefill only)", "cold"),
)


@dataclass
class Rounds:
    ttft_ms: dict[str, list[float]] = field(default_factory=dict)
    cached: dict[str, list[int]] = field(default_factory=dict)
    load_s: float | None = None  # the server's mean load time (vision_gateway_model_load_seconds)

    def add(self, step: str, ms: float, cached: int) -> None:
        self.ttft_ms.setdefault(step, []).append(ms)
        self.cached.setdefault(step, []).append(cached)

    def median(self, step: str) -> float:
        return statistics.median(self.ttft_ms[step])


def _ask(server: LocalServer, model: str, image: str | None, max_tokens: int) -> tuple[float, int]:
    """(first-token ms, cached prompt tokens) of one streamed greedy answer."""
    if image is None:
        messages = [{"role": "user", "content": "Say hello."}]
    else:
        messages = [image_message(image, "What is in this picture?")]
    timing = timed_stream(server.client(), model, messages, max_tokens)
    return 1000 * timing.ttft_s, timing.cached_tokens


def run(
    model_a: str,
    model_b: str,
    rounds: int,
    image_size: int,
    extra: list[str],
    pause_s: float = 2.0,
    log: Any = print,
) -> Rounds:
    """The rounds (module doc) against one fresh server; `extra`: more serve flags;
    `pause_s`: seconds between a model's last request and the next model's first (a user
    switching models; it lets the server's spare engine process finish its imports)."""
    out = Rounds()
    with tempfile.TemporaryDirectory(prefix="bench-model-load-") as cache:
        args = [
            f"--model=a={model_a}",
            f"--model=b={model_b}",
            "--max-loaded-models",
            "1",
            "--cache-dir",
            cache,
            *extra,
        ]
        with LocalServer(args) as server:
            for r in range(rounds):
                image = image_uri(image_size, 1000 + 2 * r)
                fresh = image_uri(image_size, 1001 + 2 * r)
                ms, cached = _ask(server, "a", image, 4)
                out.add("cold", ms, cached)
                out.add("warm", *_ask(server, "a", image, 4))
                time.sleep(pause_s)
                out.add("load_b", *_ask(server, "b", None, 4))
                time.sleep(pause_s)
                out.add("reload_disk", *_ask(server, "a", image, 4))
                time.sleep(pause_s)
                out.add("load_b", *_ask(server, "b", None, 4))
                time.sleep(pause_s)
                out.add("reload_cold", *_ask(server, "a", fresh, 4))
                log(f"round {r + 1}/{rounds}: " + ", ".join(
                    f"{k} {v[-1]:.0f} ms" for k, v in out.ttft_ms.items()
                ))  # fmt: skip
            metrics = server.metrics()
    loads = sum(v for k, v in metrics.items() if k.startswith(_LOAD + "_count"))
    total = sum(v for k, v in metrics.items() if k.startswith(_LOAD + "_sum"))
    out.load_s = total / loads if loads else None
    return out


def table(result: Rounds) -> str:
    """The markdown table: median first-token time and cached tokens per step."""
    lines = [
        "| request | first token (median ms) | cached prompt tokens (median) | rounds |",
        "| --- | ---: | ---: | ---: |",
    ]
    for label, step in STEPS:
        samples = result.ttft_ms.get(step, [])
        if not samples:
            continue
        cached = statistics.median(result.cached[step])
        lines.append(f"| {label} | {fmt(result.median(step))} | {cached:.0f} | {len(samples)} |")
    if result.load_s is not None:
        lines.append(f"\nserver-side load time (mean of its loads): {result.load_s:.2f} s")
    return "\n".join(lines)


def quick(result: Rounds) -> dict[str, Any]:
    """JSON-able summary (medians)."""
    return {
        "ttft_ms": {step: result.median(step) for step in result.ttft_ms},
        "cached_tokens": {s: statistics.median(v) for s, v in result.cached.items()},
        "load_s": result.load_s,
        "samples": result.ttft_ms,
    }
