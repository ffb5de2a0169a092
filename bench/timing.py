"""Timed streaming requests through the real `openai` client."""

from __future__ import annotations

import base64
import io
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any


@dataclass
class StreamTiming:
    """Arrival times are `time.perf_counter()` seconds. With `logprobs=True` every token
    yields one chunk, so `token_times` has one entry per generated token."""

    start: float
    token_times: list[float] = field(default_factory=list)
    text: str = ""
    token_ids: list[str] = field(default_factory=list)  # token strings (logprobs), for equality
    logprobs: list[float] = field(default_factory=list)
    usage: Any = None
    finish_reason: str | None = None
    server_timing: dict[str, float] = field(default_factory=dict)  # ms, from the header

    @property
    def ttft_s(self) -> float:
        return self.token_times[0] - self.start if self.token_times else float("nan")

    @property
    def gaps_s(self) -> list[float]:
        return [b - a for a, b in zip(self.token_times, self.token_times[1:])]

    @property
    def prompt_tokens(self) -> int | None:
        """From the usage chunk; None when the server sent no usage."""
        value = getattr(self.usage, "prompt_tokens", None)
        return None if value is None else int(value)

    @property
    def cached_tokens(self) -> int:
        details = getattr(self.usage, "prompt_tokens_details", None)
        return int(getattr(details, "cached_tokens", 0) or 0)


def timed_stream(
    client: Any,
    model: str,
    messages: list[dict[str, Any]],
    max_tokens: int,
    timing: StreamTiming | None = None,
    **kwargs: Any,
) -> StreamTiming:
    """Stream one greedy completion, recording token arrivals into `timing` (pass your own to
    watch progress from another thread).

    Works against any OpenAI-compatible server: a server that refuses `logprobs` or
    `stream_options` (a 400 naming the field) is asked again without it; with no logprobs in
    the stream every content chunk counts as one token (`token_ids` then holds the text)."""
    import openai

    timing = timing or StreamTiming(start=time.perf_counter())
    options: dict[str, Any] = {"stream_options": {"include_usage": True}, "logprobs": True}
    options = {k: v for k, v in options.items() if k not in _REFUSED}
    try:
        raw = client.chat.completions.with_raw_response.create(
            model=model,
            messages=messages,
            max_tokens=max_tokens,
            stream=True,
            temperature=kwargs.pop("temperature", 0),
            **options,
            **kwargs,
        )
    except openai.BadRequestError as exc:
        refused = next((k for k in options if k in str(exc)), None)
        if refused is None:
            raise
        _REFUSED.add(refused)
        return timed_stream(client, model, messages, max_tokens, timing, **kwargs)
    timing.server_timing.update(server_timing(raw.headers.get("server-timing", "")))
    for chunk in raw.parse():
        now = time.perf_counter()
        if chunk.usage is not None:
            timing.usage = chunk.usage
        if not chunk.choices:
            continue
        choice = chunk.choices[0]
        if choice.logprobs is not None and choice.logprobs.content:
            for entry in choice.logprobs.content:
                timing.token_times.append(now)
                timing.token_ids.append(entry.token)
                timing.logprobs.append(entry.logprob)
        elif choice.delta.content:  # a server without logprobs: one chunk, one token
            timing.token_times.append(now)
            timing.token_ids.append(choice.delta.content)
        timing.text += choice.delta.content or ""
        if choice.finish_reason:
            timing.finish_reason = choice.finish_reason
    return timing


# Optional request fields some server refused with a 400 (process-wide: one bench, one target).
_REFUSED: set[str] = set()


def image_data_uri(path: Path | None = None, size: int = 448, seed: int = 0) -> str:
    """A PNG data URI: the file at `path`, or a deterministic `size`x`size` drawing that
    differs with `seed` (distinct pixels, so distinct cache entries)."""
    if path is not None:
        data = path.read_bytes()
    else:
        from PIL import Image, ImageDraw

        image = Image.new("RGB", (size, size), (240 - seed % 50, 235, 225 + seed % 30))
        draw = ImageDraw.Draw(image)
        for i in range(6):
            x = (seed * 37 + i * 71) % (size - size // 4)
            y = (seed * 53 + i * 97) % (size - size // 4)
            color = ((seed * 11 + i * 40) % 256, (i * 90) % 256, (seed * 7 + i * 60) % 256)
            draw.ellipse((x, y, x + size // 4, y + size // 4), fill=color)
        buf = io.BytesIO()
        image.save(buf, format="PNG")
        data = buf.getvalue()
    return "data:image/png;base64," + base64.b64encode(data).decode()


def image_message(uri: str, question: str) -> dict[str, Any]:
    return {
        "role": "user",
        "content": [
            {"type": "image_url", "image_url": {"url": uri}},
            {"type": "text", "text": question},
        ],
    }


def server_timing(header: str) -> dict[str, float]:
    """`read;dur=1.2, media;dur=3.4` -> {"read": 1.2, "media": 3.4} (ms)."""
    out: dict[str, float] = {}
    for item in header.split(","):
        name, _, duration = item.strip().partition(";dur=")
        if duration:
            out[name] = float(duration)
    return out
