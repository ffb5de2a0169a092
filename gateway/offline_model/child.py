"""`ensure_model` with the build in a child process, so the caller's process imports no MLX
(the builder validates the config with the runtime's own classes and writes weights and
quantizes with MLX). The server's HTTP process builds its embedded model this way.

The child is spawned (never forked: the caller may hold threads), inherits the environment
and umask, and sends each progress line over a pipe as it goes, then the folder or its
failure; a checkpoint already built is returned without a child.
"""

from __future__ import annotations

import multiprocessing as mp
from collections.abc import Callable
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

from . import built_model


def ensure_model_in_child(
    arch: str = "qwen2_vl",
    size: str = "tiny",
    seed: int = 0,
    progress: Callable[[str], None] | None = None,
    **options: Any,
) -> Path:
    """What `ensure_model(arch, size, seed, progress, **options)` returns, built (when it is
    missing or incomplete) in a child process; `progress` gets the build's lines here, in
    order. Raises ValueError for arguments `ensure_model` refuses and RuntimeError, with the
    child's words, when the build fails or the child dies."""
    built = built_model(arch, size, seed, **options)  # (the arguments' ValueErrors too)
    if built is not None:
        return built
    ctx = mp.get_context("spawn")
    receive, send = ctx.Pipe(duplex=False)
    child = ctx.Process(
        target=_build, args=(send, arch, size, seed, options), name="vision-gateway-build-model"
    )
    child.start()
    send.close()  # ours: the pipe reads EOF once the child's end is closed too
    try:
        while True:
            try:
                kind, value = receive.recv()
            except EOFError:
                child.join()
                raise RuntimeError(
                    f"building the {arch} {size} model: its process exited "
                    f"(code {child.exitcode}) without a result"
                ) from None
            if kind == "progress":
                if progress is not None:
                    progress(value)
            elif kind == "done":
                return Path(value)
            else:
                raise RuntimeError(f"building the {arch} {size} model failed: {value}")
    finally:
        receive.close()
        child.join()


def _build(send: Connection, arch: str, size: str, seed: int, options: dict[str, Any]) -> None:
    """The child: `ensure_model`, its progress and result (or failure, in words) to `send`."""
    from . import ensure_model

    try:
        path = ensure_model(
            arch, size, seed, progress=lambda msg: send.send(("progress", msg)), **options
        )
    except Exception as exc:  # noqa: BLE001 - reported to the parent, which raises it
        send.send(("failed", f"{type(exc).__name__}: {exc}"))
    else:
        send.send(("done", str(path)))
    finally:
        send.close()
