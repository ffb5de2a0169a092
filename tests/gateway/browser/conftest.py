"""Fixtures of the browser tests: one Chromium and one real `vision-gateway serve` per test
module (so each module starts from empty caches), and a console watcher per test."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from playwright.sync_api import Browser
from support import ServerProcess
from web_pages import Console, launch_browser


@pytest.fixture(scope="module")
def browser() -> Iterator[Browser]:
    yield from launch_browser()


@pytest.fixture(scope="module")
def server() -> Iterator[ServerProcess]:
    proc = ServerProcess()
    yield proc
    assert proc.stop(), proc.log()


@pytest.fixture
def console() -> Console:
    return Console()
