"""The disk tier's background writer: one thread that turns queued entries into files, so the
engine thread never waits for a disk.

`submit` never blocks: when the queued bytes would pass `max_pending_bytes` (a disk slower
than the engine produces entries) the entry is dropped and counted; the next request that
needs it computes it again and offers it again. `close` writes what is queued (bounded by a
timeout) and stops the thread: the engine calls it when it stops, so entries of requests
answered before a SIGTERM are on disk for the next start.

Thread safety: `submit`, `flush`, `close` and `stats` may be called from any thread.
"""

from __future__ import annotations

import logging
import queue
import threading
from collections.abc import Mapping
from dataclasses import dataclass

from caches.disk import DiskStore
from caches.disk_format import RawTensor

log = logging.getLogger(__name__)

DEFAULT_MAX_PENDING_BYTES = 512 * 2**20


@dataclass(frozen=True)
class _Write:
    kind: str
    key: str
    tensors: Mapping[str, RawTensor]
    metadata: Mapping[str, str]
    nbytes: int
    touch: bool = False  # only mark the file used


class DiskWriter:
    """Writes entries to `store` on its own daemon thread, in submission order."""

    def __init__(self, store: DiskStore, max_pending_bytes: int = DEFAULT_MAX_PENDING_BYTES):
        self.store = store
        self.max_pending_bytes = max_pending_bytes
        self._queue: queue.Queue[_Write | None] = queue.Queue()
        self._lock = threading.Lock()
        self._pending_bytes = 0
        self._dropped = 0
        self._closed = False
        self._thread = threading.Thread(target=self._run, name="disk-cache-writer", daemon=True)
        self._thread.start()

    def submit(
        self, kind: str, key: str, tensors: Mapping[str, RawTensor], metadata: Mapping[str, str]
    ) -> bool:
        """Queue an entry. The tensors' buffers must stay unchanged until written (MLX arrays
        are immutable; the queue holds a reference). False: dropped (queue full or closed)."""
        nbytes = sum(t.nbytes for t in tensors.values())
        with self._lock:
            if self._closed or self._pending_bytes + nbytes > self.max_pending_bytes:
                self._dropped += 1
                return False
            self._pending_bytes += nbytes
        self._queue.put(_Write(kind, key, tensors, metadata, nbytes))
        return True

    def touch(self, kind: str, key: str) -> None:
        """Queue marking an entry's file used now (no-op if absent). Never blocks."""
        with self._lock:
            if self._closed:
                return
        self._queue.put(_Write(kind, key, {}, {}, 0, touch=True))

    def _run(self) -> None:
        while True:
            item = self._queue.get()
            try:
                if item is None:
                    return
                if item.touch:
                    self.store.touch(item.kind, item.key)
                else:
                    self.store.put(item.kind, item.key, item.tensors, item.metadata)
            except Exception:  # noqa: BLE001 - the writer must outlive any one entry
                log.exception("disk cache: writing an entry failed")
            finally:
                if item is not None:
                    with self._lock:
                        self._pending_bytes -= item.nbytes
                self._queue.task_done()

    def flush(self, timeout: float = 30.0) -> bool:
        """Wait until everything queued so far is written; False on timeout."""
        done = threading.Event()
        waiter = threading.Thread(target=lambda: (self._queue.join(), done.set()), daemon=True)
        waiter.start()
        return done.wait(timeout)

    def close(self, timeout: float = 30.0) -> None:
        """Write what is queued (up to `timeout` seconds), then stop the thread. Idempotent;
        later submits are dropped."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
        self._queue.put(None)
        self._thread.join(timeout)
        if self._thread.is_alive():
            log.warning(
                "disk cache: %d bytes still queued at shutdown were not written",
                self._pending_bytes,
            )

    def stats(self) -> dict[str, int]:
        with self._lock:
            return {"pending_bytes": self._pending_bytes, "dropped_writes": self._dropped}
