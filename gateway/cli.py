"""`vision-gateway`: the command line's parser (serve, cluster, make-model) and its dispatch.

`serve`'s flags come from `gateway.flags` and become configs there; `gateway.server` runs
them. Nothing below this module sees argv or an argparse Namespace.
"""

from __future__ import annotations

import argparse
import difflib
import importlib.metadata
import logging
import os
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import NoReturn

from gateway.cluster.cli import add_cluster_parser, cluster
from gateway.config import ConfigError
from gateway.flags import (
    BriefParser,
    DefaultsFormatter,
    add_serve_flags,
    configs_from_args,
    pool_from_args,
)
from gateway.server import serve

APIS = "OpenAI Chat Completions, Responses and Anthropic Messages"
NO_BENCH = (
    "`bench` is not part of the installed package: run the benchmarks from a source "
    "checkout with `python -m bench ...` (docs/benchmarks.md)"
)
# `make-model --arch` choices: gateway.offline_model.ARCHS, spelled out here so that parsing
# argv does not import the builder (tokenizers, mlx); tests/test_cli.py keeps them equal.
MAKE_MODEL_ARCHS = (
    "qwen2_vl",
    "qwen2_5_vl",
    "qwen3_vl",
    "gemma3",
    "smolvlm",
    "mistral3",
    "gemma4",
    "gemma3n",
    "lfm2_vl",
    "qwen3",
    "qwen3_5",
    "qwen3_5_moe",
    "llama",
    "qwen3_embedding",
    "qwen3_vl_embedding",
    "qwen3_reranker",
    "qwen3_vl_reranker",
)
TEXT_ARCHS = ("qwen3", "llama", "qwen3_embedding", "qwen3_reranker")
# `--size` choices: every family's sizes (which sizes an arch has is checked by the builder,
# `offline_model.families.check_arch_size`); tests keep them equal to the builder's.
MAKE_MODEL_SIZES = ("tiny", "small", "4b", "7b")


def _version() -> str:
    try:
        return importlib.metadata.version("vision-gateway")
    except importlib.metadata.PackageNotFoundError:  # run from a source tree, not installed
        return "unknown"


def _add_serve_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "serve",
        help=f"run the server ({APIS} APIs)",
        description="Serve a vision-language or text model (see make-model --help for the "
        f"families) with the {APIS} APIs.",
        formatter_class=DefaultsFormatter,
    )
    add_serve_flags(p)


def _add_make_model_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "make-model",
        help="build a tiny random-weight checkpoint of a supported family offline",
        description="Build a deterministic random-weight checkpoint that mlx_vlm.load (or, for "
        "text models, mlx_lm.load) accepts, with the family's tokenizer, special tokens and "
        "real chat template.",
        formatter_class=DefaultsFormatter,
    )
    p.add_argument("out", type=Path, help="directory to write the checkpoint to")
    p.add_argument(
        "--arch",
        default="qwen2_vl",
        choices=MAKE_MODEL_ARCHS,
        help="model family, as config.json's model_type: vision-language (mlx-vlm) "
        f"{', '.join(a for a in MAKE_MODEL_ARCHS if a not in TEXT_ARCHS)}; "
        f"text only (mlx-lm) {', '.join(TEXT_ARCHS)}",
    )
    p.add_argument(
        "--size",
        default="tiny",
        choices=MAKE_MODEL_SIZES,
        help="shapes: tiny (CPU tests), small (CPU benches: the real image path), 7b (Qwen-VL)"
        " and 4b (gemma3): real shapes for a GPU; not every arch has every size",
    )
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
    p.add_argument(
        "--thinking",
        action="store_true",
        help="qwen3 only: Qwen3's Thinking template (the generation prompt opens <think>, as "
        "Qwen3-*-Thinking-2507), to test thinking with",
    )


