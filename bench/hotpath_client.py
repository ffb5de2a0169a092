"""The hotpath bench's client side: one timed stream through the real `openai` SDK
(AsyncOpenAI, streaming), concurrency helpers, and the PNG files it sends by path.

Times are `time.perf_counter()` seconds taken in the client as chunks arrive: this is what a
client sees, HTTP, SSE framing and SDK parsing included.
"""

from __future__ import annotations

import asyncio
import base64
import json
import statistics
import tempfile
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bench.raw_measure import steady_window
from bench.timing import image_data_uri, server_timing


@dataclass(frozen=True)
class Stream:
    """One streamed completion. `first`/`last`: the first and last chunk carrying output
    (content or logprobs); `role`: the opening role chunk (sent once the request is admitted).
    `error` is set (and the times may be None) when the request failed."""

    start: float
    role: float | None = None
    first: float | None = None
    last: float | None = None
    completion_tokens: int = 0
    prompt_tokens: int = 0
    cached_tokens: int = 0
    text: str = ""
    finish_reason: str | None = None
    server_timing: dict[str, float] = field(default_factory=dict)  # ms, from the header
    error: str | None = None
    times: Sequence[float] = ()  # arrival of each output chunk (one per token on our server)

    @property
    def ttft_ms(self) -> float | None:
        return None if self.first is None else 1000 * (self.first - self.start)

    @property
    def role_ms(self) -> float | None:
        return None if self.role is None else 1000 * (self.role - self.start)

    @property
    def tok_s(self) -> float | None:
        """Decode speed: tokens after the first over the time after the first (tok/s)."""
        if self.first is None or self.last is None or self.last <= self.first:
            return None
        return (self.completion_tokens - 1) / (self.last - self.first)


async def stream(
    client: Any,
    messages: list[dict[str, Any]],
    max_tokens: int,
    *,
    model: str = "bench",
    temperature: float = 0.0,
    logprobs: bool = False,
    ignore_eos: bool = False,
) -> Stream:
    """One streaming chat completion; never raises (failures come back in `error`).

    `logprobs=True` makes every token its own chunk (text held back for a partial character
    would otherwise delay the first content chunk): use it for TTFT, not for decode speed.
    """
    start = time.perf_counter()
    got: dict[str, Any] = {"start": start}
    try:
        extra: dict[str, Any] = {"logprobs": True} if logprobs else {}
        if ignore_eos:
            extra["extra_body"] = {"ignore_eos": True}
        raw = await client.chat.completions.with_raw_response.create(
            model=model,
            messages=messages,
            max_tokens=max_tokens,
            stream=True,
            stream_options={"include_usage": True},
            temperature=temperature,
            **extra,
        )
        got["server_timing"] = server_timing(raw.headers.get("server-timing", ""))
        text = []
        async for chunk in raw.parse():
            now = time.perf_counter()
            if chunk.usage is not None:
                details = getattr(chunk.usage, "prompt_tokens_details", None)
                got["completion_tokens"] = chunk.usage.completion_tokens
                got["prompt_tokens"] = chunk.usage.prompt_tokens
                got["cached_tokens"] = int(getattr(details, "cached_tokens", 0) or 0)
            for choice in chunk.choices:
                if choice.delta.role and "role" not in got:
                    got["role"] = now
                if choice.delta.content or (choice.logprobs and choice.logprobs.content):
                    got.setdefault("first", now)
                    got["last"] = now
                    got.setdefault("times", []).append(now)
                    text.append(choice.delta.content or "")
                got["finish_reason"] = choice.finish_reason or got.get("finish_reason")
        got["text"] = "".join(text)
    except Exception as exc:  # noqa: BLE001 - a bench records failures, it does not stop
        got["error"] = f"{type(exc).__name__}: {exc}"[:300]
    return Stream(**got)


