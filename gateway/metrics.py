"""Prometheus metrics on private registries: the engine's (`Metrics`, kept wherever the
engine runs, possibly another process) and the HTTP edge's (`EdgeMetrics`). `/metrics` is the
edge's text followed by the engine's; no family appears in both.

Names follow vLLM's where a counterpart exists (prompt/generation tokens, time to first token,
`*_cache_queries_total` / `*_cache_hits_total`) so existing dashboards translate. Metric
objects are thread-safe (prometheus-client locks internally); the engine thread and the HTTP
thread both update them.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

from prometheus_client import (
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    disable_created_metrics,
    generate_latest,
)
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

# No `*_created` series (a creation timestamp per counter and histogram): noise for most
# scrapers, and they double the size of /metrics.
disable_created_metrics()

_LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120)
_FAST_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5)


class Metrics:
    """The engine's counters, gauges and histograms; one per engine (tests build several)."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        r = self.registry
        p = "vision_gateway_"
        self.requests = Counter(p + "requests", "Finished chat requests", ["status"], registry=r)
        self.prompt_tokens = Counter(p + "prompt_tokens", "Prompt tokens", registry=r)
        self.generation_tokens = Counter(p + "generation_tokens", "Generated tokens", registry=r)
        self.decode_steps = Counter(
            p + "decode_steps",
            "Batched decode steps (generation tokens / steps = occupancy)",
            registry=r,
        )
        self.prefill_chunks = Counter(
            p + "image_prefill_chunks", "Image prefill chunks", registry=r
        )
        self.running = Gauge(p + "running_requests", "Requests decoding in the batch", registry=r)
        self.waiting = Gauge(p + "waiting_requests", "Requests queued for a batch row", registry=r)
        # Request timings describe the users' traffic: they start over when the warm-up ends
        # (`reset_request_timings`), as the cache counters do.
        self.ttft = RestartableHistogram(
            p + "time_to_first_token_seconds", "Arrival to first token", _LATENCY_BUCKETS
        )
        self.latency = RestartableHistogram(
            p + "request_latency_seconds", "Arrival to last token", _LATENCY_BUCKETS
        )
        r.register(self.ttft)
        r.register(self.latency)
        self.step_seconds = Histogram(
            p + "engine_step_seconds",
            "One engine loop iteration",
            buckets=_FAST_BUCKETS,
            registry=r,
        )
        # Observed once per engine step that runs the tower: one block of an encode group
        # while rows decode, the whole tower for the group when none does (several images).
        self.vision_encode_seconds = Histogram(
            p + "vision_encode_step_seconds",
            "Vision tower time per engine step that runs it (a block or a whole encode group)",
            buckets=_FAST_BUCKETS,
            registry=r,
        )
        self.mlx_active_bytes = Gauge(p + "mlx_active_bytes", "MLX memory in use", registry=r)
        self.mlx_cache_bytes = Gauge(
            p + "mlx_cache_bytes", "MLX allocator cache (freed, kept for reuse)", registry=r
        )
        self.mlx_peak_bytes = Gauge(p + "mlx_peak_bytes", "MLX peak memory", registry=r)

    def reset_request_timings(self) -> None:
        """Empty the TTFT and request latency histograms: called when the start-up warm-up
        ends (the engine's cache reset), before the port opens, so no scrape ever sees the
        warm-up's requests in them and none sees a histogram go backwards."""
        self.ttft.restart()
        self.latency.restart()

    def add_collector(self, collector: object) -> None:
        """Register a custom collector (e.g. cache stats read at scrape time)."""
        self.registry.register(collector)  # type: ignore[arg-type]

    def render(self) -> bytes:
        return generate_latest(self.registry)


class RestartableHistogram:
    """A histogram that can start over empty (prometheus_client's cannot), exported as one
    family through this collector. `restart` swaps in a new histogram in one attribute store,
    so a concurrent scrape sees the old or the new one, never neither; thread-safe."""

    def __init__(self, name: str, documentation: str, buckets: tuple[float, ...]) -> None:
        self._spec = (name, documentation, buckets)
        self._histogram = self._new()

    def _new(self) -> Histogram:
        name, documentation, buckets = self._spec
        return Histogram(name, documentation, buckets=buckets, registry=None)

    def observe(self, seconds: float) -> None:
        self._histogram.observe(seconds)

    def restart(self) -> None:
        self._histogram = self._new()

    def collect(self) -> Iterator[Any]:
        return self._histogram.collect()


