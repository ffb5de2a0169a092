"""`python -m bench ...`: argparse -> bench runs.

Each bench starts its own server(s) on 127.0.0.1 (a subprocess of this installation), so the
numbers include HTTP, JSON, image decoding and hashing, exactly what a client sees. The
client-side ones (repeat-image, stall, load and the tables in `cli_tables`) can instead measure
any OpenAI-compatible server with `--base-url URL --model NAME`.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import logging
import sys
import time
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from bench import agent_loop_cli, embeddings_cli, repeat_audio
from bench.cli_tables import add_table_parsers, add_target_options
from bench.target import local_model, open_target

if TYPE_CHECKING:
    from gateway.config import CacheConfig, EngineConfig, MediaConfig, ServerConfig

PROG = "python -m bench"


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog=PROG,
        description="Benchmarks of vision-gateway (or any OpenAI-compatible server) from a "
        "checkout: bounded in requests and time, on 127.0.0.1 unless --base-url says otherwise.",
    )
    add_commands(parser.add_subparsers(dest="bench", required=True))
    return parser


def main(argv: Sequence[str] | None = None) -> None:
    """Parse `argv` (default: sys.argv), then run the one bench it names."""
    from gateway.config import ConfigError

    args = build_parser().parse_args(argv)
    logging.basicConfig(level="INFO", format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    require_plotting(args)
    try:
        args.run(args)
    except ConfigError as exc:  # a bad --server-arg, as `serve` would reject it
        sys.exit(f"{PROG}: {exc}")


def require_plotting(args: argparse.Namespace) -> None:
    """A bench asked for a plot fails before it runs, not silently after, without matplotlib."""
    if getattr(args, "plot", None) is None:
        return
    if importlib.util.find_spec("matplotlib") is None:
        sys.exit(
            f"{PROG}: --plot needs matplotlib: pip install -e '.[bench]' (or leave out --plot)"
        )


def add_commands(kinds: argparse._SubParsersAction) -> None:
    """Every bench as a subcommand of `kinds`; each sets `run` to its entry point."""
    _client_parsers(kinds)
    _engine_parsers(kinds)
    add_table_parsers(kinds, _common)
    agent_loop_cli.add_parser(kinds, _common)
    repeat_audio.add_parser(kinds, _common)
    embeddings_cli.add_parser(kinds, _common)


def _client_parsers(kinds: argparse._SubParsersAction) -> None:
    """repeat-image, stall, load: our server(s) started here, or `--base-url`'s."""
    p = kinds.add_parser("repeat-image", help="TTFT of repeat questions, caches on/off/ablation")
    _common(p)
    add_target_options(p)
    p.add_argument("--images", type=int, default=3, help="distinct images (conversations)")
    p.add_argument("--image-size", type=int, default=448)
    p.add_argument("--max-tokens", type=int, default=16)
    p.add_argument(
        "--think-ms",
        type=float,
        default=0.0,
        help="pause between a turn's last token and the next turn (a person reading; default 0: "
        "the next turn at once, as an agent loop sends it)",
    )
    p.add_argument(
        "--configs",
        default="none,vision only,prefix only,both",
        help="comma-separated cache configurations to run: none, vision only, prefix only, both "
        "(with --base-url: the one configuration the server runs)",
    )
    p.add_argument("--plot", type=Path, help="write a PNG plot (needs matplotlib)")
    p.add_argument("--markdown", type=Path, help="write the markdown table")
    p.set_defaults(run=_repeat_image)

    p = kinds.add_parser("stall", help="inter-token gaps of text streams while an image joins")
    _common(p)
    add_target_options(p)
    p.add_argument("--streams", type=int, default=4)
    p.add_argument("--image-size", type=int, nargs="+", default=[448])
    p.add_argument("--prefill-chunk", type=int, nargs="+", default=[512])
    p.add_argument("--max-tokens", type=int, default=160, help="per text stream")
    p.add_argument(
        "--images",
        type=int,
        default=1,
        help="cold image requests sent together (2: issue 30's two images into running streams)",
    )
    p.add_argument("--markdown", type=Path, help="write the markdown table")
    p.set_defaults(run=_stall)

    p = kinds.add_parser("multi-turn", help="follow-up turns with and without answer prefill")
    _common(p)
    add_target_options(p)
    p.add_argument("--conversations", type=int, default=3, help="distinct images")
    p.add_argument("--turns", type=int, default=5)
    p.add_argument("--image-size", type=int, default=448)
    p.add_argument("--max-tokens", type=int, default=64, help="per answer")
    p.add_argument("--think-ms", type=float, default=200, help="pause before each next turn")
    p.add_argument("--streams", type=int, default=4, help="text streams decoding meanwhile")
    p.add_argument("--stream-tokens", type=int, default=1500, help="per text stream")
    p.add_argument("--markdown", type=Path, help="write the markdown table")
    p.set_defaults(run=_multi_turn)

    p = kinds.add_parser(
        "model-load", help="several models: first token of an unloaded model, after a reload"
    )
    _common(p)
    p.add_argument("--other-model", help="the second model (default: a tiny Qwen3 text model)")
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--image-size", type=int, default=448)
    p.add_argument("--pause-s", type=float, default=2.0, help="between two models' requests")
    p.add_argument("--markdown", type=Path, help="write the markdown table")
    p.set_defaults(run=_model_load)

    p = kinds.add_parser("load", help="N clients mixing text and image requests for M seconds")
    _common(p)
    add_target_options(p)
    p.add_argument("--clients", type=int, default=32)
    p.add_argument("--seconds", type=float, default=120.0)
    p.add_argument("--image-pool", type=int, default=24, help="distinct images in rotation")
    p.add_argument("--image-size", type=int, default=112)
    p.add_argument("--kv-cache-mb", type=float, default=8, help="small, so eviction happens")
    p.add_argument("--vision-cache-mb", type=float, default=2)
    p.add_argument("--label", default="this run", help="this run's name in --out and plots")
    p.add_argument("--plot", type=Path, help="write RSS over time as a PNG (needs matplotlib)")
    p.add_argument(
        "--compare",
        type=Path,
        nargs="*",
        default=[],
        help="earlier --out files whose RSS series go on the same plot",
    )
    p.set_defaults(run=_load)


