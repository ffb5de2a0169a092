"""Does one long prompt slow a process's later one-stream decode? (issue 41, CPU)

    python -m docs.investigations.after_prefill [--model DIR] [--kind engine|raw]
        [--pairs 12] [--tokens 200] [--long 1400] [--modes long,fresh,fresh]

One worker process per mode, each holding the model (the gateway's `Engine` alone, no HTTP,
or raw mlx-lm's `BatchGenerator`), measured in turn, the order rotating from pair to pair:
- `long`: one prompt of `--long` words (`max_tokens` 2) before anything is measured;
- `clear`: the same, then `mx.clear_cache()` (MLX's buffer cache emptied);
- `drop` (engine only): the same, then the engine's caches cleared (`Engine.clear_caches`:
  the long prompt's KV blocks dropped), then `mx.clear_cache()`;
- `fresh`: nothing before.
Every mode then decodes `one_stream.PROMPT` greedily for `--tokens` tokens per turn; the step
(ms per token over the steady window) of each mode is divided by the first `fresh` worker's
in the same pair. Two `fresh` workers make an A/A control: how far apart two identical
processes measure on this machine in the same minutes. Prints each pair (with the MLX
buffer cache's size after the turn) and the median ratio per mode.

Without `--model` the 28-layer tiny Qwen2.5-VL of `one_stream` (built once).
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from collections.abc import Callable

from docs.investigations.one_stream import (
    PROMPT,
    SKIP,
    build_deep,
    engine_turns,
    raw_token_times,
)

MODES = ("long", "clear", "drop", "fresh")


def _engine_turn(model_dir: str) -> tuple[Callable[[str, int], list[float]], Callable[[], None]]:
    """`one_stream.engine_turns`: token times of one request of `text`, and the engine's
    cache clearing."""
    engine, turn = engine_turns(model_dir)
    return (lambda text, max_tokens: turn(text, max_tokens)[1:]), engine.clear_caches


def _raw_turn(model_dir: str) -> tuple[Callable[[str, int], list[float]], Callable[[], None]]:
    """Raw mlx-lm (`one_stream.raw_token_times`) on the chat-templated `text`."""
    from bench.raw import load_text_model
    from gateway.engine.families import load_model

    model = load_text_model(model_dir)
    family = load_model(model_dir, lazy=True)

    def turn(text: str, max_tokens: int) -> list[float]:
        ids = family.tokenize(family.render([{"role": "user", "content": text}]))
        return raw_token_times(model, ids, max_tokens)

    def no_caches() -> None:
        raise SystemExit("--modes drop: the engine's caches (raw has none)")

    return turn, no_caches


def worker(kind: str, model_dir: str, mode: str, long_words: int) -> None:
    import mlx.core as mx

    turn, clear_caches = (_engine_turn if kind == "engine" else _raw_turn)(model_dir)
    if mode != "fresh":
        turn("long " * long_words, 2)
        time.sleep(1.0)  # the request's own ending (its KV stored) is done by then
    if mode == "drop":
        clear_caches()
    if mode in ("clear", "drop"):
        mx.clear_cache()
    turn(PROMPT, 16)  # the first request of a process compiles what later ones reuse
    print(json.dumps({"ready": True}), flush=True)
    for line in sys.stdin:
        times = turn(PROMPT, SKIP + int(line))
        step_ms = 1000 * (times[-1] - times[SKIP - 1]) / (len(times) - SKIP)
        print(json.dumps([step_ms, mx.get_cache_memory() / 1e6]), flush=True)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--model")
    p.add_argument("--kind", choices=("engine", "raw"), default="engine")
    p.add_argument("--pairs", type=int, default=12)
    p.add_argument("--tokens", type=int, default=200)
    p.add_argument("--long", type=int, default=1400, help="words of the long prompt")
    p.add_argument("--modes", default="long,fresh,fresh", help=f"comma-separated, of {MODES}")
    p.add_argument("--worker", help=argparse.SUPPRESS)
    args = p.parse_args()
    model_dir = args.model or build_deep()
    if args.worker:
        worker(args.kind, model_dir, args.worker, args.long)
        return
    modes = args.modes.split(",")
    if "fresh" not in modes or any(m not in MODES for m in modes):
        p.error(f"--modes: names of {MODES}, with at least one 'fresh' (the reference)")
    procs = []
    for mode in modes:
        cmd = [sys.executable, "-m", "docs.investigations.after_prefill", "--worker", mode,
               "--kind", args.kind, "--model", model_dir, "--long", str(args.long)]  # fmt: skip
        proc = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        procs.append(proc)
    for proc in procs:
        assert proc.stdout is not None and json.loads(proc.stdout.readline())["ready"]

    def measure(k: int) -> list[float]:
        proc = procs[k]
        assert proc.stdin is not None and proc.stdout is not None
        proc.stdin.write(f"{args.tokens}\n")
        proc.stdin.flush()
        return json.loads(proc.stdout.readline())

    reference = modes.index("fresh")
    labels = [f"{m}{k}" for k, m in enumerate(modes)]
    ratios: list[list[float]] = [[] for _ in modes]
    for i in range(args.pairs):
        order = [(i + j) % len(modes) for j in range(len(modes))]
        got = {k: measure(k) for k in order}
        for k in range(len(modes)):
            ratios[k].append(got[k][0] / got[reference][0])
        cells = "  ".join(
            f"{labels[k]} {got[k][0]:.2f} ms ({got[k][1]:.1f} MB)" for k in range(len(modes))
        )
        print(f"pair {i + 1}/{args.pairs}: {cells}", flush=True)
    for k in range(len(modes)):
        if k != reference:
            slower = sum(r > 1 for r in ratios[k])
            median = statistics.median(ratios[k])
            print(f"{labels[k]} / {labels[reference]} step: median {median:.3f}"
                  f" (slower in {slower}/{args.pairs})")  # fmt: skip
    for proc in procs:
        if proc.stdin is not None:
            proc.stdin.close()
        proc.wait(30)


if __name__ == "__main__":
    main()
