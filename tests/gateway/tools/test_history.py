"""OpenAI's tool-history rules on plain messages (gateway.tools.history, no API).

Pinned: each rule's mistake is found where it is (the call for a duplicate or an unanswered
call, the tool message for an answer to no open call) and a complete history passes.
"""

from __future__ import annotations

import pytest

from gateway.frontend.chat import ChatMessage, TextPart
from gateway.tools.history import HistoryMistake, check_calls
from gateway.tools.spec import ToolCall

USER = ChatMessage("user", (TextPart("go"),))


def _calls(*ids: str) -> ChatMessage:
    return ChatMessage("assistant", (TextPart(""),), tuple(ToolCall(i, "f", "{}") for i in ids))


def _answer(call_id: str) -> ChatMessage:
    return ChatMessage("tool", (TextPart("ok"),), tool_call_id=call_id)


@pytest.mark.parametrize(
    ("messages", "mistake"),
    [
        ((USER, _calls("a", "b"), _answer("a"), USER), ("unanswered", "b", 1, 1)),
        ((USER, _calls("a")), ("unanswered", "a", 1, 0)),
        ((USER, _calls("a"), _answer("a"), _answer("a")), ("answered", "a", 3, -1)),
        ((USER, _answer("x")), ("unknown", "x", 1, -1)),
        ((USER, _calls("a"), _answer("a"), _calls("a")), ("duplicate", "a", 3, 0)),
    ],
)
def test_each_mistake_is_found_where_it_is(messages: tuple, mistake: tuple) -> None:
    with pytest.raises(HistoryMistake) as found:
        check_calls(messages)
    m = found.value
    assert (m.kind, m.call_id, m.message, m.call) == mistake and str(m)


def test_a_complete_history_passes() -> None:
    check_calls((USER, _calls("a", "b"), _answer("b"), _answer("a"), USER, _calls("c"),
                 _answer("c")))  # fmt: skip
