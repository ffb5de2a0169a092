"""`python -m bench resolution | text-prefix | concurrency`, and the target options.

Every client-side bench takes `--base-url URL --model NAME` to measure a server started
elsewhere; without `--base-url` it starts our server here (`--model` is then the checkpoint,
default the embedded tiny model) and stops it at the end.
"""

from __future__ import annotations

import argparse
import asyncio
import json
from pathlib import Path
from typing import Any


def add_target_options(p: argparse.ArgumentParser) -> None:
    """--base-url and friends (with `_common`'s --model, --server-arg, --out)."""
    p.add_argument(
        "--base-url",
        help="measure the OpenAI-compatible server at URL (e.g. http://127.0.0.1:8080) instead "
        "of starting ours; --model is then the model name requests carry",
    )
    p.add_argument("--api-key", default="unused", help="bearer key for --base-url")
    p.add_argument(
        "--backend-label", help="backend name and version for the report, e.g. 'mlx-vlm 0.7.10'"
    )
    p.add_argument("--server-pid", type=int, help="--base-url server's pid (RSS, where local)")


def add_table_parsers(kinds: argparse._SubParsersAction, common: Any) -> None:
    p = kinds.add_parser("resolution", help="cold vs warm TTFT at 224, 448, 768, 1024 px")
    _table(p, common)
    p.add_argument("--sizes", type=int, nargs="+", default=[224, 448, 768, 1024])
    p.add_argument("--reps", type=int, default=3, help="cold/warm pairs per size")
    p.add_argument("--max-tokens", type=int, default=16)
    p.set_defaults(run=_resolution)

    p = kinds.add_parser("text-prefix", help="TTFT with a shared 512-token system prompt")
    _table(p, common)
    p.add_argument("--prefix-tokens", type=int, default=512)
    p.add_argument("--reps", type=int, default=5, help="cold/warm pairs")
    p.add_argument("--max-tokens", type=int, default=16)
    p.set_defaults(run=_text_prefix)

    p = kinds.add_parser("concurrency", help="tok/s and TTFT at 1..32 streams, next to raw mlx-lm")
    _table(p, common)
    p.add_argument("--levels", type=int, nargs="+", default=[1, 2, 4, 8, 16, 32])
    p.add_argument("--max-tokens", type=int, default=64, help="generated per stream")
    p.add_argument("--image-size", type=int, default=224)
    p.add_argument("--modes", nargs="+", choices=["text", "image"], default=["text", "image"])
    p.add_argument("--reps", type=int, default=1, help="timed waves per level (median)")
    p.add_argument("--no-raw", action="store_true", help="skip raw mlx-lm BatchGenerator")
    p.add_argument("--raw-model", type=Path, help="checkpoint dir for raw (with --base-url)")
    p.add_argument(
        "--raw-json",
        type=Path,
        help="use this earlier `python -m bench.raw` output instead of measuring raw",
    )
    p.add_argument("--ttft-plot", type=Path, help="write TTFT p50/p95 as a PNG")
    p.set_defaults(run=_concurrency)


def _table(p: argparse.ArgumentParser, common: Any) -> None:
    common(p)
    add_target_options(p)
    p.add_argument("--markdown", type=Path, help="write the markdown table")
    p.add_argument("--plot", type=Path, help="write a PNG plot (needs matplotlib)")


def _measure(
    args: argparse.Namespace, name: str, settings: Any, body: Any, extra: list[str] | None = None
) -> tuple[dict[str, Any], Any]:
    """Open the target, record cache state around `body(client, log)`, write outputs."""
    from bench import report
    from bench.sse import ChatClient
    from bench.target import cache_stats, clear_caches, open_target

    log = report.progress(f"{name}: ")
    with open_target(args, extra) as (target, backend, facts):
        log(f"target {backend.name} {backend.version} at {backend.base_url} ({backend.model})")
        meta = report.metadata(name, args, backend, facts, settings)
        meta["cache_state"] = {"cleared_at_start": clear_caches(target, backend)}
        meta["cache_state"]["stats_before"] = cache_stats(target, backend)

        async def go() -> Any:
            client = ChatClient.open(backend.base_url, backend.model, args.api_key)
            try:
                result = await body(client, log)
            finally:
                await client.aclose()
            meta["client"] = {
                "refused_fields": sorted(client.dropped),
                "tokens_counted_by_chunks": client.counted_by_chunks,
            }
            return result

        result = asyncio.run(go())
        meta["cache_state"]["stats_after"] = cache_stats(target, backend)
    return meta, result


def _resolution(args: argparse.Namespace) -> None:
    from bench import report, resolution

    settings = resolution.ResolutionSettings(tuple(args.sizes), args.reps, args.max_tokens)
    meta, rows = _measure(
        args, "resolution", settings, lambda c, log: resolution.run(c, settings, log)
    )
    label = _label(meta)
    report.write_outputs(
        {**meta, "rows": rows},
        resolution.markdown(rows),
        args,
        lambda path: resolution.plot({label: rows}, path),
    )
    print(f"cold / warm: {resolution.speedups(rows)}")


def _text_prefix(args: argparse.Namespace) -> None:
    from bench import report, text_prefix

    settings = text_prefix.TextPrefixSettings(args.prefix_tokens, args.reps, args.max_tokens)
    meta, summary = _measure(
        args, "text-prefix", settings, lambda c, log: text_prefix.run(c, settings, log)
    )
    label = _label(meta)
    report.write_outputs(
        {**meta, "result": summary},
        text_prefix.markdown(summary),
        args,
        lambda path: text_prefix.plot({label: summary}, path),
    )


def _concurrency(args: argparse.Namespace) -> None:
    from bench import concurrency, report
    from bench.target import local_model

    settings = concurrency.ConcurrencySettings(
        tuple(args.levels), args.max_tokens, args.image_size, tuple(args.modes), args.reps
    )
    raw: dict[str, Any] = {}
    if args.raw_json:
        raw = json.loads(args.raw_json.read_text().strip().splitlines()[-1])
    elif not args.no_raw:
        root = args.raw_model or (None if args.base_url else Path(local_model(args)))
        if root is None:
            print("raw: skipped (with --base-url, name the checkpoint with --raw-model DIR)")
        else:
            raw = concurrency.raw_ceiling(root, settings, report.progress("raw: "))
    rows_at_once = str(max(settings.levels))  # our server started here: room for every stream
    flags = ["--max-batch", rows_at_once, "--max-waiting", str(4 * max(settings.levels))]
    meta, rows = _measure(
        args, "concurrency", settings, lambda c, log: concurrency.run(c, settings, raw, log), flags
    )
    label = _label(meta)
    report.write_outputs(
        {**meta, "raw": raw, "rows": rows},
        concurrency.markdown(rows),
        args,
        lambda path: concurrency.plot_throughput({label: rows}, path),
    )
    if args.ttft_plot and concurrency.plot_ttft({label: rows}, str(args.ttft_plot)):
        print(f"plot: {args.ttft_plot}")


def _label(meta: dict[str, Any]) -> str:
    backend = meta["backend"]
    return f"{backend['name']} {backend['version']}".strip()
