"""The engine's request and event types (gateway/engine/request.py): finish reasons.

Pinned: a finish reason is a `FinishReason` whatever the producer passed (mlx-lm's bare
strings included) and still reads, compares and serializes as the plain string the APIs
send (`"stop"`, `"length"`, `"cancelled"`), in json, orjson, f-strings and metric labels.
"""

from __future__ import annotations

import json

import orjson
import pytest

from gateway.engine.request import FinishEvent, FinishReason, Usage

USAGE = Usage(3, 1, 0)


def test_a_bare_string_becomes_the_enum() -> None:
    for reason in ("stop", "length", "cancelled"):
        event = FinishEvent(reason, USAGE)  # type: ignore[arg-type]
        assert event.finish_reason is FinishReason(reason)
        assert event == FinishEvent(FinishReason(reason), USAGE)


def test_an_unknown_reason_is_refused() -> None:
    with pytest.raises(ValueError):
        FinishEvent("tired", USAGE)  # type: ignore[arg-type]


def test_the_enum_reads_as_its_plain_string() -> None:
    reason = FinishReason.STOP
    assert reason == "stop" and "stop" == reason
    assert {"stop": 1}[reason] == 1
    assert f"{reason}" == str(reason) == "stop"
    assert json.dumps({"finish_reason": reason}) == '{"finish_reason": "stop"}'
    assert orjson.dumps({"finish_reason": reason}) == b'{"finish_reason":"stop"}'


def test_a_request_cancelled_before_it_started() -> None:
    event = FinishEvent.cancelled(7)
    assert event.finish_reason is FinishReason.CANCELLED
    assert event.usage == Usage(7, 0, 0) and event.text == "" and event.stop_sequence is None
