"""Decode throughput through HTTP, A/B over server configurations, three ways at once.

`python -m docs.investigations.decode_ab --model DIR --streams 1 16 32 --variant default \
    --variant=--in-process-engine` starts one server per variant and, for each stream
count, runs a warm wave and a timed wave of `--tokens` tokens per stream (EOS ignored), and
reports aggregate tok/s measured by:
- `sdk`: the streaming openai client (what users run; its per-chunk parsing costs client CPU);
- `sse`: a plain httpx reader that only counts `data:` lines (a client that cannot lag);
- `server`: the server's own generation-token counter over the wave's wall time.
Where `sdk` < `sse` the client is the limit, not the server. Prints JSON lines.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import shlex
import time
from typing import Any

import httpx

from bench.hotpath_client import aggregate_tok_s, stream, together
from bench.server import LocalServer

PROMPT = "Write a long story about a lighthouse keeper. Use many sentences and do not stop."


async def _sse_stream(client: httpx.AsyncClient, i: int, tokens: int) -> tuple[float, float, int]:
    body = {
        "model": "bench",
        "messages": [{"role": "user", "content": f"{i:03d} {PROMPT}"}],
        "max_tokens": tokens,
        "stream": True,
        "temperature": 0,
        "ignore_eos": True,
    }
    first = last = 0.0
    chunks = 0
    async with client.stream("POST", "/v1/chat/completions", json=body) as response:
        async for line in response.aiter_lines():
            if line.startswith("data: {") and '"content":"' in line and '"role"' not in line:
                last = time.perf_counter()
                first = first or last
                chunks += 1
    return first, last, chunks


async def _waves(base_url: str, streams: int, tokens: int) -> dict[str, Any]:
    from openai import AsyncOpenAI

    out: dict[str, Any] = {"streams": streams}
    sdk = AsyncOpenAI(base_url=base_url + "/v1", api_key="x", max_retries=0, timeout=300)
    async with sdk, httpx.AsyncClient(base_url=base_url, timeout=300) as plain:

        def one(i: int) -> Any:
            messages = [{"role": "user", "content": f"{i:03d} {PROMPT}"}]
            return stream(sdk, messages, tokens, ignore_eos=True)

        await together(streams, lambda i: stream(sdk, [{"role": "user", "content": "hi"}], 8))
        out["sdk_tok_s"] = aggregate_tok_s(await together(streams, one))
        before = await _generated(plain)
        started = time.perf_counter()
        rows = await asyncio.gather(*(_sse_stream(plain, i, tokens) for i in range(streams)))
        wall = time.perf_counter() - started
        out["server_tok_s"] = (await _generated(plain) - before) / wall
        span = max(r[1] for r in rows) - min(r[0] for r in rows)
        out["sse_tok_s"] = sum(r[2] for r in rows) / span if span > 0 else None
    return out


async def _generated(client: httpx.AsyncClient) -> float:
    text = (await client.get("/metrics")).text
    for line in text.splitlines():
        if line.startswith("vision_gateway_generation_tokens_total "):
            return float(line.split()[1])
    return 0.0


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--model", required=True)
    p.add_argument("--streams", type=int, nargs="+", default=[1, 16, 32])
    p.add_argument("--tokens", type=int, default=128)
    p.add_argument(
        "--variant", action="append", default=[], help="extra serve flags (quoted) or default"
    )
    args = p.parse_args(argv)
    for variant in args.variant or ["default"]:
        flags = ["--model", args.model, "--served-model-name", "bench", "--max-batch", "32"]
        extra = [] if variant == "default" else shlex.split(variant)
        server = LocalServer([*flags, "--warmup-image-size", "224", *extra])
        try:
            for n in args.streams:
                result = asyncio.run(_waves(server.base_url, n, args.tokens))
                print(json.dumps({"variant": variant, **result}), flush=True)
        finally:
            server.stop()


if __name__ == "__main__":
    main()
