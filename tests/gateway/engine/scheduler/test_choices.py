"""n > 1 choices: one prefill, n decode rows (tiny model, CPU).

Pinned here: choice i of a seeded request is, token for token and logprob for logprob, the
answer of a single request seeded seed + i (alone, and beside other rows); greedy choices
are the greedy answer (hybrid models too: their states are copied per choice); the prompt is
prefilled once however many choices; every choice ends with its own FinishEvent and only the
last is final; cancelling the request cancels every choice and frees all its rows; a request
for more choices than rows is refused.
"""

from __future__ import annotations

import pytest
from support import EngineHarness, chat_body, noise_image

from gateway.api.openai.parse import parse_chat_request
from gateway.config import CacheConfig
from gateway.engine.request import FinishEvent, SamplingParams
from gateway.engine.scheduler.prefill import Prefiller

NO_CACHE = CacheConfig(vision_enabled=False, prefix_enabled=False)


@pytest.fixture(scope="module")
def harness():
    h = EngineHarness("qwen2_vl", cache=NO_CACHE, max_batch=6, prefill_chunk_tokens=16)
    yield h
    h.close()


def _finishes(run) -> list[FinishEvent]:  # noqa: ANN001
    return [e for e in run.events if isinstance(e, FinishEvent)]


def test_seeded_choices_are_the_singles_with_seed_plus_index(harness: EngineHarness) -> None:
    """Invariant: choice i draws what a request seeded seed + i draws alone, also with an
    image prompt and another request decoding beside them."""
    for question, images in (("tell me a story", []), ("what is it?", [noise_image(7)])):
        body = chat_body(question, images=len(images), max_tokens=8, temperature=1.0)
        singles = [harness.run(dict(body, seed=11 + i), images) for i in range(3)]
        other = harness.submit(chat_body("background", max_tokens=30))
        run = harness.run(dict(body, seed=11, n=3), images)
        other.wait()
        for i, single in enumerate(singles):
            tokens, logprobs = run.choice(i)
            assert tokens == single.token_ids, (question, i)
            assert logprobs == pytest.approx(single.logprobs, abs=1e-4)
        assert len({tuple(run.choice(i)[0]) for i in range(3)}) == 3


def test_greedy_choices_are_the_greedy_answer(harness: EngineHarness) -> None:
    """Invariant: without sampling every choice is the one greedy answer."""
    single = harness.run(chat_body("hello there", max_tokens=7))
    run = harness.run(chat_body("hello there", max_tokens=7, n=4))
    for i in range(4):
        assert run.choice(i)[0] == single.token_ids


@pytest.mark.parametrize("arch", ["qwen3_5", "lfm2_vl"])
def test_hybrid_models_fork_their_states(arch: str) -> None:
    """Invariant: a hybrid model's choices each start from a copy of the prompt's recurrent
    or convolution states (`RowStateCache.snapshot`): greedy choices are the greedy answer,
    ids and logprobs."""
    h = EngineHarness(arch, cache=NO_CACHE, max_batch=4)
    try:
        single = h.run(chat_body("hello there", max_tokens=5))
        run = h.run(chat_body("hello there", max_tokens=5, n=3))
        for i in range(3):
            assert run.choice(i) == (single.token_ids, single.logprobs), i
    finally:
        h.close()


