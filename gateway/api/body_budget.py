"""A byte budget for request bodies being read at once, across all requests.

Each request may send up to --max-body-bytes, but many large uploads arriving together would
each hold their bytes (and the parsed JSON) at the same time. The budget bounds the sum: a
request reserves what its Content-Length announces before reading (a chunked body reserves as
it arrives) and gives it back once the body is parsed. A reservation that does not fit is a
429 with Retry-After, before any byte of that body is held.
"""

from __future__ import annotations

from gateway.errors import APIError
from gateway.metrics import EdgeMetrics


class BodyBudget:
    """Bytes reserved by bodies being read. Event-loop thread only (no locking needed).

    `reserve(n)` raises APIError 429 when `n` more bytes would exceed the capacity; every
    successful reservation must be matched by `release` with the same count.
    """

    def __init__(self, capacity_bytes: int, metrics: EdgeMetrics | None = None) -> None:
        self.capacity_bytes = capacity_bytes
        self.reserved = 0
        self._metrics = metrics

    def reserve(self, n: int) -> None:
        if self.reserved + n > self.capacity_bytes:
            if self._metrics is not None:
                self._metrics.body_budget_refusals.inc()
            raise APIError(
                429,
                f"the server is reading {self.reserved} bytes of other request bodies; this one "
                f"would pass the budget of {self.capacity_bytes} bytes for bodies being read at "
                "once (--max-inflight-body-mb); retry shortly",
                "rate_limit_error",
                code="body_budget_exhausted",
                headers={"Retry-After": "1"},
            )
        self._set(self.reserved + n)

    def release(self, n: int) -> None:
        self._set(self.reserved - n)

    def _set(self, value: int) -> None:
        self.reserved = value
        if self._metrics is not None:
            self._metrics.body_bytes_reading.set(value)
