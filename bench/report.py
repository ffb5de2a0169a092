"""What every table bench records and writes: metadata, percentiles, JSON, markdown, progress.

The recorded metadata is what a reader needs to redo or judge a run: the client machine,
the backend that answered (name, version, URL), the model (name, architecture, dtype when the
checkpoint is local), and per figure the image size, prompt and generated tokens, concurrency
and cache state.
"""

from __future__ import annotations

import json
import math
import os
import platform
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from bench.hotpath_client import Stream, median

Log = Callable[[str], None]


def progress(prefix: str = "") -> Log:
    """A logger that stamps seconds since its creation (flushes: progress under `tee`)."""
    started = time.perf_counter()

    def log(line: str) -> None:
        print(f"[{time.perf_counter() - started:6.1f} s] {prefix}{line}", flush=True)

    return log


def percentile(values: Sequence[float | None], q: float) -> float | None:
    """The q-quantile (0..1) with linear interpolation between closest ranks, over the
    values that exist; None when none do."""
    present = sorted(v for v in values if v is not None and math.isfinite(v))
    if not present:
        return None
    position = q * (len(present) - 1)
    low = math.floor(position)
    high = min(low + 1, len(present) - 1)
    return present[low] + (present[high] - present[low]) * (position - low)


def fmt(value: float | None, digits: int = 1, suffix: str = "") -> str:
    """A table cell: the number, or n/a when it could not be measured."""
    if value is None or not math.isfinite(value):
        return "n/a"
    return f"{value:.{digits}f}{suffix}"


def ratio(a: float | None, b: float | None) -> float | None:
    if a is None or b is None or not (math.isfinite(a) and math.isfinite(b)) or b <= 0:
        return None
    return a / b


def machine() -> dict[str, Any]:
    """The machine this bench runs on (recorded in every result file; imports MLX)."""
    import mlx.core as mx

    return {
        "platform": platform.platform(),
        "processor": platform.processor() or platform.machine(),
        "cpus": os.cpu_count(),
        "mlx_device": str(mx.default_device()),
        "python": platform.python_version(),
        "date": time.strftime("%Y-%m-%d %H:%M:%S"),
    }


def metadata(
    scenario: str, args: Any, backend: Any, facts: dict[str, Any], settings: Any = None
) -> dict[str, Any]:
    """The header of every result file."""
    return {
        "scenario": scenario,
        # load average at the start: on a shared machine, how much else was running
        "client_machine": {**machine(), "loadavg_1_5_15": _loadavg()},
        "backend": asdict(backend),
        "model": {"name": backend.model, **facts},
        "settings": asdict(settings) if settings is not None else {},
        "args": {k: str(v) for k, v in vars(args).items() if k != "run"},
    }


def _loadavg() -> list[float] | None:
    try:
        return [round(x, 2) for x in os.getloadavg()]
    except OSError:
        return None


def write_outputs(
    payload: dict[str, Any], table: str, args: Any, plot: Callable[[str], bool] | None
) -> None:
    """Print the table; write `--out` JSON (table included), `--markdown` and `--plot`."""
    print(table, flush=True)
    payload["table"] = table
    if getattr(args, "out", None):
        Path(args.out).write_text(json.dumps(payload, indent=2, default=str))
        print(f"json: {args.out}")
    if getattr(args, "markdown", None):
        Path(args.markdown).write_text(table + "\n")
        print(f"markdown: {args.markdown}")
    if getattr(args, "plot", None) and plot is not None:
        if plot(str(args.plot)):
            print(f"plot: {args.plot}")
        else:
            print("plot: skipped (matplotlib is not installed: pip install '.[bench]')")


@dataclass
class ColdWarm:
    """Cold and warm streams of one point of a cold-vs-warm sweep (an image size, a system
    prompt): medians, p95s and their ratio, TTFT apart from decode speed."""

    cold: list[Stream] = field(default_factory=list)
    warm: list[Stream] = field(default_factory=list)

    def summary(self) -> dict[str, Any]:
        ok_cold = [s for s in self.cold if not s.error]
        ok_warm = [s for s in self.warm if not s.error]
        cold_ms = median([s.ttft_ms for s in ok_cold])
        warm_ms = median([s.ttft_ms for s in ok_warm])
        return {
            "prompt_tokens": median([s.prompt_tokens or None for s in ok_cold]),
            "warm_cached_tokens": median([s.cached_tokens for s in ok_warm]),
            "generated_tokens": median([s.completion_tokens for s in ok_cold + ok_warm]),
            "cold_ttft_ms": cold_ms,
            "cold_ttft_p95_ms": percentile([s.ttft_ms for s in ok_cold], 0.95),
            "warm_ttft_ms": warm_ms,
            "warm_ttft_p95_ms": percentile([s.ttft_ms for s in ok_warm], 0.95),
            "cold_over_warm": ratio(cold_ms, warm_ms),
            "decode_tok_s": median([s.tok_s for s in ok_cold + ok_warm]),
            "errors": [s.error for s in self.cold + self.warm if s.error][:3],
            "cold_samples_ms": [s.ttft_ms for s in self.cold],
            "warm_samples_ms": [s.ttft_ms for s in self.warm],
        }
