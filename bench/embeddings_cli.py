"""`python -m bench embeddings`: its flags and its run (the measuring is `bench.embeddings`)."""

from __future__ import annotations

import argparse
import json
from collections.abc import Callable
from pathlib import Path


def add_parser(
    kinds: argparse._SubParsersAction, common: Callable[[argparse.ArgumentParser], None]
) -> None:
    p = kinds.add_parser(
        "embeddings", help="embeddings/s at batch 1/16/64 (text, images), repeated-image speed-up"
    )
    common(p)
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--image-size", type=int, default=224)
    p.add_argument("--batch", type=int, nargs="+", default=[1, 16, 64], help="inputs per request")
    p.add_argument("--clients", type=int, default=16, help="concurrent clients (one text each)")
    p.add_argument("--markdown", type=Path, help="write the markdown tables")
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> None:
    from bench import embeddings
    from bench.report import machine
    from bench.target import quiet_clients
    from gateway.offline_model import ensure_model

    quiet_clients()
    model = args.model or str(ensure_model("qwen3_vl_embedding"))
    batches = tuple(args.batch)
    result = embeddings.run(
        model, args.rounds, args.image_size, batches, args.server_arg, args.clients
    )
    text = embeddings.table(result, args.image_size)
    print(text)
    if args.markdown:
        args.markdown.write_text(text + "\n")
    if args.out:
        payload = {"machine": machine(), "model": model, **embeddings.quick(result)}
        args.out.write_text(json.dumps(payload, indent=2))
