"""Server-sent events framing (the WHATWG event-stream format) for JSON payloads.

One event is `[event: <name>\\n]data: <json>\\n\\n`. The JSON is compact and one line (JSON
escapes newlines inside strings), so a `data:` field never needs splitting.
"""

from __future__ import annotations

import json
from typing import Any


def sse_data(body: Any, event: str | None = None) -> str:
    """One SSE event carrying `body` as compact JSON, optionally with an `event:` name."""
    data = json.dumps(body, separators=(",", ":"))
    return f"event: {event}\ndata: {data}\n\n" if event else f"data: {data}\n\n"


DONE = "data: [DONE]\n\n"
"""OpenAI's end-of-stream sentinel."""
