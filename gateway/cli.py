"""Command line: argv -> frozen config dataclasses, nothing else below this module."""

from __future__ import annotations

import argparse
import logging
import os
import sys
from collections.abc import Sequence
from pathlib import Path

from gateway.config import MIB, CacheConfig, ConfigError, EngineConfig, MediaConfig, ServerConfig

EMBEDDED_NOTICE = (
    "This is the embedded tiny random-weight test model: its answers are noise. "
    "Start the server with --model <dir or hub id> to serve a real Qwen-VL model."
)


def _serve_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "serve",
        help="run the OpenAI-compatible server",
        description="Serve a Qwen2/2.5/3-VL model with an OpenAI-compatible API.",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    a = p.add_argument
    a("--model", help="local model dir or hub id (default: the embedded tiny offline model)")
    a("--served-model-name", help="model name clients send (default: derived from --model)")
    a("--host", default="127.0.0.1", help="bind address")
    a("--port", type=int, default=8000, help="TCP port")
    a(
        "--api-key",
        default=None,
        help="require `Authorization: Bearer KEY` (env VISION_GATEWAY_API_KEY)",
    )
    a(
        "--metrics-api-key",
        default=None,
        help="separate key for /metrics (env VISION_GATEWAY_METRICS_API_KEY; default: --api-key)",
    )
    a("--max-batch", type=int, default=16, help="rows decoding at once")
    a("--max-waiting", type=int, default=64, help="queued requests before 429")
    a("--prefill-chunk", type=int, default=512, help="tokens per prefill chunk between decodes")
    a("--default-max-tokens", type=int, default=512, help="when a request sets none")
    a("--max-context", type=int, default=32768, help="prompt + completion tokens")
    a(
        "--mlx-cache-limit-mb",
        type=float,
        default=None,
        help="cap MLX's pool of freed buffers (MiB); default: MLX's own limit",
    )
    a("--vision-cache-mb", type=float, default=512, help="vision-feature cache budget, MiB")
    a("--kv-cache-mb", type=float, default=2048, help="KV prefix cache budget, MiB")
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
        help="square image size to warm up at start-up (repeatable; default: 448 and 1024)",
    )
    a("--no-vision-cache", action="store_true", help="disable the vision-feature cache")
    a("--no-prefix-cache", action="store_true", help="disable the KV prefix cache")
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
    a("--max-image-bytes", type=int, default=20 * MIB, help="per image, bytes")
    a("--max-image-pixels", type=int, default=40_000_000, help="per image, from the header")
    a("--max-request-pixels", type=int, default=160_000_000, help="all images of one request")
    a("--max-images-per-request", type=int, default=16)
    a("--max-redirects", type=int, default=3, help="redirects followed per image URL")
    a("--max-body-bytes", type=int, default=64 * MIB, help="request body cap, bytes")
    a("--shutdown-grace", type=float, default=30.0, help="seconds to finish running requests")
    a("--log-level", default="info", choices=["debug", "info", "warning", "error"])


def _make_model_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "make-model",
        help="build a random-weight Qwen-VL checkpoint offline",
        description="Build a deterministic random-weight checkpoint that mlx_vlm.load accepts.",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    p.add_argument("out", type=Path)
    p.add_argument("--arch", default="qwen2_vl", choices=["qwen2_vl", "qwen2_5_vl", "qwen3_vl"])
    p.add_argument("--size", default="tiny", choices=["tiny", "7b"])
    p.add_argument("--seed", type=int, default=0)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="vision-gateway",
        description="OpenAI-compatible gateway for vision-language models on MLX, with "
        "content-addressed vision-feature and KV caches.",
    )
    sub = parser.add_subparsers(dest="command", required=True)
    _serve_parser(sub)
    _make_model_parser(sub)
    from gateway.bench.cli import add_bench_parser

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
        shutdown_grace_s=args.shutdown_grace,
        log_level=args.log_level,
        engine_process=not args.in_process_engine,
    )
    cache = CacheConfig(
        vision_cache_mb=args.vision_cache_mb,
        kv_cache_mb=args.kv_cache_mb,
        grammar_cache_mb=args.grammar_cache_mb,
        vision_enabled=not args.no_vision_cache,
        prefix_enabled=not args.no_prefix_cache,
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
        warmup_image_sizes=tuple(args.warmup_image_size or (448, 1024)),
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
    )
    return server, engine, media


def serve(args: argparse.Namespace) -> None:
    import dataclasses

    import uvicorn

    from gateway.app import create_app

    server, engine, media = configs_from_args(args)
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
    app = create_app(server, engine, media, notice=notice)
    uvicorn.run(
        app,
        host=server.host,
        port=server.port,
        log_level=server.log_level,
        # 0 must mean 'no grace', not uvicorn's None ('wait forever')
        timeout_graceful_shutdown=max(server.shutdown_grace_s, 0.001),
    )


def main(argv: Sequence[str] | None = None) -> None:
    args = build_parser().parse_args(argv)
    level = getattr(args, "log_level", "info").upper()
    logging.basicConfig(level=level, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        if args.command == "serve":
            serve(args)
        elif args.command == "make-model":
            from gateway.offline_model import build_model

            out = build_model(args.out, args.arch, args.size, args.seed, progress=print)
            print(f"wrote {out}")
        else:
            args.run(args)
    except ConfigError as exc:
        sys.exit(f"vision-gateway: {exc}")
