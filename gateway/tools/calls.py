"""An answer's text -> free text and tool calls, piece by piece as it streams.

The tool grammar (`gateway.tools.grammar`) guarantees the answer's shape, so the split is a
small state machine over the format's fixed texts: text up to the call marker, the name up
to `between`, the arguments object (its end found by counting brackets outside strings),
then the tail and close, then either the next call or the end. Pieces come out as soon as
they are certain: text is held back only while it could be the start of a marker, and
arguments stream as they are generated (OpenAI's `delta.tool_calls[].function.arguments`,
Anthropic's `input_json_delta`, Responses' `function_call_arguments.delta`).

One splitter per answer; not thread-safe (the route's coroutine owns it).
"""

from __future__ import annotations

import secrets
from dataclasses import dataclass

from gateway.engine.tokens.holdback import held_length
from gateway.tools.formats import ToolFormat
from gateway.tools.spec import ToolCall


@dataclass(frozen=True)
class TextPiece:
    text: str


@dataclass(frozen=True)
class CallStart:
    index: int  # the call's place among the answer's calls, from 0
    id: str
    name: str


@dataclass(frozen=True)
class CallArgs:
    index: int
    text: str  # the next piece of the arguments' JSON text


@dataclass(frozen=True)
class CallEnd:
    index: int
    complete: bool  # False: the answer ended (max_tokens) inside the arguments


Piece = TextPiece | CallStart | CallArgs | CallEnd


def new_call_id(prefix: str) -> str:
    """A fresh call id (`call_...`, `toolu_...`): 24 random hex digits after the prefix."""
    return f"{prefix}{secrets.token_hex(12)}"


class CallSplitter:
    """Feed the answer's text in order (`feed`), then `finish`; each returns the pieces now
    certain. `calls` and `text` hold the whole split so far."""

    def __init__(self, fmt: ToolFormat, id_prefix: str = "call_") -> None:
        self._fmt = fmt
        self._prefix = id_prefix
        self._buf = ""
        self._state = "text"
        self._texts: list[str] = []
        self._calls: list[ToolCall] = []
        self._args: list[str] = []
        self._depth = 0
        self._in_string = False
        self._escape = False

    @property
    def text(self) -> str:
        return "".join(self._texts)

    @property
    def calls(self) -> tuple[ToolCall, ...]:
        return tuple(self._calls)

    def feed(self, text: str) -> list[Piece]:
        self._buf += text
        out: list[Piece] = []
        while self._buf and self._step(out):
            pass
        return out

    def finish(self, cut: bool = False) -> list[Piece]:
        """The end of the answer (`cut`: by max_tokens): held-back text comes out; a call cut
        short is ended (`complete` False) with the arguments it has; the syntax of a call cut
        before its name is dropped: it is neither text nor a call. So is, when the answer was
        cut, held-back text that begins the call marker (`<tool` of `<tool_call>`: a call was
        starting; at a natural end it is text)."""
        out: list[Piece] = []
        opening = self._fmt.open or self._fmt.head
        starts_call = cut and opening.startswith(self._buf)
        if self._state == "args":
            self._end_call(out, complete=False)
        elif self._buf and self._state in ("text", "plain") and not starts_call:
            self._emit_text(out, self._buf)
        self._buf = ""
        self._state = "done"
        return out

    # ----- the state machine ------------------------------------------------------------------

    def _step(self, out: list[Piece]) -> bool:
        """Advance as far as the buffer allows; False when it needs more text."""
        fmt = self._fmt
        if self._state == "text":
            return self._in_text(out)
        if self._state == "head":
            start = len(fmt.head)
            end = self._buf.find(fmt.between, start)
            if not (self._buf.startswith(fmt.head) or fmt.head.startswith(self._buf)):
                return self._give_up(out)
            if end < 0:
                return False
            name = self._buf[start:end]
            self._buf = self._buf[end + len(fmt.between) :]
            index = len(self._calls)
            call_id = new_call_id(self._prefix)
            self._calls.append(ToolCall(call_id, name, ""))
            self._args = []
            self._depth, self._in_string, self._escape = 0, False, False
            out.append(CallStart(index, call_id, name))
            self._state = "args"
            return True
        if self._state == "args":
            return self._in_args(out)
        if self._state == "tail":
            want = fmt.tail + fmt.close
            if len(self._buf) < len(want):
                return False
            self._buf = self._buf[len(want) :]  # fixed by the grammar
            self._state = "sep"
            return True
        if self._state == "sep":
            want = fmt.separator + fmt.open
            if not fmt.parallel or not want:
                return self._give_up(out)
            if len(self._buf) < len(want):
                return self._unless_prefix(out, want)
            if not self._buf.startswith(want):
                return self._give_up(out)
            self._buf = self._buf[len(want) :]
            self._state = "head"
            return True
        return self._give_up(out)

    def _unless_prefix(self, out: list[Piece], want: str) -> bool:
        """Wait while the buffer may still become `want`; else give up."""
        if want.startswith(self._buf):
            return False
        return self._give_up(out)

    def _in_text(self, out: list[Piece]) -> bool:
        fmt = self._fmt
        if not fmt.open:  # the first character decides (llama3_json)
            if not self._texts and self._buf.startswith(fmt.head[0]):
                self._state = "head"
                return True
            return self._give_up(out)
        at = self._buf.find(fmt.open)
        if at >= 0:
            if at:
                self._emit_text(out, self._buf[:at])
            self._buf = self._buf[at + len(fmt.open) :]
            self._state = "head"
            return True
        keep = held_length(self._buf, fmt.open)
        ready = self._buf[: len(self._buf) - keep]
        if ready:
            self._emit_text(out, ready)
        self._buf = self._buf[len(ready) :]
        return False

    def _in_args(self, out: list[Piece]) -> bool:
        for i, ch in enumerate(self._buf):
            if self._in_string:
                if self._escape:
                    self._escape = False
                elif ch == "\\":
                    self._escape = True
                elif ch == '"':
                    self._in_string = False
            elif ch == '"':
                self._in_string = True
            elif ch in "{[":
                self._depth += 1
            elif ch in "}]":
                self._depth -= 1
                if self._depth == 0:
                    self._add_args(out, self._buf[: i + 1])
                    self._buf = self._buf[i + 1 :]
                    self._end_call(out, complete=True)
                    self._state = "tail"
                    return True
        self._add_args(out, self._buf)
        self._buf = ""
        return False

    def _add_args(self, out: list[Piece], text: str) -> None:
        if text:
            self._args.append(text)
            out.append(CallArgs(len(self._calls) - 1, text))

    def _end_call(self, out: list[Piece], complete: bool) -> None:
        index = len(self._calls) - 1
        last = self._calls[index]
        self._calls[index] = ToolCall(last.id, last.name, "".join(self._args))
        out.append(CallEnd(index, complete))

    def _emit_text(self, out: list[Piece], text: str) -> None:
        self._texts.append(text)
        out.append(TextPiece(text))

    def _give_up(self, out: list[Piece]) -> bool:
        """Text that is not in the format (not possible under the grammar): plain text."""
        self._emit_text(out, self._buf)
        self._buf = ""
        self._state = "plain"
        return False
