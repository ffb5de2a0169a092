"""SSE framing: one event is optional `event:` + one `data:` line + a blank line, whatever the
payload holds (newlines, non-ASCII, lone surrogates), and it parses back to the payload."""

from __future__ import annotations

import json

from gateway.api.sse import DONE, sse_data


def _parse(stream: str) -> list[tuple[str | None, object]]:
    events = []
    for block in stream.split("\n\n")[:-1]:
        name, data = None, None
        for line in block.split("\n"):
            field, _, value = line.partition(": ")
            if field == "event":
                name = value
            elif field == "data":
                assert data is None, "one data line per event"
                data = value
        events.append((name, data if data == "[DONE]" else json.loads(data)))
    return events


def test_payloads_round_trip_with_and_without_event_names() -> None:
    """Invariant: every payload comes back equal, each event on its own line pair, in order."""
    payloads = [{"text": "a\nb\r\n\n c"}, {"t": "é ✓ \ud800"}, [1, 2], "x", None]
    stream = "".join(sse_data(p, "delta" if i % 2 else None) for i, p in enumerate(payloads))
    stream += DONE
    parsed = _parse(stream)
    assert [p for _, p in parsed[:-1]] == payloads
    assert [n for n, _ in parsed[:-1]] == [None, "delta", None, "delta", None]
    assert parsed[-1] == (None, "[DONE]")


def test_an_event_is_ascii_and_ends_with_one_blank_line() -> None:
    """Invariant: the frame is ASCII (escaped JSON) and ends with exactly one blank line."""
    frame = sse_data({"text": "\n\n"}, "content_block_delta")
    assert frame.isascii()
    assert frame == 'event: content_block_delta\ndata: {"text":"\\n\\n"}\n\n'
