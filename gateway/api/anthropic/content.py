"""Content blocks of a Messages body: `text` and `image` blocks (base64 with `media_type`, or
`url`), and, in a `tool_result`, `tool_reference` blocks (a tool search's answer: the tool
is offered already, so the reference is read as a line of text). Pure validation; every
mistake is a 400 naming the block's dotted path.
"""

from __future__ import annotations

import base64
import binascii
from typing import Any

from gateway.api import fields
from gateway.errors import invalid
from gateway.frontend.chat import ImagePart, Part, TextPart

IMAGE_MEDIA_TYPES = ("image/jpeg", "image/png", "image/gif", "image/webp")
BLOCK_FEATURES = {
    "document": "documents",
    "search_result": "search results",
    "server_tool_use": "tool use",
    "container_upload": "code execution containers",
}


def content(raw: Any, where: str, role: str) -> tuple[Part, ...]:
    """A message's (or a tool result's) `content`: a string or a list of blocks."""
    if isinstance(raw, str):
        return (TextPart(fields.text(raw, where)),)
    if not isinstance(raw, list):
        raise invalid(f"`{where}` must be a string or an array of content blocks", where)
    return content_blocks(list(enumerate(raw)), where, role)


def content_blocks(raw: list[tuple[int, Any]], where: str, role: str) -> tuple[Part, ...]:
    """Text and image blocks (with their indices in the message); images in user messages
    and tool results only, `tool_reference` blocks in tool results only."""
    parts: list[Part] = []
    for j, block in raw:
        at = f"{where}[{j}]"
        kind = block.get("type") if isinstance(block, dict) else None
        kind = kind if isinstance(kind, str) else None  # e.g. a list: unhashable, and wrong
        if kind == "text":
            parts.append(TextPart(block_text(block, at)))
        elif kind == "image":
            if role not in ("user", "tool"):
                raise invalid(f"`{at}`: images are only accepted in user messages", at)
            parts.append(_image(block.get("source"), f"{at}.source"))
        elif kind == "tool_reference" and role == "tool":
            parts.append(TextPart(_reference(block, at)))
        elif kind in BLOCK_FEATURES:
            raise invalid(
                f"`{at}.type`: {kind!r} blocks ({BLOCK_FEATURES[kind]}) are not supported by "
                "this server; send text and image blocks",
                f"{at}.type",
            )
        else:
            raise invalid(f"`{at}.type` must be 'text' or 'image'", f"{at}.type")
    return tuple(parts)


def block_text(block: dict[str, Any], at: str) -> str:
    if not isinstance(block.get("text"), str):
        raise invalid(f"`{at}.text` must be a string", f"{at}.text")
    return fields.text(block["text"], f"{at}.text")


def _reference(block: dict[str, Any], at: str) -> str:
    """A `tool_reference` block: every tool the request declares is offered from the start
    (this server has no deferred loading), so the reference only says which one."""
    name = block.get("tool_name")
    if not isinstance(name, str) or not name:
        raise invalid(f"`{at}.tool_name` must be a tool's name", f"{at}.tool_name")
    return f"Tool {fields.text(name, f'{at}.tool_name')} is available."


_MAGIC = (
    (b"\x89PNG\r\n\x1a\n", "image/png"),
    (b"\xff\xd8\xff", "image/jpeg"),
    (b"GIF87a", "image/gif"),
    (b"GIF89a", "image/gif"),
)


def _sniff(data: str) -> str | None:
    """The media type the base64 `data`'s first bytes show (PNG, JPEG, GIF, WebP), or None
    (not base64, or another format: the decoder then says what is wrong)."""
    try:
        head = base64.b64decode(data[:24], validate=True)
    except (ValueError, binascii.Error):
        return None
    if head[:4] == b"RIFF" and head[8:12] == b"WEBP":
        return "image/webp"
    return next((kind for magic, kind in _MAGIC if head.startswith(magic)), None)


def _image(source: Any, at: str) -> ImagePart:
    kind = source.get("type") if isinstance(source, dict) else None
    if kind == "base64":
        media_type = source.get("media_type")
        if media_type not in IMAGE_MEDIA_TYPES:
            raise invalid(
                f"`{at}.media_type` must be one of {', '.join(IMAGE_MEDIA_TYPES)}",
                f"{at}.media_type",
            )
        data = source.get("data")
        if not isinstance(data, str) or not data:
            raise invalid(f"`{at}.data` must be a non-empty base64 string", f"{at}.data")
        if data.startswith("data:"):
            raise invalid(
                f"`{at}.data` must be bare base64: remove the `data:...;base64,` prefix (the "
                "media type goes in `media_type`)",
                f"{at}.data",
            )
        actual = _sniff(data)
        if actual is not None and actual != media_type:  # as Anthropic's API refuses it
            raise invalid(
                f"`{at}.data` holds a {actual} image but `{at}.media_type` says {media_type}: "
                "send the image's own media type",
                f"{at}.media_type",
            )
        return ImagePart(f"data:{media_type};base64,{data}", f"{at}.data")
    if kind == "url":
        url = source.get("url")
        if not isinstance(url, str) or not url:
            raise invalid(
                f"`{at}.url` must be a non-empty http(s) URL (or, with --allowed-media-dir, a "
                "local path or file:// URL)",
                f"{at}.url",
            )
        return ImagePart(url, f"{at}.url")
    if kind == "file":
        raise invalid(f"`{at}`: the Files API is not supported by this server", f"{at}.type")
    raise invalid(
        f"`{at}.type` must be 'base64' (with `media_type` and `data`) or 'url'", f"{at}.type"
    )
