"""Detokenization and stop strings (no model: a toy vocabulary).

Pinned: streamed deltas concatenate to the full decode; multi-byte characters are never split;
stop strings end the text before the stop string, also when it spans several tokens, and text
that might start a stop string is held back until it cannot; with `stop_until` (a tool call's
opening) they end only the text before it, never a call.
"""

from __future__ import annotations

from gateway.engine.request import SamplingParams
from gateway.engine.tokens.output import IncrementalDetokenizer, OutputState


# A byte-level toy vocabulary: token i is the byte i; decode joins bytes as UTF-8.
def _decode(ids: list[int]) -> str:
    return bytes(ids).decode("utf-8", errors="replace")


def _ids(text: str) -> list[int]:
    return list(text.encode("utf-8"))


def _state(*stop: str, until: str | None = None) -> OutputState:
    params = SamplingParams(max_tokens=100, stop=tuple(stop), stop_until=until)
    return OutputState(params, lambda: IncrementalDetokenizer(_decode), lambda t: _decode([t]))


def test_deltas_concatenate_to_full_decode_and_never_split_characters() -> None:
    text = "héllo wörld — ✓ 日本"
    detok = IncrementalDetokenizer(_decode)
    deltas = [detok.add(t) for t in _ids(text)]
    assert "".join(deltas) + detok.flush() == text
    assert all("\ufffd" not in d for d in deltas)


def test_stop_string_spanning_tokens_cuts_before_it() -> None:
    out = _state("NOPE", "STOP")
    emitted = ""
    for t in _ids("abc STOP def"):
        emitted += out.push(t)
        if out.stopped:
            break
    emitted += out.finish()
    assert emitted == "abc "
    assert out.stopped and out.stopped_by == "STOP"  # reported as Anthropic's stop_sequence


def test_possible_stop_prefix_is_held_back_then_released() -> None:
    out = _state("STOP")
    emitted = [out.push(t) for t in _ids("xxST")]
    assert "".join(emitted) == "xx"  # "ST" could start "STOP"
    emitted.append(out.push(_ids("!")[0]))
    assert "".join(emitted) == "xxST!"[: len("".join(emitted))]
    assert "".join(emitted) + out.finish() == "xxST!"
    assert not out.stopped and out.stopped_by is None


def test_no_stop_strings_emit_immediately() -> None:
    out = _state()
    assert [out.push(t) for t in _ids("ab")] == ["a", "b"]
    assert out.completion_tokens == 2


def test_earliest_of_several_stop_strings_wins() -> None:
    out = _state("zz", "END")
    text = ""
    for t in _ids("one END two zz"):
        text += out.push(t)
    text += out.finish()
    assert text == "one "


def _through(out: OutputState, text: str) -> str:
    emitted = ""
    for t in _ids(text):
        emitted += out.push(t)
        if out.stopped:
            break
    return emitted + out.finish()


CALL = 'Let me look.<tool_call>\n{"name": "f", "arguments": {"a": "x}y"}}\n</tool_call>'


def test_stop_strings_never_cut_a_tool_call() -> None:
    """Invariant: with `stop_until` set to the calls' opening, a stop string that occurs only
    inside a call ends nothing (the call stays whole, parseable), even one that is itself a
    prefix of the opening; a stop string before the opening still ends the answer there."""
    for stop in ("}", '"', "<", "<tool", "\n"):
        out = _state(stop, until="<tool_call>")
        assert _through(out, CALL) == CALL and not out.stopped, stop
    out = _state("look", until="<tool_call>")
    assert _through(out, CALL) == "Let me " and out.stopped_by == "look"
    out = _state("<", until="<tool_call>")  # "<" that does not open a call is a stop
    assert _through(out, "a<b<tool_call>") == "a" and out.stopped_by == "<"
    out = _state("}")  # without `stop_until` (no tools) stops apply to the whole answer
    assert _through(out, CALL) == 'Let me look.<tool_call>\n{"name": "f", "arguments": {"a": "x'
