"""`vision-gateway serve` as a process: a busy port fails at once, before the model loads, and
Ctrl-C (SIGINT to the process group) or SIGTERM drains and exits 0 without a traceback, on
both event loops; a second Ctrl-C during the drain forces a prompt exit, still without a
traceback, and tells the interrupted client that the shutdown was forced; Ctrl-C while the
model loads stops the load and exits 0.

Real signals to a real `python -m gateway serve` subprocess on 127.0.0.1 (the tiny model, no
warm-up); each server runs in its own session so that its process group is the server and
its engine child only.
"""

from __future__ import annotations

import importlib.util
import os
import signal
import socket
import subprocess
import sys
import threading
import time

import httpx
import pytest
from support import tiny_model

from bench.server import free_port
from gateway.config import ConfigError, ServerConfig
from gateway.server import bind_socket

LOOPS = ["asyncio"] + (["uvloop"] if importlib.util.find_spec("uvloop") else [])


def _start(port: int, *flags: str) -> subprocess.Popen:
    cmd = [sys.executable, "-m", "gateway", "serve", "--model", str(tiny_model())]
    cmd += ["--port", str(port), "--no-warmup", "--no-disk-cache", *flags]
    return subprocess.Popen(
        cmd,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,  # its own process group: the server and its engine child
        env=dict(os.environ, PYTHONUNBUFFERED="1"),
    )


def _wait_ready(proc: subprocess.Popen, port: int, timeout: float = 180.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and proc.poll() is None:
        try:
            if httpx.get(f"http://127.0.0.1:{port}/health", timeout=1.0).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.2)
    os.killpg(proc.pid, signal.SIGKILL)
    pytest.fail(f"server not ready:\n{proc.communicate()[1][-3000:]}")


def _finish(proc: subprocess.Popen, timeout: float) -> str:
    """The process's stderr once it exits (killed, and the test failed, after `timeout`)."""
    try:
        return proc.communicate(timeout=timeout)[1]
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        pytest.fail(f"still running {timeout} s on:\n{proc.communicate()[1][-3000:]}")


@pytest.mark.parametrize("loop", LOOPS)
@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
def test_a_signal_to_the_process_group_drains_and_exits_0(sig: int, loop: str) -> None:
    """Invariant: Ctrl-C in a terminal (SIGINT to the server and its engine child) and SIGTERM
    shut down gracefully and exit 0, with no traceback (it used to die of the re-raised signal:
    a KeyboardInterrupt traceback and status 130, and at times SIGABRT under uvloop)."""
    port = free_port()
    proc = _start(port, "--loop", loop)
    _wait_ready(proc, port)
    os.killpg(proc.pid, sig)
    err = _finish(proc, 60)
    assert proc.returncode == 0, err[-3000:]
    assert "Traceback" not in err and "terminate called" not in err, err[-3000:]
    assert "Application shutdown complete" in err, err[-3000:]


def test_ctrl_c_while_the_model_loads_exits_0_and_stops_the_load() -> None:
    """Invariant: Ctrl-C (SIGINT to the process group) while the model loads stops the load
    (the engine process too) and exits 0 without serving and without a traceback (it was a
    KeyboardInterrupt traceback in the engine process, then 'failed to load: EOFError' and
    status 3)."""
    port = free_port()
    proc = _start(port)
    assert proc.stderr is not None
    seen = []
    for line in proc.stderr:  # until the load has begun (the engine process is spawned)
        seen.append(line)
        if "loading model" in line:
            break
    time.sleep(0.3)  # the engine process is importing
    os.killpg(proc.pid, signal.SIGINT)
    err = "".join(seen) + _finish(proc, 60)
    assert proc.returncode == 0, err[-3000:]
    assert "Traceback" not in err and "failed to load" not in err, err[-3000:]
    assert "not serving" in err and "Uvicorn running" not in err, err[-3000:]
    deadline = time.monotonic() + 10  # the engine process is gone too (once it has died)
    while _live_in_group(proc.pid) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert _live_in_group(proc.pid) == []


