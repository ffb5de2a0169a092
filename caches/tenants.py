"""Per-tenant counters of one cache, for `/v1/cache/stats`' `tenants` section.

A tenant is the name of the API key a request came with when the server scopes its caches
by tenant (caches/scope.py); "" is the shared scope, reported as `SHARED`. Lookups are
counted here as the cache decides them; entries and bytes come from the cache's own books at
report time. Thread-safe (one lock); no MLX.
"""

from __future__ import annotations

import threading
from collections.abc import Mapping

SHARED = "(shared)"  # how the shared scope's tenant "" is named in reports


class TenantCounters:
    """queries / hits (and, for the prefix cache, tokens queried / hit) per tenant."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._counts: dict[str, list[int]] = {}  # tenant -> [queries, hits, tokens_q, tokens_h]

    def count(self, tenant: str, hit: bool, tokens: int = 0, tokens_hit: int = 0) -> None:
        """One lookup of `tenant`: a hit or not, and the prompt tokens it asked and got."""
        with self._lock:
            c = self._counts.setdefault(tenant, [0, 0, 0, 0])
            c[0] += 1
            c[1] += hit
            c[2] += tokens
            c[3] += tokens_hit

    def report(
        self, held: Mapping[str, tuple[int, int]], tokens: bool = False
    ) -> dict[str, dict[str, int]]:
        """Per tenant (`SHARED` for ""): queries, hits, entries and bytes (`held`: the cache's
        (entries, bytes) per tenant), and with `tokens` tokens_queried and tokens_hit."""
        with self._lock:
            counts = {t: list(c) for t, c in self._counts.items()}
        out: dict[str, dict[str, int]] = {}
        for tenant in sorted(set(counts) | set(held)):
            q, h, tq, th = counts.get(tenant, [0, 0, 0, 0])
            entries, nbytes = held.get(tenant, (0, 0))
            row = {"queries": q, "hits": h, "entries": entries, "bytes": nbytes}
            if tokens:
                row |= {"tokens_queried": tq, "tokens_hit": th}
            out[tenant or SHARED] = row
        return out
