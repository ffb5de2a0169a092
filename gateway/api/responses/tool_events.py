"""The stream of a response decoded under the tool grammar: its output items opened as the
answer's pieces (gateway.tools.calls) arrive, each closed before the next one opens.

    response.created, response.in_progress,
    [message, at its first text that is not only whitespace:
        response.output_item.added, response.content_part.added,
        response.output_text.delta*,
        response.output_text.done, response.content_part.done, response.output_item.done]
    per call:
        response.output_item.added (function_call, arguments ""),
        response.function_call_arguments.delta*,
        response.function_call_arguments.done, response.output_item.done
    or, a custom tool's call (its `input` is known once its arguments are whole):
        response.output_item.added (custom_tool_call, input ""),
        response.custom_tool_call_input.delta (the whole input),
        response.custom_tool_call_input.done, response.output_item.done
    then response.completed | response.incomplete | response.failed

The items and their `output_index`es are those of the final body (`response_body` leaves a
whitespace-only message out the same way), so the SDK's stream accumulator rebuilds it.
One per stream; not thread-safe.
"""

from __future__ import annotations

from typing import Any

from gateway.api.openai.render import logprob_list
from gateway.api.responses.render import (
    EventWriter,
    call_item,
    message_item,
    reasoning_id,
    reasoning_item,
    response_body,
    text_part,
)
from gateway.engine.request import TokenLogprob
from gateway.tools.calls import CallArgs, CallEnd, CallStart, Piece, TextPiece
from gateway.tools.spec import ToolCall


