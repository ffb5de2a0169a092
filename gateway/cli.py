"""Command line: argv -> frozen config dataclasses, nothing else below this module."""

from __future__ import annotations

import argparse
import dataclasses
import importlib.metadata
import logging
import os
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from gateway.config import (
    CacheConfig,
    ConfigError,
    EngineConfig,
    MediaConfig,
    ResponsesConfig,
    ServerConfig,
)

EMBEDDED_NOTICE = (
    "This is the embedded tiny random-weight test model: its answers are noise. "
    "Start the server with --model <dir or hub id> to serve a real Qwen-VL model."
)


def default_disk_cache_dir() -> Path:
    """The disk tier's default folder: disk-cache/ in the user cache dir (where the embedded
    model is built too)."""
    from gateway.offline_model import cache_root

    return cache_root() / "disk-cache"


def _d(config: type, name: str) -> Any:
    """The default of a config dataclass field: the one source of defaults for the flags."""
    for f in dataclasses.fields(config):
        if f.name == name:
            if f.default is not dataclasses.MISSING:
                return f.default
            return f.default_factory()  # type: ignore[misc]
    raise KeyError(f"{config.__name__} has no field {name}")


class _DefaultsFormatter(argparse.HelpFormatter):
    """Appends "(default: X)" where there is a default to show and the help does not already
    say it (argparse's own formatter also prints "(default: None)" and repeats defaults that
    the help text spells out)."""

    def _get_help_string(self, action: argparse.Action) -> str:
        text = action.help or ""
        default = action.default
        if "default" in text or default in (None, False, [], argparse.SUPPRESS):
            return text
        if action.option_strings or action.nargs in (argparse.OPTIONAL, argparse.ZERO_OR_MORE):
            return f"{text} (default: %(default)s)"
        return text


def _version() -> str:
    try:
        return importlib.metadata.version("vision-gateway")
    except importlib.metadata.PackageNotFoundError:  # run from a source tree, not installed
        return "unknown"


