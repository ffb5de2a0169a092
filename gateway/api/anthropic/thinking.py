"""Thinking blocks on the Messages wire, both ways.

Out: a `thinking` block carries the model's thinking. With `thinking.display: "omitted"` its
`thinking` text is empty and, as Anthropic documents, the `signature` keeps the thinking for
multi-turn continuity: here the signature is the thinking's text, base64 behind a prefix
(this server signs nothing; the text is the client's to read either way). Otherwise the
signature is empty.

In: an assistant's `thinking` block is its earlier thinking for the template: its text, or,
when the text is empty, what one of our signatures holds (another server's signature holds
nothing readable: the block then counts as no thinking, as a `redacted_thinking` block).
"""

from __future__ import annotations

import base64
import binascii
from typing import Any

from gateway.api import fields
from gateway.errors import invalid

PREFIX = "vision-gateway-thinking:"


def sign(text: str) -> str:
    """The signature of an omitted thinking: its text, recoverable by `thinking_text`."""
    return PREFIX + base64.b64encode(text.encode()).decode() if text else ""


def thinking_block(text: str, omit: bool = False) -> dict[str, Any]:
    """A `thinking` content block (`omit`: the text in the signature only)."""
    if omit:
        return {"type": "thinking", "thinking": "", "signature": sign(text)}
    return {"type": "thinking", "thinking": text, "signature": ""}


def thinking_text(block: dict[str, Any], at: str) -> str:
    """An assistant's earlier thinking from a `thinking` or `redacted_thinking` block ("" for
    a `redacted_thinking` block: encrypted elsewhere, nothing a template can render)."""
    if block.get("type") == "redacted_thinking":
        return ""
    text = block.get("thinking")
    if not isinstance(text, str):
        raise invalid(f"`{at}.thinking` must be a string", f"{at}.thinking")
    signature = block.get("signature")
    if text or not isinstance(signature, str) or not signature.startswith(PREFIX):
        return fields.text(text, f"{at}.thinking")
    try:
        kept = base64.b64decode(signature[len(PREFIX) :], validate=True).decode()
    except (ValueError, binascii.Error):
        raise invalid(
            f"`{at}.signature` is not a signature this server made; send the block back as "
            "it came",
            f"{at}.signature",
        ) from None
    return fields.text(kept, f"{at}.signature")
