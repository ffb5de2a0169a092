"""Does decode slow down over a server's life? Decode waves between rounds of image turns.

    python -m docs.investigations.decode_life --model DIR [--rounds 3] [--streams 1 16]
        [--image-size 1024] [--conversations 3] [--turns 5] [--server-arg=FLAG ...]

Why: in one H200 run (docs/performance.md §8g) the hotpath bench's 1-stream decode, which
comes after its image conversations, stepped at 18-19 ms where a fresh server steps at 7-9.
This bench separates "the server's history" from "the VM at that minute": one server, and
per round, for each stream count, a warm wave then `--waves` timed waves of `--tokens` greedy
tokens (EOS ignored, read by a plain SSE client), then `--conversations` new images of
`--image-size` pixels by path, each for `--turns` turns (the caches fill with image KV and
vision features; none after the last round). A server whose decode degrades with its
history shows falling tok/s round by round; pass `--server-arg=--step-trace=FILE` for the
engine's own step times (`python -m bench.steps FILE`).

Prints one JSON line per round and stream count, then a summary line: each stream count's
tok/s in the last round over the first (1.0: no change).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
from typing import Any

import httpx

from bench.hotpath_client import (
    ImageFiles,
    aggregate_tok_s,
    image_turn,
    plain_stream,
    together,
)
from bench.server import LocalServer

QUERIES, HITS = (
    "vision_gateway_vision_cache_queries_total",
    "vision_gateway_vision_cache_hits_total",
)
STORY = "Tell a long story about the sea, the wind and a lighthouse."


def _user(content: Any) -> dict[str, Any]:
    return {"role": "user", "content": content}


async def _wave(http: httpx.AsyncClient, n: int, tokens: int, salt: str) -> float:
    """`n` concurrent greedy streams of `tokens` tokens: aggregate tok/s. Raises when a
    stream fails or shows no tokens (a wave that cannot be timed is not a zero)."""

    def one(i: int) -> Any:
        prompt = [_user(f"Story {salt}{i:03d}. {STORY}")]
        return plain_stream(http, prompt, tokens, temperature=0, ignore_eos=True)

    streams = await together(n, one)
    errors = [s.error for s in streams if s.error]
    if errors:
        raise RuntimeError(f"decode wave failed: {errors[0]}")
    tok_s = aggregate_tok_s(streams)
    if tok_s is None:
        raise RuntimeError("decode wave could not be timed (no content chunks)")
    return tok_s


async def _conversation(http: httpx.AsyncClient, image: str, turns: int) -> None:
    """One image by path, asked `turns` questions in one conversation (8 tokens each)."""
    messages = [image_turn(image, "Describe the picture.")]
    for turn in range(turns):
        reply = await plain_stream(http, messages, 8, temperature=0, ignore_eos=True)
        if reply.error:
            raise RuntimeError(f"image turn {turn + 1} failed: {reply.error}")
        messages += [{"role": "assistant", "content": reply.text or "OK."}]
        messages += [_user(f"And what about detail {turn}?")]


def _vision_misses(server: LocalServer) -> float:
    """Images the server's vision cache did not hold so far (each one went through the tower)."""
    samples = server.metrics()
    return samples.get(QUERIES, 0.0) - samples.get(HITS, 0.0)


async def run(
    server: LocalServer, args: argparse.Namespace, files: ImageFiles
) -> list[dict[str, Any]]:
    """The rounds against a running server; one record per round and stream count, with the
    images encoded so far by the rounds' conversations (`images_encoded`)."""
    records = []
    before = _vision_misses(server)
    async with httpx.AsyncClient(base_url=server.base_url + "/v1", timeout=600) as http:
        for round_ in range(args.rounds):
            encoded = _vision_misses(server) - before
            for n in args.streams:
                await _wave(http, n, min(16, args.tokens), "w")  # these shapes, once
                # New prompts per wave: every timed wave equally cold for the prefix cache.
                waves = [
                    await _wave(http, n, args.tokens, f"d{round_}.{w}.") for w in range(args.waves)
                ]
                tok_s = statistics.median(waves)
                record = {"round": round_, "streams": n, "tok_s": tok_s, "waves": waves,
                          "images_encoded": encoded}  # fmt: skip
                print(json.dumps(record), flush=True)
                records.append(record)
            if round_ == args.rounds - 1:
                break  # the history after the last waves would affect nothing measured
            for k in range(args.conversations):
                image = files.path(args.image_size, 1000 * round_ + k)
                await _conversation(http, image, args.turns)
    return records


def summary(records: list[dict[str, Any]]) -> dict[str, float | None]:
    """Per stream count: median tok/s of the last round over the first."""
    out: dict[str, float | None] = {}
    for n in sorted({r["streams"] for r in records}):
        rounds = [r["tok_s"] for r in records if r["streams"] == n]
        out[f"streams_{n}_last_over_first"] = rounds[-1] / rounds[0] if rounds[0] else None
    return out


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(
        prog="python -m docs.investigations.decode_life", description=__doc__
    )
    p.add_argument("--model", required=True, help="local checkpoint dir")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--streams", type=int, nargs="+", default=[1, 16])
    p.add_argument("--tokens", type=int, default=128)
    p.add_argument("--waves", type=int, default=2, help="timed waves per stream count")
    p.add_argument("--image-size", type=int, default=1024)
    p.add_argument("--conversations", type=int, default=3, help="new images per round")
    p.add_argument("--turns", type=int, default=5)
    p.add_argument("--server-arg", action="append", default=[], help="an extra serve flag")
    args = p.parse_args(argv)
    if args.rounds < 1 or args.waves < 1:
        p.error("--rounds and --waves must be >= 1")
    files = ImageFiles()
    flags = ["--model", args.model, "--served-model-name", "bench"]
    try:
        server = LocalServer([*flags, "--allowed-media-dir", str(files.root), *args.server_arg])
        try:
            records = asyncio.run(run(server, args, files))
        except RuntimeError:
            print(server.log(), file=sys.stderr)  # why the server refused or failed
            raise
        finally:
            server.stop()
    finally:
        files.close()
    print(json.dumps({"summary": summary(records)}), flush=True)


if __name__ == "__main__":
    main()