def _engine_parsers(kinds: argparse._SubParsersAction) -> None:
    """engine (in-process, no HTTP) and hotpath (raw MLX, then our server through HTTP)."""
    p = kinds.add_parser("engine", help="engine alone (no HTTP): TTFT stages and decode steps")
    _common(p)
    p.add_argument("--image-size", type=int, default=448)
    p.add_argument("--batch", type=int, nargs="+", default=[1, 16, 32])
    p.add_argument("--decode-tokens", type=int, default=128, help="timed tokens per row")
    p.add_argument("--reps", type=int, default=5, help="repetitions per figure (median)")
    p.add_argument(
        "--raw",
        action="store_true",
        help="first measure raw MLX on the same weights (no gateway) and print ratios",
    )
    p.set_defaults(run=_engine)

    p = kinds.add_parser(
        "sampling", help="engine alone: n > 1 choices (TTFT, decode) and logit shaping cost"
    )
    _common(p)
    p.add_argument("--n", type=int, default=8, help="choices of the n > 1 request")
    p.add_argument("--batch", type=int, nargs="+", default=[1, 8, 32])
    p.add_argument("--prompt-tokens", type=int, default=512)
    p.add_argument("--decode-tokens", type=int, default=64, help="timed tokens per row")
    p.add_argument("--reps", type=int, default=3, help="repetitions per figure (median)")
    p.set_defaults(run=_sampling)

    p = kinds.add_parser(
        "hotpath", help="raw MLX ceiling, then the server through HTTP: every figure a ratio"
    )
    _common(p)
    p.add_argument("--quick", action="store_true", help="tiny sizes (CPU, tests)")
    p.add_argument("--plot", type=Path, help="write the ratios as a PNG (needs matplotlib)")
    p.add_argument("--budget-s", type=float, help="skip scenarios not started by then (s)")
    p.add_argument(
        "--only",
        action="append",
        default=[],
        metavar="NAME",
        help="run only the scenarios whose name starts with NAME (repeatable; e.g. 'decode')",
    )
    p.add_argument(
        "--no-raw-after",
        dest="raw_after",
        action="store_false",
        help="skip re-measuring raw decode after the server (the drift check)",
    )
    p.set_defaults(run=_hotpath)


