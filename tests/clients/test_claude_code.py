"""End to end: the real Claude Code CLI (pinned in tests/clients/package.json), unmodified and
configured the documented way (ANTHROPIC_BASE_URL, ANTHROPIC_MODEL), against the gateway's
Anthropic Messages API on the tiny qwen3 text model.

What it pins: Claude Code's own requests (a ~24k-token system prompt and tool list, streamed,
with `thinking`, `context_management`, `output_config`, mid-conversation system messages and
a 32000-token `max_tokens` ceiling) are served, not refused; a second run of the same prompt
reads at least 90% of its input from the prefix cache, as the CLI's own usage report says;
and a tool round trip: the model (scripted, tests/clients/scripted_engine.py) calls `Bash`,
Claude Code runs the command and sends the result back, and the run ends on the model's text.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest
from clients.agent_cli import claude, claude_result, refusals, scripted_server
from support import tiny_model

from bench.server import LocalServer

PROOF = "written by the tool round trip through the gateway"
CALL = {"name": "Bash", "arguments": {"command": f"echo '{PROOF}' > proof.txt",
                                      "description": "Write the proof file"}}  # fmt: skip
HELLO = "Hello from the tiny model."
RULES = [
    # The real model prefills (and caches) the prompt; the answer is short and fixed.
    {"last_turn_contains": "Say hello.", "prefill": True, "answer": HELLO},
    {"prompt_contains": '"name": "Bash"', "last_turn_contains": "Write the proof file",
     "last_turn_lacks": "<tool_response>",
     "answer": f"<tool_call>\n{json.dumps(CALL)}\n</tool_call>"},
    {"prompt_contains": '"name": "Bash"', "last_turn_contains": "<tool_response>",
     "answer": "The proof file is written."},
]  # fmt: skip


def _cached_share(result: dict) -> float:
    usage = result["usage"]
    read = usage.get("cache_read_input_tokens", 0)
    total = usage["input_tokens"] + read + usage.get("cache_creation_input_tokens", 0)
    return read / total


@pytest.fixture
def scripted(tmp_path: Path) -> Iterator[LocalServer]:
    args = ["--model", str(tiny_model("qwen3")), "--served-model-name", "qwen3", "--no-warmup"]
    with scripted_server(RULES, tmp_path, *args) as server:
        yield server


def test_claude_code_runs_twice_and_the_second_run_is_served_from_the_cache(
    scripted: LocalServer, tmp_path: Path
) -> None:
    """Invariant: Claude Code's requests are accepted (no 4xx), and the second run of the
    same prompt reads >= 90% of its input tokens from the prefix cache (the real engine
    prefills them; the answer is scripted, tests/clients/scripted_engine.py)."""
    work = tmp_path / "work"
    work.mkdir()
    runs = [
        claude(scripted.base_url, "qwen3", "Say hello.", tmp_path / "home", work)
        for _ in range(2)
    ]
    assert not refusals(scripted.log(500_000)), scripted.log()
    first, second = (claude_result(run) for run in runs)
    assert first["result"] == second["result"] == HELLO, runs
    assert first["usage"]["input_tokens"] + first["usage"].get("cache_read_input_tokens", 0) > 5000
    assert _cached_share(second) >= 0.9, second["usage"]
    print(f"claude -p: first run {runs[0].seconds:.1f} s, second {runs[1].seconds:.1f} s, "
          f"{_cached_share(second):.1%} of its input from the cache")


def test_claude_code_runs_the_bash_call_and_sends_the_result_back(
    scripted: LocalServer, tmp_path: Path
) -> None:
    """Invariant: a Bash tool call from the model (as tool_use blocks, streamed) is run by
    Claude Code, its tool_result goes back in the next request, and the run ends on the
    model's answer to it."""
    work = tmp_path / "work"
    work.mkdir()
    run = claude(scripted.base_url, "qwen3", "Write the proof file.", tmp_path / "home", work,
                 "--allowedTools", "Bash")  # fmt: skip
    result = claude_result(run)
    assert (work / "proof.txt").read_text().strip() == PROOF, run.explain()
    assert result["result"] == "The proof file is written.", result
    assert result["num_turns"] >= 2, result
