"""One streamed chat completion against any OpenAI-compatible server, timed by a plain client.

A plain httpx SSE reader (no SDK parsing on the timed path) that tolerates what servers differ
in: a server that refuses an optional field (`stream_options`, `logprobs`, vLLM's `ignore_eos`)
with a 4xx gets the request again without it, and the field stays off for that client. Token
counts come from the final usage chunk when the server sends one, otherwise from the number of
content chunks (one token per chunk on every server measured; `Stream.note` says which).

Times are `time.perf_counter()` seconds in the client; the result is `hotpath_client.Stream`
so the hotpath helpers (`aggregate_tok_s`, `median`) apply unchanged.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from typing import Any

import httpx

from bench.hotpath_client import Stream
from bench.timing import server_timing

OPTIONAL_FIELDS = ("ignore_eos", "logprobs", "stream_options")


@dataclass
class ChatClient:
    """Streams chat completions to `base_url` (no `/v1`) as model `model`. Not thread-safe:
    one per event loop. `dropped` lists optional fields the server refused."""

    http: httpx.AsyncClient
    model: str
    ignore_eos: bool = True
    dropped: set[str] = field(default_factory=set)
    counted_by_chunks: bool = False  # some reply had no usage: tokens counted by chunks

    @classmethod
    def open(cls, base_url: str, model: str, api_key: str = "unused", **kw: Any) -> ChatClient:
        limits = httpx.Limits(max_connections=256, max_keepalive_connections=256)
        http = httpx.AsyncClient(
            base_url=base_url.rstrip("/").removesuffix("/v1") + "/v1",
            headers={"Authorization": f"Bearer {api_key}"},
            timeout=httpx.Timeout(600.0, connect=30.0),
            limits=limits,
        )
        return cls(http, model, **kw)

    async def aclose(self) -> None:
        await self.http.aclose()

    def body(self, messages: list[dict[str, Any]], max_tokens: int, **extra: Any) -> dict:
        body: dict[str, Any] = {
            "model": self.model,
            "messages": messages,
            "max_tokens": max_tokens,
            "temperature": 0,
            "stream": True,
            "stream_options": {"include_usage": True},
            **extra,
        }
        if self.ignore_eos:
            body["ignore_eos"] = True
        for name in self.dropped:
            body.pop(name, None)
        return body

    async def chat(self, messages: list[dict[str, Any]], max_tokens: int, **extra: Any) -> Stream:
        """One streamed completion; never raises (a failure comes back in `Stream.error`)."""
        for _ in range(len(OPTIONAL_FIELDS) + 1):
            body = self.body(messages, max_tokens, **extra)
            result, refused = await self._once(body)
            if refused is None:
                return result
            self.dropped.add(refused)  # the server said no to this field: retry without it
        return result

    async def _once(self, body: dict[str, Any]) -> tuple[Stream, str | None]:
        start = time.perf_counter()
        got: dict[str, Any] = {"start": start}
        chunks = 0
        try:
            async with self.http.stream("POST", "/chat/completions", json=body) as r:
                if r.status_code != 200:
                    text = (await r.aread()).decode(errors="replace")
                    refused = _refused_field(r.status_code, text, body)
                    got["error"] = f"HTTP {r.status_code}: {text[:300]}"
                    return Stream(**got), refused
                got["server_timing"] = server_timing(r.headers.get("server-timing", ""))
                text_parts: list[str] = []
                async for line in r.aiter_lines():
                    if not line.startswith("data:"):
                        continue
                    payload = line[5:].strip()
                    if payload == "[DONE]":
                        break
                    now = time.perf_counter()
                    chunk = json.loads(payload)
                    if "error" in chunk:
                        got["error"] = f"stream error: {str(chunk['error'])[:300]}"
                        break
                    if usage := chunk.get("usage"):
                        _read_usage(usage, got)
                    for choice in chunk.get("choices") or []:
                        delta = choice.get("delta") or {}
                        if delta.get("role") and "role" not in got:
                            got["role"] = now
                        content = delta.get("content")
                        if content or (choice.get("logprobs") or {}).get("content"):
                            chunks += 1
                            got.setdefault("first", now)
                            got["last"] = now
                            got.setdefault("times", []).append(now)
                            text_parts.append(content or "")
                        got["finish_reason"] = choice.get("finish_reason") or got.get(
                            "finish_reason"
                        )
                got["text"] = "".join(text_parts)
        except (httpx.HTTPError, ValueError) as exc:
            got["error"] = f"{type(exc).__name__}: {exc}"[:300]
        if "completion_tokens" not in got and chunks:
            got["completion_tokens"] = chunks
            self.counted_by_chunks = True
        return Stream(**got), None


def _read_usage(usage: dict[str, Any], got: dict[str, Any]) -> None:
    if usage.get("completion_tokens") is not None:
        got["completion_tokens"] = int(usage["completion_tokens"])
    if usage.get("prompt_tokens") is not None:
        got["prompt_tokens"] = int(usage["prompt_tokens"])
    details = usage.get("prompt_tokens_details") or {}
    got["cached_tokens"] = int(details.get("cached_tokens") or 0)


def _refused_field(status: int, text: str, body: dict[str, Any]) -> str | None:
    """The optional field a 4xx names (so the request can go again without it), if any."""
    if not 400 <= status < 500 or status == 429:
        return None
    for name in OPTIONAL_FIELDS:
        if name in body and name in text:
            return name
    return None