def _serve_parser(
    sub: argparse._SubParsersAction,
    name: str = "serve",
    help: str = "run the server (OpenAI and Anthropic APIs)",
    description: str = "Serve a Qwen2/2.5/3-VL model with the OpenAI Chat Completions and the "
    "Anthropic Messages APIs.",
) -> argparse.ArgumentParser:
    """`serve`'s flags on a new subcommand (`cluster` has them all, passed to every replica)."""
    p = sub.add_parser(name, help=help, description=description, formatter_class=_DefaultsFormatter)
    a = p.add_argument
    a("--model", help="local model dir or hub id (default: the embedded tiny offline model)")
    a("--served-model-name", help="model name clients send (default: derived from --model)")
    a("--host", default=_d(ServerConfig, "host"), help="bind address")
    a("--port", type=int, default=_d(ServerConfig, "port"), help="TCP port")
    a(
        "--api-key",
        default=None,
        help="require the key as `Authorization: Bearer KEY` or `x-api-key: KEY` "
        "(env VISION_GATEWAY_API_KEY)",
    )
    a(
        "--metrics-api-key",
        default=None,
        help="separate key for /metrics (env VISION_GATEWAY_METRICS_API_KEY; default: --api-key)",
    )
    a("--max-batch", type=int, default=_d(EngineConfig, "max_batch"), help="rows decoding at once")
    a(
        "--max-waiting",
        type=int,
        default=_d(EngineConfig, "max_waiting"),
        help="requests queued beyond the running rows; more are refused "
        "(429, or 529 on /v1/messages)",
    )
    a(
        "--prefill-chunk",
        type=int,
        default=_d(EngineConfig, "prefill_chunk_tokens"),
        help="tokens per prefill chunk between decodes",
    )
    a(
        "--default-max-tokens",
        type=int,
        default=_d(EngineConfig, "default_max_tokens"),
        help="when a request sets none",
    )
    a(
        "--max-context",
        type=int,
        default=_d(EngineConfig, "max_context_tokens"),
        help="prompt + completion tokens",
    )
    a(
        "--mlx-cache-limit-mb",
        type=float,
        default=_d(EngineConfig, "mlx_cache_limit_mb"),
        help="cap MLX's pool of freed buffers (MiB); default: MLX's own limit",
    )
    a(
        "--vision-cache-mb",
        type=float,
        default=_d(CacheConfig, "vision_cache_mb"),
        help="vision-feature cache budget, MiB",
    )
    a(
        "--kv-cache-mb",
        type=float,
        default=_d(CacheConfig, "kv_cache_mb"),
        help="KV prefix cache budget, MiB",
    )
    a(
        "--grammar-cache-mb",
        type=float,
        default=64,
        help="compiled structured-output grammars cache budget, MiB (estimated sizes)",
    )
    a(
        "--cudnn-attention",
        action="store_true",
        help="use cuDNN attention on CUDA (fast for repeated shapes; plans a new one per length)",
    )
    a(
        "--in-process-engine",
        action="store_true",
        help="run the engine thread inside the HTTP process (one GIL: slower on a GPU)",
    )
    a(
        "--no-warmup",
        action="store_true",
        help="skip the start-up warm-up (the first requests then pay for kernel compilation)",
    )
    a(
        "--warmup-image-size",
        type=int,
        action="append",
        metavar="PX",
        help="square image size to warm up at start-up (repeatable; default: "
        f"{' and '.join(map(str, _d(EngineConfig, 'warmup_image_sizes')))})",
    )
    a(
        "--step-trace",
        type=Path,
        default=None,
        metavar="FILE",
        help="append one JSON line per engine step to FILE (stage times, rows; diagnostics)",
    )
    a("--no-vision-cache", action="store_true", help="disable the vision-feature cache")
    a("--no-prefix-cache", action="store_true", help="disable the KV prefix cache")
    a(
        "--cache-dir",
        type=Path,
        default=None,
        help="folder of the disk tier under both caches (vision features and KV blocks "
        "survive restarts; several servers may share it); default: disk-cache/ in the user "
        "cache dir ($VISION_GATEWAY_CACHE, else $XDG_CACHE_HOME/vision-gateway, else "
        "~/.cache/vision-gateway)",
    )
    a("--no-disk-cache", action="store_true", help="no disk tier: the caches live in memory only")
    a(
        "--disk-cache-gb",
        type=float,
        default=_d(CacheConfig, "disk_cache_gb"),
        help="disk tier budget for the whole --cache-dir, GiB; least recently used files go",
    )
    a(
        "--exact-cache",
        action=argparse.BooleanOptionalAction,
        default=_d(CacheConfig, "exact_reuse"),
        help="compute and reuse KV in fixed blocks so a cache hit is bit-identical to no "
        "cache on every backend (docs/caching.md); --no-exact-cache reuses any prefix",
    )
    a(
        "--kv-block-tokens",
        type=int,
        default=_d(CacheConfig, "kv_block_tokens"),
        help="block size (tokens) of --exact-cache: prefill forwards and KV reuse granularity; "
        "0: 256 on a GPU, 32 on CPU",
    )
    a(
        "--allowed-media-dir",
        action="append",
        default=[],
        metavar="DIR",
        help="serve local image paths under DIR (repeatable); none: paths are refused",
    )
    a(
        "--allow-private-urls",
        action="store_true",
        help="allow image URLs on loopback/private/link-local addresses (off: SSRF protection)",
    )
    a(
        "--allowed-url-host",
        action="append",
        default=[],
        metavar="HOST",
        help="only fetch image URLs from these hosts (repeatable)",
    )
    a(
        "--max-image-bytes",
        type=int,
        default=_d(MediaConfig, "max_image_bytes"),
        help="per image, bytes",
    )
    a(
        "--max-image-pixels",
        type=int,
        default=_d(MediaConfig, "max_image_pixels"),
        help="per image, checked from the header before decoding",
    )
    a(
        "--max-request-pixels",
        type=int,
        default=_d(MediaConfig, "max_request_pixels"),
        help="all images of one request together",
    )
    a(
        "--max-images-per-request",
        type=int,
        default=_d(MediaConfig, "max_images_per_request"),
        help="images in one request (more: 400)",
    )
    a(
        "--max-video-bytes",
        type=int,
        default=_d(MediaConfig, "max_video_bytes"),
        help="per video (the encoded clip), bytes (more: 413)",
    )
    a(
        "--max-video-seconds",
        type=float,
        default=_d(MediaConfig, "max_video_seconds"),
        help="per video, its length in seconds (longer: 413)",
    )
    a(
        "--max-video-frames",
        type=int,
        default=_d(MediaConfig, "max_video_frames"),
        help="frames sampled per video at most (a longer clip is sampled more sparsely)",
    )
    a(
        "--video-fps",
        type=float,
        default=_d(MediaConfig, "video_fps"),
        help="frames sampled per second of video (up to --max-video-frames)",
    )
    a(
        "--max-redirects",
        type=int,
        default=_d(MediaConfig, "max_redirects"),
        help="redirects followed per image URL",
    )
    a(
        "--max-body-bytes",
        type=int,
        default=_d(ServerConfig, "max_body_bytes"),
        help="request body cap, bytes (413 over it, checked before the body is read whole)",
    )
    a(
        "--max-inflight-body-mb",
        type=float,
        default=_d(ServerConfig, "max_inflight_body_mb"),
        help="request bodies being read at once, all requests together, MiB (over it: 429)",
    )
    a(
        "--shutdown-grace",
        type=float,
        default=_d(ServerConfig, "shutdown_grace_s"),
        help="seconds to finish running requests",
    )
    a(
        "--responses-max-stored",
        type=int,
        default=_d(ResponsesConfig, "max_stored"),
        help="Responses API: stored responses kept for previous_response_id (LRU; 0: none)",
    )
    a(
        "--responses-store-mb",
        type=float,
        default=_d(ResponsesConfig, "max_mb"),
        help="Responses API: MiB for stored conversations, their decoded images included",
    )
    a(
        "--responses-ttl-s",
        type=float,
        default=_d(ResponsesConfig, "ttl_s"),
        help="Responses API: seconds a stored response is kept (0: until evicted)",
    )
    a(
        "--log-level",
        default=_d(ServerConfig, "log_level"),
        choices=["debug", "info", "warning", "error"],
        help="log level of the server and the engine process",
    )
    return p


