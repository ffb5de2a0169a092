"""Errors that become OpenAI error objects.

Anything the client can fix raises `APIError` with a 4xx status and a message that says what
to change. The HTTP layer turns it into `{"error": {"message", "type", "param", "code"}}`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass
class APIError(Exception):
    """A request-level failure with an OpenAI-shaped body.

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

    def to_dict(self) -> dict[str, Any]:
        return {
            "error": {
                "message": self.message,
                "type": self.type,
                "param": self.param,
                "code": self.code,
            }
        }


def invalid(message: str, param: str | None = None, code: str | None = None) -> APIError:
    """400 invalid_request_error."""
    return APIError(400, message, "invalid_request_error", param, code)


def too_large(message: str, param: str | None = None) -> APIError:
    """413: a body, image or pixel count over a configured limit."""
    return APIError(413, message, "invalid_request_error", param, "too_large")
