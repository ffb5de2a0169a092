"""Tool calls in Chat Completions answers: `message.tool_calls`, streamed
`delta.tool_calls` (id, type and name first, the arguments in pieces) and
`finish_reason: "tool_calls"`. Pure formatting over `gateway.tools.calls` pieces.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from gateway.engine.request import FinishEvent
from gateway.tools.calls import CallArgs, CallStart, Piece, TextPiece
from gateway.tools.spec import ToolCall


def call_dicts(calls: Sequence[ToolCall]) -> list[dict[str, Any]]:
    """`message.tool_calls`."""
    return [
        {
            "id": call.id,
            "type": "function",
            "function": {"name": call.name, "arguments": call.arguments},
        }
        for call in calls
    ]


def piece_delta(piece: Piece) -> dict[str, Any] | None:
    """One piece's chunk `delta` (None: nothing to send, e.g. a call's end)."""
    if isinstance(piece, TextPiece):
        return {"content": piece.text} if piece.text else None
    if isinstance(piece, CallStart):
        function = {"name": piece.name, "arguments": ""}
        call = {"index": piece.index, "id": piece.id, "type": "function", "function": function}
        return {"tool_calls": [call]}
    if isinstance(piece, CallArgs):
        return {"tool_calls": [{"index": piece.index, "function": {"arguments": piece.text}}]}
    return None


def finish_reason(event: FinishEvent, calls: Sequence[ToolCall]) -> str:
    """ "tool_calls" when the answer ended normally after calls; else the engine's reason."""
    if calls and event.finish_reason == "stop":
        return "tool_calls"
    return str(event.finish_reason)
