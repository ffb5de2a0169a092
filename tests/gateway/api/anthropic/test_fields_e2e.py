"""End to end through the real `anthropic` SDK: every Messages field the server accepts is
applied, plain and streamed, and one it cannot apply is refused.

Pinned: top_k=1 and a tiny top_p turn a temperature-1 request into the greedy answer (so
both are applied); `system` and `stop_sequences` change the answer; `metadata`,
`service_tier` and a top-level `cache_control` are accepted and change nothing; each answer
streams to the same text; hints (adaptive thinking, an effort, `speed`) are accepted on a
model that does not think, an unknown field is named, `mcp_servers` is a 400 naming it.
"""

from __future__ import annotations

import anthropic
import pytest
from support import ServerProcess

QUESTION = [{"role": "user", "content": "Tell me about the sea."}]


@pytest.fixture(scope="module")
def server():
    proc = ServerProcess("--no-warmup")
    yield proc
    assert proc.stop(), proc.log()


def _both(client: anthropic.Anthropic, extra: dict, **kw: object) -> str:
    """The plain answer's text, checked equal to the streamed one."""
    kw.setdefault("max_tokens", 12)
    plain = client.messages.create(model="test", messages=QUESTION, extra_body=extra, **kw)  # type: ignore[arg-type]
    with client.messages.stream(
        model="test",
        messages=QUESTION,  # type: ignore[arg-type]
        extra_body=extra,
        **kw,  # type: ignore[arg-type]
    ) as stream:
        streamed = "".join(stream.text_stream)
    assert streamed == plain.content[0].text
    return streamed


def test_every_accepted_field_is_applied_plain_and_streamed(server: ServerProcess) -> None:
    """Invariant: see the module docstring."""
    client = anthropic.Anthropic(base_url=server.base_url, api_key="x", max_retries=0)
    greedy = _both(client, {"temperature": 0})
    assert _both(client, {"temperature": 1.0, "top_k": 1}) == greedy
    assert _both(client, {"temperature": 1.0, "top_p": 1e-9}) == greedy
    assert _both(client, {"temperature": 0}, system="You are a pirate.") != greedy
    stop = greedy[3:6]
    stopped = _both(client, {"temperature": 0}, stop_sequences=[stop])
    assert stopped == greedy[: greedy.index(stop)]
    same = _both(
        client,
        {"temperature": 0, "cache_control": {"type": "ephemeral"}},
        metadata={"user_id": "u1"},
        service_tier="auto",
    )
    assert same == greedy


def test_hints_are_accepted_and_what_cannot_be_done_is_refused(server: ServerProcess) -> None:
    """Invariant: on this model, which does not think, adaptive thinking and an effort are
    no thinking (the greedy answer, a 200); an unknown field is named in x-ignored-fields;
    `mcp_servers` (the model would lack their tools) is a 400 naming the field."""
    client = anthropic.Anthropic(base_url=server.base_url, api_key="x", max_retries=0)
    greedy = _both(client, {"temperature": 0})
    hinted = {"temperature": 0, "output_config": {"effort": "high"}, "speed": "fast"}
    assert _both(client, hinted, thinking={"type": "adaptive", "display": "omitted"}) == greedy
    raw = client.messages.with_raw_response.create(
        model="test",
        max_tokens=4,
        messages=QUESTION,  # type: ignore[arg-type]
        extra_body={"temperature": 0, "not_a_field": 1},
    )
    assert raw.headers["x-ignored-fields"] == "not_a_field"
    with pytest.raises(anthropic.BadRequestError) as info:
        client.messages.create(
            model="test",
            max_tokens=4,
            messages=QUESTION,  # type: ignore[arg-type]
            extra_body={"mcp_servers": [{"type": "url", "url": "https://x.test", "name": "x"}]},
        )
    assert "mcp_servers" in info.value.message
