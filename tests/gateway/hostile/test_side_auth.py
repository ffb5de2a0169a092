"""Auth on the side endpoints of the shared `hostile` server (their refusals without a key,
or with the wrong one, are rows of the hostile table).

Pinned invariant: /health is open to anyone; /metrics answers its own key
(--metrics-api-key).
"""

from __future__ import annotations

import httpx
from support import ServerProcess

from tests.gateway.hostile.server import METRICS_KEY


def test_health_needs_no_key_and_metrics_take_only_the_metrics_key(hostile: ServerProcess) -> None:
    """Invariant: /health is open; /metrics answers its own key (--metrics-api-key)."""
    health = httpx.get(hostile.base_url + "/health", timeout=10)
    assert health.status_code == 200 and health.json()["status"] == "ok"
    metrics = httpx.get(
        hostile.base_url + "/metrics",
        headers={"Authorization": f"Bearer {METRICS_KEY}"},
        timeout=10,
    )
    assert metrics.status_code == 200
    assert "vision_gateway_running_requests" in metrics.text