def _live_in_group(pgid: int) -> list[int]:
    """Processes of process group `pgid` that are not zombies (a killed engine process is one
    until init reaps it)."""
    live = []
    for entry in os.listdir("/proc"):
        try:
            with open(f"/proc/{entry}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except (OSError, IndexError):  # not a process, or gone meanwhile
            continue
        if int(fields[2]) == pgid and fields[0] != "Z":  # fields: state, ppid, pgrp, ...
            live.append(int(entry))
    return live


@pytest.mark.parametrize("loop", LOOPS)
def test_a_second_ctrl_c_forces_the_shutdown_without_a_traceback(loop: str) -> None:
    """Invariant: a second Ctrl-C while a long stream keeps the drain waiting (the default 30 s
    grace) exits at once, 0, without a traceback, and the stream's client (the openai SDK) gets
    an error saying the shutdown was forced (was: a CancelledError traceback from the app's
    cancelled lifespan, and the client told the 30 s grace was over after 1 s)."""
    import openai

    port = free_port()
    proc = _start(port, "--loop", loop)
    _wait_ready(proc, port)
    client = openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="-", max_retries=0)
    chunks, errors = [], []

    def read() -> None:
        try:
            for chunk in client.chat.completions.create(
                model=tiny_model().name, messages=[{"role": "user", "content": "a long story"}],
                max_tokens=20_000, temperature=0, stream=True,
            ):  # fmt: skip
                chunks.append(chunk)
        except openai.APIError as exc:
            errors.append(exc.message)

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    try:
        deadline = time.monotonic() + 60
        while len(chunks) < 3 and reader.is_alive() and time.monotonic() < deadline:
            time.sleep(0.01)
        assert len(chunks) >= 3, errors
        os.killpg(proc.pid, signal.SIGINT)
        time.sleep(1.0)
        assert proc.poll() is None, "the first Ctrl-C did not wait for the running stream"
        os.killpg(proc.pid, signal.SIGINT)
        forced = time.monotonic()
        err = _finish(proc, 30)
    finally:  # a failed test leaves no server behind
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.communicate()
    assert time.monotonic() - forced < 5, err[-3000:]
    assert proc.returncode == 0, err[-3000:]
    assert "Traceback" not in err and "terminate called" not in err, err[-3000:]
    assert "Application shutdown complete" in err, err[-3000:]  # the app's own shutdown ran
    reader.join(10)
    assert len(errors) == 1 and "shutdown was forced" in errors[0], errors
    assert "grace" not in errors[0], errors


def test_a_busy_port_fails_before_the_model_loads() -> None:
    """Invariant: a --port another process listens on is reported in one line, with a non-zero
    exit, before anything is loaded (it used to come after the model load and warm-up)."""
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        started = time.monotonic()
        proc = _start(port)
        err = _finish(proc, 60)
    assert proc.returncode not in (0, None)
    lines = [line for line in err.splitlines() if line.strip()]
    assert len(lines) == 1, err[-3000:]
    assert f"127.0.0.1:{port} is already in use" in lines[0] and "--port" in lines[0]
    assert "engine" not in err and time.monotonic() - started < 60


def test_bind_socket_names_the_address() -> None:
    """A busy port and an address not of this machine are ConfigErrors naming the flag."""
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        with pytest.raises(ConfigError, match=f"--port {port}: .* already in use"):
            bind_socket(ServerConfig(port=port))
    with pytest.raises(ConfigError, match="--host/--port: cannot listen on 192.0.2.1"):
        bind_socket(ServerConfig(host="192.0.2.1", port=0))  # TEST-NET-1: never local
    with bind_socket(ServerConfig(port=0)) as sock:
        assert sock.getsockname()[0] == "127.0.0.1" and sock.getsockname()[1] > 0


