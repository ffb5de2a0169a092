"""OpenAI's legacy Completions API: `POST /v1/completions` (a prompt continued, no chat
template), which benchmark and evaluation tools (vLLM's `bench serve`, lm-evaluation-harness's
`local-completions`) and editor autocompletion send.

Each prompt (text, token ids, or a list of either) becomes one `ChatRequest` with
`raw_prompt` set and goes through the same pipeline as a chat: the same caches (a repeated
prefix is a prefix-cache hit), limits, sampling and errors. With several prompts they are
admitted together and their choices numbered prompt by prompt (`index = prompt * n +
choice`), as OpenAI's API numbers them. Rendering is `completions_render`.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, replace
from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from gateway.api import fields
from gateway.api.accepted import OPENAI_COMPLETIONS, refuse_unapplied, unknown_fields
from gateway.api.http import unless_disconnected, with_errors
from gateway.api.intake import Intake
from gateway.api.openai.completions_render import EchoText, collect, sse_stream
from gateway.api.openai.parse import MAX_CHOICES, MAX_STOP_STRINGS, MAX_TOP_LOGPROBS
from gateway.api.openai.render import render_error
from gateway.errors import invalid
from gateway.frontend.admission import Admission
from gateway.frontend.chat import ChatRequest
from gateway.frontend.errors import ClientGone

MAX_PROMPTS = 64  # prompts in one request; each is a request of its own to the engine
DEFAULT_MAX_TOKENS = 16  # OpenAI's (and vLLM's) default for this API


@dataclass(frozen=True)
class CompletionRequest:
    """A parsed body: one `ChatRequest` per prompt (their `raw_prompt` set, all else equal),
    and what only this API renders: `echo` (the prompt's text before each completion) and
    `logprobs` (None: off; k: the chosen token and k alternatives, in the legacy shape)."""

    prompts: tuple[ChatRequest, ...]
    echo: bool
    logprobs: int | None

    @property
    def first(self) -> ChatRequest:
        return self.prompts[0]


def parse_completion_request(body: Any) -> CompletionRequest:
    """Validate a decoded JSON body (APIError 400 naming the field for a mistake). Unknown
    fields are ignored and named back (`x-ignored-fields`); a documented field is applied or
    refused (gateway.api.accepted.OPENAI_COMPLETIONS)."""
    if not isinstance(body, dict):
        raise invalid("the request body must be a JSON object")
    model = fields.model_name(body)
    prompts = _prompts(body.get("prompt"))
    refuse_unapplied(body, OPENAI_COMPLETIONS)
    max_tokens = fields.opt_int(body, "max_tokens", 1, 1_000_000) or DEFAULT_MAX_TOKENS
    n = fields.opt_int(body, "n", 1, MAX_CHOICES) or 1
    best_of = fields.opt_int(body, "best_of", 1, MAX_CHOICES)
    if best_of is not None and best_of != n:
        raise invalid(
            f"`best_of` ({best_of}) must equal `n` ({n}): choosing the best of more samples "
            "than are returned is not supported; omit best_of",
            "best_of",
        )
    logprobs = fields.opt_int(body, "logprobs", 0, MAX_TOP_LOGPROBS)
    echo = fields.opt_bool(body, "echo", False)
    if echo and logprobs is not None:
        raise invalid(
            "`echo` with `logprobs` asks for the prompt's log-probabilities, which this server "
            "does not compute; send one of them",
            "echo",
        )
    stream = fields.opt_bool(body, "stream", False)
    chat = ChatRequest(
        ignored_fields=unknown_fields(body, OPENAI_COMPLETIONS),
        model=model,
        messages=(),
        max_tokens=max_tokens,
        temperature=fields.opt_num(body, "temperature", 0.0, 2.0, default=1.0),
        top_p=_top_p(body),
        top_k=max(fields.opt_int(body, "top_k", -1, 1_000_000) or 0, 0),
        seed=_seed(body),
        stop=fields.stop_strings(body.get("stop"), "stop", MAX_STOP_STRINGS, True),
        logprobs=logprobs is not None,
        top_logprobs=logprobs or 0,
        stream=stream,
        include_usage=_include_usage(body, stream),
        ignore_eos=fields.opt_bool(body, "ignore_eos", False),
        cache_salt=fields.cache_salt(body),
        keep_alive_s=fields.keep_alive(body),
        n=n,
        **fields.shaping(body, max_tokens),
    )
    return CompletionRequest(tuple(replace(chat, raw_prompt=p) for p in prompts), echo, logprobs)


def _prompts(raw: Any) -> list[str | tuple[int, ...]]:
    """`prompt`: a string, token ids, or a non-empty list of strings or of token-id lists."""
    shape = "a string, a list of token ids, or a list of strings or of token-id lists"
    if isinstance(raw, str):
        return [fields.text(raw, "prompt")]
    if not isinstance(raw, list) or not raw:
        raise invalid(f"`prompt` is required: {shape}", "prompt")
    if all(_is_token(t) for t in raw):
        return [tuple(raw)]
    if len(raw) > MAX_PROMPTS:
        raise invalid(f"`prompt` holds {len(raw)} prompts; send at most {MAX_PROMPTS}", "prompt")
    out: list[str | tuple[int, ...]] = []
    for i, item in enumerate(raw):
        if isinstance(item, str):
            out.append(fields.text(item, f"prompt[{i}]"))
        elif isinstance(item, list) and item and all(_is_token(t) for t in item):
            out.append(tuple(item))
        else:
            raise invalid(
                f"`prompt[{i}]` must be a string or a non-empty list of token ids "
                f"(`prompt` is {shape})",
                f"prompt[{i}]",
            )
    return out


def _is_token(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and 0 <= value < 1 << 31


def _top_p(body: dict[str, Any]) -> float:
    top_p = fields.opt_num(body, "top_p", 0.0, 1.0, default=1.0)
    if top_p == 0.0:
        raise invalid("`top_p` must be greater than 0 (use temperature 0 for greedy)", "top_p")
    return top_p


def _seed(body: dict[str, Any]) -> int | None:
    seed = fields.opt_int(body, "seed", -(2**63), 2**64 - 1)
    return None if seed is None else seed % (2**63)


def _include_usage(body: dict[str, Any], stream: bool) -> bool:
    options = body.get("stream_options")
    if options is None:
        return False
    if not isinstance(options, dict):
        raise invalid("`stream_options` must be an object", "stream_options")
    if not stream:  # as OpenAI's API answers
        raise invalid("`stream_options` is only allowed when `stream` is true", "stream_options")
    return bool(options.get("include_usage", False))


def routes(intake: Intake) -> list[Route]:
    """`POST /v1/completions` over `intake`; its errors are OpenAI error objects."""
    pipeline = intake.pipeline

    @with_errors(render_error)
    async def completions(request: Request) -> Response:
        try:
            completion, admissions = await intake.admit_each(
                request, parse_completion_request, "cmpl-"
            )
        except ClientGone:
            return Response(status_code=499)
        echo = await _echo_texts(intake, admissions) if completion.echo else None
        created, first = int(time.time()), completion.first
        headers = admissions[0].headers()

        def abandon() -> None:
            for admission in admissions:
                pipeline.cancel(admission.request_id)

        if first.stream:
            body = sse_stream(
                admissions, created, first.model, completion.logprobs, echo,
                first.include_usage, abandon,
            )  # fmt: skip
            return StreamingResponse(body, media_type="text/event-stream", headers=headers)
        try:
            result = await unless_disconnected(
                request, collect(admissions, created, first.model, completion.logprobs, echo)
            )
        except BaseException:  # one prompt failed: the others stop too
            abandon()
            raise
        if result is None:
            abandon()
            return Response(status_code=499)
        return JSONResponse(result, headers=headers)

    return [Route("/v1/completions", completions, methods=["POST"])]


async def _echo_texts(intake: Intake, admissions: list[Admission]) -> EchoText:
    """Each prompt's text as `echo` shows it: the text sent, or its token ids decoded."""
    texts: list[str] = []
    for admission in admissions:
        prompt = admission.chat.raw_prompt
        if isinstance(prompt, str):
            texts.append(prompt)
            continue
        builder = intake.pipeline.prompts_for(admission.chat.model)
        assert builder is not None and prompt is not None  # held by the admitted request
        texts.append(await asyncio.to_thread(builder.model.decode, prompt))
    return texts
