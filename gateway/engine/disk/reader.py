"""The disk tier's reader: one thread that reads, verifies and checks the files a waiting
request will need (its `ReadPlan`), so the engine thread never waits for a disk.

A request's plan is submitted when it reaches the engine; the request is admitted once its
`Prefetch` is done (as a request with a grammar waits for its compilation), and other
requests are admitted meanwhile. At admission the engine thread copies the checked tensors
into MLX arrays: the only part of a disk hit it pays. The reader calls no MLX function: it
produces plain bytes (the file's, with views into them).

Failure policy, as on the engine thread before: a missing file ends the read (a miss); a
damaged, foreign or unfit file is removed, logged and counted (`corrupt`) and ends the read;
an unexpected error is logged and the read ends with what it has. A prefetch is never an
error for its request.

Memory: buffers held by prefetches (read, not yet released) stay under `max_held_bytes` plus
one file. Before reading a file the reader waits while the others' buffers fill the cap
(they are done reading, so their requests can be admitted, which releases them: no cycle),
and a plan whose own buffers reach the cap ends there (the rest of its hit is computed
again). The engine releases a prefetch once admitted (its bytes are copied) or cancelled; a
cancelled prefetch stops at its next file.

Thread safety: `submit`, `close`, `stats` and every `Prefetch` method may be called from any
thread.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from concurrent.futures import Future
from dataclasses import dataclass, field

from caches.disk import DiskEntry, DiskStore
from gateway.engine.disk.plan import ReadBlock, ReadFeatures, ReadPlan, check_block, check_features

log = logging.getLogger(__name__)

DEFAULT_MAX_HELD_BYTES = 1024 * 2**20
_FIT_ERRORS = (ValueError, KeyError, TypeError, RecursionError)


@dataclass
class Prefetched:
    """What a plan's read found: the blocks read, consecutive from the plan's first, and the
    features of images, by file key."""

    blocks: list[ReadBlock] = field(default_factory=list)
    features: dict[str, ReadFeatures] = field(default_factory=dict)

    def blocks_from(self, index: int) -> list[ReadBlock]:
        """The blocks from `index` on, if the read covers `index` (else none: a hit must be
        consecutive from the blocks memory holds)."""
        if not self.blocks or not self.blocks[0].index <= index <= self.blocks[-1].index:
            return []
        return self.blocks[index - self.blocks[0].index :]


class Prefetch:
    """One request's read. `future` is done when the read has finished (its result a
    `Prefetched`, possibly empty); `release` drops its buffers (idempotent)."""

    def __init__(self, reader: DiskReader, plan: ReadPlan) -> None:
        self.plan = plan
        self.future: Future[Prefetched] = Future()
        self.held_bytes = 0  # guarded by the reader's condition
        self.released = False
        self._reader = reader

    def done(self) -> bool:
        return self.future.done()

    def result(self) -> Prefetched:
        """The read's outcome (waits for it; the engine asks only once `done()`)."""
        return self.future.result()

    def release(self) -> None:
        """Forget the buffers: the request was admitted (they are copied) or cancelled (an
        unfinished read stops at its next file)."""
        self._reader._release(self)


