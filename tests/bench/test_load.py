"""The load report's arithmetic (no server needed).

Pinned: the RSS slope after warm-up is the least-squares growth in MiB/min and ignores the
warm-up quarter; deciles read the last sample of each tenth; the budget check sees every sample.
"""

from __future__ import annotations

import pytest

from bench.load import LoadReport

MiB = 2**20


def report_with(rss_mib: list[float], seconds: float) -> LoadReport:
    report = LoadReport(clients=1, seconds=seconds)
    report.rss_samples = [(100.0 + i, int(r * MiB)) for i, r in enumerate(rss_mib)]
    return report


def test_slope_is_growth_per_minute_after_warmup() -> None:
    """Invariant: a steady 0.5 MiB/s climb after warm-up reads as 30 MiB/min."""
    warmup = [100.0 + 10 * i for i in range(10)]  # steep, but inside the first quarter
    steady = [200.0 + 0.5 * i for i in range(30)]
    assert report_with(warmup + steady, 40).rss_slope_after_warmup() == pytest.approx(30.0)


def test_flat_after_warmup_reads_zero() -> None:
    """Invariant: growth confined to warm-up does not count as a leak."""
    rss = [100.0 + 10 * i for i in range(10)] + [200.0] * 30
    report = report_with(rss, 40)
    assert report.rss_slope_after_warmup() == pytest.approx(0.0)
    assert report.rss_by_decile()[-1] == 200.0
    assert report.summary()["rss_slope_after_warmup_mb_per_min"] == 0.0


def test_cache_budget_check_sees_every_sample() -> None:
    """Invariant: one over-budget sample anywhere fails the check."""
    report = LoadReport(clients=1, seconds=10)
    ok = {"prefix": {"bytes": 5, "capacity_bytes": 8}}
    report.cache_samples = [ok, {"prefix": {"bytes": 9, "capacity_bytes": 8}}, ok]
    assert not report.cache_within_budget()
    report.cache_samples = [ok, ok]
    assert report.cache_within_budget()
