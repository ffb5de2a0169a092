"""The `hostile` server and what it serves, started once for this whole folder.

Package scope: test_table.py, test_raw_socket.py, test_side_auth.py and test_property.py share
one server process (as they did as one module), so splitting them costs no extra start-up.
Its survival check runs after all of their traffic, wherever pytest collected it.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from support import ImageServer, ServerProcess, noise_png

from tests.gateway.hostile.server import BODY_CAP, KEY, METRICS_KEY, PNG

HERE = Path(__file__).parent
SURVIVAL = "test_server_still_serves_after_the_hostile_traffic"


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Move the survival check behind the last test of this folder (keeping the folder's
    tests together, so the package-scoped server is still started once): it pins that all
    the hostile traffic before it left the server healthy and idle."""
    ours = [k for k, item in enumerate(items) if item.path.parent == HERE]
    survival = [k for k in ours if items[k].name == SURVIVAL]
    if survival:
        items.insert(ours[-1], items.pop(survival[0]))


@pytest.fixture(scope="package")
def media(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    """An allowed media dir full of traps, and a sibling dir that is not allowed."""
    root = tmp_path_factory.mktemp("hardening")
    allowed = root / "allowed"
    outside = root / "outside"
    allowed.mkdir()
    outside.mkdir()
    (allowed / "a.png").write_bytes(PNG)
    (outside / "b.png").write_bytes(noise_png(2, 28, 28))
    (allowed / "folder.png").mkdir()
    os.mkfifo(allowed / "pipe.png")
    (allowed / "passwd.png").symlink_to("/etc/passwd")
    (allowed / "escape.png").symlink_to(outside / "b.png")
    return {"media": str(allowed), "outside": str(outside)}


@pytest.fixture(scope="package")
def images(media: dict[str, str]) -> Iterator[ImageServer]:
    server = ImageServer(Path(media["media"]))
    yield server
    server.close()


@pytest.fixture(scope="package")
def hostile(media: dict[str, str]) -> Iterator[ServerProcess]:
    """Auth on, a 2 MiB body cap, 2 images per request, one allowed media dir, no private
    URLs; --default-max-tokens 4 keeps valid random bodies fast."""
    proc = ServerProcess(
        "--api-key", KEY,
        "--metrics-api-key", METRICS_KEY,
        "--max-body-bytes", str(BODY_CAP),
        "--max-images-per-request", "2",
        "--allowed-media-dir", media["media"],
        "--default-max-tokens", "4",
    )  # fmt: skip
    yield proc
    assert proc.stop(), proc.log()


@pytest.fixture(scope="package")
def client(hostile: ServerProcess) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=hostile.base_url, timeout=60) as c:
        yield c
