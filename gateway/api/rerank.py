"""The rerank route, `POST /v1/rerank` (and `/v2/rerank`, where Cohere's v2 client posts):
the Cohere / Jina shape that vLLM and mlx-vlm serve. `query` and `documents` (strings, or
objects with `text` and, for a Qwen3-VL reranker, an image: `image_url` or mlx-vlm's
`image`), `top_n`, `return_documents`, and mlx-vlm's `instruction`; the answer
is `results` sorted by `relevance_score` (highest first, ties by index), each keeping its
document's `index`, with `usage`. Errors are OpenAI-shaped error objects naming the field;
Cohere's truncation and structured-document fields are refused, unknown fields ignored and
named in `x-ignored-fields` (gateway/api/accepted.py).
"""

from __future__ import annotations

import time
import uuid
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
from gateway.frontend.embed_request import RerankInput, RerankRequest

MAX_DOCUMENTS = 1000  # Cohere's limit on one request's documents


def routes(intake: Intake, pipeline: EmbedPipeline) -> list[Route]:
    """The rerank routes over `intake` (keys, drain, body limits) and `pipeline`."""

    @with_errors(render_error)
    async def rerank(request: Request) -> Response:
        body, scope = await intake.read_plain(request)
        parsed = parse_rerank_request(body)  # (first: the salt is read from an object)
        parsed = replace(parsed, scope=scope(fields.cache_salt(body)))
        result = await pipeline.rerank(parsed)
        ignored = accepted.unknown_fields(body, accepted.RERANK)
        headers = {"x-ignored-fields": ", ".join(ignored)} if ignored else None
        return Response(render(result, parsed), media_type="application/json", headers=headers)

    return [Route(path, rerank, methods=["POST"]) for path in ("/v1/rerank", "/v2/rerank")]


def parse_rerank_request(body: Any, scope: str = "") -> RerankRequest:
    """The body as a `RerankRequest`; APIError 400 naming the field for anything else."""
    if not isinstance(body, dict):
        raise invalid("the request body must be a JSON object")
    accepted.refuse_unapplied(body, accepted.RERANK)
    model = fields.model_name(body)
    query = _item(body.get("query"), "query")
    raw = body.get("documents")
    if not isinstance(raw, list) or not raw:
        raise invalid("`documents` must be a non-empty list of strings", "documents")
    if len(raw) > MAX_DOCUMENTS:
        raise invalid(
            f"`documents` holds {len(raw)}, over the limit of {MAX_DOCUMENTS}", "documents"
        )
    documents = tuple(_item(d, f"documents[{i}]") for i, d in enumerate(raw))
    instruction = body.get("instruction")
    if instruction is not None:
        instruction = _text(instruction, "instruction")
    return RerankRequest(
        model=model,
        query=query,
        documents=documents,
        instruction=instruction or "",
        top_n=fields.opt_int(body, "top_n", 1, 1 << 31),
        return_documents=fields.opt_bool(body, "return_documents", False),
        scope=scope,
        keep_alive_s=fields.keep_alive(body),
    )


def _item(raw: Any, at: str) -> RerankInput:
    """A query or document: a string, or an object with `text` (Cohere v1, Jina) and/or an
    image (`image_url` as in chat parts, or mlx-vlm's `image`: a URL string or {url})."""
    if not isinstance(raw, dict):
        return RerankInput(at, text=_text(raw, at))
    key = "image_url" if "image_url" in raw else "image"
    value = raw.get(key)
    url = value.get("url") if isinstance(value, dict) else value
    image = None
    if value is not None:
        if not isinstance(url, str) or not url.strip():
            raise invalid(f"`{at}.{key}` must be an image URL, data URI or path", f"{at}.{key}")
        image = ImagePart(url.strip(), f"{at}.{key}")
    text = raw.get("text")
    if text is None and image is None:
        raise invalid(f"`{at}` must hold a non-empty `text` or an image", at)
    return RerankInput(at, text=_text(text, f"{at}.text") if text is not None else "", image=image)


def _text(raw: Any, at: str) -> str:
    if not isinstance(raw, str) or not raw.strip():
        raise invalid(f"`{at}` must be a non-empty string", at)
    return fields.text(raw.strip(), at)  # (stripped, as mlx-vlm's reranker reads it)


def render(result: EmbedResult, request: RerankRequest) -> bytes:
    """The results, highest score first (ties: lower index first), cut to `top_n`."""
    scores = [float(s) for s in result.vectors[:, 0]]
    order = sorted(range(len(scores)), key=lambda i: (-scores[i], i))
    if request.top_n is not None:
        order = order[: request.top_n]
    results = []
    for index in order:
        row: dict[str, Any] = {"index": index, "relevance_score": scores[index]}
        if request.return_documents:
            document = request.documents[index]
            row["document"] = {"text": document.text}
            if document.image is not None:
                row["document"]["image_url"] = {"url": document.image.url}
        results.append(row)
    tokens = sum(result.tokens)
    body = {
        "id": f"rerank-{uuid.uuid4().hex}",
        "object": "rerank",
        "created": int(time.time()),
        "model": request.model,
        "results": results,
        "usage": {"prompt_tokens": tokens, "total_tokens": tokens},
    }
    return orjson.dumps(body)
