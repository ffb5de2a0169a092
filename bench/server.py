"""A `vision-gateway serve` subprocess on 127.0.0.1, for benchmarks and end-to-end tests."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import httpx


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def memory_only_unless_asked(args: Sequence[str]) -> list[str]:
    """`serve` flags with the disk tier off (`--no-disk-cache`) unless they name a
    `--cache-dir` (or already turn it off)."""
    if "--cache-dir" in args or "--no-disk-cache" in args:
        return list(args)
    return [*args, "--no-disk-cache"]


class LocalServer:
    """Starts the server (`vision-gateway <command>`, `serve` or `cluster`) with `args`, waits
    for /health, stops it with SIGTERM.

    The log goes to a file (`log()` returns its tail) so a failing start explains itself.
    Benchmarks and tests measure the memory caches from a cold start: unless `args` name a
    `--cache-dir`, the disk tier is off (`--no-disk-cache`), so files left by an earlier run
    never turn a cold request into a disk hit.
    """

    def __init__(
        self,
        args: Sequence[str],
        ready_timeout_s: float = 300.0,
        command: str = "serve",
        launcher: Sequence[str] = (),
    ) -> None:
        self.port = free_port()
        self.base_url = f"http://127.0.0.1:{self.port}"
        fd, log_name = tempfile.mkstemp(prefix=f"vision-gateway-{self.port}-", suffix=".log")
        os.close(fd)
        self.log_path = Path(log_name)
        self._log = open(self.log_path, "wb")  # noqa: SIM115 - closed in stop()
        args = memory_only_unless_asked(args)
        # `launcher`: a script (and its own arguments) taking serve's flags instead of
        # `python -m gateway COMMAND` (tests/clients/scripted_server.py)
        head = list(launcher) or ["-m", "gateway", command]
        cmd = [sys.executable, *head, "--port", str(self.port), *args]
        env = dict(os.environ, PYTHONUNBUFFERED="1")
        self.proc = subprocess.Popen(cmd, stdout=self._log, stderr=subprocess.STDOUT, env=env)
        self._wait_ready(ready_timeout_s)

    def _wait_ready(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"server exited early:\n{self.log()}")
            try:
                if httpx.get(self.base_url + "/health", timeout=1.0).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.2)
        self.stop()
        raise RuntimeError(f"server did not become ready:\n{self.log()}")

    def log(self, chars: int = 5000) -> str:
        return self.log_path.read_text(errors="replace")[-chars:]

    def client(self, **kwargs: Any) -> Any:
        from openai import OpenAI

        kwargs.setdefault("api_key", "unused")
        return OpenAI(base_url=self.base_url + "/v1", max_retries=0, timeout=300, **kwargs)

    def metrics(self, headers: dict[str, str] | None = None) -> dict[str, float]:
        """Prometheus samples by name (labels kept in the name)."""
        out: dict[str, float] = {}
        text = httpx.get(self.base_url + "/metrics", timeout=10, headers=headers).text
        for line in text.splitlines():
            if line and not line.startswith("#"):
                name, _, value = line.rpartition(" ")
                out[name] = float(value)
        return out

    def pid_rss_bytes(self) -> int:
        """Resident memory of the server and all its descendants (the engine runs in a child
        process by default), summed (Linux /proc; 0 elsewhere)."""
        return sum(_rss_bytes(pid) for pid in _process_tree(self.proc.pid))

    def stop(self, timeout: float = 60.0) -> bool:
        """SIGTERM and wait. True when the server shut down cleanly: it drained ('Application
        shutdown complete') and exited 0, as `serve` does on SIGTERM and SIGINT."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)
        self._log.close()
        clean = "Application shutdown complete" in self.log(20000)
        return self.proc.returncode == 0 and clean

    def __enter__(self) -> LocalServer:
        return self

    def __exit__(self, *_: object) -> None:
        self.stop()


def _process_tree(root: int) -> list[int]:
    """`root` and its live descendants, from /proc/<pid>/task/<tid>/children (Linux)."""
    found, todo = [], [root]
    while todo:
        pid = todo.pop()
        found.append(pid)
        for children in Path(f"/proc/{pid}/task").glob("*/children"):
            try:
                todo.extend(int(c) for c in children.read_text().split())
            except (OSError, ValueError):
                pass
    return found


def _rss_bytes(pid: int) -> int:
    try:
        fields = Path(f"/proc/{pid}/statm").read_text().split()
        return int(fields[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError):
        return 0
