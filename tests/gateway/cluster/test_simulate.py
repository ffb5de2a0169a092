"""The hit-rate simulation drives the real router and shows what affinity buys."""

from __future__ import annotations

from gateway.cluster.simulate import Workload, simulate, table


def test_affinity_beats_least_loaded_and_one_replica_is_the_baseline():
    """On a Zipf workload, affinity routing over 4 replicas hits more often than one replica
    (each image lives in one replica's cache: 4x the cache), and least-loaded routing over 4
    hits no more often than one replica; with 1 replica both policies are identical."""
    w = Workload(images=400, requests=4000, cache_images=30, concurrency=4)
    one = simulate(w, 1, True)
    assert one.hit_rate == simulate(w, 1, False).hit_rate
    affinity, least = simulate(w, 4, True), simulate(w, 4, False)
    assert affinity.hit_rate > 1.1 * one.hit_rate
    assert least.hit_rate <= one.hit_rate + 0.01
    assert affinity.max_over_mean < 2.0


def test_table_has_a_row_per_replica_count():
    """The docs' table: header, rule, one row per replica count."""
    text = table(Workload(images=50, requests=300, cache_images=5), [1, 2, 3])
    assert len(text.splitlines()) == 5 and text.splitlines()[2].startswith("| 1 |")
