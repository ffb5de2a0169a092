"""Running the real coding-agent CLIs (Claude Code, Codex CLI) against a gateway.

The CLIs are the npm packages pinned in tests/clients/package.json, installed by `.ci/run`
(`npm ci`) into tests/clients/node_modules. Where they are missing the agent tests skip,
unless VISION_GATEWAY_REQUIRE_AGENTS=1 (as `.ci/run` sets it): then a missing CLI fails.

Each test gives the CLI a HOME of its own (no user settings, credentials or history; both
CLIs write the HOME's path into their prompts, so repeated runs share one) and a working
folder, is configured the documented way (docs/api.md, "Clients"), and talks to nothing but
the gateway: the CLIs' non-essential traffic (telemetry, update checks) is switched off.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from bench.server import LocalServer

HERE = Path(__file__).resolve().parent
BIN = Path(os.environ.get("VISION_GATEWAY_AGENTS_BIN", HERE / "node_modules" / ".bin"))
TIMEOUT_S = 600


def scripted_server(rules: list[dict[str, Any]], folder: Path, *args: str) -> LocalServer:
    """`serve` on `args` behind a ScriptedEngine with `rules` (tests/clients/scripted_engine.py;
    the rules file is written into `folder`). Use it as a context manager."""
    script = folder / "rules.json"
    script.write_text(json.dumps(rules))
    launcher = [str(HERE / "scripted_server.py"), str(script)]
    return LocalServer(list(args), launcher=launcher)


def agent(name: str) -> Path:
    """The CLI `name` (claude, codex); skips the test when it is not installed (fails under
    VISION_GATEWAY_REQUIRE_AGENTS=1)."""
    path = BIN / name
    if not path.exists():
        message = f"{name} is not installed: cd tests/clients && npm ci"
        if os.environ.get("VISION_GATEWAY_REQUIRE_AGENTS") == "1":
            pytest.fail(message)
        pytest.skip(message)
    return path


@dataclass(frozen=True)
class Run:
    """One finished CLI run: its exit status, output and the working folder it ran in."""

    returncode: int
    stdout: str
    stderr: str
    cwd: Path
    seconds: float

    def explain(self) -> str:
        return f"exit {self.returncode}\n--- stdout\n{self.stdout[-4000:]}\n--- stderr\n" + (
            self.stderr[-4000:]
        )


def _run(cmd: list[str], env: dict[str, str], cwd: Path) -> Run:
    start = time.monotonic()
    done = subprocess.run(
        cmd, env=env, cwd=cwd, capture_output=True, text=True, timeout=TIMEOUT_S,
        stdin=subprocess.DEVNULL,
    )  # fmt: skip
    return Run(done.returncode, done.stdout, done.stderr, cwd, time.monotonic() - start)


def refusals(log: str) -> list[str]:
    """The server log's access lines of requests answered with a 4xx."""
    return [line for line in log.splitlines() if re.search(r'HTTP/1\.1" 4\d\d', line)]


def _base_env(home: Path) -> dict[str, str]:
    keep = ("PATH", "LANG", "LC_ALL", "TMPDIR", "SSL_CERT_FILE")
    env = {k: v for k, v in os.environ.items() if k in keep}
    home.mkdir(parents=True, exist_ok=True)
    return {**env, "HOME": str(home), "NO_COLOR": "1"}


def claude(base_url: str, model: str, prompt: str, home: Path, cwd: Path, *flags: str) -> Run:
    """`claude -p PROMPT --output-format json` against the gateway's Anthropic API."""
    env = {
        **_base_env(home),
        "ANTHROPIC_BASE_URL": base_url,
        "ANTHROPIC_API_KEY": "sk-local",
        # Every model Claude Code may ask for (its main, background and subagent models, the
        # aliases haiku/sonnet/opus stand for) is the served model.
        "ANTHROPIC_MODEL": model,
        "ANTHROPIC_SMALL_FAST_MODEL": model,
        "ANTHROPIC_DEFAULT_HAIKU_MODEL": model,
        "ANTHROPIC_DEFAULT_SONNET_MODEL": model,
        "ANTHROPIC_DEFAULT_OPUS_MODEL": model,
        "CLAUDE_CODE_SUBAGENT_MODEL": model,
        "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1",
        "DISABLE_AUTOUPDATER": "1",
        # Claude Code refuses to skip permission prompts as root; the tests run as root in CI.
        "IS_SANDBOX": "1",
    }
    cmd = [str(agent("claude")), "-p", prompt, "--output-format", "json", *flags]
    return _run(cmd, env, cwd)


def claude_result(run: Run) -> dict[str, Any]:
    """The JSON object `claude -p --output-format json` prints last."""
    assert run.returncode == 0, run.explain()
    return json.loads(run.stdout.strip().splitlines()[-1])


CODEX_CONFIG = """\
model = "{model}"
model_provider = "gateway"

[model_providers.gateway]
name = "vision-gateway"
base_url = "{base_url}/v1"
wire_api = "responses"
env_key = "VISION_GATEWAY_API_KEY"
"""


def codex(base_url: str, model: str, prompt: str, home: Path, cwd: Path, *flags: str) -> Run:
    """`codex exec --json PROMPT` against the gateway's Responses API, configured by a
    `[model_providers]` entry in $HOME/.codex/config.toml."""
    config = home / ".codex" / "config.toml"
    config.parent.mkdir(parents=True, exist_ok=True)
    config.write_text(CODEX_CONFIG.format(model=model, base_url=base_url))
    env = {
        **_base_env(home),
        "VISION_GATEWAY_API_KEY": "sk-local",
        "CODEX_HOME": str(home / ".codex"),
    }
    cmd = [str(agent("codex")), "exec", "--json", "--skip-git-repo-check", *flags, prompt]
    return _run(cmd, env, cwd)


def codex_events(run: Run) -> list[dict[str, Any]]:
    """The JSON events `codex exec --json` printed, one a line."""
    assert run.returncode == 0, run.explain()
    return [json.loads(line) for line in run.stdout.splitlines() if line.startswith("{")]
