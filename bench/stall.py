"""`bench stall`: do running text streams stall while image requests are admitted?

K text streams decode; once each has produced a few tokens, N image requests (cold: their
vision encode and prefill must run) are sent together, each on its own thread (N=1 is the
classic case; N=2 is issue 30's: two images sent at once into four running streams). We record
every token's arrival on the text streams and report, over the admission window (from the
images' send until the last image's first token):

- the largest inter-token gap of the running streams and the gap ratio: that gap over the
  decode step before the images were sent (per stream its mean gap before the window, the
  median over streams: a client that reads two tokens in one chunk under load sees one long
  and one zero gap, which would drag a median of gaps towards zero but leaves the mean);
- the tokens each stream got inside the window (a frozen stream gets none);
- each image's time to first token, sorted (head-of-line blocking shows as equal TTFTs).

Times are client-side `time.perf_counter()` seconds (reported in ms); the streams use the
real `openai` client with `logprobs`, so every token arrives as its own chunk.
"""

from __future__ import annotations

import statistics
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from bench.report import fmt
from bench.timing import StreamTiming, image_message, timed_stream
from bench.workload import image_uri
from gateway.heap import freeze_startup_objects


@dataclass(frozen=True)
class StallResult:
    prefill_chunk: int | None  # None: as the --base-url server runs
    streams: int
    image_size: int
    images: int  # image requests sent together
    baseline_gap_ms: float  # the decode step before the images (module doc)
    admission_max_gap_ms: float  # max gap on any text stream during admission
    admission_median_gap_ms: float
    gap_ratio: float  # admission_max_gap_ms / baseline_gap_ms
    image_ttft_ms: tuple[float, ...]  # each image request's TTFT, ascending
    window_ms: float  # from the send until the last image's first token
    window_tokens: tuple[int, ...]  # tokens each text stream received inside the window
    tokens_per_step: float  # generation tokens / decode steps over the whole run

    def row(self) -> str:
        ttfts = " / ".join(f"{t:.0f}" for t in self.image_ttft_ms)
        tokens = " / ".join(str(n) for n in self.window_tokens)
        return (
            f"| {self.prefill_chunk or 'as served'} | {self.streams} | "
            f"{self.images} x {self.image_size} px | "
            f"{self.baseline_gap_ms:.1f} | {self.admission_median_gap_ms:.1f} | "
            f"{self.admission_max_gap_ms:.1f} | {fmt(self.gap_ratio, 1)} | {ttfts} | "
            f"{tokens} in {self.window_ms / 1000:.1f} s | {fmt(self.tokens_per_step, 2)} |"
        )


HEADER = (
    "| prefill chunk | text streams | images sent together | decode step before (ms) | "
    "median gap during admission (ms) | max gap during admission (ms) | gap ratio | "
    "image TTFT (ms) | tokens per stream in the window | tokens/step |\n"
    "|---|---|---|---|---|---|---|---|---|---|"
)


def window_gaps(
    streams: Sequence[Sequence[float]], window: tuple[float, float]
) -> tuple[list[float], list[float], list[int]]:
    """Per stream, its mean inter-token gap before `window` (start, end) (streams with fewer
    than two tokens before it are left out); every gap overlapping the window; each stream's
    tokens inside it. Seconds in, seconds out."""
    steps: list[float] = []
    during: list[float] = []
    counts: list[int] = []
    for times in streams:
        early = [t for t in times if t <= window[0]]
        if len(early) > 1:
            steps.append((early[-1] - early[0]) / (len(early) - 1))
        for a, b in zip(times, times[1:]):
            if a < window[1] and b > window[0]:
                during.append(b - a)
        counts.append(sum(1 for t in times if window[0] < t <= window[1]))
    return steps, during, counts


def run_stall(
    server: Any,
    model: str,
    prefill_chunk: int | None,
    streams: int = 4,
    image_size: int = 448,
    max_tokens: int = 160,
    warmup_tokens: int = 8,
    log: Any = print,
    images: int = 1,
) -> StallResult:
    """One measurement (see the module doc); `server` is a `LocalServer` or `RemoteTarget`."""
    client = server.client()
    # Warm-up at the measured image size, so one-time kernel compilation is not counted.
    warm = image_uri(image_size, 424242)
    timed_stream(client, model, [image_message(warm, "warm-up")], 2)
    # The client's own full garbage-collector passes (~50 ms here over the openai SDK's
    # objects) would stop every reader thread at once and count as a gap of all streams.
    freeze_startup_objects("stall client")
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
    log(f"  {streams} text streams running; sending {images} cold {image_size}px image(s)")
    shots = _send_images(client, model, image_size, images)
    for t in threads:
        t.join(600)
    after = server.metrics()
    sent = min(s.start for s in shots)
    last_first = max((s.token_times[0] for s in shots if s.token_times), default=sent)
    if any(p.token_times and p.token_times[-1] < last_first for p in progress):
        log("  warning: a text stream ended inside the admission window (raise --max-tokens)")
    steps_before, during_gaps, counts = window_gaps(
        [p.token_times for p in progress], (sent, last_first)
    )
    baseline = statistics.median(steps_before or [float("nan")])
    worst = max(during_gaps or [float("nan")])
    tokens = _delta(before, after, "vision_gateway_generation_tokens_total")
    steps = _delta(before, after, "vision_gateway_decode_steps_total")
    return StallResult(
        prefill_chunk=prefill_chunk,
        streams=streams,
        image_size=image_size,
        images=images,
        baseline_gap_ms=1000 * baseline,
        admission_max_gap_ms=1000 * worst,
        admission_median_gap_ms=1000 * statistics.median(during_gaps or [float("nan")]),
        gap_ratio=worst / baseline if baseline > 0 else float("nan"),
        image_ttft_ms=tuple(sorted(1000 * s.ttft_s for s in shots)),
        window_ms=1000 * (last_first - sent),
        window_tokens=tuple(counts),
        tokens_per_step=tokens / steps if steps else float("nan"),
    )


def _send_images(client: Any, model: str, size: int, count: int) -> list[StreamTiming]:
    """`count` cold image requests released together (one thread each, from one barrier);
    their timings."""
    shots = [StreamTiming(start=0.0) for _ in range(count)]
    uris = [image_uri(size, time.time_ns() + k) for k in range(count)]
    barrier = threading.Barrier(count)

    def send(k: int) -> None:
        message = image_message(uris[k], f"What is this? ({k})")
        barrier.wait()
        shots[k].start = time.perf_counter()
        timed_stream(client, model, [message], 4, shots[k])

    threads = [threading.Thread(target=send, args=(k,)) for k in range(count)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(600)
    return shots


def _delta(before: dict[str, float], after: dict[str, float], name: str) -> float:
    return after.get(name, 0.0) - before.get(name, 0.0)
