"""The engine process's first code: what its target is, so that unpickling it (the first
thing a spawned process does) imports nearly nothing.

Ctrl-C and a service manager's SIGTERM reach the whole process group; the HTTP process
decides when to stop (after draining) and stops the engine process through its pipe. So the
engine process ignores both, from before its imports (gateway.engine.remote.main and the
engine's: seconds of mlx, mlx-lm, mlx-vlm), and a Ctrl-C while a model loads is no
KeyboardInterrupt traceback there.
"""

from __future__ import annotations

import signal
from typing import Any


def engine_process_entry(*args: Any) -> None:
    """Ignore SIGINT and SIGTERM, then run `engine_process_main(*args)`."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    from gateway.engine.remote.main import engine_process_main

    engine_process_main(*args)
