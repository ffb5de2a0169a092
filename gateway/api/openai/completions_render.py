"""OpenAI's legacy Completions bodies on the wire: `text_completion` JSON and SSE chunks, with
the legacy logprobs shape (`tokens`, `token_logprobs`, `top_logprobs` as token -> logprob
maps, `text_offset`).

Pure formatting over the engine events of one or more admitted prompts (a request's prompts
are numbered in order; prompt k's choice i is `index = k * n + i`). Usage counts every
prompt and every completion.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Callable, Sequence
from typing import Any

from gateway.api.openai.render import error_body, total_usage, usage_dict
from gateway.api.sse import DONE, sse_data
from gateway.engine.request import ErrorEvent, Event, FinishEvent, TokenEvent, TokenLogprob, Usage
from gateway.frontend.admission import Admission
from gateway.frontend.errors import engine_error

EchoText = Sequence[str]  # each prompt's text, shown before its completions (`echo`)


class _Choice:
    """One choice's rendering state: its index, text offset and the logprobs it asked for."""

    def __init__(self, index: int, offset: int, top: int | None) -> None:
        self.index, self.offset, self.top = index, offset, top

    def logprobs(self, entries: Sequence[TokenLogprob]) -> dict[str, Any] | None:
        """The legacy logprobs of `entries` (their text offsets continue this choice's)."""
        if self.top is None:
            return None
        body: dict[str, Any] = {
            "tokens": [],
            "token_logprobs": [],
            "top_logprobs": [],
            "text_offset": [],
        }
        for entry in entries:
            body["tokens"].append(entry.token)
            body["token_logprobs"].append(entry.logprob)
            alternatives = {token: lp for token, _, lp, _ in entry.top[: self.top]}
            body["top_logprobs"].append({entry.token: entry.logprob, **alternatives})
            body["text_offset"].append(self.offset)
            self.offset += len(entry.token)
        return body


def _choices(
    admissions: Sequence[Admission], top: int | None, echo: EchoText | None
) -> list[list[_Choice]]:
    """Every prompt's choices, numbered prompt by prompt."""
    out, index = [], 0
    for k, admission in enumerate(admissions):
        start = len(echo[k]) if echo is not None else 0
        out.append([_Choice(index + i, start, top) for i in range(admission.chat.n)])
        index += admission.chat.n
    return out


def _body(
    request_id: str, created: int, model: str, choices: list[dict[str, Any]]
) -> dict[str, Any]:
    return {
        "id": request_id,
        "object": "text_completion",
        "created": created,
        "model": model,
        "choices": choices,
    }


def _choice_dict(
    choice: _Choice, text: str, logprobs: dict[str, Any] | None, reason: str | None
) -> dict[str, Any]:
    return {"index": choice.index, "text": text, "logprobs": logprobs, "finish_reason": reason}


def _sum_usage(usages: Sequence[Usage]) -> Usage:
    """Usage of several prompts: every prompt and every completion counted."""
    return Usage(
        sum(u.prompt_tokens for u in usages),
        sum(u.completion_tokens for u in usages),
        sum(u.cached_tokens for u in usages),
        sum(u.vision_hits for u in usages),
        sum(u.vision_misses for u in usages),
        sum(u.reasoning_tokens for u in usages),
    )


async def _events(admissions: Sequence[Admission]) -> AsyncIterator[tuple[int, list[Event]]]:
    """(prompt index, the events waiting) until every prompt has ended (its final finish or
    an error). One prompt is read directly; several through one queue that a reader task
    per prompt fills."""
    if len(admissions) == 1:
        stream, ended = admissions[0].stream, False
        while not ended:
            events = await stream.get_ready()
            ended = any(_ends(e) for e in events)
            yield 0, events
        return
    queue: asyncio.Queue[tuple[int, list[Event]]] = asyncio.Queue()

    async def read(k: int, admission: Admission) -> None:
        while True:
            events = await admission.stream.get_ready()
            queue.put_nowait((k, events))
            if any(_ends(e) for e in events):
                return

    readers = [asyncio.ensure_future(read(k, a)) for k, a in enumerate(admissions)]
    open_prompts = len(admissions)
    try:
        while open_prompts:
            k, events = await queue.get()
            open_prompts -= any(_ends(e) for e in events)
            yield k, events
    finally:
        for reader in readers:
            reader.cancel()
        with contextlib.suppress(BaseException):
            await asyncio.gather(*readers, return_exceptions=True)


