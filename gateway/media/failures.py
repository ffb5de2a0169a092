"""One rule for every media load: the client gets a 4xx that names the field, whatever failed.

An APIError (a bad reference, a refused URL, a file too large) keeps its words and gains the
request field it came from; anything else is a bug, not bad input, so the client still gets a
4xx (the contract), the log gets the traceback and a counter makes it visible in stats.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable
from typing import TypeVar

from gateway.errors import APIError, invalid

log = logging.getLogger("gateway.media")
_T = TypeVar("_T")


async def as_client_error(load: Awaitable[_T], kind: str, param: str, counts: dict[str, int]) -> _T:
    """Await `load` (one `kind` of media, "image" or "video", from request field `param`);
    counts["unexpected_errors"] grows by one per failure that was not an APIError."""
    try:
        return await load
    except APIError as err:
        if err.param is None:
            err.param = param
        raise
    except Exception as exc:
        counts["unexpected_errors"] += 1
        log.exception("unexpected error loading %s %s", kind, param)
        raise invalid(
            f"could not load {kind}: unexpected {type(exc).__name__} (logged by the server)",
            param,
            code=f"{kind}_load_failed",
        ) from None