def test_the_prompt_is_prefilled_once(
    harness: EngineHarness, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Invariant: a request for 5 choices feeds its prompt as often as one for 1 choice."""
    fed: list[str] = []
    original = Prefiller.feed

    def counted(self, job, budget):  # noqa: ANN001, ANN202
        fed.append(job.request_id)
        return original(self, job, budget)

    monkeypatch.setattr(Prefiller, "feed", counted)
    question = " ".join(f"w{i}" for i in range(60))
    harness.run(chat_body(question, max_tokens=3))
    once = len(fed)
    fed.clear()
    harness.run(chat_body(question, max_tokens=3, n=5, temperature=1.0))
    assert len(fed) == once > 0


def test_each_choice_ends_and_only_the_last_is_final(harness: EngineHarness) -> None:
    """Invariant: n FinishEvents, one per index, the last final; usage counts the prompt in
    each and that choice's own tokens."""
    run = harness.run(chat_body("tell me", max_tokens=6, n=3, temperature=1.0, seed=4))
    ends = _finishes(run)
    assert sorted(e.index for e in ends) == [0, 1, 2]
    assert [e.final for e in ends] == [False, False, True]
    for end in ends:
        assert end.usage.completion_tokens == len(run.choice(end.index)[0])
        assert end.usage.prompt_tokens == ends[0].usage.prompt_tokens
    assert harness.engine.running == 0


def test_cancel_ends_every_choice_and_frees_the_rows(harness: EngineHarness) -> None:
    """Invariant: cancelling the request cancels all its choices (each gets its end, the
    last final) and gives back all n rows."""
    run = harness.submit(chat_body("count forever", max_tokens=400, n=4, temperature=1.0))
    run.wait_tokens(8)
    harness.engine.cancel(f"req-{harness._ids}")
    run.wait()
    ends = _finishes(run)
    assert sorted(e.index for e in ends) == [0, 1, 2, 3]
    assert all(e.finish_reason == "cancelled" for e in ends) and ends[-1].final
    assert len(run.token_ids) < 4 * 400
    assert harness.run(chat_body("still serving?", max_tokens=3)).finish.finish_reason
    assert harness.engine.running == 0


def test_choices_wait_for_all_their_rows(harness: EngineHarness) -> None:
    """Invariant: a request takes its n rows at once: beside 4 busy rows of 6, a request for
    3 choices waits until rows free, then answers in full."""
    busy = harness.submit(chat_body("busy", max_tokens=40, n=4, temperature=1.0))
    busy.wait_tokens(4)
    assert harness.engine.running == 4
    later = harness.submit(chat_body("later", max_tokens=5, n=3, temperature=1.0, seed=2))
    assert later.wait().choice(2)[0] and busy.wait()
    assert len(_finishes(later)) == 3
    assert harness.engine.running == 0


def test_more_choices_than_rows_is_refused(harness: EngineHarness) -> None:
    """Invariant: the engine refuses n above its rows (the HTTP edge answers 400 first)."""
    request = harness.prompts.build(parse_chat_request(chat_body("hi", n=7)), [], "too-many", 0.0)
    assert request.sampling == SamplingParams(8, temperature=0.0, logprobs=True, n=7)
    with pytest.raises(ValueError, match="max_batch"):
        harness.engine.submit(request, lambda event: None)


def test_structured_choices_each_follow_their_own_grammar(harness: EngineHarness) -> None:
    """Invariant: under a json_schema each choice has its own grammar matcher: every choice
    is valid JSON of the schema, and choice i is the single constrained answer seeded 21 + i
    (a shared matcher would fail or cross the answers)."""
    import json

    schema = {
        "type": "object",
        "properties": {"name": {"type": "string", "maxLength": 8}, "n": {"enum": [1, 2, 3]}},
        "required": ["name", "n"],
        "additionalProperties": False,
    }
    fmt = {"type": "json_schema", "json_schema": {"name": "s", "schema": schema, "strict": True}}
    body = chat_body("a record", max_tokens=60, temperature=1.0, response_format=fmt)
    singles = [harness.run(dict(body, seed=21 + i)) for i in range(3)]
    run = harness.run(dict(body, seed=21, n=3))
    ends = {e.index: e for e in _finishes(run)}
    for i, single in enumerate(singles):
        tokens, _ = run.choice(i)
        assert tokens == single.token_ids
        assert ends[i].finish_reason == "stop"
        text = "".join(
            e.text for e in run.events if getattr(e, "index", None) == i and hasattr(e, "text")
        )
        assert json.loads(text) == json.loads(single.text)
