"""Tool use in Messages answers: `tool_use` content blocks, `stop_reason: "tool_use"`, and
the streamed block sequence (a text block while text comes, then per call
`content_block_start` with the `tool_use` block, `input_json_delta`s carrying the arguments
in pieces, `content_block_stop`). Pure formatting over `gateway.tools.calls` pieces.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from gateway.api.anthropic.thinking import sign, thinking_block
from gateway.api.sse import sse_data
from gateway.engine.request import FinishEvent
from gateway.tools.calls import CallArgs, CallEnd, CallSplitter, CallStart, Piece, TextPiece
from gateway.tools.spec import ToolCall


def _input(call: ToolCall) -> Any:
    try:
        return json.loads(call.arguments)
    except json.JSONDecodeError:  # cut by max_tokens inside the arguments: no input yet
        return {}


def content_blocks(text: str, calls: Sequence[ToolCall]) -> list[dict[str, Any]]:
    """The message's `content`: its text (if any), then one `tool_use` block per call."""
    blocks: list[dict[str, Any]] = [{"type": "text", "text": text}] if text.strip() else []
    for call in calls:
        blocks.append({"type": "tool_use", "id": call.id, "name": call.name, "input": _input(call)})
    return blocks


def tool_stop(event: FinishEvent, calls: Sequence[ToolCall], reason: str) -> str:
    """ "tool_use" when the answer ended normally after calls; else `reason`."""
    return "tool_use" if calls and event.finish_reason == "stop" else reason


class BlockStream:
    """The streamed content blocks of one answer split by `splitter` (None: no tools, all
    text): thinking opens a `thinking` block (`think`), text a text block (when none is
    open), a call closes it and opens a `tool_use` block. `omit`: the thinking's text is not
    streamed; its block closes with the signature that keeps it (gateway.api.anthropic.
    thinking)."""

    def __init__(self, splitter: CallSplitter | None, omit: bool = False) -> None:
        self.splitter = splitter
        self._omit = omit
        self._thought: list[str] = []  # the open thinking block's text, when omitted
        self._index = -1
        self._open: str | None = None  # "thinking" | "text" | "tool_use" | None

    @property
    def calls(self) -> tuple[ToolCall, ...]:
        return self.splitter.calls if self.splitter is not None else ()

    def think(self, text: str) -> str:
        """`thinking_delta`s of the model's thinking (a thinking block opens first)."""
        out = ""
        if self._open != "thinking":
            out += self._close() + self._start(thinking_block(""), "thinking")
        if self._omit:
            self._thought.append(text)
            return out
        return out + _block_delta(self._index, {"type": "thinking_delta", "thinking": text})

    def feed(self, text: str, end: bool = False, cut: bool = False) -> str:
        """Blocks for `text`; `end`: the answer's last text (`cut`: by max_tokens)."""
        if self.splitter is None:
            pieces: list[Piece] = [TextPiece(text)] if text else []
        else:
            pieces = self.splitter.feed(text) + (self.splitter.finish(cut) if end else [])
        out = "".join(self._piece(p) for p in pieces)
        return out + (self._close() if end else "")

    def _piece(self, piece: Piece) -> str:
        if isinstance(piece, TextPiece):
            out = ""
            if self._open != "text":
                out += self._close() + self._start({"type": "text", "text": ""}, "text")
            delta = {"type": "text_delta", "text": piece.text}
            return out + _block_delta(self._index, delta)
        if isinstance(piece, CallStart):
            block = {"type": "tool_use", "id": piece.id, "name": piece.name, "input": {}}
            return self._close() + self._start(block, "tool_use")
        if isinstance(piece, CallArgs):
            delta = {"type": "input_json_delta", "partial_json": piece.text}
            return _block_delta(self._index, delta)
        assert isinstance(piece, CallEnd)
        return self._close()

    def _start(self, block: dict[str, Any], kind: str) -> str:
        self._index += 1
        self._open = kind
        body = {"type": "content_block_start", "index": self._index, "content_block": block}
        return sse_data(body, "content_block_start")

    def _close(self) -> str:
        if self._open is None:
            return ""
        if self._open == "thinking":  # the block's signature, as the API sends it
            signature = sign("".join(self._thought)) if self._omit else ""
            self._thought = []
            delta = {"type": "signature_delta", "signature": signature}
            return _block_delta(self._index, delta) + self._close_open()
        return self._close_open()

    def _close_open(self) -> str:
        self._open = None
        body = {"type": "content_block_stop", "index": self._index}
        return sse_data(body, "content_block_stop")


def _block_delta(index: int, delta: dict[str, Any]) -> str:
    body = {"type": "content_block_delta", "index": index, "delta": delta}
    return sse_data(body, "content_block_delta")
