"""End to end through the real `openai` SDK: the legacy Completions API (`/v1/completions`)
against `vision-gateway serve` on the tiny model.

Pinned: a completion of the chat template's rendered text is the chat answer (token for token,
logprob for logprob: the raw prompt goes through the same engine, with no template of its
own); a text prompt and its token ids are one prompt; a repeat is a prefix-cache hit with the
same tokens and logprobs (cached == uncached); streamed == plain; several prompts come back
numbered prompt by prompt (index = k * n + i), each as its single request, usage summed;
`echo` puts the prompt before the completion; the legacy logprobs shape (tokens,
token_logprobs, top_logprobs maps, increasing text_offset); a mistake is a 400 naming its
field (echo + logprobs, best_of > n, a token id outside the vocabulary, an empty prompt list,
an over-long prompt, a refused field) and an unknown model a 404.
"""

from __future__ import annotations

import openai
import pytest
from support import ServerProcess, tiny_model
from transformers import AutoTokenizer

MESSAGES = [{"role": "user", "content": "tell me a story about a lighthouse"}]


@pytest.fixture(scope="module")
def server():
    proc = ServerProcess("--max-batch", "8", "--no-warmup", "--max-context", "512")
    yield proc
    assert proc.stop(), proc.log()


@pytest.fixture(scope="module")
def tokenizer():
    return AutoTokenizer.from_pretrained(str(tiny_model()))


def _complete(client: openai.OpenAI, prompt: object, **kw: object):  # noqa: ANN202
    kw.setdefault("max_tokens", 8)
    kw.setdefault("temperature", 0)
    kw.setdefault("logprobs", 0)
    return client.completions.create(model="test", prompt=prompt, **kw)  # type: ignore[arg-type]


def _tokens(choice) -> tuple[list[str], list[float]]:  # noqa: ANN001
    return choice.logprobs.tokens, choice.logprobs.token_logprobs


def test_a_completion_of_the_rendered_chat_is_the_chat_answer(server, tokenizer) -> None:  # noqa: ANN001
    """Invariant: the raw prompt takes the chat's path through the engine: completing the
    chat template's text gives the chat's tokens and logprobs exactly."""
    client = server.client()
    chat = client.chat.completions.create(
        model="test", messages=MESSAGES, max_tokens=8, temperature=0, logprobs=True  # type: ignore[arg-type]
    )
    text = tokenizer.apply_chat_template(MESSAGES, tokenize=False, add_generation_prompt=True)
    done = _complete(client, text)
    choice = done.choices[0]
    assert choice.logprobs.tokens == [t.token for t in chat.choices[0].logprobs.content]
    assert choice.logprobs.token_logprobs == [t.logprob for t in chat.choices[0].logprobs.content]
    assert choice.text == chat.choices[0].message.content
    assert done.usage.prompt_tokens == chat.usage.prompt_tokens
    assert done.object == "text_completion" and choice.finish_reason == "length"


def test_text_and_its_token_ids_are_one_prompt_and_a_repeat_is_a_cache_hit(
    server, tokenizer  # noqa: ANN001
) -> None:
    """Invariant: a prompt as text or as the tokenizer's ids gives one answer; the repeat
    reuses the cached prefix and answers the same (tokens and logprobs)."""
    client = server.client()
    text = "The keeper climbed the stairs of the old lighthouse every night at nine " * 6
    first = _complete(client, text, max_tokens=6)
    ids = tokenizer.encode(text)
    again = _complete(client, ids, max_tokens=6)
    assert _tokens(again.choices[0]) == _tokens(first.choices[0])
    assert again.usage.prompt_tokens == first.usage.prompt_tokens == len(ids)
    assert again.usage.prompt_tokens_details.cached_tokens > 0
    assert first.usage.prompt_tokens_details.cached_tokens == 0


