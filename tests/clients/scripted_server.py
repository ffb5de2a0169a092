"""`python tests/clients/scripted_server.py SCRIPT.json [serve flags...]`: `vision-gateway
serve` with the real engine process behind a `ScriptedEngine` (tests/clients/scripted_engine.py),
for end-to-end tests whose real clients (agent CLIs) must receive tool calls from a
random-weight model. Same flags, same app, same shutdown as `serve`; test-only.
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repo root
sys.path.insert(0, str(Path(__file__).resolve().parent))

from scripted_engine import ScriptedEngine, load_rules  # noqa: E402

from gateway.app import create_app  # noqa: E402
from gateway.cli import build_parser  # noqa: E402
from gateway.engine.remote.client import RemoteEngine  # noqa: E402
from gateway.flags import configs_from_args  # noqa: E402
from gateway.server import bind_socket, resolve_model, run_app  # noqa: E402


def main(argv: list[str]) -> None:
    import logging

    logging.basicConfig(level="INFO", format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    rules = load_rules(Path(argv[0]))
    server, engine, media = configs_from_args(build_parser().parse_args(["serve", *argv[1:]]))
    with bind_socket(server) as sock:
        engine, notice = resolve_model(engine)
        scripted = ScriptedEngine(RemoteEngine(engine, server.log_level), rules)
        app = create_app(server, engine, media, notice=notice, engine_client=scripted)
        run_app(app, server, sock)
    logging.shutdown()
    sys.stdout.flush()
    import os

    os._exit(0)  # as `serve` does: skip finalization (mlx 0.32's thread-exit abort)


if __name__ == "__main__":
    main(sys.argv[1:])
