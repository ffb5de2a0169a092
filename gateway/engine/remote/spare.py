"""Spare engine processes: started ahead of need, their imports done (mlx, mlx-lm, mlx-vlm and
the families: ~1.3 s of a load's first seconds on the CPU machine), waiting to be told which
model to serve. With several models behind one server (gateway.pool) a model loaded on
demand takes a spare instead of spawning a process, so its request waits for the weights
only; the next spare starts in the background at once.

`EngineProcess` is one spawned process and its two pipes (what `RemoteEngine` runs over);
`SpareEngines` keeps at most one spare ready. Thread-safe.
"""

from __future__ import annotations

import logging
import multiprocessing as mp
import threading
from dataclasses import dataclass
from multiprocessing.connection import Connection
from typing import Any

from gateway.config import EngineConfig
from gateway.engine.remote.process_entry import engine_process_entry
from gateway.engine.wire import Configure, Stop

log = logging.getLogger(__name__)


@dataclass
class EngineProcess:
    """A spawned engine process: `commands` is our end of its command pipe, `events` of its
    event pipe. Owned by whoever took it (a `RemoteEngine`)."""

    process: Any  # multiprocessing's SpawnProcess
    commands: Connection
    events: Connection


def spawn_engine(config: EngineConfig | None, log_level: str) -> EngineProcess:
    """Spawn an engine process for `config` (None: a spare, waiting for `Configure`)."""
    ctx = mp.get_context("spawn")  # never fork a process that may hold a GPU context
    cmd_read, cmd_write = ctx.Pipe(duplex=False)
    evt_read, evt_write = ctx.Pipe(duplex=False)
    name = "vision-gateway-engine" if config is not None else "vision-gateway-spare-engine"
    process = ctx.Process(
        target=engine_process_entry,
        args=(config, log_level, cmd_read, evt_write),
        name=name,
        daemon=True,
    )
    process.start()
    cmd_read.close()
    evt_write.close()
    return EngineProcess(process, cmd_write, evt_read)


class SpareEngines:
    """At most one spare engine process, ready for the next model to load."""

    def __init__(self, log_level: str) -> None:
        self._log_level = log_level
        self._lock = threading.Lock()
        self._spare: EngineProcess | None = None
        self._closed = False

    def prepare(self) -> None:
        """Start a spare now unless one is there (returns at once; the process imports in
        the background)."""
        with self._lock:
            if self._spare is None and not self._closed:
                self._spare = spawn_engine(None, self._log_level)
                log.info("spare engine process %d started", self._spare.process.pid)

    def take(self, config: EngineConfig) -> EngineProcess:
        """An engine process for `config`: the spare (told to load it) if one is alive, else
        a new one; a new spare is started either way."""
        with self._lock:
            spare, self._spare = self._spare, None
        if spare is not None and spare.process.is_alive():
            try:
                spare.commands.send(Configure(config))
                self.prepare()
                return spare
            except (OSError, ValueError):  # it died between the check and the send
                log.warning("the spare engine process is gone; spawning one")
        engine = spawn_engine(config, self._log_level)
        self.prepare()
        return engine

    def close(self) -> None:
        """Stop the spare (if any); no new one is started."""
        with self._lock:
            self._closed = True
            spare, self._spare = self._spare, None
        if spare is None:
            return
        try:
            spare.commands.send(Stop())
        except (OSError, ValueError):
            pass
        spare.commands.close()
        spare.process.join(5)
        if spare.process.is_alive():
            spare.process.kill()
            spare.process.join(5)
        spare.events.close()
