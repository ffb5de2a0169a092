"""Running the gateway from typed configs: the model to serve, the listening socket, uvicorn.

`serve` is what `vision-gateway serve` runs; `cluster` reuses `bind_socket`, `resolve_model`
and `run_app` for its ingress. Order matters for a new user: the port is bound first (a busy
port fails in a second, not after minutes of model loading), then the model is resolved, then
the app starts. SIGINT and SIGTERM (from a terminal's Ctrl-C or a service manager, to the
whole process group) drain running requests and return normally: the process exits 0, without
a traceback. A second one while draining forces the shutdown: running requests end at once
with an error saying so, and the process still exits 0 without a traceback, within about a
second. SIGHUP rereads --api-keys-file.

What the server writes is its users' (cached images and prompts, docs/security.md): `serve`
sets the process umask to 077 (the engine process inherits it), so every folder and file it
creates is its user's alone, and refuses a --cache-dir other users can write to before
loading anything.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import errno
import logging
import os
import signal
import socket
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from gateway.config import ConfigError, EngineConfig, MediaConfig, ServerConfig
from gateway.pool.pool import ModelLoadFailed
from gateway.pool_config import PoolConfig

log = logging.getLogger(__name__)

EMBEDDED_NOTICE = (
    "This is the embedded tiny random-weight test model: its answers are noise. "
    "Start the server with --model <dir or hub id> to serve a real model (Qwen-VL, Gemma 3/3n/4, "
    "SmolVLM, Mistral 3, LFM2-VL, or an mlx-lm text model)."
)


def default_disk_cache_dir() -> Path:
    """The disk tier's default folder: disk-cache/ in the user cache dir (where the embedded
    model is built too)."""
    from gateway.offline_model import cache_root

    return cache_root() / "disk-cache"


def serve(
    server: ServerConfig, engine: EngineConfig, media: MediaConfig, pool: PoolConfig | None = None
) -> None:
    """Run the gateway until SIGINT or SIGTERM, then drain and return. Raises ConfigError
    (before loading anything) when the address is taken or a model (`engine.model`, or each
    of `pool`'s) is a missing directory or not a checkpoint this gateway serves."""
    from gateway.app import create_app

    os.umask(0o077)  # whatever the caller's umask: nothing we write is for other users
    check_cache_dir(engine)
    with bind_socket(server) as sock:
        engine, notice = resolve_model(engine)
        check_models(engine, pool)
        run_app(create_app(server, engine, media, notice=notice, pool=pool), server, sock)


def check_models(engine: EngineConfig, pool: PoolConfig | None) -> None:
    """`resolve_model`'s checks of every model of `pool` but the first (`engine.model`,
    checked already); ConfigError naming the model."""
    for spec in (pool.specs if pool else ())[1:]:
        try:
            resolve_model(dataclasses.replace(engine, model=spec.path))
        except ConfigError as exc:
            raise ConfigError(f"model {spec.name!r}: {exc}") from None


def check_cache_dir(engine: EngineConfig) -> None:
    """ConfigError when the disk tier's folder cannot serve as one: it cannot be made or
    written (under a file, on a read-only mount, another user's), or it is writable by users
    it should not be (caches/private_dir.py: world-writable, or group-writable without
    --cache-dir-group). A missing folder is made here, with the tier's modes."""
    from caches.disk import FORMAT_DIR
    from caches.private_dir import FolderModes, LooseFolder, check_folder, make_dirs

    folder = engine.cache.cache_dir
    if folder is None:
        return
    group = engine.cache.cache_dir_group
    modes = FolderModes.group_shared() if group else FolderModes.private()
    try:
        if not folder.is_dir():
            make_dirs(folder, modes)
            log.info("--cache-dir %s did not exist: made it", folder)
        # Writable first: on a read-only mount, `chmod` (what a loose folder's error asks
        # for) cannot help.
        if not os.access(folder, os.W_OK | os.X_OK):
            raise ConfigError(
                f"--cache-dir {folder}: not writable (a read-only mount, or another user's "
                "folder); give a folder this user can write, or --no-disk-cache"
            )
        for path in (folder, folder / FORMAT_DIR):
            check_folder(path, modes)
    except LooseFolder as exc:
        raise ConfigError(f"--cache-dir: {exc}") from None
    except OSError as exc:  # under a file, on a read-only file system, /proc, ...
        raise ConfigError(f"--cache-dir {folder}: cannot make or use it: {exc}") from None


def bind_socket(server: ServerConfig) -> socket.socket:
    """A TCP socket bound (not yet listening) to server.host:server.port; the caller owns and
    closes it. Raises ConfigError naming the address when it cannot be bound (in use, not an
    address of this machine, a privileged port)."""
    family = socket.AF_INET6 if ":" in server.host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    # As uvicorn does: a restart can reuse the port while old connections are in TIME_WAIT
    # (a port another process listens on still fails).
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((server.host, server.port))
    except OSError as exc:
        sock.close()
        where = f"{server.host}:{server.port}"
        if exc.errno == errno.EADDRINUSE:
            raise ConfigError(
                f"--port {server.port}: {where} is already in use (another server running?); "
                "stop it or pick another --port"
            ) from None
        reason = exc.strerror or str(exc)
        raise ConfigError(f"--host/--port: cannot listen on {where}: {reason}") from None
    return sock


def resolve_model(engine: EngineConfig) -> tuple[EngineConfig, str | None]:
    """Check `--model`, or build the embedded tiny model: the config to serve and the
    notice for /v1/models (None for a real model). Imports no MLX (the HTTP process's rule):
    the check reads config.json and the file names, the build runs in a child process."""
    model = engine.model
    if (
        model
        and model.startswith(("/", "./", "../", "~"))
        and not Path(model).expanduser().exists()  # (a file: check_checkpoint says so)
    ):
        raise ConfigError(
            f"--model {model}: no such directory; pass a local model directory or a hub id "
            "such as mlx-community/Qwen2.5-VL-7B-Instruct-4bit"
        )
    if model:
        from gateway.processors.checkpoint import check_checkpoint  # (no MLX here)

        try:
            check_checkpoint(model, engine.cache.kv_bits)
        except ValueError as exc:
            raise ConfigError(f"--model {model}: {exc}") from None
    notice = None
    if not engine.model:
        from gateway.offline_model.child import ensure_model_in_child

        os.environ.setdefault("HF_HUB_OFFLINE", "1")
        # Built (when missing) in a child process: the builder runs MLX, this process never.
        path = ensure_model_in_child(progress=lambda msg: log.info("embedded model: %s", msg))
        engine = dataclasses.replace(engine, model=str(path))
        notice = EMBEDDED_NOTICE
        log.warning(EMBEDDED_NOTICE)
    return engine, notice


PROBES = frozenset({"/health", "/metrics"})
# After a forced shutdown (a second Ctrl-C), how long the interrupted streams may take to send
# their error event and close before the app shuts down.
FORCED_CLOSE_S = 1.0


def quiet_probes(record: logging.LogRecord) -> bool:
    """uvicorn access-log filter: drop successful GETs of /health and /metrics (a load
    balancer's probe and a scraper's poll every few seconds would drown the requests in the
    log); their failures, and every other request, are logged, without their query string
    (a client's text, which the log does not keep). Off at --log-level debug."""
    args = record.args
    if isinstance(args, tuple) and len(args) == 5:  # (client, method, path, http version, status)
        client, method, path, version, status = args
        bare = str(path).split("?")[0]
        if method == "GET" and bare in PROBES and status == 200:
            return False
        record.args = (client, method, bare, version, status)
    return True


def one_line_start_failure(record: logging.LogRecord) -> bool:
    """A model that did not load at start-up (`ModelLoadFailed`, raised in the app's lifespan)
    is a refusal with a sentence, not a crash: Starlette hands uvicorn the whole traceback
    text, which this cuts to the sentence (the cause was logged where it happened)."""
    message = record.getMessage()
    marker = f"{ModelLoadFailed.__name__}: "
    if message.startswith("Traceback") and marker in message:
        record.msg, record.args = message.rsplit(marker, 1)[1].strip(), ()
    return True


def run_app(app: Any, server: ServerConfig, sock: socket.socket) -> None:
    """Serve `app` (from `create_app`) on `sock` (from `bind_socket`) until SIGINT or SIGTERM,
    then drain (`--shutdown-grace`) and return."""
    uvicorn_server(app, server).run(sockets=[sock])


def uvicorn_server(app: Any, server: ServerConfig) -> Any:
    """uvicorn's server for `app` with `server`'s settings, telling the app when a shutdown
    signal arrives (uvicorn itself only stops accepting connections and waits) so that running
    streams can end with an error event before the grace period runs out. Run it with
    `.run(sockets=[bind_socket(server)])`; it returns after a signal's graceful shutdown."""
    import uvicorn

    config = uvicorn.Config(
        app,
        host=server.host,
        port=server.port,
        log_level=server.log_level,
        loop=server.loop,
        # 0 must mean 'no grace', not uvicorn's None ('wait forever')
        timeout_graceful_shutdown=max(server.shutdown_grace_s, 0.001),
    )
    if server.log_level != "debug":  # (uvicorn set up its loggers in Config's constructor)
        logging.getLogger("uvicorn.access").addFilter(quiet_probes)
        logging.getLogger("uvicorn.error").addFilter(one_line_start_failure)
    on_exit = app.state.gateway.begin_shutdown
    on_hangup = app.state.gateway.reload_keys

    class Server(uvicorn.Server):
        def handle_exit(self, sig: int, frame: Any) -> None:
            on_exit()
            super().handle_exit(sig, frame)

        @contextlib.contextmanager
        def capture_signals(self) -> Iterator[None]:
            # uvicorn's own re-raises the signal once shut down, so that the process dies of
            # it: a KeyboardInterrupt traceback (exit 130) for Ctrl-C, status 143 for SIGTERM.
            # A drained shutdown is a clean exit here: handlers in, and back out, only.
            if threading.current_thread() is not threading.main_thread():
                yield
                return
            handled = (signal.SIGINT, signal.SIGTERM)
            previous = {sig: signal.signal(sig, self.handle_exit) for sig in handled}
            previous[signal.SIGHUP] = signal.signal(signal.SIGHUP, lambda *_: on_hangup())
            try:
                yield
            finally:
                for sig, handler in previous.items():
                    signal.signal(sig, handler)

        async def shutdown(self, sockets: list[socket.socket] | None = None) -> None:
            await super().shutdown(sockets)
            if self.force_exit:  # a second Ctrl-C while draining
                # uvicorn skips the app's shutdown then, so asyncio cancels the lifespan task
                # on its way out: a CancelledError traceback, the app's clean-up run under
                # cancellation. The app already ended the running requests (begin_shutdown);
                # their error events get a moment to reach the clients, then the app shuts
                # down as usual.
                await self._connections_closed(FORCED_CLOSE_S)
                await self.lifespan.shutdown()

        async def _connections_closed(self, timeout: float) -> None:
            deadline = asyncio.get_running_loop().time() + timeout
            while self.server_state.connections and asyncio.get_running_loop().time() < deadline:
                await asyncio.sleep(0.02)

        async def startup(self, sockets: list[socket.socket] | None = None) -> None:
            await super().startup(sockets)
            # (uvicorn logs this only for sockets it bound; not once a signal has come)
            if self.started and sockets and not self.should_exit:
                host, port = server.host, sockets[0].getsockname()[1]
                url = f"http://[{host}]:{port}" if ":" in host else f"http://{host}:{port}"
                logging.getLogger("uvicorn.error").info(
                    "Uvicorn running on %s (Press CTRL+C to quit)", url
                )

    return Server(config)
