"""End to end: the real Codex CLI (pinned in tests/clients/package.json), unmodified and
configured the documented way (a `[model_providers]` entry with `wire_api = "responses"`),
against the gateway's Responses API on the tiny qwen3 text model.

What it pins: Codex's own requests (developer messages, `namespace` and built-in tools,
`include: ["reasoning.encrypted_content"]`, `store: false`, `reasoning.summary`,
`prompt_cache_key`, `client_metadata`, streamed) are served, not refused; a second run of the
same prompt reads at least 90% of its input from the prefix cache, as the CLI's own usage
events say; and a tool round trip: the model (scripted, tests/clients/scripted_engine.py)
calls `exec_command`, Codex runs it and sends the output back, and the run ends on the
model's text.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest
from clients.agent_cli import codex, codex_events, refusals, scripted_server
from support import tiny_model

from bench.server import LocalServer

PROOF = "written by the tool round trip through the gateway"
CALL = {"name": "exec_command", "arguments": {"cmd": f"echo '{PROOF}' > proof.txt"}}
HELLO = "Hello from the tiny model."
RULES = [
    # The real model prefills (and caches) the prompt; the answer is short and fixed.
    {"last_turn_contains": "Say hello.", "prefill": True, "answer": HELLO},
    {"prompt_contains": '"name": "exec_command"', "last_turn_contains": "Write the proof file",
     "last_turn_lacks": "<tool_response>",
     "answer": f"<tool_call>\n{json.dumps(CALL)}\n</tool_call>"},
    {"prompt_contains": '"name": "exec_command"', "last_turn_contains": "<tool_response>",
     "answer": "The proof file is written."},
]  # fmt: skip
# The sandbox (bubblewrap) needs namespaces a CI container may not grant; the test's own
# temporary folder is the whole workspace.
UNSANDBOXED = "--dangerously-bypass-approvals-and-sandbox"


def _usage(events: list[dict]) -> dict:
    done = [e for e in events if e.get("type") == "turn.completed"]
    assert done, events
    return done[-1]["usage"]


@pytest.fixture
def scripted(tmp_path: Path) -> Iterator[LocalServer]:
    args = ["--model", str(tiny_model("qwen3")), "--served-model-name", "qwen3", "--no-warmup"]
    with scripted_server(RULES, tmp_path, *args) as server:
        yield server


def test_codex_runs_twice_and_the_second_run_is_served_from_the_cache(
    scripted: LocalServer, tmp_path: Path
) -> None:
    """Invariant: Codex's requests are accepted (no 4xx), and the second run of the same
    prompt reads >= 90% of its input tokens from the prefix cache (the real engine prefills
    them; the answer is scripted, tests/clients/scripted_engine.py)."""
    work = tmp_path / "work"
    work.mkdir()
    home = tmp_path / "home"
    runs = [codex(scripted.base_url, "qwen3", "Say hello.", home, work, UNSANDBOXED)
            for _ in range(2)]  # fmt: skip
    assert not refusals(scripted.log(500_000)), scripted.log()
    first, second = (_usage(codex_events(run)) for run in runs)
    assert first["input_tokens"] > 3000, first
    assert second["cached_input_tokens"] >= 0.9 * second["input_tokens"], second
    print(f"codex exec: first run {runs[0].seconds:.1f} s, second {runs[1].seconds:.1f} s, "
          f"{second['cached_input_tokens'] / second['input_tokens']:.1%} of its input cached")


def test_codex_runs_the_exec_command_call_and_sends_the_output_back(
    scripted: LocalServer, tmp_path: Path
) -> None:
    """Invariant: an exec_command call from the model (a function_call item, streamed) is run
    by Codex, its function_call_output goes back in the next request, and the run ends on the
    model's answer to it."""
    work = tmp_path / "work"
    work.mkdir()
    run = codex(scripted.base_url, "qwen3", "Write the proof file.", tmp_path / "home", work,
                UNSANDBOXED)  # fmt: skip
    events = codex_events(run)
    assert (work / "proof.txt").read_text().strip() == PROOF, run.explain()
    messages = [e["item"]["text"] for e in events
                if e.get("type") == "item.completed" and e["item"].get("type") == "agent_message"]
    assert messages[-1] == "The proof file is written.", events
