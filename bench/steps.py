"""Read an engine step trace (`serve --step-trace FILE`) wave by wave.

    python -m bench.steps FILE [--json OUT]

A wave is a run of steps up to one after which the engine is idle (no rows, nothing queued,
encoding or prefilling). Per wave: its length (engine view: first step to the step
its last row finished in), tokens decoded, the decode pace once every row has joined (ms per
step, the figure comparable with raw mlx-lm's), and where the ramp went: steps until the last
row joined, time in prefill, admission and event shipping, and the steps in which rows joined
(merging their caches into the batch; a row handed to mlx-lm's own prefill, without exact
reuse, counts when handed over and costs that prefill a forward).
"""

from __future__ import annotations

import argparse
import gzip
import json
import statistics
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

from gateway.engine.scheduler.step_trace import STAGES


def load(path: Path) -> list[dict[str, Any]]:
    """The trace's records (a `.gz` file is read compressed: the committed traces are)."""
    data = path.read_bytes()
    text = (gzip.decompress(data) if path.suffix == ".gz" else data).decode()
    return [json.loads(line) for line in text.splitlines() if line.strip()]


def waves(steps: Sequence[dict[str, Any]]) -> list[list[dict[str, Any]]]:
    """Split the trace into waves: maximal runs of steps with work (see module doc)."""
    out: list[list[dict[str, Any]]] = []
    current: list[dict[str, Any]] = []
    for step in steps:
        current.append(step)
        if not (step["rows"] or step["prefilling"] or step["encoding"] or step["waiting"]):
            out.append(current)  # idle after this step: the wave is over
            current = []
    if current:
        out.append(current)
    return out


def _step_ms(steps: Sequence[dict[str, Any]]) -> float:
    return sum(s.get(k, 0.0) for s in steps for k in STAGES)  # older traces lack newer stages


def summarize(wave: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """The figures of one wave (module doc); times in ms."""
    peak = max(s["rows"] for s in wave)
    last_join = max((i for i, s in enumerate(wave) if s["joined"]), default=0)
    full = [s for s in wave[last_join + 1 :] if s["tokens"] == peak]  # every row decoded
    end = wave[-1]["t"] + _step_ms(wave[-1:]) / 1000
    return {
        "start_s": wave[0]["t"],
        "ms": round(1000 * (end - wave[0]["t"]), 2),
        "steps": len(wave),
        "peak_rows": peak,
        "tokens": sum(s["tokens"] for s in wave),
        "join_steps": sum(1 for s in wave if s["joined"]),
        "ramp_steps": last_join + 1,
        "ramp_ms": round(_step_ms(wave[: last_join + 1]), 2),
        "full_steps": len(full),
        "full_step_ms": round(statistics.median(_step_ms([s]) for s in full), 3) if full else None,
        "full_decode_ms": round(statistics.median(s["decode"] for s in full), 3) if full else None,
        **{f"{k}_ms": round(sum(s.get(k, 0.0) for s in wave), 2) for k in STAGES},
    }


def report(rows: Iterable[dict[str, Any]]) -> str:
    keys = ("start_s", "ms", "steps", "peak_rows", "tokens", "join_steps", "ramp_steps",
            "ramp_ms", "full_step_ms", "full_decode_ms", *(f"{k}_ms" for k in STAGES))  # fmt: skip
    lines = [" ".join(f"{k:>14}" for k in keys)]
    for row in rows:
        lines.append(" ".join(f"{_fmt(row[k]):>14}" for k in keys))
    return "\n".join(lines)


def _fmt(value: Any) -> str:
    return "-" if value is None else f"{value:.2f}" if isinstance(value, float) else str(value)


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("trace", type=Path)
    parser.add_argument("--json", type=Path, help="write the per-wave figures here")
    parser.add_argument("--min-rows", type=int, default=1, help="only waves this wide or wider")
    args = parser.parse_args(argv)
    rows = [summarize(w) for w in waves(load(args.trace))]
    rows = [r for r in rows if r["peak_rows"] >= args.min_rows]
    print(report(rows))
    if args.json:
        args.json.write_text(json.dumps(rows, indent=2))


if __name__ == "__main__":
    main()
