"""Hit rates of the cluster's router for 1..N replicas under a Zipf workload of images.

Drives the real `AffinityRouter` (the class the ingress uses, bounded loads included) with a
stream of requests, each about one image drawn from a Zipf distribution over `images`
distinct images. Each replica is modelled by an LRU of `cache_images` images (its vision and
prefix caches, counted in images); a request is a hit if its replica's LRU holds the image.
Requests overlap: each stays in flight for an exponentially distributed number of arrivals
(mean `concurrency`), so the load bound matters for popular images. The same workload is also
routed with no key (least-loaded, what a plain load balancer does) for comparison.

    python -m gateway.cluster.simulate --replicas 1 2 4 8 16

Pure Python, seeded, deterministic; no Ray, no MLX.
"""

from __future__ import annotations

import argparse
import heapq
import random
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass

from gateway.cluster.router import AffinityRouter


@dataclass(frozen=True)
class Workload:
    images: int = 2000
    requests: int = 20000
    zipf_s: float = 1.0
    cache_images: int = 100  # per replica
    concurrency: float = 8.0  # mean requests in flight
    min_load: int = 4  # the router's floor of the load bound (`vision-gateway cluster`'s)
    seed: int = 0


@dataclass(frozen=True)
class Outcome:
    replicas: int
    keyed: bool
    hit_rate: float
    max_over_mean: float  # the busiest replica's requests over the mean (1.0: even)
    spilled: float  # share of requests that left their key's home replica


def simulate(workload: Workload, replicas: int, keyed: bool) -> Outcome:
    """Route `workload` over `replicas` with the real router; see the module docstring."""
    rng = random.Random(workload.seed)
    weights = [1.0 / (k + 1) ** workload.zipf_s for k in range(workload.images)]
    stream = rng.choices(range(workload.images), weights=weights, k=workload.requests)
    durations = [rng.expovariate(1.0 / workload.concurrency) for _ in stream]
    router = AffinityRouter(replicas, min_load=workload.min_load)
    caches: list[OrderedDict[int, None]] = [OrderedDict() for _ in range(replicas)]
    in_flight: list[tuple[float, int]] = []  # (end time, slot)
    hits = 0
    for t, (image, duration) in enumerate(zip(stream, durations, strict=True)):
        while in_flight and in_flight[0][0] <= t:
            router.release(heapq.heappop(in_flight)[1])
        slot = router.choose(f"media:{image}" if keyed else None)
        heapq.heappush(in_flight, (t + duration, slot))
        cache = caches[slot]
        if image in cache:
            hits += 1
            cache.move_to_end(image)
        else:
            cache[image] = None
            if len(cache) > workload.cache_images:
                cache.popitem(last=False)
    slots = router.stats()["slots"]
    routed = [s["routed"] for s in slots]  # type: ignore[index]
    spilled = sum(s["spilled_in"] for s in slots)  # type: ignore[index]
    return Outcome(
        replicas=replicas,
        keyed=keyed,
        hit_rate=hits / workload.requests,
        max_over_mean=max(routed) / (sum(routed) / replicas),
        spilled=spilled / workload.requests,
    )


def table(workload: Workload, replica_counts: Sequence[int]) -> str:
    """A markdown table: per replica count, hit rate with affinity and least-loaded."""
    rows = [
        "| replicas | hit rate, affinity | hit rate, least-loaded | affinity / 1 replica "
        "| busiest replica / mean (affinity) | spilled (affinity) |",
        "| --- | --- | --- | --- | --- | --- |",
    ]
    one = simulate(workload, 1, True).hit_rate
    for n in replica_counts:
        a, b = simulate(workload, n, True), simulate(workload, n, False)
        rows.append(
            f"| {n} | {a.hit_rate:.3f} | {b.hit_rate:.3f} | {a.hit_rate / one:.2f}x "
            f"| {a.max_over_mean:.2f} | {a.spilled:.1%} |"
        )
    return "\n".join(rows)


def main(argv: Sequence[str] | None = None) -> None:
    d = Workload()
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--replicas", type=int, nargs="+", default=[1, 2, 4, 8, 16])
    p.add_argument("--images", type=int, default=d.images)
    p.add_argument("--requests", type=int, default=d.requests)
    p.add_argument("--zipf", type=float, default=d.zipf_s)
    p.add_argument("--cache-images", type=int, default=d.cache_images)
    p.add_argument("--concurrency", type=float, default=d.concurrency)
    p.add_argument("--min-load", type=int, default=d.min_load)
    p.add_argument("--seed", type=int, default=d.seed)
    a = p.parse_args(argv)
    workload = Workload(
        a.images, a.requests, a.zipf, a.cache_images, a.concurrency, a.min_load, a.seed
    )
    print(f"{workload}\n")
    print(table(workload, a.replicas))


if __name__ == "__main__":
    main()
