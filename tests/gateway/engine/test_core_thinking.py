"""Thinking inside the engine's shared batch (the tiny Qwen3 with Qwen3's Thinking template:
the prompt opens `<think>\\n`, so every answer starts inside the thinking).

Pinned: a budget forces `</think>` as exactly the (budget+1)-th token and the rest is answer
text, the thinking is `reasoning` text only; a budget that never binds leaves tokens and
logprobs bit for bit those without one; thinking rows with budgets and grammars, batched
with free rows, give each the tokens and logprobs it gets alone (greedy and seeded); a repeat
(prefix-cache hit) gives the uncached tokens and logprobs; a grammar constrains only what
follows the thinking, whose text is free.
"""

from __future__ import annotations

import json
from dataclasses import replace

import pytest
from support import EngineHarness, chat_body, thinking_model

from gateway.api.openai.parse import parse_chat_request
from gateway.engine.request import FinishEvent, TokenEvent
from gateway.frontend.chat import ChatRequest

SCHEMA = {
    "type": "object",
    "properties": {"a": {"type": "integer", "minimum": 0, "maximum": 99}},
    "required": ["a"],
    "additionalProperties": False,
}
JSON = {"type": "json_schema", "json_schema": {"name": "a", "schema": SCHEMA, "strict": True}}


@pytest.fixture(scope="module")
def harness():
    h = EngineHarness(path=thinking_model(), max_batch=8)
    yield h
    h.close()


@pytest.fixture(scope="module")
def end_id(harness: EngineHarness) -> int:
    (token,) = harness.engine.model.tokenize("</think>")
    return token


def _chat(question: str, budget: int | None = None, **extra: object) -> ChatRequest:
    body = chat_body(question, max_tokens=16, **extra)
    return replace(parse_chat_request(body), thinking_budget=budget)


def _reasoning(run: object) -> str:
    events = run.events  # type: ignore[attr-defined]
    return "".join(e.reasoning for e in events if isinstance(e, (TokenEvent, FinishEvent)))


def test_the_budget_forces_the_end_of_the_thinking(harness: EngineHarness, end_id: int) -> None:
    """Invariant: with budget n the (n+1)-th token is `</think>` (never earlier: the seeded
    thinking does not emit it itself), the thinking's text is `reasoning` only."""
    for budget in (1, 4):
        run = harness.submit_chat(_chat("why?", budget, temperature=1.0, seed=3)).wait()
        assert run.token_ids.index(end_id) == budget
        assert isinstance(run.finish, FinishEvent) and run.finish.usage.completion_tokens == 16
        assert _reasoning(run) and "</think>" not in _reasoning(run)
    free = harness.submit_chat(_chat("why?", None, temperature=1.0, seed=3)).wait()
    assert end_id not in free.token_ids and free.text == ""  # all thinking: no answer


def test_a_budget_that_never_binds_changes_nothing(harness: EngineHarness) -> None:
    """Invariant: a thinking row whose budget is never reached (its masks all ones) gives
    the tokens and logprobs of the request without it, bit for bit."""
    for extra in ({}, {"temperature": 1.0, "seed": 11}):
        plain = harness.submit_chat(_chat("same?", None, **extra)).wait()
        bounded = harness.submit_chat(_chat("same?", 1000, **extra)).wait()
        assert bounded.token_ids == plain.token_ids
        assert bounded.logprobs == plain.logprobs


def test_batched_equals_alone(harness: EngineHarness) -> None:
    """Invariant: budget rows, budget+grammar rows and free rows decoding together each get
    the tokens and logprobs they get alone."""
    chats = [
        _chat("one", 3),
        _chat("two", 5, temperature=1.0, seed=7),
        _chat("three", 2, response_format=JSON),
        _chat("four", 4, response_format=JSON, temperature=1.0, seed=9),
        _chat("five"),
    ]
    alone = [harness.submit_chat(c).wait() for c in chats]
    with harness.arriving_together():
        runs = [harness.submit_chat(c) for c in chats]
    for one, together in zip(alone, (r.wait() for r in runs), strict=True):
        assert together.token_ids == one.token_ids
        assert together.logprobs == one.logprobs


def test_cached_equals_uncached(harness: EngineHarness) -> None:
    """Invariant: a repeat served from the prefix cache gives the uncached answer."""
    chat = _chat("cache me " * 20, 3, temperature=1.0, seed=5)
    first = harness.submit_chat(chat).wait()
    second = harness.submit_chat(chat).wait()
    assert second.finish.usage.cached_tokens > 0
    assert (second.token_ids, second.logprobs) == (first.token_ids, first.logprobs)
    assert _reasoning(second) == _reasoning(first)


def test_the_grammar_constrains_only_the_answer(harness: EngineHarness, end_id: int) -> None:
    """Invariant: under a JSON schema the thinking is free text (not JSON) and what follows
    `</think>` is the schema's JSON."""
    for seed in range(4):
        chat = _chat("json?", 3, response_format=JSON, temperature=1.0, seed=seed)
        chat = replace(chat, max_tokens=60)
        run = harness.submit_chat(chat).wait()
        assert run.token_ids.index(end_id) == 3
        assert not _reasoning(run).lstrip().startswith("{")
        if run.finish.finish_reason == "stop":
            assert json.loads(run.text)["a"] in range(100)
        else:
            assert run.text.lstrip().startswith("{")


def test_tool_calls_follow_the_thinking(harness: EngineHarness, end_id: int) -> None:
    """Invariant: with tools required, the thinking is free and the call starts right after
    `</think>` (the tool grammar waits for the thinking's end)."""
    (call_id,) = harness.engine.model.tokenize("<tool_call>")
    tool = {"type": "function", "function": {"name": "f", "parameters": SCHEMA}}
    for seed in range(3):
        body = chat_body("call f", max_tokens=40, temperature=1.0, seed=seed)
        chat = parse_chat_request({**body, "tools": [tool], "tool_choice": "required"})
        run = harness.submit_chat(replace(chat, thinking_budget=2)).wait()
        at = run.token_ids.index(end_id)
        assert at == 2 and run.token_ids[at + 1] == call_id
        assert run.text.startswith('<tool_call>\n{"name": "f"')
