"""A per-step trace of the engine loop, for finding where a wave's time goes.

`serve --step-trace FILE` appends one JSON object per engine step with work to FILE (under
`cluster`, each replica to FILE with `.replicaN` before the suffix):

    {"t": 12.345678,        # step start, seconds since the trace opened (perf_counter)
     "admit": 0.02, "encode": 0.0, "prefill": 4.1, "decode": 9.8, "ship": 0.1,  # ms per stage
     "answer": 0.0,         # ms of answer prefill (scheduler/answer_store.py)
     "store": 0.0,          # ms of the prefill stage spent storing an image part's KV blocks
     "first_token": 0.0,    # ms of the prefill stage spent on first tokens (the last row's
                            # logits, sampling, emitting, joining the batch)
     "rows": 16,            # rows decoding after the step
     "joined": 3,           # rows that joined the batch in this step
     "prefilling": 2, "encoding": 0, "waiting": 5,  # jobs in each queue after the step
     "tokens": 16,          # tokens emitted by the decode step
     "answer_rows": 0,      # query rows of answer-prefill blocks run in this step
     "admitted": ["id", ...], "first": ["id", ...]}  # requests admitted / given their first
                            # token in this step (present when not empty)

MLX evaluates lazily, so a stage's time is the time spent in it on the engine thread: GPU
work it queued may be waited for in a later stage (the decode step computes one ahead).
Steps are buffered in memory and appended in batches of `flush_every` (and at stop), so the
file costs the loop one write per batch. Off (None) by default; engine thread only.
"""

from __future__ import annotations

import json
import logging
import time
from pathlib import Path

log = logging.getLogger(__name__)

STAGES = ("admit", "encode", "prefill", "decode", "ship", "answer", "store", "first_token")


class StepTrace:
    """Collects one record per step; `stage(name)` closes the stage that began at the last
    mark. Not thread-safe: the engine thread only."""

    def __init__(self, path: Path, flush_every: int = 512) -> None:
        self.path = path
        self.flush_every = flush_every
        self._origin = time.perf_counter()
        self._pending: list[str] = []
        self._record: dict[str, float | int] = {}
        self._mark = 0.0
        self._notes: dict[str, list[str]] = {}
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text("")  # one trace per process run
        log.info("tracing engine steps to %s", path)

    def begin(self) -> None:
        self._notes = {}
        now = time.perf_counter()
        self._record = {"t": round(now - self._origin, 6), **dict.fromkeys(STAGES, 0.0)}
        self._mark = now

    def stage(self, name: str) -> None:
        """Add the time since the previous mark to stage `name` (a stage may recur)."""
        now = time.perf_counter()
        self._record[name] = round(float(self._record[name]) + 1000 * (now - self._mark), 3)
        self._mark = now

    def note(self, kind: str, request_id: str) -> None:
        """Record that `request_id` reached `kind` ("admitted", "first") in this step."""
        self._notes.setdefault(kind, []).append(request_id)

    def end(self, **counts: int) -> None:
        """Close the step's record; an idle step (the loop wakes every 0.5 s with nothing
        to do) leaves none."""
        if self._notes or any(counts.values()):
            self._pending.append(json.dumps({**self._record, **counts, **self._notes}))
        self._notes = {}
        if len(self._pending) >= self.flush_every:
            self.flush()

    def flush(self) -> None:
        if not self._pending:
            return
        try:
            with self.path.open("a") as out:
                out.write("\n".join(self._pending) + "\n")
        except OSError as exc:  # a diagnostic: never fail serving over it
            log.warning("could not write the step trace: %s", exc)
        self._pending = []
