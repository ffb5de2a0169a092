"""OpenAI Responses-API bodies on the wire: the `response` object and its typed SSE events.

Pure formatting (no engine, no store). A response's output is an assistant `message` with
one `output_text` part; with tools, the message only when the answer has text (not just
whitespace), then one `function_call` item per call (their stream: gateway.api.responses.
tool_events). Streams without tools follow the documented event sequence:

    response.created, response.in_progress, response.output_item.added,
    response.content_part.added, response.output_text.delta*, response.output_text.done,
    response.content_part.done, response.output_item.done,
    then response.completed | response.incomplete (max_output_tokens) | response.failed,
    or an `error` event when the request fails mid-stream

each with a `sequence_number` counting from 0.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from gateway.api.openai.render import logprob_list
from gateway.api.responses.parse import ResponsesRequest
from gateway.api.responses.sealed import ReasoningSeal
from gateway.api.responses.tool_list import ToolNames
from gateway.api.sse import sse_data
from gateway.engine.request import TokenLogprob, Usage
from gateway.errors import APIError
from gateway.tools.spec import ToolCall

STATUS_BY_FINISH = {"stop": "completed", "length": "incomplete", "cancelled": "cancelled"}


@dataclass(frozen=True)
class ResponseMeta:
    """What a response body repeats from its request, fixed when it is created."""

    response_id: str
    message_id: str
    created_at: int
    request: ResponsesRequest
    seal: ReasoningSeal | None = None  # seals the thinking when `include` asks for it


def usage_dict(usage: Usage) -> dict[str, Any]:
    """OpenAI's usage, plus how many of the request's images the vision tower ran on
    (`images_encoded`, e.g. a stored image whose features left the caches) or found cached
    (`images_cached`)."""
    return {
        "input_tokens": usage.prompt_tokens,
        "input_tokens_details": {
            # 0, as Anthropic's cache_creation_input_tokens here: the caches fill themselves,
            # no request asks for (or pays) a cache write; the SDK's types require the field.
            "cache_write_tokens": 0,
            "cached_tokens": usage.cached_tokens,
            "images_encoded": usage.vision_misses,
            "images_cached": usage.vision_hits,
        },
        "output_tokens": usage.completion_tokens,
        "output_tokens_details": {"reasoning_tokens": usage.reasoning_tokens},
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


@dataclass(frozen=True)
class MadeCall:
    """A call of the answer and whether it was finished (False: max_output_tokens cut its
    arguments short)."""

    call: ToolCall
    complete: bool = True


def call_item(call: ToolCall, status: str, names: ToolNames) -> dict[str, Any]:
    """A `function_call` output item (with `namespace` and the inner `name` for a tool of a
    namespace), or a `custom_tool_call` whose `input` is the string argument the model wrote
    ("" while it is incomplete); its id is the call id's random part after `fc_` / `ctc_`."""
    wire = names.wire(call.name)
    key = call.id.removeprefix("call_")
    item: dict[str, Any] = {"type": "function_call", "id": "fc_" + key, "call_id": call.id}
    if wire.custom:
        item = {"type": "custom_tool_call", "id": "ctc_" + key, "call_id": call.id}
        item["input"] = custom_input(call.arguments)
    else:
        item["arguments"] = call.arguments
    if wire.namespace is not None:
        item["namespace"] = wire.namespace
    return {**item, "name": wire.name, "status": status}


def custom_input(arguments: str) -> str:
    """A custom tool's `input` from the `{"input": "..."}` arguments the model wrote ("" for
    arguments cut short)."""
    try:
        value = json.loads(arguments)
    except json.JSONDecodeError:
        return ""
    text = value.get("input") if isinstance(value, dict) else None
    return text if isinstance(text, str) else ""


def reasoning_item(meta: ResponseMeta, status: str, text: str) -> dict[str, Any]:
    """The `reasoning` output item: the model's thinking as `reasoning_text` content; with
    `reasoning.summary` asked, the same text as its one summary part (this server has no
    separate summarizer: the summary is the thinking itself); with `include:
    ["reasoning.encrypted_content"]`, the thinking sealed (gateway.api.responses.sealed) for
    the client to send back."""
    asked = meta.request.reasoning_summary and text
    summary = [{"type": "summary_text", "text": text}] if asked else []
    seal = meta.seal if meta.request.encrypted_reasoning and text else None
    return {
        "type": "reasoning",
        "id": reasoning_id(meta),
        "status": status,
        "summary": summary,
        "content": [{"type": "reasoning_text", "text": text}],
        "encrypted_content": seal.seal(text) if seal is not None else None,
    }


def reasoning_id(meta: ResponseMeta) -> str:
    return "rs_" + meta.message_id.removeprefix("msg_")


def tools_on(request: ResponsesRequest) -> bool:
    """Whether the answer is decoded under the tool grammar (and split into calls)."""
    return request.tools is not None and request.tools.constrained


def response_body(
    meta: ResponseMeta,
    status: str,
    text: str | None = None,
    logprobs: list[TokenLogprob] | None = None,
    usage: Usage | None = None,
    error: APIError | None = None,
    calls: Sequence[MadeCall] = (),
    reasoning: str | None = None,
) -> dict[str, Any]:
    """The `response` object. `status`: in_progress, completed, incomplete, cancelled or
    failed; `text` None leaves `output` empty; `calls` follow the message (which, with tools
    on, is left out when `text` is only whitespace, and after a thinking when it is empty).
    `reasoning`: the thinking ("" none; None: the model does not think), an item first."""
    r = meta.request
    item_status = "completed" if status in ("completed", "cancelled") else status
    if status == "failed":
        item_status = "incomplete"
    output = []
    if reasoning:
        output.append(reasoning_item(meta, "completed" if text else item_status, reasoning))
    blank = tools_on(r) and not text.strip() if text is not None else False
    if text is not None and not blank and not (reasoning and not text):
        done = "completed" if calls else item_status  # a call after it closed it
        output.append(message_item(meta, done, text, logprobs))
    names = r.tool_names
    output += [
        call_item(c.call, "completed" if c.complete else "incomplete", names) for c in calls
    ]
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
        "output": output,
        "parallel_tool_calls": r.tools.parallel if r.tools is not None else True,
        "previous_response_id": r.previous_response_id,
        "reasoning": {"effort": None, "summary": r.reasoning_summary},
        "store": r.store,
        "temperature": r.temperature,
        "text": {"format": r.text_format},
        "tool_choice": r.tool_choice_echo,
        "tools": list(r.tools_echo),
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