class ToolEvents:
    """Pieces -> events through `writer` (which numbers them)."""

    def __init__(self, writer: EventWriter, blank_opens: bool = False) -> None:
        self.writer = writer
        # Without tools (a thinking model's answer) any text opens the message, as the
        # plain stream's message holds whitespace too.
        self.blank_opens = blank_opens
        self.message_seen = False
        self.meta = writer.meta
        self.names = writer.meta.request.tool_names
        self.index = -1  # the open (or last) item's output_index
        self.message_open = False
        self.text = ""  # the message's text so far
        self.pending = ""  # whitespace that does not open the message (yet)
        self.calls: dict[int, ToolCall] = {}  # by the call's index among the answer's calls
        self.reasoning_open = False
        self.thought = ""  # the thinking so far

    def opening(self) -> str:
        body = response_body(self.meta, "in_progress")
        return self.writer.event("response.created", response=body) + self.writer.event(
            "response.in_progress", response=body
        )

    def pieces(self, pieces: list[Piece], logprobs: tuple[TokenLogprob, ...]) -> str:
        """The events of `pieces` (one engine event's); its logprobs go with its first text."""
        out = []
        for piece in pieces:
            if isinstance(piece, TextPiece):
                out.append(self._text(piece.text, logprobs))
                logprobs = ()
            elif isinstance(piece, CallStart):
                out.append(self._call_start(piece))
            elif isinstance(piece, CallArgs):
                out.append(self._call_args(piece))
            elif isinstance(piece, CallEnd):
                out.append(self._call_end(piece))
        return "".join(out)

    def think(self, text: str) -> str:
        """The thinking's events: its `reasoning` item opens (first), then text deltas."""
        out = ""
        if not self.reasoning_open:
            self.index += 1
            self.reasoning_open = True
            item = reasoning_item(self.meta, "in_progress", "")
            out = self.writer.event(
                "response.output_item.added", output_index=self.index, item=item
            )
        self.thought += text
        return out + self.writer.event(
            "response.reasoning_text.delta", **self._at_thought(), delta=text
        )

    def closing(self, final: dict[str, Any]) -> str:
        """The open item's done events (if any) and the terminal event."""
        items = {item["type"]: item for item in final["output"]}
        out = self._close_reasoning(items.get("reasoning"))
        if "message" in items and not self.message_seen:  # an answer that streamed no text
            out += self._open_message()
        out += self._close_message(items["message"]) if self.message_open else ""
        terminal = {"incomplete": "response.incomplete", "failed": "response.failed"}.get(
            final["status"], "response.completed"
        )
        return out + self.writer.event(terminal, response=final)

    # ----- items --------------------------------------------------------------------------

    def _at(self) -> dict[str, Any]:
        return {"item_id": self.meta.message_id, "output_index": self.index, "content_index": 0}

    def _at_thought(self) -> dict[str, Any]:
        item_id = reasoning_id(self.meta)
        return {"item_id": item_id, "output_index": self.index, "content_index": 0}

    def _close_reasoning(self, item: dict[str, Any] | None = None) -> str:
        """The thinking's done events; with `reasoning.summary` asked, its summary part's
        events (the whole thinking, in one delta) before the item's done."""
        if not self.reasoning_open:
            return ""
        self.reasoning_open = False
        item = item or reasoning_item(self.meta, "completed", self.thought)
        w, at = self.writer, self._at_thought()
        out = w.event("response.reasoning_text.done", **at, text=self.thought)
        if item["summary"]:
            part = item["summary"][0]
            at = {"item_id": at["item_id"], "output_index": self.index, "summary_index": 0}
            empty = {**part, "text": ""}
            out += "".join(
                (
                    w.event("response.reasoning_summary_part.added", **at, part=empty),
                    w.event("response.reasoning_summary_text.delta", **at, delta=part["text"]),
                    w.event("response.reasoning_summary_text.done", **at, text=part["text"]),
                    w.event("response.reasoning_summary_part.done", **at, part=part),
                )
            )
        return out + w.event("response.output_item.done", output_index=self.index, item=item)

    def _text(self, text: str, logprobs: tuple[TokenLogprob, ...]) -> str:
        out = ""
        if not self.message_open:
            self.pending += text
            if not (self.pending.strip() or self.blank_opens):
                return ""
            text, self.pending = self.pending, ""
            out = self._open_message()
        self.text += text
        delta = {"delta": text, "logprobs": logprob_list(logprobs)}
        return out + self.writer.event("response.output_text.delta", **self._at(), **delta)

    def _open_message(self) -> str:
        out = self._close_reasoning()
        self.index += 1
        self.message_open = self.message_seen = True
        item = message_item(self.meta, "in_progress", None, None)
        out += self.writer.event("response.output_item.added", output_index=self.index, item=item)
        return out + self.writer.event(
            "response.content_part.added", **self._at(), part=text_part("", [])
        )

    def _close_message(self, item: dict[str, Any]) -> str:
        self.message_open = False
        part = item["content"][0]
        w = self.writer
        return "".join(
            (
                w.event("response.output_text.done", **self._at(), text=part["text"], logprobs=[]),
                w.event("response.content_part.done", **self._at(), part=part),
                w.event("response.output_item.done", output_index=self.index, item=item),
            )
        )

    def _call_start(self, piece: CallStart) -> str:
        out = self._close_reasoning()
        if self.message_open:
            out += self._close_message(message_item(self.meta, "completed", self.text, None))
        self.index += 1
        call = self.calls[piece.index] = ToolCall(piece.id, piece.name, "")
        item = call_item(call, "in_progress", self.names)
        return out + self.writer.event(
            "response.output_item.added", output_index=self.index, item=item
        )

    def _call_args(self, piece: CallArgs) -> str:
        call = self.calls[piece.index]
        self.calls[piece.index] = ToolCall(call.id, call.name, call.arguments + piece.text)
        item_id = call_item(call, "", self.names)["id"]
        if self.names.wire(call.name).custom:  # its input is JSON-escaped until it is whole
            return ""
        return self.writer.event(
            "response.function_call_arguments.delta",
            item_id=item_id,
            output_index=self.index,
            delta=piece.text,
        )

    def _call_end(self, piece: CallEnd) -> str:
        call = self.calls[piece.index]
        item = call_item(call, "completed" if piece.complete else "incomplete", self.names)
        w = self.writer
        if item["type"] == "custom_tool_call":
            at = {"item_id": item["id"], "output_index": self.index}
            return "".join(
                (
                    w.event("response.custom_tool_call_input.delta", **at, delta=item["input"]),
                    w.event("response.custom_tool_call_input.done", **at, input=item["input"]),
                    w.event("response.output_item.done", output_index=self.index, item=item),
                )
            )
        return w.event(
            "response.function_call_arguments.done",
            item_id=item["id"],
            output_index=self.index,
            name=call.name,
            arguments=call.arguments,
        ) + w.event("response.output_item.done", output_index=self.index, item=item)
