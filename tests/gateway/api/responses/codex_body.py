"""A `POST /v1/responses` body shaped as Codex CLI 0.171.0 sends its first request (captured
from the real client; texts shortened, every field and item kind kept): developer messages
with ids, the environment as a user message, function tools with `strict: false`, a
`namespace` of function tools, the built-in `web_search`, `reasoning: {summary: auto}`
without an effort, `store: false`, `include: ["reasoning.encrypted_content"]`,
`prompt_cache_key` and `client_metadata`.
"""

from __future__ import annotations

from typing import Any

SESSION = "01a24278-fc76-7613-837e-25e8d16b3105"
HEADERS = {
    "x-codex-beta-features": "remote_compaction_v2",
    "x-codex-window-id": f"{SESSION}:0",
    "x-client-request-id": SESSION,
    "session-id": SESSION,
    "thread-id": SESSION,
    "originator": "codex_exec",
    "accept": "text/event-stream",
    "accept-encoding": "zstd,gzip",
}
_STRING = {"type": "string"}


def _fn(name: str, description: str, properties: dict[str, Any], required: list[str]) -> dict:
    return {
        "type": "function",
        "name": name,
        "description": description,
        "strict": False,
        "parameters": {
            "type": "object",
            "properties": properties,
            "required": required,
            "additionalProperties": False,
        },
    }


def _message(role: str, text: str, key: str) -> dict[str, Any]:
    return {
        "type": "message",
        "id": f"msg_{SESSION[:-4]}{key}",
        "role": role,
        "content": [{"type": "input_text", "text": text}],
    }


def codex_body(question: str = "Say hello.", model: str = "test") -> dict[str, Any]:
    """The body; `question` is the user's prompt (the last message)."""
    exec_command = _fn(
        "exec_command",
        "Runs a command in a PTY, returning output or a session ID for ongoing interaction.",
        {
            "cmd": {**_STRING, "description": "Shell command to execute."},
            "workdir": {**_STRING, "description": "Optional working directory."},
            "yield_time_ms": {"type": "number", "description": "How long to wait (ms)."},
            "tty": {"type": "boolean", "description": "Whether to allocate a TTY."},
        },
        ["cmd"],
    )
    write_stdin = _fn(
        "write_stdin",
        "Writes characters to an existing unified exec session and returns recent output.",
        {"session_id": {"type": "number"}, "chars": _STRING},
        ["session_id"],
    )
    agents = {
        "type": "namespace",
        "name": "multi_agent_v1",
        "description": "Tools for spawning and managing sub-agents.",
        "tools": [
            _fn("spawn_agent", "Spawn a sub-agent for a well-scoped task.",
                {"message": _STRING, "fork_context": {"type": "boolean"}}, ["message"]),
            _fn("close_agent", "Close an agent and any open descendants.",
                {"target": {**_STRING, "description": "Agent id to close."}}, ["target"]),
        ],
    }  # fmt: skip
    goal = _fn("get_goal", "Get the current goal for this thread.", {}, [])
    developer = (
        "You are a coding agent running in the Codex CLI, a terminal-based coding assistant. "
        "You are expected to be precise, safe, and helpful.\n\n# How you work\n\n"
        "Before making tool calls, send a brief preamble to the user explaining what you are "
        "about to do. Keep going until the query is completely resolved.\n" * 4
    )
    return {
        "model": model,
        "stream": True,
        "input": [
            _message("developer", developer, "5e5e"),
            _message("developer", "<permissions instructions>\nread-only\n", "c301"),
            _message("user", "<environment_context>\n  <cwd>/tmp/w</cwd>\n  <shell>bash"
                     "</shell>\n</environment_context>", "4cfe"),
            _message("user", question, "924e"),
        ],  # fmt: skip
        "tools": [exec_command, write_stdin, agents, goal,
                  {"type": "web_search", "external_web_access": False}],  # fmt: skip
        "tool_choice": "auto",
        "parallel_tool_calls": True,
        "reasoning": {"summary": "auto"},
        "store": False,
        "include": ["reasoning.encrypted_content"],
        "prompt_cache_key": SESSION,
        "client_metadata": {"session_id": SESSION, "turn_id": SESSION, "thread_id": SESSION},
    }
