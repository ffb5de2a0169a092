"""Answer prefill (issue 27 target 4) measured in-process, two engines side by side on the
embedded tiny model: `--answer-prefill` (default) and `--no-answer-prefill`, requests
alternating between them so both see the same machine load (this shared CPU's noise is
+-30% and more between minutes; HTTP adds its own: `python -m bench multi-turn` is the
client-side view).

`python -m docs.investigations.answer_prefill warm [--conversations 6] [--think-ms 200]`:
image conversations of 5 turns (448 px, 64-token answers, the history resent with each
answer as received); per warm turn the time from `Engine.submit` to the first token, the
prefill forwards it ran and its cached / prompt tokens.

`python -m docs.investigations.answer_prefill text-first [--reps 12]`: a text request sent
the moment an 800-token answer ends (so its answer prefill, ~25 blocks, is due in idle time):
its time to first token; answer prefill must yield to it.
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable
from threading import Event
from typing import Any

import numpy as np
from PIL import Image

from caches.hashing import pixel_hash
from gateway.api.openai.parse import parse_chat_request
from gateway.config import CacheConfig, EngineConfig
from gateway.engine.core import Engine
from gateway.engine.request import ErrorEvent, FinishEvent, TokenEvent
from gateway.frontend.prompt import PromptBuilder
from gateway.media import DecodedImage
from gateway.metrics import Metrics
from gateway.offline_model import ensure_model

CONFIGS = {"answer prefill": True, "prompt only": False}


class Side:
    """One engine and its prompt builder; `forwards` counts prefill forwards."""

    def __init__(self, answer_prefill: bool) -> None:
        config = EngineConfig(
            model=str(ensure_model()),
            served_model_name="t",
            cache=CacheConfig(answer_prefill=answer_prefill),
        )
        self.engine = Engine(config, Metrics())
        self.engine.start(timeout=300)
        self.prompts = PromptBuilder(self.engine.model, 8192, 16)
        self.forwards = 0
        model, prefill = self.engine.model, self.engine.model.prefill

        def counted(*args: Any, **kwargs: Any) -> Any:
            self.forwards += 1
            return prefill(*args, **kwargs)

        model.prefill = counted

    def send(self, body: dict, images: list, on_finish: Callable[[], None] | None = None):  # noqa: ANN201
        """Submit; returns (first-token time holder, done event, events)."""
        request = self.prompts.build(
            parse_chat_request(body), images, f"r{time.perf_counter_ns()}", time.perf_counter()
        )
        first: list[float] = []
        events: list[Any] = []
        done = Event()

        def sink(event: Any) -> None:
            if isinstance(event, TokenEvent) and not first:
                first.append(time.perf_counter())
            events.append(event)
            if isinstance(event, (FinishEvent, ErrorEvent)):
                if on_finish is not None:
                    on_finish()
                done.set()

        self.engine.submit(request, sink)
        return first, done, events


def _image(seed: int) -> DecodedImage:
    rng = np.random.default_rng(seed)
    rgb = Image.fromarray((rng.random((448, 448, 3)) * 255).astype("uint8"), "RGB")
    digest = pixel_hash("RGB", rgb.width, rgb.height, rgb.tobytes())
    return DecodedImage(rgb, digest, rgb.width, rgb.height, "data", 0.0, 0.0)


def _text(events: list) -> str:
    return "".join(e.text for e in events if isinstance(e, (TokenEvent, FinishEvent)))


def warm(sides: dict[str, Side], conversations: int, think: float) -> None:
    rows: dict[str, dict[str, list]] = {n: {"ttft": [], "fw": [], "c": [], "p": []} for n in sides}
    for conv in range(conversations):
        image = _image(200 + conv)
        first_turn = [
            {"type": "image_url", "image_url": {"url": "x"}},
            {"type": "text", "text": "What is in this picture?"},
        ]
        history = {n: [{"role": "user", "content": first_turn}] for n in sides}
        for turn in range(5):
            for name, side in sides.items():
                body = {"model": "t", "temperature": 0, "max_tokens": 64, "messages": history[name]}
                before, t0 = side.forwards, time.perf_counter()
                first, done, events = side.send(body, [image])
                done.wait(120)
                if turn:
                    usage = events[-1].usage
                    rows[name]["ttft"].append(1000 * (first[0] - t0))
                    rows[name]["fw"].append(side.forwards - before)
                    rows[name]["c"].append(usage.cached_tokens)
                    rows[name]["p"].append(usage.prompt_tokens)
                history[name] += [
                    {"role": "assistant", "content": _text(events)},
                    {"role": "user", "content": f"What else? (part {turn + 2})"},
                ]
                time.sleep(think)
    print("| config | warm TTFT ms, median (IQR) | prefill forwards per warm turn | cached |")
    print("|---|---|---|---|")
    for name, r in rows.items():
        q = statistics.quantiles(r["ttft"], n=4)
        share = sum(r["c"]) / sum(r["p"])
        print(
            f"| {name} | {statistics.median(r['ttft']):.1f} ({q[0]:.1f}-{q[2]:.1f}) | "
            f"{statistics.mean(r['fw']):.2f} | {sum(r['c'])} / {sum(r['p'])} ({share:.1%}) |"
        )


def text_first(sides: dict[str, Side], reps: int) -> None:
    rows: dict[str, list[float]] = {n: [] for n in sides}
    for rep in range(reps):
        for name, side in sides.items():
            quick = {"model": "t", "temperature": 0, "max_tokens": 4}
            quick["messages"] = [{"role": "user", "content": f"Quick question {rep}?"}]
            sent: list[float] = []
            holder: dict[str, Any] = {}

            def follow(
                side: Side = side, quick: dict = quick, sent: list = sent, holder: dict = holder
            ) -> None:
                sent.append(time.perf_counter())  # (on the engine thread, as the answer ends)
                holder["q"] = side.send(quick, [])

            long = {"model": "t", "temperature": 0, "max_tokens": 800, "ignore_eos": True}
            long["messages"] = [{"role": "user", "content": f"A very long story {rep}"}]
            side.send(long, [], on_finish=follow)[1].wait(300)
            first, done, _ = holder["q"]
            done.wait(60)
            rows[name].append(1000 * (first[0] - sent[0]))
            time.sleep(0.3)
    print("| config | text TTFT right after a long answer, ms: median (IQR) | max |")
    print("|---|---|---|")
    for name, r in rows.items():
        q = statistics.quantiles(r, n=4)
        print(f"| {name} | {statistics.median(r):.1f} ({q[0]:.1f}-{q[2]:.1f}) | {max(r):.1f} |")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("what", choices=["warm", "text-first"])
    parser.add_argument("--conversations", type=int, default=6)
    parser.add_argument("--think-ms", type=float, default=200)
    parser.add_argument("--reps", type=int, default=12)
    args = parser.parse_args()
    sides = {name: Side(on) for name, on in CONFIGS.items()}
    try:
        if args.what == "warm":
            warm(sides, args.conversations, args.think_ms / 1000)
        else:
            text_first(sides, args.reps)
    finally:
        for side in sides.values():
            side.engine.stop()


if __name__ == "__main__":
    main()
