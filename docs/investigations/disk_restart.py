"""What a disk hit costs: time to first token of one image question on a cold server, on a
restarted server that finds the answer's KV (or the image's features) on disk, and again
from memory; plus the engine's own time reading and checking the files.

    python -m docs.investigations.disk_restart [--model DIR] [--sizes 224 448 1024]

Per image size (medians over 3 distinct images): server 1 (warmed up at that size, so no
kernel compilation is timed) answers the question cold and is stopped with SIGTERM; server 2
on the same --cache-dir answers it again (KV blocks from disk), then with text before the
image (no KV block past that text is shared: the features come from disk, the prefill
runs), then the first question again (memory). Each answer is checked equal to the cold one
(token strings and logprobs). `*_load_s`: the engine thread's time per disk hit (the copy
into MLX); `*_read_s`: the reader thread's (reading, verifying and checking the files,
misses included), while the request waits and other rows keep decoding.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
from pathlib import Path
from typing import Any

import httpx

from bench.server import LocalServer
from bench.timing import image_message, timed_stream
from bench.workload import image_uri

QUESTION = "Describe the picture."


def _ask(server: LocalServer, uri: str, before: str | None = None) -> tuple[float, Any, float]:
    """(TTFT, the answer's (token, logprob) pairs, the edge's image load time (decode and hash;
    a repeat of the same bytes skips the decode), seconds)."""
    message = image_message(uri, QUESTION)
    if before is not None:
        message["content"].insert(0, {"type": "text", "text": before})
    t = timed_stream(server.client(), "bench", [message], 8)
    answer = [(tok, lp) for tok, lp in zip(t.token_ids, t.logprobs, strict=False)]
    return t.ttft_s, answer, t.server_timing.get("media", 0.0) / 1000


def _disk(server: LocalServer) -> dict[str, Any]:
    return httpx.get(server.base_url + "/v1/cache/stats", timeout=10).json()["disk"]


def _warm(server: LocalServer, size: int) -> None:
    """A text question and a question about an image not measured, first: a fresh server's
    first request, and its first image (the decoder's own start), cost tens of ms more than
    later ones, which is not the disk's doing."""
    timed_stream(server.client(), "bench", [{"role": "user", "content": "Hello"}], 2)
    _ask(server, image_uri(size, seed=7))


def measure(model: list[str], size: int, folder: Path, images: int = 3) -> dict[str, float]:
    """Medians over `images` distinct images of one size."""
    flags = [*model, "--served-model-name", "bench", "--cache-dir", str(folder)]
    flags += ["--warmup-image-size", str(size)]
    uris = [image_uri(size, seed=1000 * size + k) for k in range(2 * images)]
    asked, before = uris[:images], uris[images:]
    first = LocalServer(flags)
    try:
        _warm(first, size)
        cold = [_ask(first, uri) for uri in asked]
        cold_before = [_ask(first, uri, "Look:") for uri in before]
        encode = first.metrics()
    finally:
        first.stop()
    second = LocalServer(flags)
    try:
        _warm(second, size)
        from_disk = [_ask(second, uri) for uri in asked]
        from_features = [_ask(second, uri, "Look:") for uri in before]
        from_memory = [_ask(second, uri) for uri in asked]
        disk = _disk(second)
    finally:
        second.stop()
    for runs in (from_disk, from_memory):
        assert [r[1] for r in runs] == [r[1] for r in cold], "a cached answer differs"
    assert [r[1] for r in from_features] == [r[1] for r in cold_before], "features differ"
    encodes = encode["vision_gateway_vision_encode_step_seconds_count"]
    return {
        "size": size,
        "ttft_cold_s": _median(cold),
        "ttft_kv_from_disk_s": _median(from_disk),
        "ttft_memory_s": _median(from_memory),
        "media_kv_from_disk_s": _median(from_disk, 2),
        "media_memory_s": _median(from_memory, 2),
        "ttft_cold_text_first_s": _median(cold_before),
        "ttft_features_from_disk_s": _median(from_features),
        "encode_s": encode["vision_gateway_vision_encode_step_seconds_sum"] / max(encodes, 1),
        "kv_load_s": disk["prefix"]["load_seconds"] / max(disk["prefix"]["lookups_hit"], 1),
        "features_load_s": disk["vision"]["load_seconds"] / max(disk["vision"]["images_hit"], 1),
        # the reader thread's part (files read, verified, checked), per hit as above
        "kv_read_s": disk["prefix"]["read_seconds"] / max(disk["prefix"]["lookups_hit"], 1),
        "features_read_s": disk["vision"]["read_seconds"] / max(disk["vision"]["images_hit"], 1),
        "folder_bytes": disk["bytes"],
        "files": disk["entries"],
    }


def _median(runs: list[tuple[float, Any, float]], column: int = 0) -> float:
    return statistics.median(r[column] for r in runs)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", help="model directory (default: the embedded tiny model)")
    parser.add_argument("--sizes", type=int, nargs="+", default=[224, 448, 1024])
    args = parser.parse_args(argv)
    model = ["--model", args.model] if args.model else []
    keys = None
    for size in args.sizes:
        with tempfile.TemporaryDirectory(prefix="disk-bench-") as folder:
            row = measure(model, size, Path(folder))
        if keys is None:
            keys = list(row)
            print("| " + " | ".join(keys) + " |")
            print("|" + "---|" * len(keys))
        print("| " + " | ".join(_fmt(row[k]) for k in keys) + " |", flush=True)


def _fmt(value: float) -> str:
    if isinstance(value, int):
        return str(value)
    return f"{value * 1000:.1f} ms" if value < 10 else f"{value:.0f}"


if __name__ == "__main__":
    main()
