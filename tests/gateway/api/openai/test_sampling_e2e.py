"""End to end through the real `openai` SDK: n > 1 choices, penalties, logit_bias and
min_tokens against `vision-gateway serve`, plain and streamed.

Pinned: n seeded choices come back in index order, each the answer of a single request seeded
seed + i, streamed chunks carry their choice's index and add up to the plain choices, usage
counts the prompt once; each shaping field (presence/frequency penalty, logit_bias, and
vLLM's repetition_penalty and min_tokens through `extra_body`) changes the answer and is
the same streamed; n above --max-batch, a bad logit_bias id and a refused field are 400s
naming the field (Chat Completions and Responses).
"""

from __future__ import annotations

import openai
import pytest
from support import ServerProcess

PROMPT = [{"role": "user", "content": "tell me a story"}]


@pytest.fixture(scope="module")
def server():
    proc = ServerProcess("--max-batch", "8", "--no-warmup")
    yield proc
    assert proc.stop(), proc.log()


def _ask(client: openai.OpenAI, **kw: object):  # noqa: ANN202
    kw.setdefault("max_tokens", 8)
    return client.chat.completions.create(model="test", messages=PROMPT, logprobs=True, **kw)  # type: ignore[call-overload]


def _ids(choice) -> list[str]:  # noqa: ANN001
    return [t.token for t in choice.logprobs.content]


def _streamed(client: openai.OpenAI, **kw: object) -> tuple[dict[int, str], list]:
    """Each choice's streamed text by index, and the chunks."""
    chunks = list(
        _ask(client, stream=True, stream_options={"include_usage": True}, **kw)  # type: ignore[arg-type]
    )
    texts: dict[int, str] = {}
    for chunk in chunks:
        for choice in chunk.choices:
            texts[choice.index] = texts.get(choice.index, "") + (choice.delta.content or "")
    return texts, chunks


def test_n_choices_plain_and_streamed(server: ServerProcess) -> None:
    """Invariant: choice i is the single answer seeded 40 + i; the stream's choices are the
    plain ones; usage counts the prompt once and every choice's tokens."""
    client = server.client()
    plain = _ask(client, n=3, seed=40, temperature=1.0)
    assert [c.index for c in plain.choices] == [0, 1, 2]
    for i, choice in enumerate(plain.choices):
        single = _ask(client, seed=40 + i, temperature=1.0).choices[0]
        assert choice.message.content == single.message.content
        assert _ids(choice) == _ids(single)
        assert choice.finish_reason == "length"
    one = _ask(client, seed=40, temperature=1.0)
    assert plain.usage.prompt_tokens == one.usage.prompt_tokens
    assert plain.usage.completion_tokens == 3 * 8
    texts, chunks = _streamed(client, n=3, seed=40, temperature=1.0)
    assert texts == {i: c.message.content for i, c in enumerate(plain.choices)}
    finishes = [c.index for chunk in chunks for c in chunk.choices if c.finish_reason]
    assert sorted(finishes) == [0, 1, 2]
    assert chunks[-1].usage.completion_tokens == 24
    assert chunks[-1].usage.prompt_tokens == one.usage.prompt_tokens


@pytest.mark.parametrize(
    "fields",
    [
        {"presence_penalty": 2.0},
        {"frequency_penalty": 2.0},
        {"extra_body": {"repetition_penalty": 2.0}},
        {"logit_bias": {"7": 100}},
        # 2034, 2036: the tiny qwen2_vl model's end tokens, pushed to the top
        {"extra_body": {"min_tokens": 30}, "logit_bias": {"2034": 100, "2036": 100}},
    ],
    ids=["presence", "frequency", "repetition", "logit_bias", "min_tokens"],
)
def test_each_shaping_field_changes_the_answer_plain_and_streamed(
    server: ServerProcess, fields: dict
) -> None:
    """Invariant: the field changes the greedy answer (the random-weight model repeats
    itself; min_tokens keeps the pushed end tokens back for 30 tokens) and the stream
    gives the same text."""
    client = server.client()
    base = _ask(client, temperature=0, max_tokens=40)
    shaped = _ask(client, temperature=0, max_tokens=40, **fields)
    assert _ids(shaped.choices[0]) != _ids(base.choices[0])
    if "logit_bias" in fields and "extra_body" not in fields:
        assert set(_ids(shaped.choices[0])) == {_ids(shaped.choices[0])[0]}
    if "extra_body" in fields and "min_tokens" in fields["extra_body"]:
        assert shaped.usage.completion_tokens == 31 and shaped.choices[0].finish_reason == "stop"
    texts, _ = _streamed(client, temperature=0, max_tokens=40, **fields)
    assert texts[0] == shaped.choices[0].message.content


def test_refusals_name_their_field(server: ServerProcess) -> None:
    """Invariant: n above --max-batch, a token id outside the vocabulary, and a documented
    field the server cannot apply are 400s whose param names the field."""
    client = server.client()
    for kw, param in (
        ({"n": 9}, "n"),
        ({"logit_bias": {"99999999": 1}}, "logit_bias.99999999"),
        ({"modalities": ["text", "audio"]}, "modalities"),
        ({"extra_body": {"min_p": 0.1}}, "min_p"),
    ):
        with pytest.raises(openai.BadRequestError) as info:
            _ask(client, **kw)
        assert info.value.body["param"] == param  # type: ignore[index]
    with pytest.raises(openai.BadRequestError) as info:
        client.responses.create(model="test", input="hi", background=True)
    assert info.value.body["param"] == "background"  # type: ignore[index]
