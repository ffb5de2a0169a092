"""`bench load`: N concurrent clients mixing text and image requests for M seconds.

Bounded in time and count, loopback only. Each client loops: pick a request (text, or an image
from a pool of distinct images so the caches both hit and evict; streamed or not), send it, and
classify the outcome: complete answer, 4xx, 429, 5xx, or lost (connection error, truncated
stream, missing finish). Meanwhile a sampler reads the server's RSS and cache stats every
second. Reports requests, outcomes by status, p50/p99 latency, peak RSS, RSS by tenth of the run
and its slope after warm-up (a leak shows as a steady positive slope), and cache bytes vs
budget.
"""

from __future__ import annotations

import asyncio
import json
import random
import statistics
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

import httpx

from bench.plots import line_plot
from bench.timing import image_data_uri


@dataclass
class LoadReport:
    clients: int
    seconds: float
    outcomes: Counter = field(default_factory=Counter)  # "ok", "4xx:400", "429", "5xx:500", "lost"
    latencies_s: list[float] = field(default_factory=list)
    rss_samples: list[tuple[float, int]] = field(default_factory=list)  # (t, bytes)
    cache_samples: list[dict[str, Any]] = field(default_factory=list)

    @property
    def requests(self) -> int:
        return sum(self.outcomes.values())

    def percentile(self, q: float) -> float:
        if not self.latencies_s:
            return float("nan")
        ordered = sorted(self.latencies_s)
        return ordered[min(len(ordered) - 1, int(q * len(ordered)))]

    def rss_after_warmup(self) -> tuple[int, int]:
        """(RSS at the end of the first quarter, peak RSS after it), bytes."""
        if not self.rss_samples:
            return 0, 0
        t0 = self.rss_samples[0][0]
        later = [r for t, r in self.rss_samples if t - t0 >= self.seconds / 4] or [0]
        first = next((r for t, r in self.rss_samples if t - t0 >= self.seconds / 4), 0)
        return first, max(later)

    def rss_by_decile(self) -> list[float]:
        """RSS (MiB) at the end of each tenth of the run: flat after warm-up means no leak."""
        if not self.rss_samples:
            return []
        t0 = self.rss_samples[0][0]
        out = []
        for tenth in range(1, 11):
            upto = [r for t, r in self.rss_samples if t - t0 <= self.seconds * tenth / 10]
            out.append(round(upto[-1] / 2**20, 1) if upto else 0.0)
        return out

    def rss_slope_after_warmup(self) -> float:
        """Least-squares RSS growth after the first quarter, MiB per minute (about 0 = flat)."""
        if not self.rss_samples:
            return 0.0
        t0 = self.rss_samples[0][0]
        points = [(t, r / 2**20) for t, r in self.rss_samples if t - t0 >= self.seconds / 4]
        if len(points) < 2:
            return 0.0
        mean_t = sum(t for t, _ in points) / len(points)
        mean_r = sum(r for _, r in points) / len(points)
        var = sum((t - mean_t) ** 2 for t, _ in points)
        cov = sum((t - mean_t) * (r - mean_r) for t, r in points)
        return 60.0 * cov / var if var else 0.0

    def rss_series(self) -> list[list[float]]:
        """[[seconds since start, RSS MiB], ...]: one point per sample, for plots."""
        if not self.rss_samples:
            return []
        t0 = self.rss_samples[0][0]
        return [[round(t - t0, 1), round(r / 2**20, 1)] for t, r in self.rss_samples]

    def cache_within_budget(self) -> bool:
        return all(s[c]["bytes"] <= s[c]["capacity_bytes"] for s in self.cache_samples for c in s)

    def summary(self) -> dict[str, Any]:
        warm, peak = self.rss_after_warmup()
        last = self.cache_samples[-1] if self.cache_samples else {}
        return {
            "clients": self.clients,
            "seconds": self.seconds,
            "requests": self.requests,
            "outcomes": dict(self.outcomes),
            "server_errors": sum(v for k, v in self.outcomes.items() if k.startswith("5xx")),
            "lost": self.outcomes.get("lost", 0),
            "p50_latency_s": round(self.percentile(0.50), 3),
            "p99_latency_s": round(self.percentile(0.99), 3),
            "peak_rss_mb": round(max((r for _, r in self.rss_samples), default=0) / 2**20, 1),
            "rss_mb_by_decile": self.rss_by_decile(),
            "rss_after_warmup_mb": round(warm / 2**20, 1),
            "peak_rss_after_warmup_mb": round(peak / 2**20, 1),
            "rss_slope_after_warmup_mb_per_min": round(self.rss_slope_after_warmup(), 2),
            "cache_within_budget": self.cache_within_budget(),
            "cache_bytes": {c: (v["bytes"], v["capacity_bytes"]) for c, v in last.items()},
        }


