"""An admitted chat request, as the front end hands it to an API: the engine's admission
event, the stream of the request's later events, and where the time went on the way.

Immutable values; the stream inside is read on the event loop by one consumer (the API
rendering it).
"""

from __future__ import annotations

from dataclasses import dataclass

from gateway.engine.request import AdmittedEvent, Event
from gateway.frontend.chat import ChatRequest
from gateway.frontend.streams import EventStream
from gateway.tools.formats import ToolFormat


@dataclass(frozen=True)
class Timings:
    """perf_counter() marks of one request's way to admission (seconds): it arrived, its body
    was read, its media loaded, its prompt built, the engine admitted it."""

    arrival: float
    read: float
    media: float
    prompt: float
    admit: float

    def server_timing(self) -> str:
        """A standard Server-Timing header value (ms per phase)."""
        marks = (self.arrival, self.read, self.media, self.prompt, self.admit)
        names = ("read", "media", "prompt", "admit")
        return ", ".join(
            f"{name};dur={1000 * (b - a):.1f}"
            for name, a, b in zip(names, marks[:-1], marks[1:], strict=True)
        )


@dataclass(frozen=True)
class Admission:
    """An admitted request: its later events arrive on `stream` (tokens, then one finish or
    error event). The caller owns cancelling it (`ChatPipeline.cancel`) if it stops reading."""

    request_id: str
    chat: ChatRequest
    event: AdmittedEvent
    stream: EventStream[Event]
    timings: Timings
    # The call syntax to split the answer by (gateway.tools.calls), when it was decoded
    # under a tool grammar; None: the answer is plain text.
    tool_format: ToolFormat | None = None
    # The answer may hold thinking (the model thinks and the prompt left it open): its
    # events' `reasoning` text is rendered as the API's thinking (reasoning_content,
    # thinking blocks, reasoning items).
    thinks: bool = False
    # The most tokens the answer may have: the request's max_tokens, or less where the
    # prompt leaves less room in the context (None: not told).
    max_tokens: int | None = None

    def headers(self) -> dict[str, str]:
        """x-request-id, x-cache (hits and cached tokens) and Server-Timing, the same for
        every API; x-ignored-fields when the body held fields the API's parser ignored;
        x-max-tokens-capped when its max_tokens was more than the context leaves."""
        e = self.event
        ignored = {"x-ignored-fields": ", ".join(self.chat.ignored_fields)}
        return {
            **(ignored if self.chat.ignored_fields else {}),
            **self._capped(),
            "x-request-id": self.request_id,
            "x-cache": (
                f"vision-hits={e.vision_hits}; vision-misses={e.vision_misses}; "
                f"cached-tokens={e.cached_tokens}; prompt-tokens={e.prompt_tokens}; "
                f"vision-disk-hits={e.vision_disk_hits}; "
                f"disk-cached-tokens={e.disk_cached_tokens}"
            ),
            "server-timing": self.timings.server_timing(),
        }

    def _capped(self) -> dict[str, str]:
        """`x-max-tokens-capped: requested=32000; capped=17231; prompt-tokens=23537;
        context=40768` when the request's max_tokens (max_output_tokens) was more than the
        room its prompt left in the context; the answer then ends with the API's length
        reason if it gets there."""
        asked, granted = self.chat.max_tokens, self.max_tokens
        if asked is None or granted is None or granted >= asked:
            return {}
        prompt = self.event.prompt_tokens
        value = (
            f"requested={asked}; capped={granted}; prompt-tokens={prompt}; "
            f"context={prompt + granted}"
        )
        return {"x-max-tokens-capped": value}
