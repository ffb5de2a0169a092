"""Request-level errors, independent of the wire format.

Anything the client can fix raises `APIError` with a 4xx status and a message that says what
to change. Each API renders it in its own shape: OpenAI's `{"error": {"message", "type",
"param", "code"}}` (gateway.api.openai.render) or Anthropic's `{"type": "error", "error":
{"type", "message"}}` (gateway.api.anthropic.render).
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class APIError(Exception):
    """A request-level failure: an HTTP status, a message for the client, and OpenAI-style
    classification that other wire formats map to their own.

    `type` follows OpenAI's vocabulary: invalid_request_error, authentication_error,
    not_found_error, rate_limit_error, server_error. `param` names the offending field
    (dotted path such as "messages[0].content[1].image_url.url") when there is one.
    """

    status: int
    message: str
    type: str = "invalid_request_error"
    param: str | None = None
    code: str | None = None
    headers: dict[str, str] | None = None

    def __post_init__(self) -> None:
        super().__init__(self.message)


def invalid(message: str, param: str | None = None, code: str | None = None) -> APIError:
    """400 invalid_request_error."""
    return APIError(400, message, "invalid_request_error", param, code)


def too_large(message: str, param: str | None = None) -> APIError:
    """413: a body, image or pixel count over a configured limit."""
    return APIError(413, message, "invalid_request_error", param, "too_large")
