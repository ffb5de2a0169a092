"""The Responses stream of an answer decoded under the tool grammar: items open as the
answer's pieces arrive, and the streamed items are exactly the final body's."""

from __future__ import annotations

import json

from gateway.api.responses.parse import parse_responses_request
from gateway.api.responses.render import EventWriter, MadeCall, ResponseMeta, response_body
from gateway.api.responses.tool_events import ToolEvents
from gateway.tools.calls import CallEnd, CallSplitter
from gateway.tools.formats import HERMES

FN = {"type": "function", "name": "click", "parameters": {"type": "object", "properties": {
    "x": {"type": "integer"}}, "required": ["x"]}}  # fmt: skip
META = ResponseMeta(
    "resp_1", "msg_1", 7, parse_responses_request({"model": "m", "input": "x", "tools": [FN]})
)


def _stream(chunks: list[str]) -> tuple[list[dict], dict]:
    """Events and final body for an answer arriving in `chunks` (as routes.py does it)."""
    splitter = CallSplitter(HERMES)
    events = ToolEvents(EventWriter(META))
    text = events.opening()
    complete: dict[int, bool] = {}
    for i, chunk in enumerate(chunks):
        pieces = splitter.feed(chunk) + (splitter.finish() if i == len(chunks) - 1 else [])
        complete.update((p.index, p.complete) for p in pieces if isinstance(p, CallEnd))
        text += events.pieces(pieces, ())
    calls = [MadeCall(c, complete[i]) for i, c in enumerate(splitter.calls)]
    final = response_body(META, "completed", splitter.text, None, None, None, calls)
    text += events.closing(final)
    frames = [
        json.loads(b.split("\n")[1].removeprefix("data: ")) for b in text.strip().split("\n\n")
    ]
    return frames, final


def _items(frames: list[dict]) -> list[dict]:
    return [f["item"] for f in frames if f["type"] == "response.output_item.done"]


def test_text_then_two_calls() -> None:
    """Invariant: a message item (index 0) closes when the first call opens; each call's
    argument deltas join to its `done` arguments; the done items equal the final output."""
    call = '<tool_call>\n{"name": "click", "arguments": {"x": %d}}\n</tool_call>'
    answer = "I will click." + call % 1 + "\n" + call % 22
    frames, final = _stream([answer[i : i + 5] for i in range(0, len(answer), 5)])
    kinds = [f["type"] for f in frames]
    assert kinds.count("response.output_item.added") == 3 and kinds[-1] == "response.completed"
    assert _items(frames) == final["output"]
    assert [i["type"] for i in final["output"]] == ["message", "function_call", "function_call"]
    assert final["output"][0]["content"][0]["text"] == "I will click."
    for index in (1, 2):
        deltas = [
            f["delta"]
            for f in frames
            if f["type"].endswith("arguments.delta") and f["output_index"] == index
        ]
        assert "".join(deltas) == final["output"][index]["arguments"]
    assert [f["sequence_number"] for f in frames] == list(range(len(frames)))


def test_whitespace_before_a_call_opens_no_message() -> None:
    """Invariant: text that is only whitespace is neither streamed nor in the body; a call cut
    short is an `incomplete` item in both."""
    frames, final = _stream(["\n", '<tool_call>\n{"name": "click", "arguments": {"x": 1'])
    assert [i["type"] for i in final["output"]] == ["function_call"]
    assert final["output"][0]["status"] == "incomplete" and _items(frames) == final["output"]
    assert not any(f["type"].startswith("response.output_text") for f in frames)
