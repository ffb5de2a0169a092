"""OpenAI's embeddings route, `POST /v1/embeddings`: the body parsed into an `EmbedRequest`,
run by the front end's `EmbedPipeline`, answered in OpenAI's shape (`data[i].embedding`
as floats, or base64 of little-endian float32 with `encoding_format: "base64"`, which the
OpenAI SDK asks for and decodes; `usage.prompt_tokens`). Errors are OpenAI error objects
naming the field.

`input` takes what OpenAI's does (a string, a list of strings, a list of token ids, a list
of such lists) and, for multimodal embedders, images as content parts the way chat
messages carry them: an element that is an `image_url` / `text` part object is an input of
that one part, an element that is a list of part objects is one input of those parts in
order (rendered with the model's chat template). Fields it does not know are ignored and
named back in `x-ignored-fields` (gateway/api/accepted.py's table lists the known ones).
"""

from __future__ import annotations

import base64
from dataclasses import replace
from typing import Any

import orjson
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from gateway.api import accepted, fields
from gateway.api.http import with_errors
from gateway.api.intake import Intake
from gateway.api.openai.render import render_error
from gateway.engine.embed.request import EmbedResult
from gateway.errors import invalid
from gateway.frontend.chat import ImagePart
from gateway.frontend.embed import EmbedPipeline
from gateway.frontend.embed_request import EmbedInput, EmbedRequest

MAX_INPUTS = 2048  # OpenAI's limit on one request's inputs
FORMATS = ("float", "base64")


def routes(intake: Intake, pipeline: EmbedPipeline) -> list[Route]:
    """The embeddings route over `intake` (keys, drain, body limits) and `pipeline`."""

    @with_errors(render_error)
    async def embeddings(request: Request) -> Response:
        body, scope = await intake.read_plain(request)
        embed = parse_embeddings_request(body)
        embed = replace(embed, cache_scope=scope(fields.cache_salt(body)))
        result = await pipeline.embed(embed)
        ignored = accepted.unknown_fields(body, accepted.OPENAI_EMBEDDINGS)
        headers = {"x-ignored-fields": ", ".join(ignored)} if ignored else None
        return Response(render(result, embed), media_type="application/json", headers=headers)

    return [Route("/v1/embeddings", embeddings, methods=["POST"])]


def parse_embeddings_request(body: Any) -> EmbedRequest:
    """The body as an `EmbedRequest`; APIError 400 naming the field for anything else."""
    if not isinstance(body, dict):
        raise invalid("the request body must be a JSON object")
    accepted.refuse_unapplied(body, accepted.OPENAI_EMBEDDINGS)
    model = fields.model_name(body)
    fmt = body.get("encoding_format")
    if fmt is None:  # (null: the default, as OpenAI's; "", 0, {} are not)
        fmt = "float"
    if fmt not in FORMATS:
        raise invalid("`encoding_format` must be 'float' or 'base64'", "encoding_format")
    user = body.get("user")
    if user is not None and not isinstance(user, str):
        raise invalid("`user` must be a string", "user")
    return EmbedRequest(
        model=model,
        inputs=_inputs(body.get("input")),
        dimensions=fields.opt_int(body, "dimensions", 1, 1 << 20),
        encoding_format=fmt,
        user=user,
        cache_scope="",
        keep_alive_s=fields.keep_alive(body),
    )


def _inputs(raw: Any) -> tuple[EmbedInput, ...]:
    if raw is None:
        raise invalid("`input` is required: a string, a list of strings or of token ids", "input")
    if isinstance(raw, str):
        return (EmbedInput("input", text=fields.text(raw, "input")),)
    if isinstance(raw, dict):
        return (EmbedInput("input", parts=_parts([raw], "input", ["input"])),)
    if not isinstance(raw, list):
        raise invalid("`input` must be a string or a list", "input")
    if not raw:
        raise invalid("`input` must not be an empty list", "input")
    if all(_is_id(x) for x in raw):  # one input as token ids
        return (EmbedInput("input", ids=tuple(raw)),)
    _check_ids(raw, "input")
    if len(raw) > MAX_INPUTS:
        raise invalid(f"`input` holds {len(raw)} inputs, over the limit of {MAX_INPUTS}", "input")
    return tuple(_input(x, f"input[{i}]") for i, x in enumerate(raw))


def _input(raw: Any, at: str) -> EmbedInput:
    if isinstance(raw, str):
        return EmbedInput(at, text=fields.text(raw, at))
    if isinstance(raw, dict):
        return EmbedInput(at, parts=_parts([raw], at, [at]))
    if isinstance(raw, list) and raw and all(_is_id(x) for x in raw):
        return EmbedInput(at, ids=tuple(raw))
    if isinstance(raw, list):
        _check_ids(raw, at)
    if isinstance(raw, list) and raw and all(isinstance(x, dict) for x in raw):
        return EmbedInput(at, parts=_parts(raw, at, [f"{at}[{j}]" for j in range(len(raw))]))
    raise invalid(
        f"`{at}` must be a string, a non-empty list of token ids, a content part "
        "(text or image_url) or a non-empty list of content parts",
        at,
    )


def _parts(raws: list[Any], at: str, where: list[str]) -> tuple[str | ImagePart, ...]:
    """The content parts of one input (`where`: each part's field); 400 naming the input
    when they hold no text and no image (as an empty string input is refused: the chat
    template alone is not an input)."""
    parts = tuple(_part(raw, place) for raw, place in zip(raws, where, strict=True))
    if all(part == "" for part in parts):
        raise invalid(f"`{at}` is empty: its text parts hold no text and it has no image", at)
    return parts


def _part(raw: dict[str, Any], at: str) -> str | ImagePart:
    kind = raw.get("type")
    if kind == "text":
        value = raw.get("text")
        if not isinstance(value, str):
            raise invalid(f"`{at}.text` must be a string", f"{at}.text")
        return fields.text(value, f"{at}.text")
    if kind in ("image_url", "input_image"):
        url = fields.media_url(raw, at, "image_url", "image")
        return ImagePart(url, f"{at}.image_url.url")
    raise invalid(f"`{at}.type` must be 'text' or 'image_url'", f"{at}.type")


def _is_id(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and 0 <= value < 1 << 31


def _check_ids(raw: list[Any], at: str) -> None:
    """A list of integers meant as token ids with one out of range: 400 naming that
    element (rather than the list's shape, which is right)."""
    if not raw or not all(isinstance(x, int) and not isinstance(x, bool) for x in raw):
        return
    k = next(k for k, x in enumerate(raw) if not _is_id(x))
    raise invalid(
        f"`{at}[{k}]` is {raw[k]}: a token id must be an integer from 0 to {(1 << 31) - 1}",
        f"{at}[{k}]",
    )


def render(result: EmbedResult, request: EmbedRequest) -> bytes:
    """OpenAI's list of embeddings (floats as float32's shortest text, or base64)."""
    tokens = sum(result.tokens)
    data: list[dict[str, Any]] = []
    for index, vector in enumerate(result.vectors):
        if request.encoding_format == "base64":
            value: Any = base64.b64encode(vector.astype("<f4").tobytes()).decode("ascii")
        else:
            value = vector
        data.append({"object": "embedding", "index": index, "embedding": value})
    body = {
        "object": "list",
        "data": data,
        "model": request.model,
        "usage": {"prompt_tokens": tokens, "total_tokens": tokens},
    }
    return orjson.dumps(body, option=orjson.OPT_SERIALIZE_NUMPY)
