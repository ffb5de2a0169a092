"""`bench stall`: do running text streams stall while an image request is admitted?

K text streams decode; once each has produced a few tokens, one image request (cold: its
vision encode and prefill must run) is sent. We record every token's arrival on the text
streams and report their inter-token gaps before and while the image request is admitted
(from its send until its first token), plus the image request's time to first token.
"""

from __future__ import annotations

import statistics
import threading
import time
from dataclasses import dataclass
from typing import Any

from bench.report import fmt
from bench.timing import StreamTiming, image_message, timed_stream
from bench.workload import image_uri


@dataclass(frozen=True)
class StallResult:
    prefill_chunk: int | None  # None: as the --base-url server runs
    streams: int
    image_size: int
    baseline_gap_ms: float  # median inter-token gap before the image request
    admission_max_gap_ms: float  # max gap on any text stream during admission
    admission_median_gap_ms: float
    image_ttft_ms: float
    tokens_per_step: float  # generation tokens / decode steps over the whole run

    def row(self) -> str:
        return (
            f"| {self.prefill_chunk or 'as served'} | {self.streams} | "
            f"{self.image_size}x{self.image_size} | "
            f"{self.baseline_gap_ms:.1f} | {self.admission_median_gap_ms:.1f} | "
            f"{self.admission_max_gap_ms:.1f} | {self.image_ttft_ms:.0f} | "
            f"{fmt(self.tokens_per_step, 2)} |"
        )


HEADER = (
    "| prefill chunk | text streams | image | median gap before (ms) | "
    "median gap during admission (ms) | max gap during admission (ms) | image TTFT (ms) | "
    "tokens/step |\n"
    "|---|---|---|---|---|---|---|---|"
)


def run_stall(
    server: Any,
    model: str,
    prefill_chunk: int | None,
    streams: int = 4,
    image_size: int = 448,
    max_tokens: int = 160,
    warmup_tokens: int = 8,
    log: Any = print,
) -> StallResult:
    client = server.client()
    # Warm-up at the measured image size, so one-time kernel compilation is not counted.
    warm = image_uri(image_size, 424242)
    timed_stream(client, model, [image_message(warm, "warm-up")], 2)
    before = server.metrics()
    timings: list[StreamTiming | None] = [None] * streams
    progress: list[StreamTiming] = []

    def text_stream(i: int) -> None:
        messages = [{"role": "user", "content": f"Tell me a long story, number {i}."}]
        t = StreamTiming(start=time.perf_counter())
        progress.append(t)
        timings[i] = timed_stream(client, model, messages, max_tokens, t)

    threads = [threading.Thread(target=text_stream, args=(i,)) for i in range(streams)]
    for t in threads:
        t.start()
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline:
        if len(progress) == streams and all(len(p.token_times) >= warmup_tokens for p in progress):
            break
        time.sleep(0.01)
    log(f"  {streams} text streams running; sending a cold {image_size}px image request")
    uri = image_uri(image_size, time.time_ns())
    image = timed_stream(client, model, [image_message(uri, "What is this?")], 4)
    for t in threads:
        t.join(600)
    after = server.metrics()
    window = (image.start, image.token_times[0] if image.token_times else image.start)
    before_gaps, during_gaps = [], []
    for timing in progress:
        for a, b in zip(timing.token_times, timing.token_times[1:]):
            if b <= window[0]:
                before_gaps.append(b - a)
            elif a < window[1] and b > window[0]:
                during_gaps.append(b - a)
    tokens = _delta(before, after, "vision_gateway_generation_tokens_total")
    steps = _delta(before, after, "vision_gateway_decode_steps_total")
    return StallResult(
        prefill_chunk=prefill_chunk,
        streams=streams,
        image_size=image_size,
        baseline_gap_ms=1000 * statistics.median(before_gaps or [float("nan")]),
        admission_max_gap_ms=1000 * max(during_gaps or [float("nan")]),
        admission_median_gap_ms=1000 * statistics.median(during_gaps or [float("nan")]),
        image_ttft_ms=1000 * image.ttft_s,
        tokens_per_step=tokens / steps if steps else float("nan"),
    )


def _delta(before: dict[str, float], after: dict[str, float], name: str) -> float:
    return after.get(name, 0.0) - before.get(name, 0.0)
