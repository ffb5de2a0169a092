"""An embedding engine's Prometheus metrics: inputs, tokens, forwards, vision-tower passes,
the batch latency, and its two caches read at scrape time (one source with
`/v1/cache/stats`: the caches' own counters)."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily

from gateway.metrics import cache_size_families

_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10)
P = "vision_gateway_"


class EmbedMetrics:
    """One embedding engine's registry. Thread-safe (prometheus-client locks)."""

    def __init__(self, stats: Callable[[], dict[str, dict[str, Any]]]) -> None:
        self.registry = CollectorRegistry()
        r = self.registry
        self.inputs = Counter(
            P + "embedding_inputs", "Inputs embedded (cache hits too)", registry=r
        )
        self.tokens = Counter(P + "embedding_tokens", "Tokens of the inputs embedded", registry=r)
        self.forwards = Counter(
            P + "embedding_forwards",
            "Batched model forwards (inputs computed / forwards)",
            registry=r,
        )
        self.rows = Counter(P + "embedding_rows", "Inputs computed by a forward", registry=r)
        self.tower_passes = Counter(
            P + "embedding_tower_passes", "Images run through the vision tower", registry=r
        )
        self.batch_seconds = Histogram(
            P + "embedding_batch_seconds",
            "One engine batch: cache lookups, tower passes, forwards",
            buckets=_BUCKETS,
            registry=r,
        )
        r.register(_CacheCollector(stats))  # type: ignore[arg-type]

    def render(self) -> bytes:
        return generate_latest(self.registry)


class _CacheCollector:
    """The embedding and vision caches' counters, as the chat engine names its caches'."""

    def __init__(self, stats: Callable[[], dict[str, dict[str, Any]]]) -> None:
        self._stats = stats

    def collect(self) -> Iterator[Any]:
        stats = self._stats()
        embedding, vision = stats["embedding"], stats["vision"]
        yield CounterMetricFamily(
            P + "embedding_cache_queries", "Inputs looked up", embedding["queries"]
        )
        yield CounterMetricFamily(P + "embedding_cache_hits", "Inputs found", embedding["hits"])
        yield CounterMetricFamily(P + "vision_cache_queries", "Images looked up", vision["queries"])
        yield CounterMetricFamily(P + "vision_cache_hits", "Images found", vision["hits"])
        yield from cache_size_families(stats, ("embedding", "vision"))
