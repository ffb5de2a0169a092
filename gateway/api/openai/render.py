"""OpenAI response bodies on the wire: `chat.completion` JSON, `chat.completion.chunk` SSE
streams and error objects.

Pure formatting over engine events (see gateway.engine.request); no engine or cache access.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from typing import Any

from starlette.responses import Response

from gateway.api.http import json_response
from gateway.api.openai.tool_render import call_dicts, finish_reason, piece_delta
from gateway.api.sse import DONE, sse_data
from gateway.engine.request import (
    ErrorEvent,
    Event,
    FinishEvent,
    TokenEvent,
    TokenLogprob,
    Usage,
)
from gateway.errors import APIError
from gateway.frontend.errors import engine_error
from gateway.frontend.streams import EventStream
from gateway.tools.calls import CallSplitter
from gateway.tools.formats import ToolFormat


def error_body(error: APIError) -> dict[str, Any]:
    """`{"error": {"message", "type", "param", "code"}}`."""
    return {
        "error": {
            "message": error.message,
            "type": error.type,
            "param": error.param,
            "code": error.code,
        }
    }


def render_error(error: APIError) -> Response:
    """An APIError as OpenAI's error response (status, body, headers such as Retry-After)."""
    return json_response(error_body(error), error.status, error.headers)


async def sse_stream(
    stream: EventStream[Event],
    request_id: str,
    created: int,
    model: str,
    usage: bool,
    on_abandon: Callable[[], None],
    tool_format: ToolFormat | None = None,
    choices: int = 1,
) -> AsyncIterator[str]:
    """OpenAI chat.completion.chunk events until [DONE]. `on_abandon` runs if the client goes
    away before the end (the generator is closed early), to free the request's row. With a
    `tool_format` the answer is split into `content` and `tool_calls` deltas. With `choices`
    > 1 every chunk names its choice's `index`; each choice ends with its own finish chunk,
    and the usage chunk (prompt counted once) follows the last.

    Events that are already waiting are written together (one chunk per token still, but
    one transport write), so a busy loop does not fall further behind the engine."""
    done = False
    # One splitter per choice: each choice's text is split into content and calls alone.
    splitters = [
        CallSplitter(tool_format) if tool_format is not None else None for _ in range(choices)
    ]
    ends: list[FinishEvent] = []

    def chunk(index: int, delta: dict[str, Any], reason: str | None = None, lps: Any = None) -> str:
        return sse_data(chunk_body(request_id, created, model, delta, reason, lps, index))

    def split_chunks(
        index: int, text: str, logprobs: list[TokenLogprob], end: FinishEvent | None = None
    ) -> str:
        splitter = splitters[index]
        assert splitter is not None
        cut = end is not None and end.finish_reason == "length"
        pieces = splitter.feed(text) + (splitter.finish(cut) if end is not None else [])
        deltas = [d for d in map(piece_delta, pieces) if d is not None]
        if logprobs and not deltas:
            deltas = [{"content": ""}]
        return "".join(
            chunk(index, d, None, logprobs if i == 0 else None) for i, d in enumerate(deltas)
        )

    def token_chunk(event: TokenEvent) -> str:
        thought, logprobs = "", event.logprobs
        if event.reasoning:  # vLLM's `delta.reasoning_content`; the token's logprobs ride on it
            thought = chunk(
                event.index, {"reasoning_content": event.reasoning}, None, list(logprobs)
            )
            logprobs = ()
        if not (event.text or logprobs):
            return thought  # held back (a possible stop string, a partial character)
        if splitters[event.index] is not None:
            return thought + split_chunks(event.index, event.text, list(logprobs))
        return thought + chunk(event.index, {"content": event.text}, None, list(logprobs))

    def final_chunks(event: FinishEvent) -> str:
        out = []
        reason: str = event.finish_reason
        if event.reasoning:
            out.append(chunk(event.index, {"reasoning_content": event.reasoning}))
        splitter = splitters[event.index]
        if splitter is not None:
            out.append(split_chunks(event.index, event.text, [], end=event))
            reason = finish_reason(event, splitter.calls)
        elif event.text:
            out.append(chunk(event.index, {"content": event.text}))
        out.append(chunk(event.index, {}, reason))
        ends.append(event)
        if not event.final:
            return "".join(out)
        if usage:
            out.append(sse_data(usage_chunk_body(request_id, created, model, total_usage(ends))))
        return "".join(out) + DONE

    try:
        yield "".join(chunk(i, {"role": "assistant", "content": ""}) for i in range(choices))
        while not done:
            out: list[str] = []
            for event in await stream.get_ready():
                if isinstance(event, TokenEvent):
                    out.append(token_chunk(event))
                elif isinstance(event, FinishEvent):
                    done = event.final
                    out.append(final_chunks(event))
                    if done:
                        break
                elif isinstance(event, ErrorEvent):
                    done = True
                    out.append(sse_data(error_body(engine_error(event))) + DONE)
                    break
            text = "".join(out)
            if text:
                yield text
    finally:
        if not done:
            on_abandon()