class EdgeMetrics:
    """What the HTTP edge measures itself: image decoding and hashing, request bodies."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        r = self.registry
        p = "vision_gateway_"
        self.image_decode_seconds = Histogram(
            p + "image_decode_seconds", "Image decode time", buckets=_FAST_BUCKETS, registry=r
        )
        self.image_hash_seconds = Histogram(
            p + "image_hash_seconds", "Pixel hash time", buckets=_FAST_BUCKETS, registry=r
        )
        self.body_bytes_reading = Gauge(
            p + "request_body_bytes_reading",
            "Bytes reserved for request bodies being read now (--max-inflight-body-mb)",
            registry=r,
        )
        self.http_responses = Counter(
            p + "http_responses",
            "HTTP responses by route (its path template; 'other': no route) and status code, "
            "refusals before the engine included (gateway.api.response_count)",
            ["route", "status"],
            registry=r,
        )
        self.body_budget_refusals = Counter(
            p + "request_body_budget_refusals",
            "Requests refused with 429 because bodies being read filled --max-inflight-body-mb",
            registry=r,
        )
        self.pool = PoolMetrics(r)

    def render(self) -> bytes:
        return generate_latest(self.registry)


class PoolMetrics:
    """The model pool's (gateway.pool), on the edge's registry: loads, their seconds and
    failures, unloads by reason, and which models are loaded, each labelled by `model`."""

    def __init__(self, registry: CollectorRegistry) -> None:
        p, r = "vision_gateway_model_", registry
        self._loads = Counter(p + "loads", "Models loaded", ["model"], registry=r)
        self._failures = Counter(
            p + "load_failures", "Model loads that failed or timed out", ["model"], registry=r
        )
        self._unloads = Counter(
            p + "unloads",
            "Models unloaded, by reason (evicted: room for another; idle: keep-alive over; "
            "admin: the unload endpoint; crashed: its engine died, loaded again)",
            ["model", "reason"],
            registry=r,
        )
        self._seconds = Histogram(
            p + "load_seconds",
            "Seconds from starting a model's engine to serving it",
            ["model"],
            buckets=(0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600),
            registry=r,
        )
        self._loaded = Gauge(p + "loaded", "1 while the model is loaded", ["model"], registry=r)

    def loaded(self, model: str, seconds: float) -> None:
        self._loads.labels(model).inc()
        self._seconds.labels(model).observe(seconds)
        self.set_loaded(model, True)

    def load_failed(self, model: str) -> None:
        self._failures.labels(model).inc()

    def unloaded(self, model: str, reason: str) -> None:
        self._unloads.labels(model, reason).inc()

    def set_loaded(self, model: str, loaded: bool) -> None:
        self._loaded.labels(model).set(1 if loaded else 0)


class CacheCollector:
    """Exports cache statistics read at scrape time, so `/metrics`, `/v1/cache/stats` and
    responses agree by construction (one source: the caches' own counters)."""

    def __init__(self, stats: Callable[[], dict[str, dict[str, Any]]]) -> None:
        self._stats = stats

    def collect(self) -> Iterator[Any]:
        stats = self._stats()
        p = "vision_gateway_"
        vision, prefix = stats["vision"], stats["prefix"]
        # vLLM's convention: vision (multimodal) cache counts items, prefix cache counts tokens.
        yield CounterMetricFamily(p + "vision_cache_queries", "Images looked up", vision["queries"])
        yield CounterMetricFamily(p + "vision_cache_hits", "Images found", vision["hits"])
        # The same lookups by medium (audio features live in the vision cache too).
        for name, doc, key in (("queries", "looked up", "queries"), ("hits", "found", "hits")):
            metric = CounterMetricFamily(
                p + f"vision_cache_media_{name}", f"Images and audio clips {doc}", labels=["media"]
            )
            for media, row in vision.get("media", {}).items():
                metric.add_metric([media], row[key])
            yield metric
        yield CounterMetricFamily(
            p + "prefix_cache_queries", "Prompt tokens looked up", prefix["tokens_queried"]
        )
        yield CounterMetricFamily(
            p + "prefix_cache_hits", "Prompt tokens found", prefix["tokens_hit"]
        )
        # The prefix cache is a block radix tree: how much of it is shared.
        for name, doc, key in (
            ("prefix_cache_blocks", "KV blocks held, each once", "blocks"),
            ("prefix_cache_shared_blocks", "KV blocks held by 2+ entries", "shared_blocks"),
            ("prefix_cache_stored_tokens", "Tokens the entries stand for", "stored_tokens"),
            ("prefix_cache_unique_tokens", "Tokens held (each block once)", "unique_tokens"),
            ("prefix_cache_sharing_ratio", "stored_tokens / unique_tokens", "sharing_ratio"),
            ("prefix_cache_bytes_per_token", "Bytes held per token held", "bytes_per_token"),
            ("kv_cache_bits", "Bits per stored KV value (--kv-bits, else the dtype's)", "kv_bits"),
            ("prefix_cache_snapshots", "Blocks holding a recurrent-state snapshot", "snapshots"),
            ("prefix_cache_snapshot_bytes", "Bytes of those snapshots", "snapshot_bytes"),
            ("prefix_cache_snapshot_hits", "Hits restored from a snapshot", "snapshot_hits"),
        ):
            if key in prefix:
                yield GaugeMetricFamily(p + name, doc, value=prefix[key])
        # grammar: once the engine has loaded the model
        yield from cache_size_families(stats, ("vision", "prefix", "grammar"))
        if stats.get("disk", {}).get("enabled"):
            yield from _disk_families(p, stats["disk"])
        if "grammar" in stats:  # structured output: compiled grammars, counted per request
            grammar = stats["grammar"]
            yield CounterMetricFamily(
                p + "grammar_cache_queries", "Grammars looked up", grammar["queries"]
            )
            yield CounterMetricFamily(p + "grammar_cache_hits", "Grammars found", grammar["hits"])


def _disk_families(p: str, disk: dict[str, Any]) -> Iterator[Any]:
    """The disk tier (docs/caching.md): hits reported apart from the memory caches' (a disk
    hit is a memory miss that the disk served). Vision counts images, prefix counts tokens
    (as the memory caches do); file counters are per file (a KV block is one file)."""
    vision, prefix = disk["vision"], disk["prefix"]
    yield CounterMetricFamily(
        p + "disk_cache_vision_hits",
        "Images whose features were read from disk",
        vision["images_hit"],
    )
    yield CounterMetricFamily(
        p + "disk_cache_prefix_hits",
        "Prompt tokens whose KV was read from disk",
        prefix["tokens_hit"],
    )
    for name, doc, key in (
        ("disk_cache_file_reads", "Files looked up (hits and misses)", None),
        ("disk_cache_file_writes", "Files written", "writes"),
        ("disk_cache_write_errors", "Files that failed to write", "write_errors"),
        ("disk_cache_corrupt_files", "Damaged or foreign files removed", "corrupt"),
    ):
        metric = CounterMetricFamily(p + name, doc, labels=["cache"])
        for cache, counts in (("vision", vision), ("prefix", prefix)):
            value = counts["hits"] + counts["misses"] if key is None else counts[key]
            metric.add_metric([cache], value)
        yield metric
    for name, doc, key in (
        ("disk_cache_load_seconds", "Engine thread's time on disk hits (into MLX)", "load_seconds"),
        ("disk_cache_read_seconds", "Reader thread's time reading, checking files", "read_seconds"),
    ):
        seconds = CounterMetricFamily(p + name, doc, labels=["cache"])
        for cache, counts in (("vision", vision), ("prefix", prefix)):
            seconds.add_metric([cache], counts[key])
        yield seconds
    yield GaugeMetricFamily(
        p + "disk_cache_read_held_bytes",
        "Bytes read ahead for waiting requests, not yet used",
        disk["read_held_bytes"],
    )
    yield CounterMetricFamily(
        p + "disk_cache_evictions", "Files this process removed for the budget", disk["evictions"]
    )
    yield CounterMetricFamily(
        p + "disk_cache_dropped_writes",
        "Entries not written: the write queue was full",
        disk["dropped_writes"],
    )
    yield GaugeMetricFamily(p + "disk_cache_bytes", "Bytes of the cache folder", disk["bytes"])
    yield GaugeMetricFamily(p + "disk_cache_files", "Files in the cache folder", disk["entries"])
    yield GaugeMetricFamily(
        p + "disk_cache_capacity_bytes", "Disk budget (--disk-cache-gb)", disk["capacity_bytes"]
    )


def cache_size_families(
    stats: dict[str, dict[str, Any]], caches: tuple[str, ...]
) -> Iterator[Any]:
    """Evictions, bytes, entries and budget of each cache in `caches` that `stats` holds,
    one family each labelled by `cache` (every engine kind names its caches' sizes so)."""
    for name, doc, key, family in (
        ("cache_evictions", "Entries evicted", "evictions", CounterMetricFamily),
        ("cache_bytes", "Bytes held (used array sizes)", "bytes", GaugeMetricFamily),
        ("cache_entries", "Entries held", "entries", GaugeMetricFamily),
        ("cache_capacity_bytes", "Byte budget", "capacity_bytes", GaugeMetricFamily),
    ):
        metric = family("vision_gateway_" + name, doc, labels=["cache"])
        for cache in caches:
            if cache in stats:
                metric.add_metric([cache], stats[cache][key])
        yield metric
