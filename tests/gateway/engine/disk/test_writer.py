"""Invariants of gateway.engine.disk.writer.DiskWriter (no MLX): submit never blocks and
never writes on the caller's thread; what was queued before `close` is on disk after it; a
full queue drops (and counts) instead of waiting; a write that raises does not stop the
thread."""

from __future__ import annotations

import threading
from pathlib import Path

from caches.disk import DiskStore
from caches.disk_format import RawTensor
from gateway.engine.disk.writer import DiskWriter


def _tensors(n: int = 100) -> dict[str, RawTensor]:
    return {"x": RawTensor("U8", (n,), b"\1" * n)}


class _SlowStore(DiskStore):
    """Blocks every write until released; records the writing threads."""

    def __init__(self, *args: object, **kwargs: object) -> None:
        super().__init__(*args, **kwargs)  # type: ignore[arg-type]
        self.release = threading.Event()
        self.threads: set[str] = set()

    def put(self, kind, key, tensors, meta):  # noqa: ANN001, ANN201
        self.threads.add(threading.current_thread().name)
        self.release.wait(30)
        if key.startswith("bad"):
            raise RuntimeError("injected")
        return super().put(kind, key, tensors, meta)


def test_queued_entries_are_written_by_close_off_the_callers_thread(tmp_path: Path) -> None:
    """Invariant: submit returns at once while the disk is stuck; close writes everything
    queued before it, on the writer's own thread; later submits are dropped."""
    store = _SlowStore(tmp_path, "ns01", 10**6)
    writer = DiskWriter(store)
    keys = [f"{i:08d}aa" for i in range(3)]
    assert writer.submit("vision", "bad0000000", _tensors(), {})  # raises inside: survived
    for key in keys:
        assert writer.submit("vision", key, _tensors(), {})
    assert not any(store.contains("vision", k) for k in keys)  # nothing written yet
    store.release.set()
    writer.close()
    assert all(store.contains("vision", k) for k in keys)
    assert store.threads == {"disk-cache-writer"}
    assert not writer.submit("vision", "11111111aa", _tensors(), {})
    assert writer.stats() == {"pending_bytes": 0, "dropped_writes": 1}


def test_a_full_queue_drops_instead_of_waiting(tmp_path: Path) -> None:
    """Invariant: past `max_pending_bytes` queued, an entry is dropped and counted."""
    store = _SlowStore(tmp_path, "ns01", 10**6)
    writer = DiskWriter(store, max_pending_bytes=250)
    assert writer.submit("prefix", "00000001aa", _tensors(), {})
    assert writer.submit("prefix", "00000002aa", _tensors(), {})
    assert not writer.submit("prefix", "00000003aa", _tensors(), {})  # 300 > 250
    assert writer.stats()["dropped_writes"] == 1
    store.release.set()
    assert writer.flush(30)
    assert writer.submit("prefix", "00000003aa", _tensors(), {})  # room again
    writer.close()
    assert store.contains("prefix", "00000003aa")