def _body(rng: random.Random, model: str, images: list[str]) -> dict[str, Any]:
    kind = rng.random()
    if kind < 0.5:
        content: Any = f"Question {rng.randint(0, 10**6)}: tell me something."
    else:
        content = [
            {"type": "image_url", "image_url": {"url": rng.choice(images)}},
            {"type": "text", "text": rng.choice(["What is this?", "Colours?", "Shapes?"])},
        ]
    return {
        "model": model,
        "messages": [{"role": "user", "content": content}],
        "max_tokens": rng.randint(4, 24),
        "temperature": rng.choice([0, 0.7]),
        "stream": rng.random() < 0.5,
    }


async def _one(client: httpx.AsyncClient, body: dict[str, Any]) -> str:
    try:
        if not body["stream"]:
            r = await client.post("/v1/chat/completions", json=body)
            if r.status_code != 200:
                return _status_class(r.status_code)
            data = r.json()
            ok = data["choices"][0]["finish_reason"] in ("stop", "length") and "usage" in data
            return "ok" if ok else "lost"
        async with client.stream("POST", "/v1/chat/completions", json=body) as r:
            if r.status_code != 200:
                await r.aread()
                return _status_class(r.status_code)
            finish, done = None, False
            async for line in r.aiter_lines():
                if line == "data: [DONE]":
                    done = True
                elif line.startswith("data: "):
                    chunk = json.loads(line[6:])
                    if "error" in chunk:
                        return "5xx:stream"
                    for choice in chunk.get("choices", []):
                        finish = choice.get("finish_reason") or finish
            return "ok" if done and finish in ("stop", "length") else "lost"
    except (httpx.HTTPError, ValueError, KeyError):
        return "lost"


def _status_class(status: int) -> str:
    if status == 429:
        return "429"
    return f"{'5xx' if status >= 500 else '4xx'}:{status}"


async def run_load(
    server: Any,
    model: str,
    clients: int,
    seconds: float,
    image_pool: int = 24,
    image_size: int = 112,
    seed: int = 0,
    log: Any = print,
) -> LoadReport:
    report = LoadReport(clients, seconds)
    images = [image_data_uri(size=image_size, seed=i) for i in range(image_pool)]
    deadline = time.monotonic() + seconds
    limits = httpx.Limits(max_connections=clients + 4)
    timeout = httpx.Timeout(120.0)

    async with httpx.AsyncClient(base_url=server.base_url, limits=limits, timeout=timeout) as http:

        async def client_loop(index: int) -> None:
            rng = random.Random(seed * 1000 + index)
            while time.monotonic() < deadline:
                started = time.perf_counter()
                outcome = await _one(http, _body(rng, model, images))
                report.outcomes[outcome] += 1
                if outcome == "ok":
                    report.latencies_s.append(time.perf_counter() - started)
                elif outcome == "429":
                    await asyncio.sleep(0.2)

        async def sampler() -> None:
            start = time.monotonic()
            while time.monotonic() < deadline:
                report.rss_samples.append((time.monotonic(), server.pid_rss_bytes()))
                try:
                    stats = (await http.get("/v1/cache/stats")).json()
                    report.cache_samples.append(
                        {c: {k: stats[c][k] for k in ("bytes", "capacity_bytes")} for c in stats}
                    )
                except (httpx.HTTPError, ValueError, KeyError):
                    pass
                elapsed = time.monotonic() - start
                if int(elapsed) % 10 == 0:
                    log(f"  {elapsed:5.0f}s  requests {report.requests}  {dict(report.outcomes)}")
                await asyncio.sleep(1.0)

        await asyncio.gather(sampler(), *(client_loop(i) for i in range(clients)))
    return report


def p50(values: list[float]) -> float:
    return statistics.median(values) if values else float("nan")


def plot_rss(series: dict[str, list[list[float]]], path: str) -> bool:
    """RSS over time, one line per run (label -> rss_series). False when matplotlib is missing."""
    lines = {label: ([t for t, _ in pts], [mb for _, mb in pts]) for label, pts in series.items()}
    return line_plot(
        lines,
        path,
        xlabel="seconds of load",
        ylabel="server RSS (MiB)",
        title="Server memory under load",
    )
