"""`bench concurrency`: throughput and TTFT as concurrent streams grow, next to raw mlx-lm.

At each level N (1, 2, 4, 8, 16, 32 by default) N streamed requests start at once, text-only
(distinct long-answer prompts) and then with images (each request a distinct, never-seen
image: vision tower and prefill included). Per wave: TTFT p50/p95 (send to first token),
aggregate decode tok/s (all completion tokens over the time from the first first-token to the
last last-token, so prefill is not in it), end-to-end tok/s (over the wave's whole wall time),
and per-stream decode tok/s (median). TTFT and decode are always apart.

Raw: mlx-lm's own `BatchGenerator` at the same batch sizes on the same weights
(`bench.raw`, in a subprocess before anything else, so its memory is gone when the
server loads), the ceiling the aggregate is divided by. The paper's figure: 3.7-4.3x
aggregate at 16 streams over 1.
"""

from __future__ import annotations

import time
from collections.abc import Awaitable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from bench.hotpath_client import Stream, aggregate_tok_s, median, together
from bench.plots import line_plot
from bench.report import Log, fmt, percentile, ratio
from bench.sse import ChatClient
from bench.workload import image_turn, image_uri, salt, story


@dataclass(frozen=True)
class ConcurrencySettings:
    levels: tuple[int, ...] = (1, 2, 4, 8, 16, 32)  # concurrent streams
    max_tokens: int = 64  # generated per stream (EOS ignored where the server allows)
    image_size: int = 224  # square px, image mode
    modes: tuple[str, ...] = ("text", "image")
    reps: int = 1  # timed waves per level and mode (aggregate: the median wave's)


def raw_ceiling(model_dir: Path, settings: ConcurrencySettings, log: Log) -> dict[str, Any]:
    """Raw mlx-lm BatchGenerator decode at the same batch sizes (`hotpath.run_raw`: a
    subprocess; {"error": ...} if it failed)."""
    from bench.hotpath import QUICK, run_raw

    raw_settings = replace(
        QUICK,
        streams=settings.levels,
        decode_tokens=settings.max_tokens,
        image_size=settings.image_size,
    )
    return run_raw(model_dir, raw_settings, log, quick=True)


def wave_summary(
    mode: str, n: int, waves: list[tuple[float, list[Stream]]], raw: dict[str, Any]
) -> dict[str, Any]:
    """One level's figures over its timed waves ((start time, streams) each): TTFT and
    per-stream percentiles over every stream; aggregate and end-to-end tok/s the median of
    the per-wave values (a wave is the unit those describe)."""
    streams = [s for _, wave_streams in waves for s in wave_streams]
    ok = [s for s in streams if not s.error and s.first is not None]
    aggregates, end_to_end = [], []
    for started, wave_streams in waves:
        done = [s for s in wave_streams if not s.error and s.last is not None]
        aggregates.append(aggregate_tok_s(wave_streams))
        if done:
            wall = max(s.last for s in done) - started  # type: ignore[type-var]
            end_to_end.append(sum(s.completion_tokens for s in done) / wall)
    agg = median(aggregates)
    raw_agg = raw.get(f"decode_tok_s_b{n}") if mode == "text" else None
    return {
        "mode": mode,
        "streams": n,
        "waves": len(waves),
        "ok": len(ok),
        "requests": len(streams),
        "errors": [s.error for s in streams if s.error][:3],
        "prompt_tokens": median([s.prompt_tokens or None for s in ok]),
        "generated_tokens": median([s.completion_tokens for s in ok]),
        "ttft_p50_ms": percentile([s.ttft_ms for s in ok], 0.50),
        "ttft_p95_ms": percentile([s.ttft_ms for s in ok], 0.95),
        "aggregate_decode_tok_s": agg,
        "aggregate_per_wave_tok_s": aggregates,
        "end_to_end_tok_s": median(end_to_end),
        "per_stream_decode_tok_s": median([s.tok_s for s in ok]),
        "raw_decode_tok_s": raw_agg,
        "vs_raw": ratio(agg, raw_agg),
    }


async def wave(
    client: ChatClient, settings: ConcurrencySettings, mode: str, n: int, seed: int, tokens: int
) -> list[Stream]:
    """`n` requests at once: distinct story prompts, or distinct never-seen images."""

    def one(i: int) -> Awaitable[Stream]:
        tag = salt(f"{mode}{n}-{seed}", i)
        if mode == "text":
            return client.chat([{"role": "user", "content": story(tag)}], tokens)
        uri = image_uri(settings.image_size, seed + i)
        return client.chat([image_turn(uri, f"{tag}: describe it.")], tokens)

    return await together(n, one)


