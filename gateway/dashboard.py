"""The live dashboard's numbers: a short history of engine and cache counters, and what it says
about the last seconds and minutes (hit rates, tokens per second, TTFT percentiles).

The counters live in the engine (possibly another process); `GET /v1/dashboard` takes a
`Sample` of them (cache stats, running/waiting, the engine's Prometheus text) at most once a
`min_interval_s`, so history exists while someone watches and costs nothing otherwise. A gap
in the history (nobody watching) shows as no data, never as a made-up rate.

Pure arithmetic over samples, no I/O. Not thread-safe: the caller (one event loop) serialises.
"""

from __future__ import annotations

import math
import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from prometheus_client.parser import text_string_to_metric_families

TTFT_FAMILY = "vision_gateway_time_to_first_token_seconds"
GENERATED_FAMILY = "vision_gateway_generation_tokens"
QUANTILES = (0.5, 0.9, 0.99)


@dataclass(frozen=True)
class Sample:
    """Engine and cache counters at monotonic time `t` (seconds).

    caches: `Engine.cache_stats()` (cumulative hits/misses/tokens, current bytes/entries).
    generated: generation tokens since start. ttft_buckets: the TTFT histogram's cumulative
    (upper bound in seconds, count) pairs, bounds ascending, +inf last.
    """

    t: float
    caches: dict[str, dict[str, Any]]
    running: int
    waiting: int
    generated: float
    ttft_buckets: tuple[tuple[float, float], ...]

    def counter(self, cache: str, name: str) -> float:
        return float(self.caches[cache][name])


def parse_engine_metrics(text: bytes | str) -> tuple[float, tuple[tuple[float, float], ...]]:
    """(generation tokens total, TTFT histogram buckets) from the engine's Prometheus text."""
    if isinstance(text, bytes):
        text = text.decode("utf-8")
    generated = 0.0
    buckets: list[tuple[float, float]] = []
    for family in text_string_to_metric_families(text):
        # A cluster's text also repeats every sample per replica (`replica` label): the
        # samples without it are the totals.
        samples = [s for s in family.samples if "replica" not in s.labels]
        if family.name == GENERATED_FAMILY:
            generated = sum(s.value for s in samples if s.name.endswith("_total"))
        elif family.name == TTFT_FAMILY:
            buckets = [
                (float(s.labels["le"]), s.value) for s in samples if s.name.endswith("_bucket")
            ]
    return generated, tuple(sorted(buckets))


def histogram_quantile(q: float, buckets: Sequence[tuple[float, float]]) -> float | None:
    """Prometheus' estimate of quantile `q` from cumulative buckets: linear within the bucket
    that holds the rank; the highest finite bound if the rank falls in +inf. None if empty."""
    if not buckets or buckets[-1][1] <= 0:
        return None
    rank = q * buckets[-1][1]
    lower, below = 0.0, 0.0
    for bound, count in buckets:
        if count >= rank:
            if math.isinf(bound):
                return lower
            if count == below:
                return bound
            return lower + (bound - lower) * (rank - below) / (count - below)
        lower, below = bound, count
    return lower


