"""Plain mlx-lm text models through the engine (families/text.py).

Pinned, for the tiny qwen3 and llama checkpoints (mlx-lm model classes, real templates): the greedy
answer through the engine equals mlx-lm's own `stream_generate` on the same checkpoint and
prompt, token for token, with the chosen tokens' logprobs equal; cached == uncached and
batched == alone at tolerance zero (token ids and logprobs); structured output constrains a
text model too; a family's CachePolicy turns the prefix cache off with its reason in the
stats.
"""

from __future__ import annotations

import json

import mlx.core as mx
import pytest
from support import EngineHarness, Run, chat_body, tiny_model

from gateway.config import CacheConfig
from gateway.engine.families import CachePolicy
from gateway.engine.families.text import TextModel
from tests.gateway.engine.families.common import (
    assert_batched_equals_alone,
    assert_cached_equals_uncached,
    conversation,
)

MODEL_TYPES = ["qwen3", "llama"]
# Long enough for several 32-token exact-reuse blocks on CPU.
SYSTEM = "You are a careful assistant. " * 6


def _messages(question: str) -> list[dict]:
    return [{"role": "system", "content": SYSTEM}, {"role": "user", "content": question}]


def _reference(path: str, prompt: list[int], max_tokens: int) -> tuple[list[int], list[float]]:
    """mlx-lm's own greedy generate: token ids and each chosen token's logprob."""
    from mlx_lm import load, stream_generate

    model, tokenizer = load(path)
    ids, logprobs = [], []
    for response in stream_generate(
        model, tokenizer, prompt, max_tokens=max_tokens, sampler=lambda x: mx.argmax(x, axis=-1)
    ):
        ids.append(int(response.token))
        logprobs.append(float(response.logprobs[response.token].item()))
        if response.finish_reason is not None:
            break
    return ids, logprobs


@pytest.mark.parametrize("model_type", MODEL_TYPES)
def test_greedy_answer_equals_mlx_lm_generate(model_type: str) -> None:
    """Invariant: engine (exact-reuse blocks, batched decode) == mlx-lm's generate."""
    path = tiny_model(model_type)
    h = EngineHarness(path=path, max_batch=4)
    try:
        assert isinstance(h.engine.model, TextModel)
        questions = ["What is a prime number?", "Name three colours, please."]
        for question in questions:
            body = {**chat_body(question, max_tokens=24), "messages": _messages(question)}
            run = h.run(body)
            prompt = h.engine.model.tokenize(h.engine.model.render(_messages(question)))
            assert len(prompt) > 64  # several blocks, and a partial final one
            ids, logprobs = _reference(str(path), prompt, 24)
            assert run.token_ids == ids
            assert run.logprobs == logprobs  # tolerance zero
    finally:
        h.close()


def _story(h: EngineHarness) -> list[Run]:
    """A multi-turn conversation, each turn resending the history, then a repeat."""
    body = {**chat_body("", max_tokens=10), "messages": _messages("Tell me a story.")}
    return conversation(h, (body, []), 4, lambda t: f"Go on, part {t}.", [(body, [])])


@pytest.mark.parametrize("model_type", MODEL_TYPES)
def test_cached_equals_uncached(model_type: str) -> None:
    """Invariant: prefix-cache hits change nothing (token ids and logprobs, tolerance 0)."""

    def check(cached: EngineHarness, runs: list[Run]) -> None:
        assert runs[-1].finish.usage.cached_tokens > 0  # the repeat was a hit

    assert_cached_equals_uncached(tiny_model(model_type), _story, check, max_batch=4)


def test_batched_equals_alone() -> None:
    """Invariant: requests decoded together answer as each does alone."""
    h = EngineHarness(path=tiny_model("qwen3"), max_batch=8)
    try:
        questions = [f"Question number {i}: why?" * (i + 1) for i in range(4)]
        bodies = [{**chat_body(q, max_tokens=12), "messages": _messages(q)} for q in questions]
        assert_batched_equals_alone(h, [(b, []) for b in bodies])
    finally:
        h.close()


def test_structured_output_on_a_text_model() -> None:
    """Invariant: a JSON-schema response_format constrains a text model's answer."""
    h = EngineHarness(path=tiny_model("qwen3"), max_batch=2)
    schema = {
        "type": "object",
        # (finite: a random-weight model would write an integer's digits forever)
        "properties": {"n": {"type": "boolean"}},
        "required": ["n"],
        "additionalProperties": False,
    }
    body = chat_body(
        "Give me a number as JSON.",
        max_tokens=40,
        response_format={"type": "json_schema", "json_schema": {"name": "n", "schema": schema}},
    )
    try:
        run = h.run(body)
        assert run.finish.finish_reason == "stop", run.text
        answer = json.loads(run.text)
        assert set(answer) == {"n"} and isinstance(answer["n"], bool)
    finally:
        h.close()


def test_cache_policy_turns_the_prefix_cache_off_with_its_reason() -> None:
    """Invariant: a family that turns the prefix cache off gets no hits and stores nothing,
    and /v1/cache/stats says why."""

    class NoPrefix(TextModel):
        cache_policy = CachePolicy(prefix_off="test: this layer type cannot be restored")

    path = tiny_model("qwen3")
    h = EngineHarness(path=path, max_batch=2, loader=lambda: NoPrefix(str(path)))
    try:
        body = {**chat_body("", max_tokens=4), "messages": _messages("Hello there.")}
        first, second = h.run(body), h.run(body)
        assert first.token_ids == second.token_ids
        assert second.finish.usage.cached_tokens == 0
        stats = h.engine.cache_stats()
        assert stats["prefix"]["entries"] == 0
        assert stats["family"]["prefix_cache"] == "off: test: this layer type cannot be restored"
        assert stats["family"]["family"] == "text"
    finally:
        h.close()


def test_without_the_exact_rule_answers_still_equal_mlx_lm() -> None:
    """Invariant: with --no-exact-cache (text prefill through `text_core` and mlx-lm's own
    batch prefill) the greedy tokens are still mlx-lm's, cached or not."""
    path = tiny_model("qwen3")
    h = EngineHarness(path=path, max_batch=4, cache=CacheConfig(exact_reuse=False))
    try:
        question = "What is a prime number?"
        body = {**chat_body(question, max_tokens=16), "messages": _messages(question)}
        first, second = h.run(body), h.run(body)
        prompt = h.engine.model.tokenize(h.engine.model.render(_messages(question)))
        ids, _ = _reference(str(path), prompt, 16)
        assert first.token_ids == ids and second.token_ids == ids
        assert second.finish.usage.cached_tokens > 0
    finally:
        h.close()
