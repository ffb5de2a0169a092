"""End to end: the request Codex CLI sends, through the real `openai` SDK's
`client.responses.create` against `vision-gateway serve` (tests/gateway/api/responses/
codex_body.py holds the body: developer messages with ids, a namespace of function tools,
web_search, `include: ["reasoning.encrypted_content"]`, `store: false`, a summary without
an effort, streamed, with Codex's headers and `accept-encoding: zstd,gzip`).

Pinned, on the tiny Qwen2-VL (a model that does not think): a 200 whose stream is plain
SSE (no content-encoding, whatever the client accepts), ends in a terminal event and holds
no reasoning item; `x-ignored-fields` names the web_search tool; the same request again reads
most of its prompt from the cache. On the tiny Qwen3 with a Thinking template: the reasoning
item carries an `encrypted_content` blob made with the key kept in the cache folder; sent
back as Codex sends it (summary and blob, no content) the thinking is in the next prompt
again (more prompt tokens than without it); a tampered blob is a 400 naming it. A
namespaced tool's call goes out as `function_call` with `namespace` and comes back under its
flat name.
"""

from __future__ import annotations

import base64
import json
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest
from support import LocalServer, ServerProcess, thinking_model

from gateway.api.responses.sealed import KEY_FILE
from tests.gateway.api.responses.codex_body import HEADERS, codex_body

LIMIT = 16  # Codex sends no max_output_tokens; the test bounds the random model's answer


@pytest.fixture(scope="module")
def plain():
    proc = ServerProcess("--no-warmup", "--kv-block-tokens", "8")
    yield proc
    assert proc.stop(), proc.log()


@pytest.fixture(scope="module")
def thinking(tmp_path_factory: pytest.TempPathFactory):
    folder = tmp_path_factory.mktemp("cache")
    args = ["--model", str(thinking_model()), "--served-model-name", "test", "--no-warmup"]
    proc = LocalServer([*args, "--kv-block-tokens", "8", "--cache-dir", str(folder)])
    proc.folder = folder  # type: ignore[attr-defined]
    yield proc
    assert proc.stop(), proc.log()


def _create(client: openai.OpenAI, body: dict[str, Any]) -> tuple[Any, list[Any]]:
    """One streamed create as Codex makes it: the raw HTTP response and the SDK's events."""
    sdk = {k: v for k, v in body.items() if k != "client_metadata"}
    sdk.setdefault("max_output_tokens", LIMIT)
    raw = client.responses.with_raw_response.create(
        **sdk, temperature=1.0, extra_headers=HEADERS,
        extra_body={"client_metadata": body["client_metadata"], "seed": 5},
    )  # fmt: skip
    return raw, list(raw.parse())


def test_codex_request_streams_and_its_repeat_reads_the_cache(plain: ServerProcess) -> None:
    client = plain.client()
    raw, events = _create(client, codex_body())
    assert raw.status_code == 200 and "content-encoding" not in raw.headers
    assert raw.headers["x-ignored-fields"] == "tools[4]"  # web_search
    assert events[0].type == "response.created"
    final = events[-1].response
    assert events[-1].type in ("response.completed", "response.incomplete"), events[-1]
    assert all(item.type != "reasoning" for item in final.output)
    assert final.store is False and final.reasoning.summary == "auto"
    _, again = _create(client, codex_body())
    usage = again[-1].response.usage
    assert usage.input_tokens == final.usage.input_tokens > 300
    assert usage.input_tokens_details.cached_tokens >= usage.input_tokens - 16


def test_the_stream_is_not_compressed_for_an_accept_encoding(plain: ServerProcess) -> None:
    """A client announcing zstd and gzip reads plain SSE frames off the wire."""
    body = {**codex_body(), "max_output_tokens": 4}
    headers = {**HEADERS, "authorization": "Bearer x"}
    with httpx.stream("POST", plain.base_url + "/v1/responses", json=body, headers=headers,
                      timeout=300) as response:  # fmt: skip
        assert response.status_code == 200 and "content-encoding" not in response.headers
        assert response.headers["content-type"].startswith("text/event-stream")
        first = next(response.iter_raw())
    assert first.startswith(b"event: response.created\n")


