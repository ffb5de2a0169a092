"""Time to first token for questions about a short video: first question vs a repeat, with the
caches on and off. Starts its own server (`vision-gateway serve`) on 127.0.0.1.

    HF_HUB_OFFLINE=1 .venv/bin/python -m docs.investigations.video_ttft [--model DIR] [--size 448]
        [--frames 16] [--runs 5] [--json OUT]

Each run sends a fresh clip (distinct pixels: nothing cached for it), asks "What happens?"
(cold: decode, tower, prefill), then a second question about the same clip (repeat: the
decoded frames come from the memo, the tower and the clip's prefill from the caches). The
clip is `--frames` frames of `--size` px at 4 fps, sampled at the server's 2 fps. One
warm-up clip first (kernels compile on first use). Prints the median of each.
"""

from __future__ import annotations

import argparse
import base64
import io
import json
import statistics
import time
from fractions import Fraction

import numpy as np

from bench.server import LocalServer


def clip(seed: int, frames: int, size: int) -> str:
    """A lossless MOV (PNG frames) data URI of random colour blocks."""
    import av

    rng = np.random.default_rng(seed)
    blocks = rng.integers(0, 256, (frames, size // 16, size // 16, 3), np.uint8)
    pixels = blocks.repeat(16, axis=1).repeat(16, axis=2)
    out = io.BytesIO()
    with av.open(out, mode="w", format="mov") as c:
        stream = c.add_stream("png", rate=4)
        stream.width = stream.height = pixels.shape[1]
        stream.pix_fmt = "rgb24"
        for i, frame in enumerate(pixels):
            f = av.VideoFrame.from_ndarray(np.ascontiguousarray(frame), format="rgb24")
            f.pts, f.time_base = i, Fraction(1, 4)
            for packet in stream.encode(f):
                c.mux(packet)
        for packet in stream.encode():
            c.mux(packet)
    return "data:video/quicktime;base64," + base64.b64encode(out.getvalue()).decode()


def ttft_ms(client: object, model: str, url: str, question: str) -> tuple[float, int]:
    start = time.perf_counter()
    stream = client.chat.completions.create(  # type: ignore[attr-defined]
        model=model, stream=True, max_tokens=4, temperature=0,
        stream_options={"include_usage": True},
        messages=[{"role": "user", "content": [
            {"type": "video_url", "video_url": {"url": url}},
            {"type": "text", "text": question}]}],
    )  # fmt: skip
    first, prompt = None, 0
    for chunk in stream:
        if first is None and chunk.choices and chunk.choices[0].delta.content is not None:
            first = (time.perf_counter() - start) * 1000
        if chunk.usage:
            prompt = chunk.usage.prompt_tokens
    return float(first or 0.0), prompt


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default=None)
    parser.add_argument("--size", type=int, default=448)
    parser.add_argument("--frames", type=int, default=16)
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--json", default=None)
    args = parser.parse_args()
    model_args = ["--model", args.model, "--served-model-name", "m"] if args.model else []
    results = {}
    for label, flags in [
        ("caches on", []),
        ("caches off", ["--no-vision-cache", "--no-prefix-cache"]),
    ]:
        server = LocalServer([*model_args, "--no-warmup", *flags])
        try:
            client = server.client()
            model = client.models.list().data[0].id
            ttft_ms(client, model, clip(10_000, args.frames, args.size), "Warm up?")
            cold, repeat, prompt = [], [], 0
            for run in range(args.runs):
                url = clip(run, args.frames, args.size)
                ms, prompt = ttft_ms(client, model, url, "What happens?")
                cold.append(ms)
                repeat.append(ttft_ms(client, model, url, "What colour is it?")[0])
            results[label] = {
                "cold_ms": statistics.median(cold),
                "repeat_ms": statistics.median(repeat),
                "prompt_tokens": prompt,
            }
            print(label, json.dumps(results[label]))
        finally:
            server.stop()
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"args": vars(args), "results": results}, f, indent=1)


if __name__ == "__main__":
    main()