def _common(p: argparse.ArgumentParser) -> None:
    p.add_argument("--model", help="model dir or hub id (default: the embedded tiny model)")
    p.add_argument("--server-arg", action="append", default=[], help="extra serve flag")
    p.add_argument("--out", type=Path, help="write results as JSON")


def _multi_turn(args: argparse.Namespace) -> None:
    from bench.cli_client import multi_turn

    multi_turn(args)


def _repeat_image(args: argparse.Namespace) -> None:
    from bench.cli_client import repeat_image

    repeat_image(args)


def _stall(args: argparse.Namespace) -> None:
    from bench.cli_client import stall

    stall(args)


def _model_load(args: argparse.Namespace) -> None:
    from bench import model_load
    from bench.report import machine

    first = local_model(args)
    other = args.other_model or str(_tiny("qwen3"))
    result = model_load.run(
        first, other, args.rounds, args.image_size, args.server_arg, args.pause_s
    )
    text = model_load.table(result)
    print(text)
    if args.markdown:
        args.markdown.write_text(text + "\n")
    if args.out:
        payload = {"machine": machine(), "models": [first, other], **model_load.quick(result)}
        args.out.write_text(json.dumps(payload, indent=2))


def _tiny(arch: str) -> Path:
    """A tiny random-weight checkpoint of `arch`, built once into the user cache."""
    from gateway.offline_model import ensure_model

    return ensure_model(arch)


def _load(args: argparse.Namespace) -> None:
    import asyncio

    from bench.load import plot_rss, run_load
    from bench.report import machine

    if args.clients > 256 or args.seconds > 3600:
        raise SystemExit("bench load is bounded: at most 256 clients and 3600 s")

    extra = ["--kv-cache-mb", str(args.kv_cache_mb), "--vision-cache-mb", str(args.vision_cache_mb)]
    with open_target(args, [*extra, "--max-waiting", str(4 * args.clients)]) as (server, be, _):
        print(f"{args.clients} clients for {args.seconds:.0f} s against {server.base_url}")
        report = asyncio.run(
            run_load(server, be.model, args.clients, args.seconds, args.image_pool, args.image_size)
        )
        server_stats = server.metrics()
        clean = server.stop()  # None for a --base-url server (not ours to stop)
    model = args.model or be.details.get("model_card", {}).get("root")
    summary = report.summary()
    summary["clean_shutdown"] = clean
    summary["decode_steps"] = server_stats.get("vision_gateway_decode_steps_total")
    summary["generation_tokens"] = server_stats.get("vision_gateway_generation_tokens_total")
    for gauge in ("active", "cache", "peak"):  # MLX's own memory, to read RSS against
        value = server_stats.get(f"vision_gateway_mlx_{gauge}_bytes", 0.0)
        summary[f"mlx_{gauge}_mb_at_end"] = round(value / 2**20, 1)
    print(json.dumps(summary, indent=2))
    summary["label"] = args.label
    summary["rss_mb_series"] = report.rss_series()
    if args.out:
        args.out.write_text(json.dumps({"machine": machine(), "model": model, **summary}, indent=2))
    if args.plot:
        series = {}
        for earlier in args.compare:
            data = json.loads(earlier.read_text())
            series[data.get("label", earlier.stem)] = data.get("rss_mb_series", [])
        series[args.label] = summary["rss_mb_series"]
        if plot_rss(series, str(args.plot)):
            print(f"plot: {args.plot}")


