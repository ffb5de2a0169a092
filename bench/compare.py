"""Side by side: several backends' `--out` files of one scenario -> one table and one plot.

`python -m bench.compare FILE.json... [--markdown M.md] [--plot P.png]
[--ttft-plot T.png]` (all files of one scenario: repeat-image, resolution, text-prefix,
concurrency or stall). Each file's own table gets a leading backend column (its recorded
backend name and version, or `--labels`), so every figure keeps the meaning it has in the
single-backend table. Also turns a JSON brought back from another machine (no matplotlib
there) into its plot.
"""

from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path
from typing import Any

from bench.plots import bar_plot


def label(data: dict[str, Any], fallback: str) -> str:
    backend = data.get("backend") or {}
    name = f"{backend.get('name', '')} {backend.get('version', '')}".strip()
    return name or fallback


def side_by_side(tables: dict[str, str]) -> str:
    """Markdown tables of the same columns, one per backend -> one table with a backend
    column (header and separator from the first)."""
    out: list[str] = []
    for name, table in tables.items():
        lines = [line for line in table.strip().splitlines() if line.startswith("|")]
        if not out:
            out += ["| backend " + lines[0], "|---" + lines[1]]
        out += [f"| {name} " + line for line in lines[2:]]
    return "\n".join(out)


def plot(scenario: str, series: dict[str, dict[str, Any]], path: str, ttft: bool) -> bool:
    """The scenario's plot with one series per backend (label -> its --out payload)."""
    from bench import concurrency, resolution, text_prefix

    if scenario == "resolution":
        return resolution.plot({k: v["rows"] for k, v in series.items()}, path)
    if scenario == "text-prefix":
        return text_prefix.plot({k: v["result"] for k, v in series.items()}, path)
    if scenario == "concurrency":
        rows = {k: v["rows"] for k, v in series.items()}
        draw = concurrency.plot_ttft if ttft else concurrency.plot_throughput
        return draw(rows, path)
    if scenario == "repeat-image":
        groups = {}
        for name, data in series.items():
            for config, r in data["results"].items():
                key = name if config == "as served" else f"{name}\n{config}"
                warm = [t for turn in ("2", "3", "4", "5") for t in r["ttft_ms"][turn]]
                groups[key] = {
                    "turn 1 (cold)": statistics.median(r["ttft_ms"]["1"]),
                    "turns 2-5 (warm)": statistics.median(warm),
                }
        return bar_plot(
            groups, path, ylabel="median TTFT (ms)", title="Repeat questions about one image",
            log_y=True,
        )  # fmt: skip
    if scenario == "stall":
        groups = {}
        for name, data in series.items():
            for r in data["rows"]:
                groups[f"{name}\n{r['image_size']}px"] = {
                    "median gap before": r["baseline_gap_ms"],
                    "median gap during admission": r["admission_median_gap_ms"],
                    "max gap during admission": r["admission_max_gap_ms"],
                }
        return bar_plot(
            groups, path, ylabel="inter-token gap of running text streams (ms)",
            title="Text streams while a cold image request is admitted",
        )  # fmt: skip
    raise ValueError(f"no plot for scenario {scenario!r}")


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="python -m bench.compare", description=__doc__)
    p.add_argument("files", type=Path, nargs="+")
    p.add_argument("--labels", nargs="+", help="one per file (default: the recorded backend)")
    p.add_argument("--markdown", type=Path)
    p.add_argument("--plot", type=Path)
    p.add_argument("--ttft-plot", type=Path, help="concurrency: TTFT p50/p95 instead")
    args = p.parse_args(argv)
    payloads = [json.loads(f.read_text()) for f in args.files]
    scenarios = {d.get("scenario") for d in payloads}
    if len(scenarios) != 1:
        raise SystemExit(f"files of one scenario, please (got {sorted(map(str, scenarios))})")
    scenario = scenarios.pop()
    labels = args.labels or [label(d, f.stem) for d, f in zip(payloads, args.files)]
    series = dict(zip(labels, payloads, strict=True))
    table = side_by_side({name: d["table"] for name, d in series.items()})
    print(table)
    if args.markdown:
        args.markdown.write_text(table + "\n")
    for path, ttft in ((args.plot, False), (args.ttft_plot, True)):
        if path and plot(scenario, series, str(path), ttft):
            print(f"plot: {path}")


if __name__ == "__main__":
    main()
