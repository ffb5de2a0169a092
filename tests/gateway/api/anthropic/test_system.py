"""System text of a Messages body (gateway.api.anthropic.system), parsed and placed.

Pinned: a billing-metadata system block is never rendered (two requests that differ only in
its per-request `cch=` value are the same request: the prefix cache is not defeated); a
`role: "system"` message is a system turn where it stands (leading ones join the top-level
`system`), hidden by `clear_at: "next_user_message"` once a user message follows, its
`output_config.effort` sets the effort of the answer it precedes; where the template does
not render a late system turn (the probe says so of Qwen3.5's and Gemma 3's templates, not
of Qwen3's), it is folded into user messages as docs/api.md says, and the folded Claude Code
conversation renders under Qwen3.5's template.
"""

from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest
from support import tiny_model

from gateway.api.anthropic.parse import parse_messages, parse_messages_request
from gateway.api.anthropic.system import place_system, renders_late_system
from gateway.errors import APIError
from gateway.frontend.chat import ChatMessage, TextPart
from gateway.frontend.prompt import template_messages
from gateway.offline_model.chat_templates import gemma3, qwen3_5

BASE = {"model": "m", "max_tokens": 5, "messages": [{"role": "user", "content": "hi"}]}
CLAUDE_CODE = json.loads((Path(__file__).parent / "claude_code_body.json").read_text())["body"]


def _roles_and_text(body: dict, fold: bool = False) -> list[tuple[str, str]]:
    chat = parse_messages_request(body, fold_system=fold)
    return [(m["role"], m["content"]) for m in template_messages(chat)]


def test_billing_metadata_is_not_rendered() -> None:
    """Invariant: a system block of client billing metadata is dropped, so a per-request
    `cch=` value leaves the request (and its prompt) unchanged."""
    one, two = copy.deepcopy(CLAUDE_CODE), copy.deepcopy(CLAUDE_CODE)
    billing = "x-anthropic-billing-header: cc_version=2.1.332; cch={};"
    one["system"][0]["text"], two["system"][0]["text"] = billing.format(1), billing.format(2)
    assert parse_messages_request(one) == parse_messages_request(two)
    rendered = template_messages(parse_messages_request(one))[0]["content"]
    assert "billing" not in rendered and rendered.startswith("You are a Claude agent")
    only = {**BASE, "system": billing.format(3)}
    assert _roles_and_text(only) == [("user", "hi")]


def test_a_late_system_message_stands_where_it_is_sent() -> None:
    body = {**BASE, "system": "top", "messages": [
        {"role": "system", "content": "lead"},
        {"role": "user", "content": "hi"},
        {"role": "assistant", "content": "yes"},
        {"role": "system", "content": [{"type": "text", "text": "late", "cache_control": {}}]},
        {"role": "user", "content": "more"},
    ]}  # fmt: skip
    assert _roles_and_text(body) == [
        ("system", "top\n\nlead"),
        ("user", "hi"),
        ("assistant", "yes"),
        ("system", "late"),
        ("user", "more"),
    ]


def test_clear_at_next_user_message_and_a_per_turn_effort() -> None:
    """Invariant: `clear_at: next_user_message` shows a system message only until a user
    message follows it; a system message's `output_config.effort` after the last user
    message turns thinking on (optionally), one before it does not; `content: []` with only
    an output_config renders nothing."""
    note = {"role": "system", "content": "note", "clear_at": "next_user_message"}
    effort = {"role": "system", "content": [], "output_config": {"effort": "low"}}
    user = {"role": "user", "content": "hi"}
    shown = parse_messages_request({**BASE, "messages": [user, note, effort]})
    assert [m.role for m in shown.messages] == ["user", "system"]
    assert (shown.thinking, shown.thinking_optional) == (True, True)
    hidden = parse_messages_request({**BASE, "messages": [note, effort, user]})
    assert [m.role for m in hidden.messages] == ["user"] and hidden.thinking is None