def _engine_cache_config(model: str, serve_flags: list[str]) -> CacheConfig:
    """The cache settings (exact reuse, block size, budgets) that `serve` would build from
    these flags: `bench engine --server-arg` measures the engine under them (the disk tier
    only if they name a --cache-dir, as bench.server.LocalServer does)."""
    from bench.server import memory_only_unless_asked

    flags = memory_only_unless_asked(serve_flags)
    return _serve_configs(["--model", model, *flags])[1].cache


def _serve_configs(flags: list[str]) -> tuple[ServerConfig, EngineConfig, MediaConfig]:
    """(ServerConfig, EngineConfig, MediaConfig) that `vision-gateway serve FLAGS` would run
    with: the product's own flag parser and its one argparse -> config conversion."""
    from gateway.flags import add_serve_flags, configs_from_args

    parser = argparse.ArgumentParser(prog=f"{PROG} (--server-arg)")
    add_serve_flags(parser)
    return configs_from_args(parser.parse_args(flags))


def _sampling(args: argparse.Namespace) -> None:
    from bench import sampling

    model = local_model(args)
    out = sampling.run(model, args.n, args.batch, args.prompt_tokens, args.decode_tokens, args.reps)
    print(sampling.report(out))
    if args.out:
        args.out.write_text(json.dumps(sampling.quick(out), indent=2))


def _engine(args: argparse.Namespace) -> None:
    import gc

    import mlx.core as mx

    from bench.engine_profile import Profiler
    from bench.raw_measure import RawSettings
    from bench.report import machine

    model = local_model(args)
    settings = RawSettings(
        batches=tuple(args.batch), decode_tokens=args.decode_tokens, reps=args.reps
    )
    raw: dict[str, Any] = {}
    if args.raw:
        from bench import hotpath
        from bench import raw as raw_bench

        root = hotpath.model_dir(model)
        raw_settings = settings
        if raw_bench.is_vision_checkpoint(root):  # the warm-TTFT prefix: the image prompt
            prefix = hotpath.image_prompt_tokens(root, args.image_size)
            raw_settings = replace(settings, prefix_tokens=prefix)
        raw = raw_bench.run(root, raw_settings, log=print)
        gc.collect()
        mx.clear_cache()  # the raw model's buffers, before the engine loads its own copy
    cache = _engine_cache_config(model, args.server_arg)
    profiler = Profiler(model, max_batch=max(64, *args.batch), cache=cache)
    results = profiler.run(args.image_size, settings)
    if raw:
        from bench.engine_profile import compare_rows
        from bench.hotpath_report import table

        print(table(compare_rows(results, raw)))
    else:
        for key, value in results.items():
            print(f"{key:28s} {value:10.2f}")
    if args.out:
        payload = {"machine": machine(), "model": model, "server_args": args.server_arg,
                   **results, "raw": raw}  # fmt: skip
        args.out.write_text(json.dumps(payload, indent=2))


def _hotpath(args: argparse.Namespace) -> None:
    from bench import hotpath
    from bench.hotpath_report import Row, plot

    settings = hotpath.QUICK if args.quick else hotpath.HotpathSettings()
    if args.budget_s is not None:
        settings = replace(settings, budget_s=args.budget_s)
    if args.only:
        settings = replace(settings, only=tuple(args.only))
    settings = replace(settings, raw_after=args.raw_after)
    started = time.perf_counter()

    def log(line: str) -> None:
        print(f"[{time.perf_counter() - started:6.1f} s] {line}", flush=True)

    def save(payload: dict[str, Any]) -> None:  # after every step: a kill loses little
        payload["args"] = {k: str(v) for k, v in vars(args).items() if k != "run"}
        if args.out:
            args.out.write_text(json.dumps(payload, indent=2))

    payload = hotpath.run(local_model(args), settings, log, args.server_arg, args.quick, save)
    print(payload["table"], flush=True)
    if args.out:
        print(f"json: {args.out}")
    if args.plot and plot([Row.from_dict(r) for r in payload["rows"]], str(args.plot)):
        print(f"plot: {args.plot}")
