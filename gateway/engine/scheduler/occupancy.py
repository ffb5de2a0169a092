"""How many requests the engine holds, the one piece of scheduling state other threads read.

`queued`: submitted, not yet given a row (waiting in the inbox or the scheduler's queue);
`active`: holding a row (encoding, prefilling or decoding). Both count rows: a request for
n choices (`SamplingParams.n`) counts n, as it will decode n rows. Rows plus queue slots
are the engine's capacity: `reserve` counts a request at `Engine.submit`, before the engine
thread has even seen it, so a burst of submits cannot overshoot the queue.

Thread contract: `reserve` runs on any thread; `admit`, `unqueue` and `free_row` run on the
engine thread; every change holds the lock; the properties are single reads (no lock: a
reader gets a value that was true at some instant).
"""

from __future__ import annotations

import threading

from gateway.engine.client import EngineBusy


class Occupancy:
    """The queued/active request counts of one engine; see the module docstring."""

    def __init__(self, max_waiting: int, max_batch: int) -> None:
        self._max_waiting = max_waiting
        self._max_batch = max_batch
        self._lock = threading.Lock()
        self._queued = 0
        self._active = 0

    @property
    def queued(self) -> int:
        """Requests submitted and not yet given a row (any thread)."""
        return self._queued

    @property
    def active(self) -> int:
        """Requests holding a row (any thread)."""
        return self._active

    @property
    def idle(self) -> bool:
        """Nothing queued, nothing holding a row (any thread)."""
        return self._active == 0 and self._queued == 0

    def reserve(self, rows: int = 1) -> None:
        """Count one more queued request of `rows` rows; raises EngineBusy when the rows and
        queue slots left cannot take it (any thread)."""
        with self._lock:
            if self._queued + self._active + rows > self._max_waiting + self._max_batch:
                limit = self._max_waiting + self._max_batch
                raise EngineBusy(min(self._active, self._max_batch), self._queued, limit)
            self._queued += rows

    def admit(self, rows: int = 1) -> None:
        """A queued request takes its rows (engine thread)."""
        with self._lock:
            self._queued -= rows
            self._active += rows

    def unqueue(self, rows: int = 1) -> None:
        """A queued request left before taking a row: cancelled or failed (engine thread)."""
        with self._lock:
            self._queued -= rows

    def free_row(self, rows: int = 1) -> None:
        """A request (or one choice) holding `rows` rows ended (engine thread)."""
        with self._lock:
            self._active -= rows
