"""The bench's view of a server's memory, and of its disk tier.

Pinned: RSS counts the whole process tree, since the engine (the model, MLX's buffers) lives in
a child process of `serve`: a soak that watched only the HTTP process would miss its growth.
Servers and engines the benches and tests start have no disk tier unless given a --cache-dir.
"""

from __future__ import annotations

import subprocess
import sys

from bench.cli import _engine_cache_config
from bench.server import _process_tree, _rss_bytes, memory_only_unless_asked

CHILD_HOLDS_MB = 120
PARENT = f"""
import subprocess, sys, time
child = subprocess.Popen([sys.executable, "-c",
    "import time; b = bytearray({CHILD_HOLDS_MB} << 20); b[::4096] = b'x' * len(b[::4096]); "
    "print('ready', flush=True); time.sleep(60)"], stdout=subprocess.PIPE)
child.stdout.readline()
print("ready", flush=True)
time.sleep(60)
"""


def test_rss_includes_the_child_processes() -> None:
    """Invariant: the tree's RSS includes a child's resident memory."""
    parent = subprocess.Popen([sys.executable, "-c", PARENT], stdout=subprocess.PIPE)
    try:
        assert parent.stdout is not None and parent.stdout.readline().strip() == b"ready"
        tree = _process_tree(parent.pid)
        assert len(tree) == 2 and tree[0] == parent.pid
        total = sum(_rss_bytes(pid) for pid in tree)
        assert total - _rss_bytes(parent.pid) >= CHILD_HOLDS_MB << 20
    finally:
        for pid in _process_tree(parent.pid)[::-1]:
            subprocess.run(["kill", str(pid)], check=False)
        parent.wait(10)


def test_no_disk_tier_unless_a_cache_dir_is_named(tmp_path) -> None:  # noqa: ANN001
    """Invariant: files of an earlier run never turn a bench's or test's cold request into a
    disk hit: the disk tier is off unless the flags name a --cache-dir."""
    assert memory_only_unless_asked(["--no-warmup"]) == ["--no-warmup", "--no-disk-cache"]
    named = ["--cache-dir", str(tmp_path)]
    assert memory_only_unless_asked(named) == named
    assert _engine_cache_config("m", []).cache_dir is None
    assert _engine_cache_config("m", named).cache_dir == tmp_path
