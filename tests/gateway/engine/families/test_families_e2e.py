"""End to end, once per model family: `vision-gateway serve` on the family's tiny checkpoint
(two processes, the engine's own), through the `openai` and `anthropic` SDKs, the
playground in Chromium and `python -m bench repeat-image`.

Pinned, for each family of FAMILIES (one server each, module-scoped):
- /v1/models and /v1/cache/stats name the family, its `model_type` and media, and the caches'
  state (both on; a text model has no vision cache);
- Chat Completions answers with exactly the reference's logprobs over HTTP (mlx-vlm's own
  generate; mlx-lm's for a text model; tolerance zero) for the reference's prompt length;
  streamed == plain; a repeat is a prefix-cache hit with the same answer and logprobs;
- Anthropic Messages with a system prompt, plain and streamed, say the same;
- a Responses follow-up (`previous_response_id`) reads the first turn's whole blocks from
  the cache and answers as the whole conversation does with the caches cleared;
- a JSON-schema `response_format` constrains the answer;
- a media kind the family does not take is a 400 naming the part (OpenAI's shape, and
  Anthropic's for an image sent to a text model), and the server keeps serving;
- the playground shows "family: <family> · <model_type>" (skipped without Chromium);
- `bench repeat-image --base-url` runs against it (vision families: a smoke test of the
  bench, not a timing: the warm turn is a cache hit and the run completes).
What differs per family is its `Family` row (served.py): checkpoint, the image asked
about, serve flags, the exact-reuse block size, what it refuses, its caches' state.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import anthropic
import httpx
import openai
import pytest
from playwright.sync_api import Browser, expect
from reference import reference_generate
from support import ServerProcess, data_uri, tiny_model
from web_pages import NEEDS_CHROMIUM, WAIT_MS, Console, launch_browser, open_page

from tests.gateway.engine.families.served import (
    FAMILIES,
    QUESTION,
    Family,
    OneAhead,
    chat,
    png,
    refused_part,
)


@pytest.fixture(scope="module", params=FAMILIES, ids=lambda f: f.arch)
def fam(request: pytest.FixtureRequest) -> Family:
    return request.param


@pytest.fixture(scope="module")
def servers(request: pytest.FixtureRequest) -> Iterator[OneAhead]:
    """The families this run collected from this module, in collection order (a `-k`
    selection starts no other server)."""
    order: list[Family] = []
    for item in request.session.items:
        callspec = getattr(item, "callspec", None)
        if item.module is request.module and callspec and "fam" in callspec.params:
            if callspec.params["fam"] not in order:
                order.append(callspec.params["fam"])
    starter = OneAhead(order)
    yield starter
    starter.close()


@pytest.fixture(scope="module")
def server(fam: Family, servers: OneAhead) -> Iterator[ServerProcess]:
    proc = servers.take(fam)
    yield proc
    assert proc.stop(), proc.log()


@pytest.fixture(scope="module")
def client(server: ServerProcess) -> openai.OpenAI:
    return server.client()


def test_models_and_stats_name_the_family(fam: Family, server: ServerProcess) -> None:
    card = httpx.get(server.base_url + "/v1/models").json()["data"][0]
    assert (card["family"], card["model_type"], card["media"]) == (
        fam.family,
        fam.arch,
        list(fam.media),
    )
    family = httpx.get(server.base_url + "/v1/cache/stats").json()["family"]
    assert (family["family"], family["prefix_cache"], family["vision_cache"]) == (
        fam.family,
        "on",
        fam.vision_cache,
    )


def test_openai_answer_is_the_references_streamed_and_cached(
    fam: Family, client: openai.OpenAI
) -> None:
    """Invariant: over HTTP the greedy answer's logprobs are the reference's (tolerance
    zero) for the reference's prompt; streamed == plain; the repeat is a prefix-cache hit
    with the same answer and logprobs."""
    kw = {"model": "test", "messages": chat(fam), "max_tokens": 8, "temperature": 0}
    plain = client.chat.completions.create(**kw, logprobs=True)  # type: ignore[call-overload]
    images = [fam.image()] if fam.image else []
    parts = [{"type": "image"}] * len(images) + [{"type": "text", "text": QUESTION}]
    messages = [{"role": "user", "content": parts if images else QUESTION}]
    template = dict(fam.template)
    ref = reference_generate(tiny_model(fam.arch), messages, images, 8, template_kwargs=template)
    logprobs = [t.logprob for t in plain.choices[0].logprobs.content]
    assert logprobs == list(ref.logprobs)
    assert plain.usage.prompt_tokens == len(ref.prompt_ids)
    chunks = client.chat.completions.create(**kw, stream=True)  # type: ignore[call-overload]
    streamed = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert streamed == plain.choices[0].message.content
    again = client.chat.completions.create(**kw, logprobs=True)  # type: ignore[call-overload]
    assert again.choices[0].message.content == plain.choices[0].message.content
    assert [t.logprob for t in again.choices[0].logprobs.content] == logprobs
    assert again.usage.prompt_tokens_details.cached_tokens > 0


def test_anthropic_messages_plain_and_streamed(fam: Family, server: ServerProcess) -> None:
    """Invariant: a Messages request with a system prompt (the family's template renders
    Anthropic's `system` as a leading system message) answers greedily, the stream says
    the same."""
    claude = anthropic.Anthropic(base_url=server.base_url, api_key="x", max_retries=0)
    content: list[dict] = [{"type": "text", "text": QUESTION}]
    if fam.image:
        data = data_uri(png(fam.arch)).split(",")[1]
        source = {"type": "base64", "media_type": "image/png", "data": data}
        content.insert(0, {"type": "image", "source": source})
    kw = {
        "model": "test",
        "max_tokens": 6,
        "system": "Be brief.",
        "messages": [{"role": "user", "content": content}],
        "extra_body": {"temperature": 0},  # (Anthropic samples at 1.0 by default)
    }
    plain = claude.messages.create(**kw)  # type: ignore[arg-type]
    assert plain.usage.output_tokens == 6 and plain.stop_reason == "max_tokens"
    with claude.messages.stream(**kw) as stream:  # type: ignore[arg-type]
        streamed = "".join(stream.text_stream)
    assert streamed == "".join(b.text for b in plain.content if b.type == "text")


def test_responses_follow_up_reads_the_first_turns_kv(
    fam: Family, server: ServerProcess, client: openai.OpenAI
) -> None:
    """Invariant: turn 2 through `previous_response_id` reads the first turn's whole blocks
    from the cache and answers as the same conversation sent in full after the caches were
    cleared."""
    if fam.image:
        image = {"type": "input_image", "image_url": data_uri(png(fam.arch))}
        content: list[dict] = [image, {"type": "input_text", "text": QUESTION}]
    else:
        content = [{"type": "input_text", "text": QUESTION}]
    kw = {"model": "test", "temperature": 0, "max_output_tokens": 6}
    first = client.responses.create(input=[{"role": "user", "content": content}], **kw)  # type: ignore[arg-type]
    follow = "Tell me more."
    second = client.responses.create(input=follow, previous_response_id=first.id, **kw)  # type: ignore[arg-type]
    assert second.usage.input_tokens > first.usage.input_tokens
    # every whole block of the first prompt but its last token (never stored by some families)
    whole = (first.usage.input_tokens - 1) // fam.block * fam.block
    assert second.usage.input_tokens_details.cached_tokens >= whole > 0
    assert httpx.post(server.base_url + "/v1/cache/clear").status_code == 200
    history = [
        *chat(fam),
        {"role": "assistant", "content": first.output_text},
        {"role": "user", "content": follow},
    ]
    full = client.chat.completions.create(
        model="test", messages=history, max_tokens=6, temperature=0
    )
    assert full.usage.prompt_tokens_details.cached_tokens == 0
    assert full.choices[0].message.content == second.output_text


def _thinking_off(fam: Family) -> dict:
    """The request fields that turn a thinking template's thinking off (none for others)."""
    thinks = any(name == "enable_thinking" for name, _ in fam.template)
    return {"chat_template_kwargs": {"enable_thinking": False}} if thinks else {}


def test_structured_output(fam: Family, client: openai.OpenAI) -> None:
    schema = {
        "type": "object",
        "properties": {"round": {"type": "boolean"}},  # finite for a random-weight model
        "required": ["round"],
        "additionalProperties": False,
    }
    answer = client.chat.completions.create(  # type: ignore[call-overload]
        model="test",
        messages=chat(fam, "Is there a circle? Answer as JSON."),
        max_tokens=40,
        temperature=0,
        response_format={"type": "json_schema", "json_schema": {"name": "a", "schema": schema}},
        # A template that opens a thinking (qwen3_5's default) makes the grammar wait for its
        # end, which a random-weight model never writes: ask for the answer alone.
        extra_body=_thinking_off(fam),
    )
    assert answer.choices[0].finish_reason == "stop"
    parsed = json.loads(answer.choices[0].message.content or "")
    assert set(parsed) == {"round"} and isinstance(parsed["round"], bool)


def test_a_media_kind_it_does_not_take_is_a_400_naming_the_part(
    fam: Family, server: ServerProcess
) -> None:
    """Invariant: a part of a kind the family does not take (video for the vision families,
    images for a text model) is refused before the engine with a 400 naming the part, in
    OpenAI's error shape (and Anthropic's for an image), and the server keeps serving."""
    content = [{"type": "text", "text": "What is this?"}, refused_part(fam.refuses)]
    body = {"model": "test", "max_tokens": 4, "messages": [{"role": "user", "content": content}]}
    r = httpx.post(server.base_url + "/v1/chat/completions", json=body, timeout=60)
    assert r.status_code == 400, r.text
    error = r.json()["error"]
    field = "image_url" if fam.refuses == "image" else "video_url"
    assert error["param"] == f"messages[0].content[1].{field}.url"
    assert f"does not take {fam.refuses} input" in error["message"]
    assert error["code"] == f"unsupported_{fam.refuses}"  # a video is not called an image
    if fam.refuses == "video":  # the family reads images: the message says so
        assert "send images or text" in error["message"]
    claude = anthropic.Anthropic(base_url=server.base_url, api_key="x", max_retries=0)
    if fam.refuses == "image":  # (Anthropic's Messages carry no video)
        data = data_uri(png("gemma3")).split(",")[1]
        source = {"type": "base64", "media_type": "image/png", "data": data}
        parts = [{"type": "text", "text": "What?"}, {"type": "image", "source": source}]
        with pytest.raises(anthropic.BadRequestError) as err:
            claude.messages.create(
                model="test", max_tokens=4, messages=[{"role": "user", "content": parts}]
            )
        assert err.value.body["error"]["type"] == "invalid_request_error"  # type: ignore[index]
        assert "messages[0].content[1]" in err.value.body["error"]["message"]  # type: ignore[index]
    answer = claude.messages.create(
        model="test", max_tokens=4, messages=[{"role": "user", "content": "Still there?"}]
    )
    assert answer.usage.output_tokens > 0


@pytest.fixture(scope="module")
def browser() -> Iterator[Browser]:
    """One headless Chromium for every family's playground check."""
    yield from launch_browser()


@NEEDS_CHROMIUM
def test_the_playground_shows_the_family(
    fam: Family, server: ServerProcess, browser: Browser
) -> None:
    """Invariant: the playground's model line names the family and `model_type` that
    /v1/models reports (the page's own script reads them)."""
    console = Console()
    page = open_page(browser, console)
    page.goto(server.base_url + "/")
    expect(page.get_by_test_id("model-family")).to_have_text(
        f"family: {fam.family} · {fam.arch}", timeout=WAIT_MS
    )
    expect(page.get_by_test_id("model-name")).to_have_text("test", timeout=WAIT_MS)
    page.context.close()
    assert console.besides_http_errors() == []


def test_bench_repeat_image_runs_against_it(
    fam: Family, server: ServerProcess, tmp_path: Path
) -> None:
    """Invariant: `python -m bench repeat-image --base-url` completes one 5-turn conversation
    about a 56 px image (224 px where blocks are 64 tokens) against the family (warm turns
    are cache hits; a smoke test of the bench on the family, not a timing)."""
    if fam.image is None:
        pytest.skip("repeat-image asks about images; a text model takes none")
    from bench.cli import main

    out = tmp_path / "repeat.json"
    argv = ["repeat-image", "--base-url", server.base_url, "--model", "test"]
    size = "56" if fam.block < 64 else "224"  # a prompt of at least one whole block
    main([*argv, "--images", "1", "--image-size", size, "--max-tokens", "4", "--out", str(out)])
    data = json.loads(out.read_text())
    result = data["results"]["as served"]
    assert [len(result["ttft_ms"][str(turn)]) for turn in range(1, 6)] == [1] * 5
    assert result["cached_tokens"]["2"][0] > 0
    assert data["mismatches"] == {} and data["backend"]["ours"] is True