def _reasoning_round_trip(item: dict[str, Any], call_id: str) -> list[dict[str, Any]]:
    """The input of Codex's next request after the model thought, then called a tool:
    the reasoning item as Codex keeps it (no content, no id), the call and its output."""
    first = codex_body()["input"]
    call = {"type": "function_call", "call_id": call_id, "name": "exec_command",
            "arguments": json.dumps({"cmd": "echo hello"})}  # fmt: skip
    out = {"type": "function_call_output", "call_id": call_id, "output": "hello"}
    return [*first, item, call, out]


def test_encrypted_reasoning_round_trip(thinking: LocalServer) -> None:
    client = thinking.client()
    raw, events = _create(client, codex_body())
    assert raw.status_code == 200
    final = events[-1].response
    reasoning = next(item for item in final.output if item.type == "reasoning")
    thought = reasoning.content[0].text
    assert thought and reasoning.encrypted_content and thought not in reasoning.encrypted_content
    done = [e.item for e in events if e.type == "response.output_item.done"]
    assert done[0].encrypted_content == reasoning.encrypted_content
    assert (Path(thinking.folder) / KEY_FILE).stat().st_size == 32  # type: ignore[attr-defined]
    kept = {"type": "reasoning", "summary": [s.model_dump() for s in reasoning.summary],
            "encrypted_content": reasoning.encrypted_content}  # fmt: skip
    with_thought = {**codex_body(), "input": _reasoning_round_trip(kept, "call_1")}
    raw, events = _create(client, with_thought)
    assert raw.status_code == 200, events
    tokens = events[-1].response.usage.input_tokens
    bare = {**kept, "summary": [], "encrypted_content": None}
    without = {**codex_body(), "input": _reasoning_round_trip(bare, "call_1")}
    _, events = _create(client, without)
    assert tokens > events[-1].response.usage.input_tokens  # the thinking is in the prompt
    blob = bytearray(base64.b64decode(reasoning.encrypted_content))
    blob[-1] ^= 1
    tampered = {**kept, "encrypted_content": base64.b64encode(bytes(blob)).decode()}
    with pytest.raises(openai.BadRequestError) as info:
        _create(client, {**codex_body(), "input": _reasoning_round_trip(tampered, "call_1")})
    assert info.value.body["param"] == "input[4].encrypted_content"  # type: ignore[index]


def test_a_namespaced_call_goes_out_and_comes_back_as_codex_keeps_it(
    plain: ServerProcess,
) -> None:
    """A call of a namespaced tool (forced here: the random model rarely calls) is a
    `function_call` with `namespace` and the inner `name`, its arguments valid for the inner
    tool; sent back in the next request's input with its output, as Codex does with store
    false, it is read under the flat name (a 200, not an unknown-call 400)."""
    client = plain.client()
    body = codex_body()
    choice = {"type": "function", "name": "close_agent", "namespace": "multi_agent_v1"}
    raw, events = _create(client, {**body, "tool_choice": choice, "max_output_tokens": 120})
    assert raw.status_code == 200
    (call,) = [i for i in events[-1].response.output if i.type == "function_call"]
    assert (call.namespace, call.name) == ("multi_agent_v1", "close_agent")
    if call.status == "completed":  # the random model's string may run past the budget
        assert set(json.loads(call.arguments)) == {"target"}
    assert call.arguments.replace(" ", "").startswith('{"target":"')
    kept = {"type": "function_call", "call_id": call.call_id, "name": call.name,
            "namespace": call.namespace, "arguments": call.arguments}  # fmt: skip
    out = {"type": "function_call_output", "call_id": call.call_id, "output": "closed"}
    raw, events = _create(client, {**body, "input": [*body["input"], kept, out]})
    assert raw.status_code == 200 and events[-1].response.status in ("completed", "incomplete")