async def plain_stream(
    http: Any, messages: list[dict[str, Any]], max_tokens: int, **fields: Any
) -> Stream:
    """Like `stream`, read by a plain httpx client (`http`, base URL set) that only looks for
    content in each SSE line and parses the closing usage chunk: the server's share of the
    SDK's figures when many streams run at once. Never raises."""
    body = {"model": "bench", "messages": messages, "max_tokens": max_tokens, "stream": True,
            "stream_options": {"include_usage": True}, **fields}  # fmt: skip
    start = time.perf_counter()
    got: dict[str, Any] = {"start": start}
    try:
        async with http.stream("POST", "/chat/completions", json=body) as response:
            if response.status_code != 200:
                detail = (await response.aread())[:200]
                raise RuntimeError(f"HTTP {response.status_code}: {detail!r}")
            async for line in response.aiter_lines():
                now = time.perf_counter()
                if '"content":"' in line and '"content":""' not in line:
                    got.setdefault("first", now)
                    got["last"] = now
                    got.setdefault("times", []).append(now)
                elif '"usage":{' in line:
                    usage = json.loads(line.removeprefix("data:"))["usage"]
                    got["completion_tokens"] = usage["completion_tokens"]
                    got["prompt_tokens"] = usage["prompt_tokens"]
    except Exception as exc:  # noqa: BLE001 - a bench records failures, it does not stop
        got["error"] = f"{type(exc).__name__}: {exc}"[:300]
    return Stream(**got)


async def together(n: int, make: Callable[[int], Awaitable[Stream]]) -> list[Stream]:
    """Start `make(0..n-1)` at once; their Streams in order."""
    return list(await asyncio.gather(*(make(i) for i in range(n))))


def aggregate_tok_s(streams: Sequence[Stream]) -> float | None:
    """Sum of completion tokens over the wall time from the first first-token to the last
    last-token (tok/s); None if any stream failed."""
    if not streams or any(s.error or s.first is None or s.last is None for s in streams):
        return None
    wall = max(s.last for s in streams) - min(s.first for s in streams)  # type: ignore[type-var]
    return sum(s.completion_tokens for s in streams) / wall if wall > 0 else None


def steady_tok_s(streams: Sequence[Stream], skip: int = 10) -> float | None:
    """Aggregate tok/s over the window in which every stream decodes, each stream's first
    `skip` tokens left out: the same window raw's decode figure uses
    (`raw_measure.steady_window`), so the ratio compares like with like; the wave's admission
    and ramp, which `aggregate_tok_s` includes, are outside it. None if a stream failed or
    has no more than `skip` timed tokens."""
    if not streams or any(s.error or len(s.times) <= skip for s in streams):
        return None
    tokens, seconds = steady_window([list(s.times) for s in streams], skip)
    return tokens / seconds if seconds > 0 else None


def median(values: Sequence[float | None]) -> float | None:
    """Median of the values that exist (None when none do)."""
    present = [v for v in values if v is not None]
    return statistics.median(present) if present else None


def first_error(streams: Sequence[Stream]) -> str | None:
    return next((s.error for s in streams if s.error), None)


class ImageFiles:
    """Deterministic PNGs in a temp dir (the server's --allowed-media-dir); `seed` makes them
    distinct (new pixels: vision- and prefix-cache misses)."""

    def __init__(self) -> None:
        self._dir = tempfile.TemporaryDirectory(prefix="vision-gateway-hotpath-")
        self.root = Path(self._dir.name).resolve()

    def path(self, size: int, seed: int) -> str:
        """Absolute path of a size x size PNG (written on first use)."""
        target = self.root / f"img-{size}-{seed}.png"
        if not target.exists():
            target.write_bytes(base64.b64decode(self.uri(size, seed).split(",", 1)[1]))
        return str(target)

    @staticmethod
    def uri(size: int, seed: int) -> str:
        return image_data_uri(size=size, seed=seed)

    def close(self) -> None:
        self._dir.cleanup()


def image_turn(url: str, question: str) -> dict[str, Any]:
    return {
        "role": "user",
        "content": [
            {"type": "image_url", "image_url": {"url": url}},
            {"type": "text", "text": question},
        ],
    }