def _make_model_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "make-model",
        help="build a random-weight Qwen-VL checkpoint offline",
        description="Build a deterministic random-weight checkpoint that mlx_vlm.load accepts.",
        formatter_class=_DefaultsFormatter,
    )
    p.add_argument("out", type=Path, help="directory to write the checkpoint to")
    p.add_argument(
        "--arch",
        default="qwen2_vl",
        choices=["qwen2_vl", "qwen2_5_vl", "qwen3_vl"],
        help="architecture",
    )
    p.add_argument("--size", default="tiny", choices=["tiny", "7b"], help="shapes")
    p.add_argument("--seed", type=int, default=0, help="weights seed")
    p.add_argument(
        "--dtype",
        choices=["float32", "bfloat16", "float16"],
        help="weight dtype (default: float32 for tiny, bfloat16 for 7b)",
    )
    p.add_argument(
        "--quantize",
        type=int,
        choices=[4, 8],
        help="quantize the language model to this many bits with mlx-vlm's converter "
        "(as the mlx-community checkpoints are)",
    )
    p.add_argument(
        "--q-group-size", type=int, default=64, choices=[32, 64, 128], help="quantization groups"
    )


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="vision-gateway",
        description="OpenAI- and Anthropic-compatible gateway for vision-language models on "
        "MLX, with content-addressed vision-feature and KV caches.",
    )
    parser.add_argument("--version", action="version", version=f"%(prog)s {_version()}")
    sub = parser.add_subparsers(dest="command", required=True)
    _serve_parser(sub)
    from gateway.cluster.cli import add_cluster_parser

    add_cluster_parser(_serve_parser, sub)
    _make_model_parser(sub)
    from bench.cli import add_bench_parser

    add_bench_parser(sub)
    return parser


def configs_from_args(args: argparse.Namespace) -> tuple[ServerConfig, EngineConfig, MediaConfig]:
    """The one place argparse values become configuration."""
    server = ServerConfig(
        host=args.host,
        port=args.port,
        # Keys may come from the environment so they stay out of `ps` and shell history.
        api_key=args.api_key or os.environ.get("VISION_GATEWAY_API_KEY"),
        metrics_api_key=args.metrics_api_key or os.environ.get("VISION_GATEWAY_METRICS_API_KEY"),
        max_body_bytes=args.max_body_bytes,
        max_inflight_body_mb=args.max_inflight_body_mb,
        shutdown_grace_s=args.shutdown_grace,
        log_level=args.log_level,
        engine_process=not args.in_process_engine,
        responses=ResponsesConfig(
            max_stored=args.responses_max_stored,
            max_mb=args.responses_store_mb,
            ttl_s=args.responses_ttl_s,
        ),
    )
    cache = CacheConfig(
        vision_cache_mb=args.vision_cache_mb,
        kv_cache_mb=args.kv_cache_mb,
        grammar_cache_mb=args.grammar_cache_mb,
        vision_enabled=not args.no_vision_cache,
        prefix_enabled=not args.no_prefix_cache,
        exact_reuse=args.exact_cache,
        kv_block_tokens=args.kv_block_tokens,
        cache_dir=None if args.no_disk_cache else (args.cache_dir or default_disk_cache_dir()),
        disk_cache_gb=args.disk_cache_gb,
    )
    model = args.model
    name = args.served_model_name or (Path(model).name if model else "vision-gateway-tiny")
    engine = EngineConfig(
        model=model or "",
        served_model_name=name,
        max_batch=args.max_batch,
        max_waiting=args.max_waiting,
        prefill_chunk_tokens=args.prefill_chunk,
        default_max_tokens=args.default_max_tokens,
        mlx_cache_limit_mb=args.mlx_cache_limit_mb,
        max_context_tokens=args.max_context,
        cache=cache,
        cudnn_attention=args.cudnn_attention,
        warmup=not args.no_warmup,
        warmup_image_sizes=tuple(args.warmup_image_size or _d(EngineConfig, "warmup_image_sizes")),
        step_trace=args.step_trace,
    )
    media = MediaConfig(
        allowed_media_dirs=tuple(Path(d) for d in args.allowed_media_dir),
        allow_private_urls=args.allow_private_urls,
        allowed_url_hosts=tuple(args.allowed_url_host),
        max_image_bytes=args.max_image_bytes,
        max_image_pixels=args.max_image_pixels,
        max_request_pixels=args.max_request_pixels,
        max_images_per_request=args.max_images_per_request,
        max_redirects=args.max_redirects,
        max_video_bytes=args.max_video_bytes,
        max_video_seconds=args.max_video_seconds,
        max_video_frames=args.max_video_frames,
        video_fps=args.video_fps,
    )
    return server, engine, media