def test_a_model_that_cannot_load_is_one_line_before_anything_loads(tmp_path, monkeypatch) -> None:  # noqa: ANN001
    """Invariant: a --model folder without config.json or weights, a config.json that is not
    JSON or names a type no family serves, a malformed hub id, a file for the folder and a
    bare name that is no folder here are ConfigErrors naming --model and what is wrong (were
    two tracebacks and status 3 after the engine started)."""
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    from gateway.config import EngineConfig
    from gateway.server import resolve_model

    def refused(model: str) -> str:
        with pytest.raises(ConfigError) as info:
            resolve_model(EngineConfig(model=model, served_model_name="m"))
        return str(info.value)

    assert "holds no config.json" in refused(str(tmp_path))
    (tmp_path / "config.json").write_text("{bad")
    assert "config.json is not valid JSON" in refused(str(tmp_path))
    (tmp_path / "config.json").write_text('{"model_type": "bert"}')
    assert "unsupported model type 'bert'" in refused(str(tmp_path))
    tiny = tiny_model("qwen2_vl")
    (tmp_path / "config.json").write_text((tiny / "config.json").read_text())
    assert "holds no *.safetensors weights" in refused(str(tmp_path))
    assert refused("bad repo!!").startswith("--model bad repo!!: not a local folder, nor a hub id")
    assert f"{tmp_path}/config.json is a file" in refused(str(tmp_path / "config.json"))
    assert "no folder 'tiny-visoin' here" in refused("tiny-visoin")  # a typo, not a hub id
    assert resolve_model(EngineConfig(model=str(tiny), served_model_name="m"))[0].model == str(tiny)


def test_a_model_the_engine_refuses_at_start_is_a_sentence_not_a_traceback() -> None:
    """Invariant: a model that passes the start-up checks but that the engine refuses while
    loading (here --kv-bits with a group size its 16-wide heads cannot take) stops the server
    with a non-zero exit and the refusal's sentence, without a traceback."""
    proc = _start(free_port(), "--kv-bits", "8", "--kv-group-size", "64")
    err = _finish(proc, 180)
    assert proc.returncode not in (0, None)
    assert "Traceback" not in err, err[-3000:]
    assert "did not load: model failed to load: --kv-bits 8 --kv-group-size 64" in err


def test_a_read_only_cache_dir_is_refused_at_start(tmp_path) -> None:  # noqa: ANN001
    """Invariant: a --cache-dir on a read-only mount or under a file is a start-up error
    naming it (was: one ERROR line later and a server without its disk tier, or a
    traceback); a missing folder is made."""
    from gateway.config import CacheConfig, EngineConfig
    from gateway.server import check_cache_dir

    def engine(folder) -> EngineConfig:  # noqa: ANN001
        return EngineConfig(model="m", served_model_name="m", cache=CacheConfig(cache_dir=folder))

    check_cache_dir(engine(tmp_path / "not" / "yet"))
    mount = tmp_path / "ro"
    mount.mkdir()
    made = subprocess.run(["mount", "-t", "tmpfs", "-o", "ro,size=1m", "tmpfs", str(mount)],
                          capture_output=True)  # fmt: skip
    if made.returncode != 0:
        pytest.skip(f"cannot mount a read-only tmpfs here: {made.stderr.decode().strip()}")
    try:
        for folder in (mount, mount / "cache"):  # read-only: not writable, cannot be made
            with pytest.raises(ConfigError, match="not writable|Read-only file system"):
                check_cache_dir(engine(folder))
        a_file = tmp_path / "a-file"
        a_file.write_text("x")
        with pytest.raises(ConfigError, match="cannot make or use it"):
            check_cache_dir(engine(a_file / "under"))
    finally:
        subprocess.run(["umount", str(mount)], check=True)


def test_probe_requests_are_not_access_logged() -> None:
    """Invariant: successful GETs of /health and /metrics (probes, scrapes) leave uvicorn's
    access log; their failures and every other request stay in it, without a query string."""
    import logging

    from gateway.server import quiet_probes

    def record(method: str, path: str, status: int) -> logging.LogRecord:
        args = ("127.0.0.1:5", method, path, "1.1", status)
        fmt = '%s - "%s %s HTTP/%s" %d'  # uvicorn's access line
        return logging.LogRecord("uvicorn.access", logging.INFO, "", 0, fmt, args, None)

    assert not quiet_probes(record("GET", "/health", 200))
    assert not quiet_probes(record("GET", "/metrics?x=1", 200))
    assert quiet_probes(record("GET", "/metrics", 401))
    assert quiet_probes(record("POST", "/health", 405))
    kept = record("GET", "/v1/cache/entries?limit=SECRET", 200)
    assert quiet_probes(kept) and "SECRET" not in kept.getMessage()  # no query string
