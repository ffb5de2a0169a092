"""OpenAI Responses-API bodies on the wire: the `response` object and its typed SSE events.

Pure formatting (no engine, no store). One response has one output item, an assistant
`message` with one `output_text` part. Streams follow the documented event sequence:

    response.created, response.in_progress, response.output_item.added,
    response.content_part.added, response.output_text.delta*, response.output_text.done,
    response.content_part.done, response.output_item.done,
    then response.completed | response.incomplete (max_output_tokens) | response.failed,
    or an `error` event when the request fails mid-stream

each with a `sequence_number` counting from 0.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from gateway.api.openai.render import logprob_list
from gateway.api.responses.parse import ResponsesRequest
from gateway.api.sse import sse_data
from gateway.engine.request import TokenLogprob, Usage
from gateway.errors import APIError

STATUS_BY_FINISH = {"stop": "completed", "length": "incomplete", "cancelled": "cancelled"}


@dataclass(frozen=True)
class ResponseMeta:
    """What a response body repeats from its request, fixed when it is created."""

    response_id: str
    message_id: str
    created_at: int
    request: ResponsesRequest


def usage_dict(usage: Usage) -> dict[str, Any]:
    """OpenAI's usage, plus how many of the request's images the vision tower ran on
    (`images_encoded`, e.g. a stored image whose features left the caches) or found cached
    (`images_cached`)."""
    return {
        "input_tokens": usage.prompt_tokens,
        "input_tokens_details": {
            "cached_tokens": usage.cached_tokens,
            "images_encoded": usage.vision_misses,
            "images_cached": usage.vision_hits,
        },
        "output_tokens": usage.completion_tokens,
        "output_tokens_details": {"reasoning_tokens": 0},
        "total_tokens": usage.total_tokens,
    }


def text_part(text: str, logprobs: list[TokenLogprob] | None) -> dict[str, Any]:
    return {
        "type": "output_text",
        "text": text,
        "annotations": [],
        "logprobs": logprob_list(logprobs or []),
    }


def message_item(
    meta: ResponseMeta, status: str, text: str | None, logprobs: list[TokenLogprob] | None
) -> dict[str, Any]:
    """The assistant message item; `text` None: no content part yet (a stream's start)."""
    return {
        "type": "message",
        "id": meta.message_id,
        "status": status,
        "role": "assistant",
        "content": [] if text is None else [text_part(text, logprobs)],
    }


def response_body(
    meta: ResponseMeta,
    status: str,
    text: str | None = None,
    logprobs: list[TokenLogprob] | None = None,
    usage: Usage | None = None,
    error: APIError | None = None,
) -> dict[str, Any]:
    """The `response` object. `status`: in_progress, completed, incomplete, cancelled or
    failed; `text` None leaves `output` empty."""
    r = meta.request
    item_status = "completed" if status in ("completed", "cancelled") else status
    if status == "failed":
        item_status = "incomplete"
    return {
        "id": meta.response_id,
        "object": "response",
        "created_at": meta.created_at,
        "status": status,
        "error": None
        if error is None
        else {"code": error.code or error.type, "message": error.message},
        "incomplete_details": {"reason": "max_output_tokens"} if status == "incomplete" else None,
        "instructions": r.instructions,
        "max_output_tokens": r.max_output_tokens,
        "model": r.model,
        "output": [] if text is None else [message_item(meta, item_status, text, logprobs)],
        "parallel_tool_calls": False,
        "previous_response_id": r.previous_response_id,
        "reasoning": {"effort": None, "summary": None},
        "store": r.store,
        "temperature": r.temperature,
        "text": {"format": r.text_format},
        "tool_choice": "none",
        "tools": [],
        "top_logprobs": r.top_logprobs,
        "top_p": r.top_p,
        "truncation": r.truncation,
        "usage": None if usage is None else usage_dict(usage),
        "metadata": r.metadata,
    }


def error_event(error: APIError, sequence: int) -> str:
    """The stream's `error` event (the stream ends after it)."""
    body = {
        "type": "error",
        "code": error.code or error.type,
        "message": error.message,
        "param": error.param,
        "sequence_number": sequence,
    }
    return sse_data(body, "error")


class EventWriter:
    """Numbers and frames one stream's events (one writer per stream; not thread-safe)."""

    def __init__(self, meta: ResponseMeta) -> None:
        self.meta = meta
        self.sequence = 0

    def event(self, kind: str, **payload: Any) -> str:
        body = {"type": kind, **payload, "sequence_number": self.sequence}
        self.sequence += 1
        return sse_data(body, kind)

    def _at(self) -> dict[str, Any]:
        return {"item_id": self.meta.message_id, "output_index": 0, "content_index": 0}

    def opening(self) -> str:
        body = response_body(self.meta, "in_progress")
        return "".join(
            (
                self.event("response.created", response=body),
                self.event("response.in_progress", response=body),
                self.event(
                    "response.output_item.added",
                    output_index=0,
                    item=message_item(self.meta, "in_progress", None, None),
                ),
                self.event("response.content_part.added", **self._at(), part=text_part("", [])),
            )
        )

    def delta(self, text: str, logprobs: tuple[TokenLogprob, ...]) -> str:
        return self.event(
            "response.output_text.delta", **self._at(), delta=text, logprobs=logprob_list(logprobs)
        )

    def closing(self, final: dict[str, Any]) -> str:
        """The done events and the terminal event for the finished `final` response body."""
        item = final["output"][0]
        part = item["content"][0]
        terminal = {"incomplete": "response.incomplete", "failed": "response.failed"}.get(
            final["status"], "response.completed"
        )
        return "".join(
            (
                self.event(
                    "response.output_text.done",
                    **self._at(),
                    text=part["text"],
                    logprobs=part["logprobs"],
                ),
                self.event("response.content_part.done", **self._at(), part=part),
                self.event("response.output_item.done", output_index=0, item=item),
                self.event(terminal, response=final),
            )
        )
