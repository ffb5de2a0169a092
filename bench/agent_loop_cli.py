"""`python -m bench agent-loop`: its flags and the run over the cache configurations
(bench.agent_loop has the loop itself)."""

from __future__ import annotations

import argparse
from collections.abc import Callable
from pathlib import Path
from typing import Any


def add_parser(kinds: argparse._SubParsersAction, common: Callable[[Any], None]) -> None:
    from bench.cli_tables import add_target_options

    p = kinds.add_parser(
        "agent-loop", help="screenshot agent loop: per-turn TTFT with caches on vs off"
    )
    common(p)
    add_target_options(p)
    p.add_argument("--turns", type=int, default=10)
    p.add_argument("--image-size", type=int, default=1024, help="screenshot side (px)")
    p.add_argument("--max-tokens", type=int, default=64, help="room for one call")
    p.add_argument(
        "--configs",
        default="caches on,caches off",
        help="comma-separated: 'caches on', 'caches off' (with --base-url: the server's own)",
    )
    p.add_argument("--plot", type=Path, help="write TTFT per turn as a PNG (needs matplotlib)")
    p.add_argument("--markdown", type=Path, help="write the markdown table")
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> None:
    from bench import agent_loop as bench
    from bench import report
    from bench.target import open_target

    if not 1 <= args.turns <= 50:
        raise SystemExit("bench agent-loop is bounded: 1 to 50 turns")
    log = report.progress("agent-loop: ")
    names = ["as served"] if args.base_url else [n.strip() for n in args.configs.split(",")]
    results: dict[str, list[Any]] = {}
    meta: dict[str, Any] = {}
    for name in names:
        log(f"config '{name}': starting")
        flags = [] if args.base_url else bench.CONFIGS[name]
        with open_target(args, flags) as (target, backend, facts):
            meta = meta or report.metadata("agent-loop", args, backend, facts)
            results[name] = bench.run_loop(
                target, backend.model, args.turns, args.image_size, args.max_tokens, log
            )
    differ = bench.differing_calls(results)
    payload = {
        **meta,
        "image_size": args.image_size,
        "turns": args.turns,
        "results": {n: [r.__dict__ for r in rows] for n, rows in results.items()},
        "differing_calls": differ,
    }
    table = bench.markdown(results)
    report.write_outputs(payload, table, args, lambda path: bench.plot(results, path))
    if differ:
        raise SystemExit(f"the calls differ with the caches on and off at turns {differ}")
