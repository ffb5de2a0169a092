"""End to end: Claude Code's own request through the real `anthropic` SDK (its beta Messages
API, as Claude Code calls it) against `vision-gateway serve` on the tiny Qwen3 (it thinks and
calls tools).

Pinned: the body Claude Code 2.1.332 sends (billing-metadata system block, cache_control,
tools with `defer_loading`, a `role: "system"` message last, metadata, adaptive thinking with
`display: "omitted"`, context_management, output_config.effort), streamed with its tools, is a
200 naming nothing as ignored; the omitted thinking comes as an empty thinking block whose
signature brings it back next turn; the final message_delta reports `context_management`; a
second request that differs only in the billing block's per-request `cch=` reads most of its
prompt from the cache. Plain: server tools and unknown fields are dropped and named in
x-ignored-fields; count_tokens reports the unedited length when edits cleared something.
"""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import anthropic
import httpx
import pytest
from support import ServerProcess

from gateway.api.anthropic.thinking import PREFIX

CAPTURED = json.loads((Path(__file__).parent / "claude_code_body.json").read_text())
BETAS = CAPTURED["anthropic-beta"].split(",")


@pytest.fixture(scope="module")
def server():
    proc = ServerProcess(
        "--no-warmup", "--kv-block-tokens", "8", "--max-context", "16384", arch="qwen3"
    )
    yield proc
    assert proc.stop(), proc.log()


def _client(server: ServerProcess) -> anthropic.Anthropic:
    return anthropic.Anthropic(base_url=server.base_url, api_key="x", max_retries=0, timeout=600)


def _body(cch: int) -> dict[str, Any]:
    """The captured body with a short answer (random weights) and this request's `cch=`."""
    body = copy.deepcopy(CAPTURED["body"])
    body["system"][0]["text"] = f"x-anthropic-billing-header: cc_version=2.1.332; cch={cch:05};"
    body["max_tokens"] = 24
    del body["stream"]
    return body


def _streamed(server: ServerProcess, body: dict[str, Any]) -> tuple[Any, httpx.Headers]:
    with _client(server).beta.messages.stream(**body, betas=BETAS) as stream:
        final = stream.get_final_message()
        return final, stream.response.headers


def test_claude_codes_request_streams_and_reads_its_prompt_from_the_cache(
    server: ServerProcess,
) -> None:
    """Invariant: see the module docstring (the streamed half)."""
    first, headers = _streamed(server, _body(1))
    assert "x-ignored-fields" not in headers
    assert first.context_management is not None and first.context_management.applied_edits == []
    for block in first.content:
        if block.type == "thinking":
            assert block.thinking == "" and block.signature.startswith(PREFIX)
    second, _ = _streamed(server, _body(2))
    usage = second.usage
    total = usage.input_tokens + (usage.cache_read_input_tokens or 0)
    assert first.usage.input_tokens + (first.usage.cache_read_input_tokens or 0) == total
    assert (usage.cache_read_input_tokens or 0) > 0.9 * total, usage


def test_dropped_fields_are_named_and_counts_report_the_unedited_prompt(
    server: ServerProcess,
) -> None:
    """Invariant: see the module docstring (the plain half)."""
    body = _body(3)
    body["tools"].append({"type": "web_search_20250305", "name": "web_search"})
    body["speculative_field"] = True
    response = httpx.post(f"{server.base_url}/v1/messages?beta=true", json=body, timeout=600)
    assert response.status_code == 200, response.text
    web = f"tools[{len(body['tools']) - 1}]"
    assert response.headers["x-ignored-fields"] == f"speculative_field, {web}"
    assert response.json()["context_management"] == {"applied_edits": []}
    use = {"type": "tool_use", "id": "toolu_1", "name": "Read", "input": {"file_path": "/a"}}
    thought = {"type": "thinking", "thinking": "t " * 200, "signature": ""}
    result = {"type": "tool_result", "tool_use_id": "toolu_1", "content": "text"}
    turn = [{"role": "user", "content": "go"}, {"role": "assistant", "content": [thought, use]},
            {"role": "user", "content": [result]}]  # fmt: skip
    edit = {"type": "clear_thinking_20251015", "keep": {"type": "thinking_turns", "value": 0}}
    count = {"model": "test", "messages": turn, "context_management": {"edits": [edit]}}
    counted = httpx.post(f"{server.base_url}/v1/messages/count_tokens", json=count, timeout=600)
    assert counted.status_code == 200, counted.text
    tokens = counted.json()
    # Qwen3's template keeps the thinking of a turn after the last question: clearing it
    # shortens the prompt
    assert tokens["context_management"]["original_input_tokens"] > tokens["input_tokens"] + 100