class LiveStats:
    """A bounded history of samples (`history_s`) and the dashboard's report over it."""

    def __init__(
        self,
        history_s: float = 600.0,
        min_interval_s: float = 0.9,
        rate_window_s: float = 30.0,
        speed_window_s: float = 5.0,
        ttft_window_s: float = 300.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.history_s = history_s
        self.min_interval_s = min_interval_s
        self.rate_window_s = rate_window_s
        self.speed_window_s = speed_window_s
        self.ttft_window_s = ttft_window_s
        self.clock = clock
        self._samples: deque[Sample] = deque()

    def due(self) -> bool:
        """Is it time for a new sample?"""
        return not self._samples or self.clock() - self._samples[-1].t >= self.min_interval_s

    def add(self, sample: Sample) -> None:
        """Append a sample; drop those older than `history_s`. Counters that went backwards
        (the caches were replaced or the TTFT histogram started over, e.g. after warm-up)
        start a new history."""
        if self._samples and _went_backwards(self._samples[-1], sample):
            self._samples.clear()
        self._samples.append(sample)
        while self._samples and sample.t - self._samples[0].t > self.history_s:
            self._samples.popleft()

    def report(self) -> dict[str, Any]:
        """JSON-able: the latest counters plus rates over the history (None: no data)."""
        samples = list(self._samples)
        if not samples:
            return {"samples": 0}
        last = samples[-1]
        series = self._series(samples)
        return {
            "samples": len(samples),
            "history_s": round(last.t - samples[0].t, 3),
            "running": last.running,
            "waiting": last.waiting,
            "caches": last.caches,
            "tokens_per_s": series["tokens_per_s"][-1],
            "ttft": self._ttft(samples),
            "series": series,
        }

    def _series(self, samples: list[Sample]) -> dict[str, list[float | None]]:
        """Per sample: hit rates over the preceding `rate_window_s`, tokens/s over the
        preceding `speed_window_s`; `t` in seconds relative to the latest sample (<= 0)."""
        now = samples[-1].t
        hits = _starts(samples, self.rate_window_s)
        speed = _starts(samples, self.speed_window_s)
        out: dict[str, list[float | None]] = {"t": [round(s.t - now, 3) for s in samples]}
        for cache in ("vision", "prefix"):
            out[f"{cache}_hit_rate"] = [
                _ratio(samples, j, i, _get(cache, "hits"), _get(cache, "queries"))
                for i, j in enumerate(hits)
            ]
        out["prefix_token_hit_rate"] = [
            _ratio(samples, j, i, _get("prefix", "tokens_hit"), _get("prefix", "tokens_queried"))
            for i, j in enumerate(hits)
        ]
        out["tokens_per_s"] = [
            _ratio(samples, j, i, _generated, _time) for i, j in enumerate(speed)
        ]
        return out

    def _ttft(self, samples: list[Sample]) -> dict[str, Any]:
        """TTFT percentiles (ms) of the requests that got their first token within the last
        `ttft_window_s` of history; with a single sample, of all requests since start
        (`window_s` None)."""
        last = samples[-1]
        base = next((s for s in samples if last.t - s.t <= self.ttft_window_s), last)
        window: float | None = last.t - base.t
        if base is last:
            base_counts: dict[float, float] = {}
            window = None
        else:
            base_counts = dict(base.ttft_buckets)
        delta = [(b, c - base_counts.get(b, 0.0)) for b, c in last.ttft_buckets]
        out: dict[str, Any] = {
            "window_s": None if window is None else round(window, 3),
            "count": int(delta[-1][1]) if delta else 0,
        }
        for q in QUANTILES:
            value = histogram_quantile(q, delta)
            out[f"p{round(q * 100)}_ms"] = None if value is None else round(value * 1000, 1)
        return out


def _ttft_count(s: Sample) -> float:
    return s.ttft_buckets[-1][1] if s.ttft_buckets else 0.0


def _get(cache: str, name: str) -> Callable[[Sample], float]:
    return lambda s: s.counter(cache, name)


def _generated(s: Sample) -> float:
    return s.generated


def _time(s: Sample) -> float:
    return s.t


def _starts(samples: Sequence[Sample], window_s: float) -> list[int | None]:
    """Per sample i: the index of the earliest sample j < i no more than `window_s` before it,
    or None. One pass (samples are in time order)."""
    out: list[int | None] = []
    j = 0
    for i, sample in enumerate(samples):
        while j < i and sample.t - samples[j].t > window_s:
            j += 1
        out.append(j if j < i else None)
    return out


def _ratio(
    samples: Sequence[Sample],
    j: int | None,
    i: int,
    numerator: Callable[[Sample], float],
    denominator: Callable[[Sample], float],
) -> float | None:
    """Change of `numerator` per change of `denominator` from sample j to sample i; None
    without a start sample or without any change in the denominator."""
    if j is None:
        return None
    below = denominator(samples[i]) - denominator(samples[j])
    if below <= 0:
        return None
    return round((numerator(samples[i]) - numerator(samples[j])) / below, 4)


def _went_backwards(before: Sample, after: Sample) -> bool:
    if after.generated < before.generated or _ttft_count(after) < _ttft_count(before):
        return True
    return any(
        after.counter(c, k) < before.counter(c, k)
        for c in ("vision", "prefix")
        for k in ("hits", "queries")
    )