class DiskReader:
    """Reads plans from `store` on its own daemon thread, in submission order."""

    def __init__(self, store: DiskStore, max_held_bytes: int = DEFAULT_MAX_HELD_BYTES) -> None:
        self.store = store
        self.max_held_bytes = max_held_bytes
        self._queue: queue.Queue[Prefetch | None] = queue.Queue()
        self._cond = threading.Condition()
        self._held = 0
        self._closed = False
        self._stats = {"read_files": 0, "read_bytes": 0, "reads_cancelled": 0}
        self.read_seconds = {"vision": 0.0, "prefix": 0.0}
        self._thread = threading.Thread(target=self._run, name="disk-cache-reader", daemon=True)
        self._thread.start()

    def submit(self, plan: ReadPlan) -> Prefetch:
        """Queue a plan's read; never blocks. After `close`, the prefetch is done and empty."""
        prefetch = Prefetch(self, plan)
        with self._cond:  # (so every plan queued while open precedes close's sentinel)
            if not self._closed:
                self._queue.put(prefetch)
                return prefetch
        prefetch.future.set_result(Prefetched())
        return prefetch

    def close(self, timeout: float = 5.0) -> None:
        """Stop the thread (queued reads end empty). Idempotent."""
        with self._cond:
            if self._closed:
                return
            self._closed = True
            self._cond.notify_all()
        self._queue.put(None)
        self._thread.join(timeout)

    def stats(self) -> dict[str, object]:
        """Counters: `read_held_bytes` (buffers of unreleased prefetches now), `read_files`
        and `read_bytes` (verified files read), `reads_cancelled` (prefetches released before
        their read ended), `read_seconds` per kind (this thread's time reading, verifying and
        checking files, hits and misses)."""
        with self._cond:
            return {
                "read_held_bytes": self._held,
                **self._stats,
                "read_seconds": dict(self.read_seconds),
            }

    # ----- the reader thread --------------------------------------------------------------

    def _run(self) -> None:
        while True:
            prefetch = self._queue.get()
            if prefetch is None:
                return
            found = Prefetched()
            try:
                self._read(prefetch, found)
            except Exception:  # noqa: BLE001 - the reader must outlive any one plan
                log.exception("disk cache: reading ahead failed; the rest is a miss")
            finally:
                prefetch.future.set_result(found)

    def _read(self, prefetch: Prefetch, found: Prefetched) -> None:
        plan = prefetch.plan
        for want in plan.blocks:
            entry = self._get(prefetch, "prefix", want.key)
            if entry is None:
                break
            try:
                args = (plan.block_tokens, plan.layers, *entry, plan.state_layers, plan.quantized)
                found.blocks.append(check_block(want, *args))
            except _FIT_ERRORS as exc:
                self.store.discard("prefix", want.key, f"does not fit the request: {exc}")
                break
        covered = plan.covered_after(len(found.blocks))
        for image in plan.images:
            if image.end <= covered or image.key in found.features:
                continue  # the KV covers it (or an earlier image of the same pixels)
            entry = self._get(prefetch, "vision", image.key)
            if entry is None:
                continue
            try:
                found.features[image.key] = check_features(image, *entry)
            except _FIT_ERRORS as exc:
                self.store.discard("vision", image.key, f"does not fit the request: {exc}")

    def _get(self, prefetch: Prefetch, kind: str, key: str) -> tuple | None:
        """(metadata, tensors) of a verified file, its bytes counted as held by `prefetch`;
        None for a miss, or when the prefetch was released or the reader closed."""
        with self._cond:
            while (
                self._held >= self.max_held_bytes
                and self._held > prefetch.held_bytes  # others hold some: wait for them
                and not (prefetch.released or self._closed)
            ):
                self._cond.wait()
            if prefetch.released or self._closed or prefetch.held_bytes >= self.max_held_bytes:
                return None
        started = time.perf_counter()
        entry: DiskEntry | None = self.store.get(kind, key)
        elapsed = time.perf_counter() - started
        with self._cond:
            self.read_seconds[kind] += elapsed
            if entry is None:
                return None
            self._stats["read_files"] += 1
            self._stats["read_bytes"] += entry.nbytes
            if prefetch.released:  # cancelled while reading: drop it now
                return None
            prefetch.held_bytes += entry.nbytes
            self._held += entry.nbytes
        return entry.metadata, entry.tensors

    def _release(self, prefetch: Prefetch) -> None:
        with self._cond:
            if prefetch.released:
                return
            prefetch.released = True
            if not prefetch.future.done():
                self._stats["reads_cancelled"] += 1
            self._held -= prefetch.held_bytes
            prefetch.held_bytes = 0
            self._cond.notify_all()
