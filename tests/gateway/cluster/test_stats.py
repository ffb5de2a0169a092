"""Cluster-wide cache stats, metrics and entries merged from per-replica reports."""

from __future__ import annotations

from prometheus_client.parser import text_string_to_metric_families

from gateway.cluster.stats import merge_cache_stats, merge_entries, merge_metrics
from gateway.dashboard import parse_engine_metrics
from gateway.metrics import Metrics


def _stats(hits, misses, tokens_hit, tokens_queried, stored=10, unique=5):
    return {
        "vision": {
            "hits": hits,
            "misses": misses,
            "queries": hits + misses,
            "hit_rate": 0.123,
            "enabled": True,
            "bytes": 100,
        },
        "prefix": {
            "hits": hits,
            "misses": misses,
            "queries": hits + misses,
            "hit_rate": 0.5,
            "tokens_hit": tokens_hit,
            "tokens_queried": tokens_queried,
            "token_hit_rate": 0.9,
            "block_tokens": 32,
            "stored_tokens": stored,
            "unique_tokens": unique,
            "sharing_ratio": 2.0,
            "enabled": False,
        },
    }


def test_counters_sum_and_rates_are_recomputed():
    """Counters add up over replicas; hit rates come from the sums (not averaged); a setting
    (block_tokens) stays as is; a replica that did not answer (None) is left out."""
    merged = merge_cache_stats([_stats(3, 1, 64, 100), _stats(0, 4, 0, 300), None])
    assert merged["vision"]["hits"] == 3 and merged["vision"]["misses"] == 5
    assert merged["vision"]["hit_rate"] == 3 / 8
    assert merged["vision"]["bytes"] == 200 and merged["vision"]["enabled"] is True
    assert merged["prefix"]["token_hit_rate"] == 64 / 400
    assert merged["prefix"]["block_tokens"] == 32
    assert merged["prefix"]["sharing_ratio"] == 20 / 10
    assert merged["prefix"]["enabled"] is False


def _disk(path, folder_bytes, entries, hits, writes):
    return {"disk": {"enabled": True, "path": path, "capacity_bytes": 1000,
                     "bytes": folder_bytes, "entries": entries, "writes": writes,
                     "vision": {"hits": hits, "load_seconds": 0.5}}}  # fmt: skip


def test_a_shared_disk_folder_is_counted_once():
    """Replicas on one host share one disk folder: its bytes, entries and capacity count once
    (the largest report of that folder), another folder adds its own; per-replica counters
    (writes, nested per-kind hits and load times) are summed."""
    merged = merge_cache_stats([
        _disk("/c/ns", 300, 3, hits=2, writes=4),
        _disk("/c/ns", 310, 4, hits=1, writes=1),  # scanned a moment later
        _disk("/other/ns", 50, 1, hits=0, writes=1),
    ])["disk"]  # fmt: skip
    assert (merged["bytes"], merged["entries"], merged["capacity_bytes"]) == (360, 5, 2000)
    assert merged["writes"] == 6 and merged["vision"] == {"hits": 3, "load_seconds": 1.5}
    assert merged["paths"] == ["/c/ns", "/other/ns"] and merged["enabled"] is True


def _replica_metrics(requests: int, ttft: float) -> bytes:
    m = Metrics()
    for _ in range(requests):
        m.requests.labels(status="ok").inc()
        m.generation_tokens.inc(5)
        m.ttft.observe(ttft)
    return m.render()


def test_metrics_totals_and_per_replica_series():
    """The merged exposition parses; each sample's total (no replica label) is the sum of
    its per-replica series, and the dashboard's parser reads the totals only."""
    text = merge_metrics([(0, _replica_metrics(2, 0.01)), (1, _replica_metrics(3, 5.0))])
    samples = {}
    families = list(text_string_to_metric_families(text.decode()))
    assert all(f.type != "unknown" for f in families)  # every sample under its header
    assert len({f.name for f in families}) == len(families)
    for family in families:
        for s in family.samples:
            samples[(s.name, tuple(sorted(s.labels.items())))] = s.value
    ok = (("status", "ok"),)
    assert samples[("vision_gateway_requests_total", ok)] == 5
    assert samples[("vision_gateway_requests_total", (("replica", "0"), ("status", "ok")))] == 2
    assert samples[("vision_gateway_requests_total", (("replica", "1"), ("status", "ok")))] == 3
    generated, buckets = parse_engine_metrics(text)
    assert generated == 25
    assert buckets[-1][1] == 5  # the +Inf bucket: all five requests, counted once
    assert not any(name.endswith("_created") and not labels for name, labels in samples)


def test_merged_metrics_of_one_replica_match_its_own():
    """With one replica the totals equal that replica's own samples (nothing lost)."""
    own = _replica_metrics(4, 0.2)
    merged = merge_metrics([(0, own)])
    mine = {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for f in text_string_to_metric_families(own.decode())
        for s in f.samples
        if not s.name.endswith("_created")
    }
    theirs = {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for f in text_string_to_metric_families(merged.decode())
        for s in f.samples
        if "replica" not in s.labels
    }
    assert mine == theirs


def _entry(nbytes, hits, age):
    return {
        "kind": "vision",
        "hash": "ab",
        "hashes": ["ab"],
        "images": 1,
        "tokens": 4,
        "bytes": nbytes,
        "hits": hits,
        "age_s": age,
    }


def test_entries_merge_sorted_and_tagged():
    """The merged report holds the overall largest and most-hit entries, each with its
    replica, and counts and bytes summed."""
    a = {
        "counts": {"vision": 2, "prefix": 0},
        "bytes": {"vision": 30, "prefix": 0},
        "largest": [_entry(20, 1, 1.0), _entry(10, 9, 2.0)],
        "most_hit": [_entry(10, 9, 2.0), _entry(20, 1, 1.0)],
    }
    b = {
        "counts": {"vision": 1, "prefix": 3},
        "bytes": {"vision": 25, "prefix": 7},
        "largest": [_entry(25, 3, 0.5)],
        "most_hit": [_entry(25, 3, 0.5)],
    }
    merged = merge_entries([(0, a), (1, b)], limit=2)
    assert merged["counts"] == {"vision": 3, "prefix": 3}
    assert merged["bytes"] == {"vision": 55, "prefix": 7}
    assert [(e["bytes"], e["replica"]) for e in merged["largest"]] == [(25, 1), (20, 0)]
    assert [(e["hits"], e["replica"]) for e in merged["most_hit"]] == [(9, 0), (3, 1)]


def test_kv_format_stays_a_setting_and_bytes_per_token_is_recomputed():
    """--kv-bits: each replica's KV bits and group size are settings (not summed), and the
    bytes per cached token come from the summed bytes and tokens."""
    replicas = [
        {"prefix": {"bytes": b, "unique_tokens": t, "bytes_per_token": b / t, "kv_bits": 8,
                    "kv_group_size": 64, "kv_quantized": True, "kv_dtype": "bfloat16"}}
        for b, t in ((100, 10), (300, 20))
    ]  # fmt: skip
    merged = merge_cache_stats(replicas)["prefix"]
    assert (merged["kv_bits"], merged["kv_group_size"], merged["kv_quantized"]) == (8, 64, True)
    assert merged["bytes_per_token"] == 400 / 30