def test_streamed_equals_plain(server) -> None:  # noqa: ANN001
    """Invariant: the stream's text and logprobs are the plain answer's; a usage chunk ends it."""
    client = server.client()
    plain = _complete(client, "Once upon a time", max_tokens=10, seed=3, temperature=1.0)
    chunks = list(
        _complete(
            client, "Once upon a time", max_tokens=10, seed=3, temperature=1.0,
            stream=True, stream_options={"include_usage": True},
        )
    )  # fmt: skip
    text = "".join(c.text for chunk in chunks for c in chunk.choices)
    tokens = [t for chunk in chunks for c in chunk.choices if c.logprobs for t in c.logprobs.tokens]
    assert text == plain.choices[0].text
    assert tokens == plain.choices[0].logprobs.tokens
    assert chunks[-1].usage.completion_tokens == plain.usage.completion_tokens == 10
    assert [c.finish_reason for chunk in chunks for c in chunk.choices if c.finish_reason] == [
        "length"
    ]


@pytest.mark.parametrize("stream", [False, True])
def test_several_prompts_are_numbered_prompt_by_prompt(server, stream: bool) -> None:  # noqa: ANN001
    """Invariant: prompt k's choice i is index k * n + i and equals that prompt's single
    request (seeded choices: seed + i); usage sums every prompt and completion."""
    client = server.client()
    prompts = ["a lighthouse keeper", "a ship in a storm", "the message in the bottle"]
    kw = {"max_tokens": 5, "n": 2, "seed": 11, "temperature": 1.0}
    singles = [_complete(client, p, **kw) for p in prompts]
    if stream:
        chunks = list(_complete(client, prompts, stream=True, **kw))
        texts: dict[int, str] = {}
        for chunk in chunks:
            for c in chunk.choices:
                texts[c.index] = texts.get(c.index, "") + c.text
    else:
        together = _complete(client, prompts, **kw)
        assert [c.index for c in together.choices] == list(range(6))
        texts = {c.index: c.text for c in together.choices}
        assert together.usage.prompt_tokens == sum(s.usage.prompt_tokens for s in singles)
        assert together.usage.completion_tokens == 6 * 5
    for k, single in enumerate(singles):
        for i, choice in enumerate(single.choices):
            assert texts[k * 2 + i] == choice.text


def test_echo_and_the_legacy_logprobs_shape(server) -> None:  # noqa: ANN001
    """Invariant: echo prefixes the prompt's text; logprobs=k gives each token's logprob, a
    map of at most k + 1 alternatives holding the chosen one, and increasing offsets."""
    client = server.client()
    echoed = client.completions.create(
        model="test", prompt="Once upon a time", max_tokens=4, temperature=0, echo=True
    )
    plain = _complete(client, "Once upon a time", max_tokens=4, logprobs=3)
    assert echoed.choices[0].text == "Once upon a time" + plain.choices[0].text
    lp = plain.choices[0].logprobs
    assert len(lp.tokens) == len(lp.token_logprobs) == len(lp.top_logprobs) == 4
    for token, logprob, top in zip(lp.tokens, lp.token_logprobs, lp.top_logprobs, strict=True):
        assert top[token] == logprob and len(top) <= 4
        assert max(top.values()) == logprob  # greedy: the chosen token is the most likely
    assert lp.text_offset == sorted(lp.text_offset) and lp.text_offset[0] == 0


@pytest.mark.parametrize(
    ("fields", "param"),
    [
        ({"prompt": "x", "echo": True, "logprobs": 1}, "echo"),
        ({"prompt": "x", "best_of": 3}, "best_of"),
        ({"prompt": [10**6]}, "prompt"),
        ({"prompt": []}, "prompt"),
        ({"prompt": ["ok", 5]}, "prompt[1]"),
        ({"prompt": "x", "suffix": "y"}, "suffix"),
        ({"prompt": "x", "extra_body": {"min_p": 0.1}}, "min_p"),
        ({"prompt": "word " * 600}, "prompt"),
    ],
)
def test_mistakes_are_400s_naming_the_field(server, fields: dict, param: str) -> None:  # noqa: ANN001
    """Invariant: each mistake is a 400 whose error names the field at fault."""
    client = server.client()
    with pytest.raises(openai.BadRequestError) as refused:
        client.completions.create(model="test", max_tokens=2, **fields)
    assert refused.value.body["param"] == param, refused.value.body


def test_an_unknown_model_is_a_404(server) -> None:  # noqa: ANN001
    client = server.client()
    with pytest.raises(openai.NotFoundError):
        client.completions.create(model="nope", prompt="x", max_tokens=2)
