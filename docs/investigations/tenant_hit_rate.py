"""What tenant scoping costs in cache hits: a team of tenants asking about one pool of images
with one system prompt, on a server that shares its caches between tenants and on one that
does not (`--cache-scope shared` vs `tenant`), same requests, same order.

    python -m docs.investigations.tenant_hit_rate [--tenants 4] [--images 6] [--rounds 3]

Each round, every tenant asks about every image of the pool (the team's system prompt, the
image, a question of its own), so within a round each image is asked about `tenants` times.
Reported per mode from `/v1/cache/stats` (admin key): the vision cache's hit rate (images),
the prefix cache's token hit rate (prompt tokens served from KV), and the median time to
first token of the requests after each tenant's first round (what a user of a warm server
waits). The embedded tiny model on CPU, memory caches only (the disk tier would turn a
second server's misses into disk hits).
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
from pathlib import Path
from typing import Any

import httpx

from bench.server import LocalServer
from bench.timing import timed_stream
from bench.workload import image_uri

SYSTEM = "You are the team's assistant for reviewing product photos. " * 4
ADMIN = "sk-admin-investigation"


def _run(mode: str, tenants: int, images: int, rounds: int, size: int) -> dict[str, Any]:
    keys = {f"t{i}": f"sk-tenant-{i}-key" for i in range(tenants)}
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "keys"
        path.write_text("".join(f"{n} {k}\n" for n, k in keys.items()))
        args = ["--api-keys-file", str(path), "--admin-api-key", ADMIN, "--cache-scope", mode]
        args += ["--served-model-name", "bench", "--warmup-image-size", str(size)]
        with LocalServer(args) as server:
            pool = [image_uri(size, seed) for seed in range(images)]
            warm_ttft = []
            for r in range(rounds):
                for name, key in keys.items():
                    for i, uri in enumerate(pool):
                        content = [
                            {"type": "image_url", "image_url": {"url": uri}},
                            {"type": "text", "text": f"{name}: what is wrong in photo {i}?"},
                        ]
                        messages = [
                            {"role": "system", "content": SYSTEM},
                            {"role": "user", "content": content},
                        ]
                        t = timed_stream(server.client(api_key=key), "bench", messages, 4)
                        if r > 0:
                            warm_ttft.append(t.ttft_s)
            stats = httpx.get(
                server.base_url + "/v1/cache/stats",
                headers={"authorization": f"Bearer {ADMIN}"},
                timeout=30,
            ).json()
    return {
        "mode": mode,
        "requests": tenants * images * rounds,
        "vision_hit_rate": stats["vision"]["hit_rate"],
        "vision_hits": stats["vision"]["hits"],
        "vision_queries": stats["vision"]["queries"],
        "token_hit_rate": stats["prefix"]["token_hit_rate"],
        "tokens_hit": stats["prefix"]["tokens_hit"],
        "tokens_queried": stats["prefix"]["tokens_queried"],
        "warm_ttft_ms": 1000 * statistics.median(warm_ttft) if warm_ttft else float("nan"),
        "tenants_seen": sorted(stats.get("tenants", {})),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tenants", type=int, default=4)
    parser.add_argument("--images", type=int, default=6)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--image-size", type=int, default=224)
    args = parser.parse_args()
    rows = [
        _run(mode, args.tenants, args.images, args.rounds, args.image_size)
        for mode in ("shared", "tenant")
    ]
    print("| mode | requests | vision hits / queries | vision hit rate | prompt tokens hit "
          "/ queried | token hit rate | warm TTFT (median, rounds 2+) |")  # fmt: skip
    print("| --- | --- | --- | --- | --- | --- | --- |")
    for r in rows:
        print(
            f"| {r['mode']} | {r['requests']} | {r['vision_hits']} / {r['vision_queries']} | "
            f"{r['vision_hit_rate']:.3f} | {r['tokens_hit']} / {r['tokens_queried']} | "
            f"{r['token_hit_rate']:.3f} | {r['warm_ttft_ms']:.1f} ms |"
        )
    print("tenants in stats:", {r["mode"]: r["tenants_seen"] for r in rows})


if __name__ == "__main__":
    main()