async def collect(
    stream: EventStream[Event],
    request_id: str,
    created: int,
    model: str,
    want_logprobs: bool,
    tool_format: ToolFormat | None = None,
    choices: int = 1,
) -> dict[str, Any]:
    """The `chat.completion` body: `choices` choices in index order; usage counts the prompt
    once and every choice's completion."""
    pieces: list[list[str]] = [[] for _ in range(choices)]
    thoughts: list[list[str]] = [[] for _ in range(choices)]
    logprobs: list[list[Any]] = [[] for _ in range(choices)]
    ends: dict[int, FinishEvent] = {}
    while True:
        event = await stream.get()
        if isinstance(event, TokenEvent):
            pieces[event.index].append(event.text)
            thoughts[event.index].append(event.reasoning)
            logprobs[event.index].extend(event.logprobs)
        elif isinstance(event, FinishEvent):
            pieces[event.index].append(event.text)
            thoughts[event.index].append(event.reasoning)
            ends[event.index] = event
            if event.final:
                break
        elif isinstance(event, ErrorEvent):
            raise engine_error(event)
    done = [ends[i] for i in sorted(ends)]
    body = completion_body(request_id, created, model, "", "stop", total_usage(done), None)
    body["choices"] = [
        _choice(i, "".join(pieces[i]), ends[i], logprobs[i] if want_logprobs else None, tool_format)
        for i in sorted(ends)
    ]
    for choice in body["choices"]:
        thought = "".join(thoughts[choice["index"]])
        if thought:  # vLLM's field: the model's thinking, apart from its answer
            choice["message"]["reasoning_content"] = thought
    return body


def _choice(
    index: int,
    text: str,
    end: FinishEvent,
    logprobs: list[TokenLogprob] | None,
    tool_format: ToolFormat | None,
) -> dict[str, Any]:
    """One choice of a `chat.completion` body."""
    choice = {
        "index": index,
        "message": {"role": "assistant", "content": text},
        "logprobs": logprobs_dict(logprobs) if logprobs is not None else None,
        "finish_reason": end.finish_reason,
    }
    if tool_format is not None:
        splitter = CallSplitter(tool_format)
        splitter.feed(text)
        splitter.finish(cut=end.finish_reason == "length")
        content = splitter.text  # without a call's syntax cut short before its name
        choice["message"]["content"] = content  # type: ignore[index]
        if splitter.calls:
            choice["message"]["content"] = content if content.strip() else None  # type: ignore[index]
            choice["message"]["tool_calls"] = call_dicts(splitter.calls)  # type: ignore[index]
        choice["finish_reason"] = finish_reason(end, splitter.calls)
    return choice


def total_usage(ends: list[FinishEvent]) -> Usage:
    """The request's usage from its choices' ends: the prompt once, every completion."""
    first = ends[0].usage
    completion = sum(e.usage.completion_tokens for e in ends)
    return Usage(
        first.prompt_tokens,
        completion,
        first.cached_tokens,
        first.vision_hits,
        first.vision_misses,
        sum(e.usage.reasoning_tokens for e in ends),
    )


def usage_dict(usage: Usage) -> dict[str, Any]:
    return {
        "prompt_tokens": usage.prompt_tokens,
        "completion_tokens": usage.completion_tokens,
        "total_tokens": usage.total_tokens,
        "prompt_tokens_details": {"cached_tokens": usage.cached_tokens},
        **(
            {"completion_tokens_details": {"reasoning_tokens": usage.reasoning_tokens}}
            if usage.reasoning_tokens
            else {}
        ),
    }


def logprob_list(entries: list[TokenLogprob] | tuple[TokenLogprob, ...]) -> list[dict[str, Any]]:
    """Token logprobs in OpenAI's wire shape (chat `logprobs.content`, Responses deltas)."""
    return [
        {
            "token": e.token,
            "logprob": e.logprob,
            "bytes": list(e.bytes),
            "top_logprobs": [
                {"token": t, "logprob": lp, "bytes": list(b)} for t, _, lp, b in e.top
            ],
        }
        for e in entries
    ]


def logprobs_dict(entries: list[TokenLogprob]) -> dict[str, Any]:
    return {"content": logprob_list(entries)}


def completion_body(
    request_id: str,
    created: int,
    model: str,
    text: str,
    finish_reason: str,
    usage: Usage,
    logprobs: list[TokenLogprob] | None,
) -> dict[str, Any]:
    return {
        "id": request_id,
        "object": "chat.completion",
        "created": created,
        "model": model,
        "choices": [
            {
                "index": 0,
                "message": {"role": "assistant", "content": text},
                "logprobs": logprobs_dict(logprobs) if logprobs is not None else None,
                "finish_reason": finish_reason,
            }
        ],
        "usage": usage_dict(usage),
    }


def chunk_body(
    request_id: str,
    created: int,
    model: str,
    delta: dict[str, Any],
    finish_reason: str | None = None,
    logprobs: list[TokenLogprob] | None = None,
    index: int = 0,
) -> dict[str, Any]:
    return {
        "id": request_id,
        "object": "chat.completion.chunk",
        "created": created,
        "model": model,
        "choices": [
            {
                "index": index,
                "delta": delta,
                "logprobs": logprobs_dict(logprobs) if logprobs else None,
                "finish_reason": finish_reason,
            }
        ],
    }


def usage_chunk_body(request_id: str, created: int, model: str, usage: Usage) -> dict[str, Any]:
    return {
        "id": request_id,
        "object": "chat.completion.chunk",
        "created": created,
        "model": model,
        "choices": [],
        "usage": usage_dict(usage),
    }
