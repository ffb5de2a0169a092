"""Warm follow-up turns: Responses API with `previous_response_id` against Chat Completions
with the image resent.

    python -m docs.investigations.responses_turns [--model DIR] [--image-size 1024] [--repeats 5]

Starts one server (both caches on) and runs, per repeat, two 5-turn conversations about two
fresh images of the same size: one through `POST /v1/responses` (turn 1 sends the image,
turns 2-5 only `previous_response_id` and the question) and one through
`POST /v1/chat/completions` (every turn resends the history and the image as a data URI).
Each turn is streamed with logprobs; TTFT is client-side, request sent -> first token event.
The Server-Timing header splits the server's part (read, media, prompt, admit). Prints a
markdown table of medians over turns 2-5.
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import time
from collections.abc import Iterator
from typing import Any

import httpx

from bench.server import LocalServer
from bench.timing import image_message, server_timing
from bench.workload import image_uri

QUESTIONS = [
    "What is in this picture?",
    "What colours do you see?",
    "How many shapes are there?",
    "Which shape is the largest?",
    "Describe the background.",
]


def noise_uri(size: int, seed: int) -> str:
    """A `size`x`size` JPEG (quality 90) of random pixels as a data URI: incompressible
    content, so its size is that of a detailed photo, not of a flat drawing."""
    import base64
    import io

    import numpy as np
    from PIL import Image

    pixels = np.random.default_rng(seed).integers(0, 256, (size, size, 3), dtype=np.uint8)
    buf = io.BytesIO()
    Image.fromarray(pixels, "RGB").save(buf, format="JPEG", quality=90)
    return "data:image/jpeg;base64," + base64.b64encode(buf.getvalue()).decode()


def _events(response: httpx.Response) -> Iterator[dict[str, Any]]:
    for line in response.iter_lines():
        if line.startswith("data: ") and line != "data: [DONE]":
            yield json.loads(line[6:])


def _timed(http: httpx.Client, path: str, body: dict[str, Any]) -> dict[str, Any]:
    """One streamed request: TTFT (ms), the server's phases, the final text and usage."""
    start = time.perf_counter()
    ttft, text, final = None, [], {}
    payload = json.dumps(body).encode()
    with http.stream("POST", path, content=payload) as response:
        response.raise_for_status()
        phases = server_timing(response.headers.get("server-timing", ""))
        for event in _events(response):
            if event.get("type") == "response.output_text.delta":
                piece = event["delta"]
            elif "choices" in event and event["choices"]:
                delta = event["choices"][0]
                piece = delta["delta"].get("content", "") if delta.get("logprobs") else None
            else:
                final = event.get("response", event) if "type" in event else event
                continue
            if piece is not None:
                ttft = ttft if ttft is not None else time.perf_counter() - start
                text.append(piece)
    usage = final.get("usage") or {}
    cached = usage.get("input_tokens_details", usage.get("prompt_tokens_details", {}))
    return {
        "ttft_ms": 1000 * (ttft or 0.0),
        "phases": phases,
        "text": "".join(text),
        "id": final.get("id"),
        "cached": cached.get("cached_tokens", 0),
        "bytes": len(payload),
    }


def responses_turns(http: httpx.Client, model: str, uri: str, max_tokens: int) -> list[dict]:
    out, previous = [], None
    for turn, question in enumerate(QUESTIONS):
        body: dict[str, Any] = {
            "model": model,
            "stream": True,
            "temperature": 0,
            "max_output_tokens": max_tokens,
            "include": ["message.output_text.logprobs"],
        }
        if turn == 0:
            image = {"type": "input_image", "image_url": uri}
            body["input"] = [
                {"role": "user", "content": [image, {"type": "input_text", "text": question}]}
            ]
        else:
            body["input"], body["previous_response_id"] = question, previous
        result = _timed(http, "/v1/responses", body)
        previous = result["id"]
        out.append(result)
    return out


def chat_turns(http: httpx.Client, model: str, uri: str, max_tokens: int) -> list[dict]:
    out, messages = [], []
    for turn, question in enumerate(QUESTIONS):
        messages.append(
            image_message(uri, question) if turn == 0 else {"role": "user", "content": question}
        )
        body = {
            "model": model,
            "messages": messages,
            "stream": True,
            "temperature": 0,
            "max_tokens": max_tokens,
            "logprobs": True,
            "stream_options": {"include_usage": True},
        }
        result = _timed(http, "/v1/chat/completions", body)
        messages.append({"role": "assistant", "content": result["text"]})
        out.append(result)
    return out


def _median(runs: list[list[dict]], key: Any) -> float:
    return statistics.median(key(r) for conversation in runs for r in conversation[1:])


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", help="model dir (default: the embedded tiny model)")
    p.add_argument("--image-size", type=int, default=1024)
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--max-tokens", type=int, default=8)
    p.add_argument("--kv-block-tokens", type=int, default=0)
    p.add_argument(
        "--image",
        choices=["drawn", "noise"],
        default="noise",
        help="drawn: a flat PNG drawing (small); noise: a JPEG of random pixels (photo-sized)",
    )
    args = p.parse_args(argv)
    flags = ["--no-warmup", "--kv-block-tokens", str(args.kv_block_tokens)]
    flags += ["--served-model-name", "bench"] + (["--model", args.model] if args.model else [])
    server = LocalServer(flags)
    try:
        http = httpx.Client(base_url=server.base_url, timeout=600)
        size = args.image_size
        make = noise_uri if args.image == "noise" else image_uri
        responses_turns(http, "bench", make(size, 10_000), args.max_tokens)  # warm-up
        chat_turns(http, "bench", make(size, 10_001), args.max_tokens)
        runs: dict[str, list[list[dict]]] = {"responses": [], "chat": []}
        for r in range(args.repeats):
            uris = make(size, 2 * r), make(size, 2 * r + 1)
            runs["responses"].append(responses_turns(http, "bench", uris[0], args.max_tokens))
            runs["chat"].append(chat_turns(http, "bench", uris[1], args.max_tokens))
    finally:
        server.stop()
    print(
        f"{platform.machine()} {platform.system()}, {args.image} image {size}x{size} px, "
        f"{args.repeats} conversations per path, medians over turns 2-5\n"
    )
    print("| path | TTFT ms | server read ms | server media ms | cached tokens | request bytes |")
    print("|---|---|---|---|---|---|")
    for name, label in (
        ("responses", "Responses, previous_response_id"),
        ("chat", "Chat Completions, image resent"),
    ):
        rows = runs[name]
        cells = [
            _median(rows, lambda t: t["ttft_ms"]),
            _median(rows, lambda t: t["phases"].get("read", 0.0)),
            _median(rows, lambda t: t["phases"].get("media", 0.0)),
            _median(rows, lambda t: t["cached"]),
            _median(rows, lambda t: t["bytes"]),
        ]
        print(
            f"| {label} | "
            + " | ".join(f"{c:.1f}" for c in cells[:3])
            + f" | {cells[3]:.0f} | {cells[4]:.0f} |"
        )


if __name__ == "__main__":
    main()