def serve(args: argparse.Namespace) -> None:
    from gateway.app import create_app

    server, engine, media = configs_from_args(args)
    engine, notice = resolve_model(engine)
    app = create_app(server, engine, media, notice=notice)
    uvicorn_server(app, server).run()


def resolve_model(engine: EngineConfig) -> tuple[EngineConfig, str | None]:
    """Check `--model`, or build the embedded tiny model: the config to serve and the
    notice for /v1/models (None for a real model)."""
    model = engine.model
    if (
        model
        and model.startswith(("/", "./", "../", "~"))
        and not Path(model).expanduser().is_dir()
    ):
        raise ConfigError(
            f"--model {model}: no such directory; pass a local model directory or a hub id "
            "such as mlx-community/Qwen2.5-VL-7B-Instruct-4bit"
        )
    notice = None
    if not engine.model:
        from gateway.offline_model import ensure_model

        os.environ.setdefault("HF_HUB_OFFLINE", "1")
        path = ensure_model(progress=lambda msg: logging.info("embedded model: %s", msg))
        engine = dataclasses.replace(engine, model=str(path))
        notice = EMBEDDED_NOTICE
        logging.warning(EMBEDDED_NOTICE)
    return engine, notice


def uvicorn_server(app: Any, server: ServerConfig) -> Any:
    """uvicorn's server for `app` (from `create_app`) on `server`'s address, telling the app
    when a shutdown signal arrives (uvicorn itself only stops accepting connections and
    waits) so that running streams can end with an error event before the grace period runs
    out. Used by `serve` and by `cluster`'s ingress."""
    import uvicorn

    config = uvicorn.Config(
        app,
        host=server.host,
        port=server.port,
        log_level=server.log_level,
        # 0 must mean 'no grace', not uvicorn's None ('wait forever')
        timeout_graceful_shutdown=max(server.shutdown_grace_s, 0.001),
    )
    on_exit = app.state.gateway.begin_shutdown

    class Server(uvicorn.Server):
        def handle_exit(self, sig: int, frame: Any) -> None:
            on_exit()
            super().handle_exit(sig, frame)

    return Server(config)


def main(argv: Sequence[str] | None = None) -> None:
    args = build_parser().parse_args(argv)
    level = getattr(args, "log_level", "info").upper()
    logging.basicConfig(level=level, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        if args.command == "serve":
            serve(args)
        elif args.command == "cluster":
            from gateway.cluster.cli import cluster

            cluster(args)
        elif args.command == "make-model":
            from gateway.offline_model import build_model

            out = build_model(
                args.out,
                args.arch,
                args.size,
                args.seed,
                progress=print,
                dtype=args.dtype,
                quantize=args.quantize,
                group_size=args.q_group_size,
            )
            print(f"wrote {out}")
        else:
            _require_plotting(args)
            args.run(args)
    except ConfigError as exc:
        sys.exit(f"vision-gateway: {exc}")


def _require_plotting(args: argparse.Namespace) -> None:
    """A bench asked for a plot fails before it runs, not silently after, without matplotlib."""
    if getattr(args, "plot", None) is None:
        return
    import importlib.util

    if importlib.util.find_spec("matplotlib") is None:
        sys.exit(
            "vision-gateway: --plot needs matplotlib: pip install 'vision-gateway[bench]' "
            "(or leave out --plot)"
        )