async def run(
    client: ChatClient, settings: ConcurrencySettings, raw: dict[str, Any], log: Log
) -> list[dict[str, Any]]:
    """Every mode, every level; one summary per wave (scaling vs 1 stream added at the end)."""
    rows: list[dict[str, Any]] = []
    seed = 1
    for mode in settings.modes:
        if mode == "image":  # this size's tower and prefill shapes, untimed
            await client.chat([image_turn(image_uri(settings.image_size, 0), "Hi?")], 2)
        for n in settings.levels:
            if mode == "text":  # this batch size's decode shapes, untimed
                await wave(client, settings, mode, n, -seed, 4)
            waves = []
            for _ in range(settings.reps):
                started = time.perf_counter()
                streams = await wave(client, settings, mode, n, seed, settings.max_tokens)
                waves.append((started, streams))
                seed += n
            row = wave_summary(mode, n, waves, raw)
            rows.append(row)
            log(
                f"{mode:5s} x{n:3d}: TTFT p50 {fmt(row['ttft_p50_ms'])} / p95 "
                f"{fmt(row['ttft_p95_ms'])} ms, aggregate {fmt(row['aggregate_decode_tok_s'])} "
                f"tok/s (raw {fmt(row['raw_decode_tok_s'])}), per stream "
                f"{fmt(row['per_stream_decode_tok_s'])} tok/s, ok {row['ok']}/{row['requests']}"
                + (f" ERROR {row['errors'][0]}" if row["errors"] else "")
            )
    return add_scaling(rows)


def add_scaling(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Each row's aggregate over the same mode's lowest level (the paper's scaling figure)."""
    for row in rows:
        same = [r for r in rows if r["mode"] == row["mode"]]
        base = min(same, key=lambda r: r["streams"])
        row["scaling_vs_1"] = ratio(row["aggregate_decode_tok_s"], base["aggregate_decode_tok_s"])
    return rows


HEADER = (
    "| mode | streams | TTFT p50 (ms) | TTFT p95 (ms) | aggregate decode tok/s | scaling vs 1 | "
    "raw BatchGenerator tok/s | vs raw | per-stream tok/s | end-to-end tok/s | "
    "prompt / generated tokens | ok |\n|---|---|---|---|---|---|---|---|---|---|---|---|"
)


def markdown(rows: list[dict[str, Any]]) -> str:
    lines = [HEADER]
    for r in rows:
        lines.append(
            f"| {r['mode']} | {r['streams']} | {fmt(r['ttft_p50_ms'])} | {fmt(r['ttft_p95_ms'])} | "
            f"{fmt(r['aggregate_decode_tok_s'])} | {fmt(r['scaling_vs_1'], 2, 'x')} | "
            f"{fmt(r['raw_decode_tok_s'])} | {fmt(r['vs_raw'], 2, 'x')} | "
            f"{fmt(r['per_stream_decode_tok_s'])} | {fmt(r['end_to_end_tok_s'])} | "
            f"{fmt(r['prompt_tokens'], 0)} / {fmt(r['generated_tokens'], 0)} | "
            f"{r['ok']}/{r['requests']} |"
        )
    return "\n".join(lines)


def _series(rows: list[dict[str, Any]], mode: str, key: str) -> tuple[list[int], list[float]]:
    picked = [r for r in rows if r["mode"] == mode]
    values = [float("nan") if r[key] is None else r[key] for r in picked]
    return [r["streams"] for r in picked], values


def plot_throughput(series: dict[str, list[dict[str, Any]]], path: str) -> bool:
    """Aggregate decode tok/s against streams: per backend and mode, plus raw (label -> rows)."""
    lines: dict[str, tuple[list[int], list[float]]] = {}
    for label, rows in series.items():
        prefix = f"{label}, " if len(series) > 1 else ""
        for mode in dict.fromkeys(r["mode"] for r in rows):
            lines[f"{prefix}{mode}"] = _series(rows, mode, "aggregate_decode_tok_s")
        raw_label = "raw mlx-lm BatchGenerator (same weights)"
        if raw_label not in lines and any(r["raw_decode_tok_s"] for r in rows):
            lines[raw_label] = _series(rows, "text", "raw_decode_tok_s")  # one ceiling for all
    levels = sorted({r["streams"] for rows in series.values() for r in rows})
    return line_plot(
        lines, path, xlabel="concurrent streams", ylabel="aggregate decode tokens/s",
        title="Throughput by concurrency", log_y=True, marker="o", xticks=levels,
    )  # fmt: skip


def plot_ttft(series: dict[str, list[dict[str, Any]]], path: str) -> bool:
    """TTFT p50 and p95 against streams, per backend and mode."""
    lines: dict[str, tuple[list[int], list[float]]] = {}
    for label, rows in series.items():
        prefix = f"{label}, " if len(series) > 1 else ""
        for mode in dict.fromkeys(r["mode"] for r in rows):
            lines[f"{prefix}{mode} p50"] = _series(rows, mode, "ttft_p50_ms")
            lines[f"{prefix}{mode} p95"] = _series(rows, mode, "ttft_p95_ms")
    levels = sorted({r["streams"] for rows in series.values() for r in rows})
    return line_plot(
        lines, path, xlabel="concurrent streams", ylabel="time to first token (ms)",
        title="TTFT by concurrency", log_y=True, marker="o", xticks=levels,
    )  # fmt: skip
