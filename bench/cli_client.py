"""`bench repeat-image` and `bench stall`: our server(s) started here, or `--base-url`'s.

With `--base-url` these degrade to what the target offers: repeat-image runs the one cache
configuration the server has (the ablation needs our `--no-*-cache` flags, and its answer
check needs a no-cache reference), `Server-Timing` columns read n/a, and stall's tokens per
decode step (from our `/metrics`) reads n/a.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any


def repeat_image(args: argparse.Namespace) -> None:
    from bench import repeat_image as bench
    from bench import report
    from bench.target import open_target

    log = report.progress("repeat-image: ")
    names = [n.strip() for n in args.configs.split(",")]
    if args.base_url:
        names = ["as served"]
    results, meta = {}, {}
    for name in names:
        log(f"config '{name}': starting" + ("" if args.base_url else " server"))
        flags = [] if args.base_url else bench.CONFIGS[name]
        with open_target(args, flags) as (target, backend, facts):
            meta = meta or report.metadata("repeat-image", args, backend, facts)
            results[name] = bench.run_config(
                target, backend.model, name, args.images, args.image_size, args.max_tokens, log,
                think_s=args.think_ms / 1000,
            )  # fmt: skip
    reference = results.get("none")
    mismatches = (
        {n: bench.compare_answers(reference, r) for n, r in results.items()} if reference else {}
    )
    table = bench.markdown(results, mismatches)
    meta["cache_state"] = {"configurations": {n: bench.CONFIGS.get(n) for n in names}}
    payload = {
        **meta,
        "image_size": args.image_size,
        "think_ms": args.think_ms,
        "results": {
            n: {
                "ttft_ms": r.ttft_ms,
                "cached_tokens": r.cached_tokens,
                "prompt_tokens": r.prompt_tokens,
                "generated_tokens": r.generated_tokens,
                "decode_tok_s": r.decode_tok_s,
                "server_pre_admission_ms": r.server_ms,
            }
            for n, r in results.items()
        },
        "mismatches": mismatches,
    }
    report.write_outputs(payload, table, args, lambda path: bench.plot(results, path))
    if any(differ for differ, _ in mismatches.values()):
        raise SystemExit("cached answers differ from uncached answers")


def multi_turn(args: argparse.Namespace) -> None:
    from bench import multi_turn as bench
    from bench import report
    from bench.target import open_target

    log = report.progress("multi-turn: ")
    results: dict[str, Any] = {}
    meta: dict[str, Any] = {}
    names = ["as served"] if args.base_url else list(bench.CONFIGS)
    for name in names:
        log(f"config '{name}': starting")
        with open_target(args, bench.CONFIGS.get(name, [])) as (target, backend, facts):
            meta = meta or report.metadata("multi-turn", args, backend, facts)
            results[name] = bench.run_config(target, backend.model, name, args, log)
    table = "\n".join([bench.HEADER, *(bench.row(n, r) for n, r in results.items())])
    differ = bench.answers_differ(*results.values()) if len(results) == 2 else 0
    table += f"\n\nanswers differing between the configurations: {differ}"
    rows = {
        n: {**{k: v for k, v in r.items() if k not in ("conversations", "during")},
            "turns": bench.per_turn(r)}
        for n, r in results.items()
    }  # fmt: skip
    report.write_outputs({**meta, "results": rows, "answers_differ": differ}, table, args, None)
    if differ:
        raise SystemExit("answers differ between the configurations")


def stall(args: argparse.Namespace) -> None:
    from bench import report
    from bench import stall as bench
    from bench.target import open_target

    log = report.progress("stall: ")
    rows: list[Any] = []
    meta: dict[str, Any] = {}
    chunks = [None] if args.base_url else args.prefill_chunk
    for chunk in chunks:
        flags = [] if chunk is None else ["--prefill-chunk", str(chunk)]
        log(f"prefill chunk {chunk or 'as served'}: starting")
        with open_target(args, flags) as (target, backend, facts):
            meta = meta or report.metadata("stall", args, backend, facts)
            for size in args.image_size:
                rows.append(
                    bench.run_stall(
                        target,
                        backend.model,
                        chunk,
                        args.streams,
                        size,
                        args.max_tokens,
                        log=log,
                        images=args.images,
                    )
                )
    table = "\n".join([bench.HEADER, *(r.row() for r in rows)])
    report.write_outputs({**meta, "rows": [r.__dict__ for r in rows]}, table, args, None)


def load_series(paths: list[Path]) -> dict[str, Any]:
    """label -> payload of earlier --out files (for side-by-side reports)."""
    out = {}
    for path in paths:
        data = json.loads(path.read_text())
        backend = data.get("backend", {})
        out[f"{backend.get('name', path.stem)} {backend.get('version', '')}".strip()] = data
    return out
