"""docs/investigations/decode_alternate.py: the engine's step period read from a step trace.

Pinned: only consecutive plain decode steps of exactly n rows count (a step that prefilled or
took a join, and the gap into or out of it, is not a decode step's period)."""

from __future__ import annotations

import json
from pathlib import Path

from docs.investigations.decode_alternate import engine_step_ms


def test_engine_step_ms_counts_plain_steps_of_n_rows_only(tmp_path: Path) -> None:
    steps = [
        {"t": 0.000, "rows": 1, "tokens": 1},
        {"t": 0.010, "rows": 1, "tokens": 1},
        {"t": 0.020, "rows": 1, "tokens": 1},
        {"t": 0.100, "rows": 2, "tokens": 1, "joined": 1, "prefill": 40.0},  # a join
        {"t": 0.150, "rows": 2, "tokens": 2},
        {"t": 0.162, "rows": 2, "tokens": 2},
        {"t": 0.174, "rows": 2, "tokens": 2},
    ]
    trace = tmp_path / "steps.jsonl"
    trace.write_text("\n".join(json.dumps(s) for s in steps) + "\n")
    assert engine_step_ms(trace, [1, 2, 4]) == {"1": 10.0, "2": 12.0, "4": None}