def _ends(event: Event) -> bool:
    return isinstance(event, ErrorEvent) or (isinstance(event, FinishEvent) and event.final)


async def collect(
    admissions: Sequence[Admission],
    created: int,
    model: str,
    top: int | None,
    echo: EchoText | None,
) -> dict[str, Any]:
    """The `text_completion` body: every prompt's choices in index order."""
    states = _choices(admissions, top, echo)
    texts = {
        c.index: [echo[k] if echo is not None else ""] for k, cs in enumerate(states) for c in cs
    }
    entries: dict[int, list[TokenLogprob]] = {c.index: [] for cs in states for c in cs}
    ends: dict[int, FinishEvent] = {}
    finals: list[list[FinishEvent]] = [[] for _ in admissions]
    async for k, events in _events(admissions):
        for event in events:
            if isinstance(event, ErrorEvent):
                raise engine_error(event)
            if isinstance(event, TokenEvent):
                index = states[k][event.index].index
                texts[index].append(event.text)
                entries[index].extend(event.logprobs)
            elif isinstance(event, FinishEvent):
                index = states[k][event.index].index
                texts[index].append(event.text)
                ends[index] = event
                finals[k].append(event)
    choices = [
        _choice_dict(
            c, "".join(texts[c.index]), c.logprobs(entries[c.index]), ends[c.index].finish_reason
        )
        for cs in states
        for c in cs
    ]
    body = _body(admissions[0].request_id, created, model, choices)
    body["usage"] = usage_dict(_sum_usage([total_usage(f) for f in finals]))
    return body


async def sse_stream(
    admissions: Sequence[Admission],
    created: int,
    model: str,
    top: int | None,
    echo: EchoText | None,
    usage: bool,
    on_abandon: Callable[[], None],
) -> AsyncIterator[str]:
    """`text_completion` chunks until [DONE]: the echoed prompts first, then one chunk per
    token event with text or logprobs, each choice's finish chunk, and (`usage`) a usage
    chunk after the last. `on_abandon` runs if the client goes away before the end."""
    states = _choices(admissions, top, echo)
    request_id = admissions[0].request_id
    finals: list[list[FinishEvent]] = [[] for _ in admissions]
    done = failed = False

    def chunk(choice: _Choice, text: str, lps: Any = None, reason: str | None = None) -> str:
        return sse_data(
            _body(request_id, created, model, [_choice_dict(choice, text, lps, reason)])
        )

    try:
        if echo is not None:
            yield "".join(chunk(c, echo[k]) for k, cs in enumerate(states) for c in cs)
        async for k, events in _events(admissions):
            out: list[str] = []
            for event in events:
                if isinstance(event, ErrorEvent):  # the other prompts are cancelled
                    done = failed = True
                    out.append(sse_data(error_body(engine_error(event))) + DONE)
                    break
                if isinstance(event, TokenEvent) and (event.text or event.logprobs):
                    choice = states[k][event.index]
                    out.append(chunk(choice, event.text, choice.logprobs(event.logprobs)))
                elif isinstance(event, FinishEvent):
                    out.append(chunk(states[k][event.index], event.text, None, event.finish_reason))
                    finals[k].append(event)
            if out:
                yield "".join(out)
            if done:
                return
        done = True
        tail = ""
        if usage:
            total = _sum_usage([total_usage(f) for f in finals])
            tail = sse_data({**_body(request_id, created, model, []), "usage": usage_dict(total)})
        yield tail + DONE
    finally:
        if failed or not done:
            on_abandon()