def build_parser() -> argparse.ArgumentParser:
    parser = BriefParser(
        prog="vision-gateway",
        description="OpenAI- and Anthropic-compatible gateway for vision-language models on "
        "MLX, with content-addressed vision-feature and KV caches.",
    )
    parser.add_argument("--version", action="version", version=f"%(prog)s {_version()}")
    sub = parser.add_subparsers(dest="command", required=True)
    _add_serve_parser(sub)
    add_cluster_parser(sub)
    _add_make_model_parser(sub)
    return parser


def _make_model(args: argparse.Namespace) -> None:
    from gateway.offline_model import build_model, check_arch_size

    try:
        check_arch_size(args.arch, args.size, args.dtype)
    except ValueError as exc:  # e.g. a size this arch has none of: a usage error, no traceback
        sys.exit(f"vision-gateway make-model: {exc}")
    if args.thinking and args.arch != "qwen3":
        sys.exit("vision-gateway make-model: --thinking is for --arch qwen3")
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
    if args.thinking:
        from gateway.offline_model.qwen3 import use_thinking_template

        use_thinking_template(out)
    print(f"wrote {out}")


def main(argv: Sequence[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else list(argv)
    # transformers (tokenizers, configs) says at import that PyTorch is missing, which reads
    # as if the model would not load; nothing here needs PyTorch. (Its other advice stays.)
    os.environ.setdefault("TRANSFORMERS_NO_ADVISORY_WARNINGS", "1")
    parser = build_parser()
    if next((a for a in argv if not a.startswith("-")), None) == "bench":
        parser.error(NO_BENCH)  # argparse's "invalid choice" would not say where it went
    args, unknown = parser.parse_known_args(argv)
    if unknown:
        _unknown_flags(parser, args.command, unknown)
    level = getattr(args, "log_level", "info").upper()
    logging.basicConfig(level=level, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    if level != "DEBUG":  # httpx logs every request's full URL (image URLs' query strings too)
        for name in ("httpx", "httpcore"):
            logging.getLogger(name).setLevel(logging.WARNING)
    try:
        if args.command == "make-model":
            _make_model(args)
            return
        if args.command == "serve":
            serve(*configs_from_args(args), pool_from_args(args))  # (sets umask 077 itself)
        else:
            os.umask(0o077)  # what the replicas write is their users' (docs/security.md)
            cluster(args)
    except ConfigError as exc:
        sys.exit(f"vision-gateway: {exc}")
    except KeyboardInterrupt:  # Ctrl-C before the server took over its signals (model load)
        print("vision-gateway: interrupted", file=sys.stderr)
        _exit_without_finalizing(130)
    _exit_without_finalizing(0)  # the server drained and stopped after SIGINT or SIGTERM


def _unknown_flags(parser: argparse.ArgumentParser, command: str, unknown: list[str]) -> NoReturn:
    """The usage error for flags `command` does not have, from that command's parser (its
    --help is the one to read), with the closest flag it has for a typo (`--modle`)."""
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    command_parser = sub.choices[command]
    flags = [o for a in command_parser._actions for o in a.option_strings if o.startswith("--")]
    hints = []
    for arg in unknown:
        close = difflib.get_close_matches(arg.split("=", 1)[0], flags, n=1, cutoff=0.75)
        if close:
            hints.append(f"did you mean {close[0]} (for {arg})?")
    message = f"unrecognized arguments: {' '.join(unknown)}"
    command_parser.error(f"{message}{'; ' + ' '.join(hints) if hints else ''}")


def _exit_without_finalizing(status: int) -> NoReturn:
    """Flush the logs and output and leave at once, skipping interpreter finalization.

    mlx 0.32 (pinned) aborts the process ("terminate called without an active exception",
    SIGABRT) when a thread that used MLX exits while the interpreter finalizes: its
    thread-local destructors take the GIL (ml-explore/mlx#3126, fixed after 0.32). This
    process's worker threads use MLX (the model's prompt side), and joining them in Python
    returns before their destructors have run. After a drained shutdown there is nothing left
    to finalize: the engine process has stopped and the caches have reached the disk.
    """
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(status)
