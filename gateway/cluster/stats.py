"""Cluster-wide views over per-replica reports: cache stats, Prometheus text, cache entries.

Each replica answers for its own engine; the ingress merges the answers so that
`/v1/cache/stats`, `/metrics` and `/v1/cache/entries` read like one server's (the totals,
under the same keys and names) and also say what each replica holds:

- cache stats: every counter summed, rates recomputed from the sums, plus a `replicas` list
  (each replica's own stats, or its error) and the router's counters under `router`;
- metrics: every sample summed over replicas under its own name and labels, then each
  replica's samples again with a `replica="N"` label (so PromQL `{replica=""}` selects the
  totals and `{replica!=""}` one replica's series);
- entries: the replicas' largest and most-hit entries merged, each tagged with its replica.

Pure functions over JSON-able dicts and text; no Ray, no MLX.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from gateway.metrics_merge import merge_metrics as merge_metrics

# Derived values: recomputed from the summed counters, never summed themselves.
_RATIOS = {
    "hit_rate": ("hits", "queries"),
    "token_hit_rate": ("tokens_hit", "tokens_queried"),
    "sharing_ratio": ("stored_tokens", "unique_tokens"),
    "bytes_per_token": ("bytes", "unique_tokens"),
}
_SAME_EVERYWHERE = {"block_tokens", "kv_bits", "kv_group_size"}  # settings, alike everywhere
_PER_FOLDER = ("capacity_bytes", "bytes", "entries")  # the disk tier's folder-wide values


def merge_cache_stats(per_replica: Sequence[dict[str, Any] | None]) -> dict[str, Any]:
    """The sum of the replicas' `cache_stats()` (None: that replica did not answer)."""
    answered = [r for r in per_replica if r is not None]
    total: dict[str, Any] = {}
    for stats in answered:
        for cache, counters in stats.items():
            if isinstance(counters, dict):
                _add_counters(total.setdefault(cache, {}), counters)
    if isinstance(total.get("disk"), dict):
        _merge_disk_folders(answered, total["disk"])
    for counters in total.values():
        for name, (num, den) in _RATIOS.items():
            if name in counters:
                counters[name] = counters[num] / counters[den] if counters.get(den) else 0.0
    return total


def _merge_disk_folders(answered: Sequence[dict[str, Any]], disk: dict[str, Any]) -> None:
    """A disk folder's size and entries are the folder's, not a replica's: replicas on one
    host share one (`--cache-dir`), so summing would count it once per replica. Those values
    are summed over distinct folders instead (each folder's largest report: replicas scan it
    at different times); every other disk counter (hits, loads, writes) is per replica."""
    folders: dict[str, dict[str, Any]] = {}
    for stats in answered:
        report = stats.get("disk")
        if not isinstance(report, dict) or "path" not in report:
            continue
        seen = folders.setdefault(str(report["path"]), {})
        for key in _PER_FOLDER:
            if isinstance(report.get(key), (int, float)):
                seen[key] = max(seen.get(key, 0), report[key])
    for key in _PER_FOLDER:
        if any(key in seen for seen in folders.values()):
            disk[key] = sum(seen.get(key, 0) for seen in folders.values())
    if folders:
        disk["paths"] = sorted(folders)


def _add_counters(into: dict[str, Any], counters: dict[str, Any]) -> None:
    for key, value in counters.items():
        if isinstance(value, dict):  # e.g. the disk tier's per-kind counters
            _add_counters(into.setdefault(key, {}), value)
        elif isinstance(value, bool):
            into[key] = into.get(key, False) or value
        elif key in _SAME_EVERYWHERE:
            into[key] = max(into.get(key, value), value)
        elif isinstance(value, (int, float)):
            into[key] = into.get(key, 0) + value


def merge_entries(per_replica: Sequence[tuple[int, dict[str, Any]]], limit: int) -> dict[str, Any]:
    """`caches.entries.entries_report` over all replicas: counts and bytes summed, the
    `limit` largest and most-hit entries of all, each with its `replica`."""
    counts: dict[str, int] = {}
    nbytes: dict[str, int] = {}
    largest: list[dict[str, Any]] = []
    most_hit: list[dict[str, Any]] = []
    for slot, report in per_replica:
        for kind, n in report["counts"].items():
            counts[kind] = counts.get(kind, 0) + n
        for kind, n in report["bytes"].items():
            nbytes[kind] = nbytes.get(kind, 0) + n
        largest += [{**e, "replica": slot} for e in report["largest"]]
        most_hit += [{**e, "replica": slot} for e in report["most_hit"]]
    largest.sort(key=lambda e: (-e["bytes"], -e["hits"], e["age_s"]))
    most_hit.sort(key=lambda e: (-e["hits"], -e["bytes"], e["age_s"]))
    return {
        "object": "cache.entries",
        "limit": limit,
        "counts": counts,
        "bytes": nbytes,
        "largest": largest[:limit],
        "most_hit": most_hit[:limit],
    }
