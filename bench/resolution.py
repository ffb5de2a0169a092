"""`bench resolution`: cold vs warm time to first token across image sizes.

For each square size (224, 448, 768, 1024 px by default): one untimed pair at that size first
(kernels compiled, buffers grown), then `reps` times: a question about an image the server has
never seen (cold: decode, vision tower, prefill) and then a different question about the same
image in a new one-turn conversation (warm: what a server's caches can save). The paper's
resolution sweep reports the cold/warm ratio growing with size (6.7x at 224 to 13.1x at 1024).
TTFT is reported apart from decode speed (tokens after the first over the time after it).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from bench.plots import line_plot
from bench.report import ColdWarm, Log, fmt
from bench.sse import ChatClient
from bench.workload import image_turn, image_uri

COLD_Q = "Describe this picture in detail."
WARM_Q = "How many shapes are in this picture?"


@dataclass(frozen=True)
class ResolutionSettings:
    sizes: tuple[int, ...] = (224, 448, 768, 1024)  # square image edge, px
    reps: int = 3  # cold/warm pairs per size (median)
    max_tokens: int = 16  # generated per request


@dataclass
class SizeResult(ColdWarm):
    size: int = 0

    def summary(self) -> dict[str, Any]:
        return {"image_size": self.size, **super().summary()}


async def run(client: ChatClient, settings: ResolutionSettings, log: Log) -> list[dict[str, Any]]:
    """Every size in order; returns one summary per size."""
    results = []
    seed = 0
    for size in settings.sizes:
        seed += 1
        uri = image_uri(size, 10_000 + seed)  # untimed pair: compile this size's shapes
        await client.chat([image_turn(uri, COLD_Q)], 2)
        await client.chat([image_turn(uri, WARM_Q)], 2)
        result = SizeResult(size=size)
        for rep in range(settings.reps):
            seed += 1
            uri = image_uri(size, seed)
            cold = await client.chat([image_turn(uri, COLD_Q)], settings.max_tokens)
            warm = await client.chat([image_turn(uri, WARM_Q)], settings.max_tokens)
            result.cold.append(cold)
            result.warm.append(warm)
            log(
                f"{size}px rep {rep + 1}/{settings.reps}: cold {fmt(cold.ttft_ms)} ms, "
                f"warm {fmt(warm.ttft_ms)} ms (cached {warm.cached_tokens}/{warm.prompt_tokens})"
                + (f" ERROR {cold.error or warm.error}" if cold.error or warm.error else "")
            )
        results.append(result.summary())
    return results


HEADER = (
    "| image | prompt tokens | TTFT cold (ms, median) | TTFT warm (ms, median) | cold / warm | "
    "warm cached tokens | decode tok/s (per request) | generated tokens |\n"
    "|---|---|---|---|---|---|---|---|"
)


def markdown(rows: list[dict[str, Any]]) -> str:
    lines = [HEADER]
    for r in rows:
        lines.append(
            f"| {r['image_size']}x{r['image_size']} | {fmt(r['prompt_tokens'], 0)} | "
            f"{fmt(r['cold_ttft_ms'])} | {fmt(r['warm_ttft_ms'])} | "
            f"{fmt(r['cold_over_warm'], 1, 'x')} | {fmt(r['warm_cached_tokens'], 0)} | "
            f"{fmt(r['decode_tok_s'])} | {fmt(r['generated_tokens'], 0)} |"
        )
    return "\n".join(lines)


def plot(series: dict[str, list[dict[str, Any]]], path: str) -> bool:
    """Cold and warm TTFT against image size, two lines per backend (label -> rows)."""
    lines = {}
    for label, rows in series.items():
        sizes = [r["image_size"] for r in rows]
        prefix = f"{label}: " if len(series) > 1 else ""
        lines[f"{prefix}cold"] = (sizes, [_nan(r["cold_ttft_ms"]) for r in rows])
        lines[f"{prefix}warm (same image, new question)"] = (
            sizes,
            [_nan(r["warm_ttft_ms"]) for r in rows],
        )
    sizes = sorted({r["image_size"] for rows in series.values() for r in rows})
    return line_plot(
        lines,
        path,
        xlabel="image size (px, square)",
        ylabel="median time to first token (ms)",
        title="TTFT by image resolution, cold vs warm",
        log_y=True,
        marker="o",
        xticks=sizes,
    )


def _nan(value: float | None) -> float:
    return float("nan") if value is None else value


def speedups(rows: list[dict[str, Any]]) -> str:
    """'6.7x at 224 -> 13.1x at 1024' style summary."""
    parts = [f"{fmt(r['cold_over_warm'], 1, 'x')} at {r['image_size']}" for r in rows]
    return " -> ".join(parts) if parts else "n/a"
