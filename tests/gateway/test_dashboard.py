"""Invariants of gateway.dashboard: the engine's Prometheus text is read back exactly; TTFT
percentiles follow Prometheus' histogram_quantile; rates cover only the stated windows and say
"no data" (None) rather than inventing a rate across gaps; history is bounded and restarts
when counters go backwards."""

from __future__ import annotations

import math

import pytest

from gateway.dashboard import LiveStats, Sample, histogram_quantile, parse_engine_metrics
from gateway.metrics import Metrics

INF = math.inf


def _caches(vh: int = 0, vq: int = 0, ph: int = 0, pq: int = 0, th: int = 0, tq: int = 0) -> dict:
    return {
        "vision": {"hits": vh, "queries": vq},
        "prefix": {"hits": ph, "queries": pq, "tokens_hit": th, "tokens_queried": tq},
    }


def _sample(t: float, generated: float = 0.0, buckets=((1.0, 0.0), (INF, 0.0)), **c: int):
    return Sample(t, _caches(**c), running=1, waiting=2, generated=generated, ttft_buckets=buckets)


def test_parse_engine_metrics_reads_the_engines_own_registry() -> None:
    """Invariant: generation tokens and the TTFT histogram's cumulative buckets come back
    exactly as the engine's Metrics recorded them (ascending bounds, +inf last)."""
    metrics = Metrics()
    metrics.generation_tokens.inc(42)
    for seconds in (0.003, 0.02, 0.02, 7.0):
        metrics.ttft.observe(seconds)
    generated, buckets = parse_engine_metrics(metrics.render())
    assert generated == 42
    counts = dict(buckets)
    assert (counts[0.005], counts[0.025], counts[5.0], counts[10.0], counts[INF]) == (1, 3, 3, 4, 4)
    assert [b for b, _ in buckets] == sorted(b for b, _ in buckets) and buckets[-1][0] == INF


def test_request_timings_start_over_and_the_counters_do_not() -> None:
    """Invariant: `reset_request_timings` (the end of the warm-up) empties the TTFT and
    latency histograms, keeps their families in the text, and leaves the counters alone;
    later observations count from zero."""
    metrics = Metrics()
    metrics.generation_tokens.inc(5)
    metrics.ttft.observe(0.02)
    metrics.latency.observe(0.3)
    metrics.reset_request_timings()
    text = metrics.render().decode()
    assert "vision_gateway_time_to_first_token_seconds_count 0.0" in text
    assert "vision_gateway_request_latency_seconds_count 0.0" in text
    generated, buckets = parse_engine_metrics(text)
    assert generated == 5 and buckets[-1] == (INF, 0)
    metrics.ttft.observe(7.0)
    assert dict(parse_engine_metrics(metrics.render())[1])[5.0] == 0


@pytest.mark.parametrize(
    "q, buckets, expected",
    [
        (0.5, [(0.1, 0), (0.2, 10), (INF, 10)], 0.15),  # linear inside the bucket
        (0.5, [(0.1, 10), (INF, 10)], 0.05),  # first bucket starts at 0
        (0.99, [(0.1, 5), (INF, 10)], 0.1),  # rank in +inf: highest finite bound
        (0.5, [(0.1, 0), (INF, 0)], None),  # no observations
        (0.5, [], None),
    ],
)
def test_histogram_quantile_matches_prometheus(q: float, buckets, expected) -> None:  # noqa: ANN001
    """Invariant: quantiles are Prometheus' histogram_quantile estimates."""
    value = histogram_quantile(q, buckets)
    assert value == (None if expected is None else pytest.approx(expected))


def test_rates_cover_their_windows_and_gaps_are_no_data() -> None:
    """Invariant: a hit rate at a sample is hits/queries since the earliest sample within the
    window before it; tokens/s likewise per second; no earlier sample in the window (first
    sample, or after a gap) or no queries gives None."""
    live = LiveStats(rate_window_s=30, speed_window_s=5)
    live.add(_sample(0, generated=0, vh=0, vq=0))
    live.add(_sample(1, generated=10, vh=1, vq=2))
    live.add(_sample(2, generated=30, vh=1, vq=2))
    live.add(_sample(100, generated=40, vh=5, vq=10))  # after a gap nobody watched
    series = live.report()["series"]
    assert series["t"] == [-100, -99, -98, 0]
    assert series["vision_hit_rate"] == [None, 0.5, 0.5, None]
    assert series["tokens_per_s"] == [None, 10.0, 15.0, None]
    assert series["prefix_hit_rate"] == [None, None, None, None]  # no prefix lookups at all


def test_report_carries_latest_counts_and_ttft_over_its_window() -> None:
    """Invariant: running/waiting/caches are the latest sample's; TTFT percentiles count only
    requests within `ttft_window_s` of history, or all since start with a single sample."""
    live = LiveStats(ttft_window_s=60)
    live.add(_sample(0, buckets=((0.1, 4), (1.0, 4), (INF, 4))))
    only = live.report()["ttft"]
    assert only["window_s"] is None and only["count"] == 4 and only["p50_ms"] == 50.0
    live.add(_sample(30, buckets=((0.1, 4), (1.0, 6), (INF, 6))))
    report = live.report()
    assert report["ttft"]["count"] == 2 and report["ttft"]["window_s"] == 30
    assert report["ttft"]["p50_ms"] == pytest.approx(550.0)  # both new ones in (0.1, 1]
    assert (report["running"], report["waiting"]) == (1, 2)
    assert report["caches"] == _caches()


def test_history_is_bounded_due_is_rate_limited_and_resets_restart_it() -> None:
    """Invariant: samples older than history_s are dropped; due() is False within
    min_interval_s of the last sample; counters (the TTFT count included) going backwards
    start a new history."""
    now = [0.0]
    live = LiveStats(history_s=10, min_interval_s=1, clock=lambda: now[0])
    assert live.due()
    for t in range(15):
        live.add(_sample(float(t), generated=t))
    assert live.report()["samples"] == 11 and live.report()["history_s"] == 10
    now[0] = 14.5
    assert not live.due()
    now[0] = 15.0
    assert live.due()
    live.add(_sample(15.0, generated=0))  # the engine's counters restarted
    assert live.report()["samples"] == 1
    live.add(_sample(16.0, generated=1, buckets=((1.0, 3.0), (INF, 3.0))))
    live.add(_sample(17.0, generated=2, buckets=((1.0, 0.0), (INF, 0.0))))  # TTFT started over
    assert live.report()["samples"] == 1 and live.report()["ttft"]["count"] == 0
