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


def _stream(chunks: list[str], meta: ResponseMeta = META) -> tuple[list[dict], dict]:
    """Events and final body for an answer arriving in `chunks` (as routes.py does it)."""
    splitter = CallSplitter(HERMES)
    events = ToolEvents(EventWriter(meta))
    text = events.opening()
    complete: dict[int, bool] = {}
    for i, chunk in enumerate(chunks):
        pieces = splitter.feed(chunk) + (splitter.finish() if i == len(chunks) - 1 else [])
        complete.update((p.index, p.complete) for p in pieces if isinstance(p, CallEnd))
        text += events.pieces(pieces, ())
    calls = [MadeCall(c, complete[i]) for i, c in enumerate(splitter.calls)]
    final = response_body(meta, "completed", splitter.text, None, None, None, calls)
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


def test_namespaced_and_custom_calls_stream_their_wire_items() -> None:
    """Invariant: a namespaced call streams as a function_call with its namespace and inner
    name; a custom tool's call streams no JSON argument deltas but its whole `input` in one
    custom_tool_call_input delta and done; the done items equal the final output."""
    ns = {"type": "namespace", "name": "agents", "description": "", "tools": [FN]}
    custom = {"type": "custom", "name": "apply_patch"}
    request = parse_responses_request({"model": "m", "input": "x", "tools": [ns, custom]})
    meta = ResponseMeta("resp_1", "msg_1", 7, request)
    call = '<tool_call>\n{"name": "%s", "arguments": %s}\n</tool_call>'
    answer = "\n".join((call % ("agents__click", '{"x": 3}'),
                        call % ("apply_patch", '{"input": "a\\nb"}')))  # fmt: skip
    frames, final = _stream([answer[i : i + 4] for i in range(0, len(answer), 4)], meta)
    spawn, patch = final["output"]
    assert (spawn["namespace"], spawn["name"]) == ("agents", "click")
    assert (patch["type"], patch["input"]) == ("custom_tool_call", "a\nb")
    assert _items(frames) == final["output"]
    custom_events = [f for f in frames if f["type"].startswith("response.custom_tool_call")]
    assert [f["type"].rsplit(".", 1)[1] for f in custom_events] == ["delta", "done"]
    assert custom_events[0]["delta"] == custom_events[1]["input"] == "a\nb"
    assert all(f["output_index"] == 0 for f in frames if f["type"].endswith("arguments.delta"))
    added = [f["item"] for f in frames if f["type"] == "response.output_item.added"]
    assert [(i["type"], i["name"]) for i in added] == [
        ("function_call", "click"), ("custom_tool_call", "apply_patch")]  # fmt: skip
