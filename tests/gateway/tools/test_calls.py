"""The streaming split of an answer into text and calls (gateway.tools.calls).

Pinned: any chunking of the same answer gives the same text, calls and argument text; a call
cut inside its arguments ends incomplete; a call cut before its name is dropped, not text;
Llama 3 JSON is a call only when the answer starts with "{".
"""

from __future__ import annotations

import random

from gateway.tools.calls import CallArgs, CallEnd, CallSplitter, CallStart, TextPiece
from gateway.tools.formats import HERMES, LLAMA3_JSON

ANSWER = (
    'Let me look <tool_call>\n{"name": "click", "arguments": {"x": "a}\\"b", "y": [1, {"z": 2}]}}'
    '\n</tool_call>\n<tool_call>\n{"name": "scroll", "arguments": {}}\n</tool_call>'
)


def _split(text: str, sizes: list[int]) -> tuple[CallSplitter, list]:
    splitter, pieces, at = CallSplitter(HERMES), [], 0
    for size in sizes:
        pieces += splitter.feed(text[at : at + size])
        at += size
    pieces += splitter.feed(text[at:]) + splitter.finish()
    return splitter, pieces


def test_any_chunking_gives_the_same_split() -> None:
    rng = random.Random(0)
    for _ in range(50):
        sizes = [rng.randint(1, 7) for _ in range(40)]
        splitter, pieces = _split(ANSWER, sizes)
        assert splitter.text == "Let me look "
        assert [(c.name, c.arguments) for c in splitter.calls] == [
            ("click", '{"x": "a}\\"b", "y": [1, {"z": 2}]}'),
            ("scroll", "{}"),
        ]
        starts = [p for p in pieces if isinstance(p, CallStart)]
        assert [s.index for s in starts] == [0, 1]
        assert [s.id for s in starts] == [c.id for c in splitter.calls]
        args = "".join(p.text for p in pieces if isinstance(p, CallArgs) and p.index == 0)
        assert args == splitter.calls[0].arguments
        assert [p.complete for p in pieces if isinstance(p, CallEnd)] == [True, True]
        text = "".join(p.text for p in pieces if isinstance(p, TextPiece))
        assert text == "Let me look "


def test_text_that_only_looks_like_a_marker_start_is_released_at_the_end() -> None:
    splitter = CallSplitter(HERMES)
    assert splitter.feed("a <tool_") == [TextPiece("a ")]
    assert splitter.finish() == [TextPiece("<tool_")]
    assert splitter.calls == ()


def test_a_call_cut_in_its_arguments_ends_incomplete() -> None:
    splitter = CallSplitter(HERMES)
    splitter.feed('<tool_call>\n{"name": "click", "arguments": {"x": 1')
    assert splitter.finish() == [CallEnd(0, complete=False)]
    assert splitter.calls[0].arguments == '{"x": 1'


def test_a_call_cut_before_its_name_is_dropped() -> None:
    splitter = CallSplitter(HERMES)
    splitter.feed('<tool_call>\n{"name": "cl')
    assert splitter.finish() == []
    assert splitter.text == "" and splitter.calls == ()


def test_a_call_cut_inside_its_marker_leaves_no_text() -> None:
    """Invariant: cut by max_tokens inside the call marker (`<tool`), the held text was a
    call starting: dropped; the same text at a natural end is text (released above)."""
    for held in ("<", "<tool", "<tool_call"):
        splitter = CallSplitter(HERMES)
        assert splitter.feed("ok " + held) == [TextPiece("ok ")]
        assert splitter.finish(cut=True) == [] and splitter.text == "ok ", held
    splitter = CallSplitter(HERMES)
    splitter.feed("a < b")  # no marker prefix at the end: text, cut or not
    splitter.finish(cut=True)
    assert splitter.text == "a < b"


def test_llama3_json_call_or_text() -> None:
    splitter = CallSplitter(LLAMA3_JSON, "toolu_")
    splitter.feed('{"name": "click", "parameters": {"x": 3}}')
    splitter.finish()
    assert [(c.name, c.arguments) for c in splitter.calls] == [("click", '{"x": 3}')]
    assert splitter.calls[0].id.startswith("toolu_")
    text = CallSplitter(LLAMA3_JSON)
    text.feed('no call {"name": ')
    text.finish()
    assert text.text == 'no call {"name": ' and text.calls == ()
