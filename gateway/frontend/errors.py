"""The front end's failures as `APIError`s, in OpenAI's vocabulary; each API renders them in
its own shape (gateway.api.*.render).

Pure constructors: nothing here touches the engine or a connection.
"""

from __future__ import annotations

from gateway.engine.client import EngineBusy
from gateway.engine.request import ErrorEvent, ErrorKind
from gateway.errors import APIError, invalid
from gateway.frontend.chat import ChatRequest
from gateway.frontend.prompt import UnsupportedImage


class ClientGone(Exception):
    """The client disconnected before admission; the request was cancelled (answer 499)."""


class Overloaded(APIError):
    """The engine's waiting queue is full. OpenAI answers 429, Anthropic 529."""


def prompt_error(exc: ValueError, chat: ChatRequest) -> APIError:
    """400 for a prompt that cannot be built: an image the processor refuses (named by its
    field), else e.g. an image placeholder typed into the text."""
    if isinstance(exc, UnsupportedImage):
        return invalid(str(exc), chat.media[exc.index].param, f"unsupported_{exc.kind}")
    field = "prompt" if chat.raw_prompt is not None else "messages"
    return invalid(f"could not build the prompt: {exc}", field)


def engine_busy(busy: EngineBusy) -> Overloaded:
    """The error for a full engine queue (429 + Retry-After in OpenAI's terms)."""
    return Overloaded(
        429,
        f"{busy}; retry shortly",
        "rate_limit_error",
        code="server_busy",
        headers={"Retry-After": "1"},
    )


def engine_error(event: ErrorEvent) -> APIError:
    """The error for an engine failure: 503 while shutting down, 400 for a schema beyond the
    grammar engine's limits (found while decoding), else 500."""
    if event.kind is ErrorKind.SHUTTING_DOWN:
        return shutting_down(event.message)
    if event.kind is ErrorKind.GRAMMAR_LIMIT:
        return invalid(event.message, event.param, "unsupported_schema")
    return APIError(500, event.message, "server_error")


def engine_unavailable() -> APIError:
    """503: the engine (its process, or every replica) is not running."""
    return APIError(503, "the engine is not running", code="unavailable")


def shutting_down(message: str = "the server is shutting down") -> APIError:
    """503 for a request the server will not serve because it is stopping (or not started)."""
    return APIError(503, message, "server_error", code="unavailable")


def model_not_found(name: str, served: list[str]) -> APIError:
    """404 for a request naming a model this server does not serve; the message lists the
    served names."""
    names = ", ".join(f"`{n}`" for n in served)
    return APIError(
        404,
        f"The model `{name}` does not exist on this server; it serves {names} (see /v1/models)",
        "invalid_request_error",
        "model",
        "model_not_found",
    )


def wrong_task(name: str, task: str, route: str) -> APIError:
    """400 for a request to a model that does not do what its route asks (a chat request to
    an embedding model, an embeddings request to a chat model or a reranker, ...); names
    `model` and says what the model does."""
    does = {
        "embed": "an embedding model: it serves /v1/embeddings",
        "rerank": "a reranker: it serves /v1/rerank",
    }.get(
        task,
        "a chat model: it serves the chat routes (/v1/chat/completions, /v1/messages, "
        "/v1/responses)",
    )
    return invalid(f"The model `{name}` is {does}, not {route}", "model", "model_task_mismatch")
