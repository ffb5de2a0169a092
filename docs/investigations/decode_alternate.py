"""Decode through HTTP against raw mlx-lm, alternated round by round in one process tree.

    python -m docs.investigations.decode_alternate --model DIR [--streams 1 16 32]
        [--rounds 4] [--tokens 128] [--step-trace FILE] [--server-arg=FLAG ...]

A lent VM's speed drifts within a device call by more than the effect being measured (run
13a: raw at one row 33% slower after the server than before it), so a ratio of a server
figure to a raw figure taken minutes apart says little. This keeps one server up (idle
between its waves) and, in each round, measures raw mlx-lm's `BatchGenerator` (`bench.raw`,
a subprocess: same weights, same batch sizes, steady window) and then the server's decode
waves at the same stream counts (the plain SSE reader, `steady_tok_s`: the same window,
no SDK parsing), so each server figure has a raw figure from seconds before it. Two ratios
per stream count: "steady" (the steady window against raw's; issue 27 target 1) and "wave"
(each whole wave, first token to last, against raw's whole wave, both with their prefill
ramp; target 2). Each round's ratios are reported, then the median of the per-round ratios.

With `--step-trace FILE` the server traces its steps and the engine's own step period at each
row count is reported too (the median gap between consecutive steps that decoded exactly that
many rows and did nothing else), which separates the engine from the HTTP path.
Prints one JSON object per round and a summary.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import subprocess
import sys
from pathlib import Path
from typing import Any

import httpx

from bench.hotpath_client import aggregate_tok_s, plain_stream, steady_tok_s, together
from bench.hotpath_scenarios import STORY
from bench.server import LocalServer


def raw_round(model: str, streams: list[int], tokens: int) -> dict[str, dict[str, float]]:
    """Raw decode tok/s and ms per step per batch size, measured now in a fresh subprocess."""
    cmd = [sys.executable, "-m", "bench.raw", "--model", model, "--decode-only",
           "--decode-tokens", str(tokens), "--decode-reps", "3",
           "--batch", *map(str, streams)]  # fmt: skip
    out = subprocess.run(cmd, capture_output=True, text=True, check=True)
    data = json.loads(out.stdout.strip().splitlines()[-1])
    return {
        "tok_s": {str(n): data[f"decode_tok_s_b{n}"] for n in streams},
        "wave_tok_s": {str(n): data[f"decode_wave_tok_s_b{n}"] for n in streams},
        "step_ms": {str(n): round(data[f"decode_step_ms_b{n}"], 2) for n in streams},
    }


async def server_round(
    base_url: str, streams: list[int], tokens: int, salt: int
) -> dict[str, dict[str, float | None]]:
    """The server's steady-window tok/s ("steady") and whole-wave tok/s, ramp included
    ("wave": `aggregate_tok_s`), per stream count: medians of 3 waves after one warm-up."""
    out: dict[str, dict[str, float | None]] = {"steady": {}, "wave": {}}
    async with httpx.AsyncClient(base_url=base_url + "/v1", timeout=300) as http:
        for n in streams:

            def one(i: int, tag: str, count: int = tokens) -> Any:
                messages = [{"role": "user", "content": f"Story {salt}{tag}{i:03d}. {STORY}"}]
                return plain_stream(http, messages, count, temperature=0, ignore_eos=True)

            await together(n, lambda i: one(i, "w", 16))
            waves = [await together(n, lambda i, k=k: one(i, f"t{k}")) for k in range(3)]
            for key, figure in (("steady", steady_tok_s), ("wave", aggregate_tok_s)):
                good = [x for x in map(figure, waves) if x]
                out[key][str(n)] = statistics.median(good) if good else None
    return out


def engine_step_ms(trace: Path, streams: list[int]) -> dict[str, float | None]:
    """Median period (ms) between consecutive plain decode steps of exactly n rows."""
    rows = [json.loads(line) for line in trace.read_text().splitlines() if line.strip()]
    plain = [
        r.get("rows") == r.get("tokens") and not r.get("joined") and r.get("prefill", 0) < 0.01
        for r in rows
    ]
    out: dict[str, float | None] = {}
    for n in streams:
        gaps = [
            1000 * (b["t"] - a["t"])
            for a, b, pa, pb in zip(rows, rows[1:], plain, plain[1:], strict=False)
            if pa and pb and a["rows"] == n and b["rows"] == n
        ]
        out[str(n)] = round(statistics.median(gaps), 2) if gaps else None
    return out


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", required=True)
    p.add_argument("--streams", type=int, nargs="+", default=[1, 16, 32])
    p.add_argument("--rounds", type=int, default=4)
    p.add_argument("--tokens", type=int, default=128)
    p.add_argument("--step-trace", type=Path)
    p.add_argument("--server-arg", action="append", default=[])
    args = p.parse_args(argv)
    flags = ["--model", args.model, "--served-model-name", "bench", "--max-batch", "32"]
    if args.step_trace:
        flags.append(f"--step-trace={args.step_trace}")
    # steady window against raw's steady window (target 1); whole waves against raw's whole
    # waves, each ramp included (target 2)
    ratios: dict[str, dict[str, list[float]]] = {
        key: {str(n): [] for n in args.streams} for key in ("steady", "wave")
    }
    server = LocalServer([*flags, *args.server_arg])
    try:
        for k in range(args.rounds):
            raw = raw_round(args.model, args.streams, args.tokens)
            ours = asyncio.run(server_round(server.base_url, args.streams, args.tokens, k))
            row = {"round": k, "raw": raw, "server_tok_s": ours, "ratio": {}}
            for key, raw_key in (("steady", "tok_s"), ("wave", "wave_tok_s")):
                row["ratio"][key] = {}
                for n, value in ours[key].items():
                    if value and raw[raw_key].get(n):
                        row["ratio"][key][n] = round(value / raw[raw_key][n], 3)
                        ratios[key][n].append(value / raw[raw_key][n])
            print(json.dumps(row), flush=True)
    finally:
        server.stop()
    summary: dict[str, Any] = {"median_ratio": {}, "ratio_range": {}}
    for key, by_n in ratios.items():
        done = {n: r for n, r in by_n.items() if r}
        summary["median_ratio"][key] = {n: round(statistics.median(r), 3) for n, r in done.items()}
        summary["ratio_range"][key] = {
            n: [round(min(r), 3), round(max(r), 3)] for n, r in done.items()
        }
    if args.step_trace and args.step_trace.exists():
        summary["engine_step_ms"] = engine_step_ms(args.step_trace, args.streams)
    print(json.dumps({"summary": summary}), flush=True)


if __name__ == "__main__":
    main()