@pytest.mark.parametrize(
    ("message", "param"),
    [
        ({"role": "system", "content": "x", "clear_at": "later"}, "messages[1].clear_at"),
        ({"role": "user", "content": "x", "clear_at": "never"}, "messages[1].clear_at"),
        ({"role": "system", "content": [{"type": "image"}]}, "messages[1].content[0].type"),
        ({"role": "system", "content": 5}, "messages[1].content"),
        ({"role": "system", "content": "x", "output_config": {"effort": "huge"}},
         "messages[1].output_config.effort"),
    ],
)  # fmt: skip
def test_system_message_mistakes_name_the_field(message: dict, param: str) -> None:
    with pytest.raises(APIError) as info:
        parse_messages_request({**BASE, "messages": [BASE["messages"][0], message]})
    assert info.value.param == param


def _texts(messages: tuple[ChatMessage, ...]) -> list[tuple[str, str]]:
    return [(m.role, "".join(p.text for p in m.parts if isinstance(p, TextPart))) for m in messages]


def _m(role: str, text: str) -> ChatMessage:
    return ChatMessage(role, (TextPart(text),))


def test_folding_puts_late_system_text_into_user_messages_in_order() -> None:
    """Invariant: folded, a late system message joins the user message it follows, else the
    next user message (tool results stay next to their calls), else becomes a user message
    before the assistant turn it preceded or at the end; the leading system stays."""
    s = "<system-reminder>\n{}\n</system-reminder>"
    folded = place_system(
        (_m("system", "top"), _m("user", "u1"), _m("system", "a"), _m("assistant", "x"),
         _m("system", "b"), _m("tool", "r"), _m("system", "c"), _m("user", "u2"),
         _m("system", "d"), _m("assistant", "y"), _m("system", "e")),
        fold=True,
    )  # fmt: skip
    assert _texts(folded) == [
        ("system", "top"),
        ("user", "u1\n\n" + s.format("a")),
        ("assistant", "x"),
        ("tool", "r"),
        ("user", s.format("b") + "\n\n" + s.format("c") + "\n\nu2\n\n" + s.format("d")),
        ("assistant", "y"),
        ("user", s.format("e")),
    ]


@pytest.fixture(scope="module")
def render():
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(tiny_model("qwen3"))

    def with_template(template: str | None):
        def run(messages: list[dict]) -> str:
            return tokenizer.apply_chat_template(
                messages, chat_template=template, tokenize=False, add_generation_prompt=True
            )

        return run

    return with_template


def test_the_probe_knows_which_templates_render_a_late_system_turn(render) -> None:  # noqa: ANN001
    """Invariant: Qwen3's template renders a late system turn (kept); Qwen3.5's raises and
    Gemma 3's breaks its alternation (folded); a template that drops it is folded too."""
    assert renders_late_system(render(None))
    assert not renders_late_system(render(qwen3_5.TEMPLATE))
    assert not renders_late_system(render(gemma3.TEMPLATE))
    first_only = (
        "{% for m in messages %}{% if m.role != 'system' or loop.first %}{{ m.content }}"
        "{% endif %}{% endfor %}"
    )
    assert not renders_late_system(render(first_only))


def test_claude_codes_conversation_folded_renders_under_qwen3_5(render) -> None:  # noqa: ANN001
    """Invariant: Claude Code's first request ends with a system message; folded, Qwen3.5's
    template (which refuses it unfolded) renders it, its text in the user turn."""
    qwen3_5_render = render(qwen3_5.TEMPLATE)
    kept = template_messages(parse_messages(CLAUDE_CODE).chat)
    with pytest.raises(Exception, match="System message must be at the beginning"):
        qwen3_5_render(kept)
    folded = template_messages(parse_messages(CLAUDE_CODE, fold_system=True).chat)
    text = qwen3_5_render(folded)
    assert "<system-reminder>\n# Environment" in text and text.count("<|im_start|>system") == 1
