"""The step-trace reader (bench/steps.py), on a synthetic trace.

Pinned: a wave ends at the step after which the engine is idle; the ramp is the steps up to
the last join; the steady figures use only steps where every row decoded; a gzip-compressed
trace reads the same as the plain file.
"""

from __future__ import annotations

import gzip
import json
from pathlib import Path

from bench.steps import load, summarize, waves


def _step(t: float, rows: int, joined: int, tokens: int, decode: float, **kw: int) -> dict:
    queues = {"prefilling": 0, "encoding": 0, "waiting": 0} | kw
    times = {"admit": 0.1, "encode": 0.0, "prefill": 5.0 if joined else 0.0, "ship": 0.1}
    return {"t": t, **times, "decode": decode, "rows": rows, "joined": joined,
            "tokens": tokens, **queues}  # fmt: skip


TRACE = [
    _step(0.00, 2, 2, 0, 20.0, prefilling=1),  # wave 1: two join, one still prefilling
    _step(0.03, 3, 1, 2, 20.0),
    _step(0.06, 3, 0, 3, 10.0),
    _step(0.07, 3, 0, 3, 12.0),
    _step(0.09, 0, 0, 3, 10.0),  # every row finished: idle after this step
    _step(5.00, 1, 1, 0, 9.0),  # wave 2: one request alone
    _step(5.01, 0, 0, 1, 9.0),
]


def test_waves_split_at_idle_and_summaries_count_the_ramp(tmp_path: Path) -> None:
    first, second = waves(TRACE)
    assert len(first) == 5 and len(second) == 2
    summary = summarize(first)
    assert summary["peak_rows"] == 3 and summary["tokens"] == 11
    assert summary["join_steps"] == 2 and summary["ramp_steps"] == 2
    assert summary["full_steps"] == 3 and summary["full_decode_ms"] == 10.0
    assert summary["prefill_ms"] == 10.0
    plain, packed = tmp_path / "t.jsonl", tmp_path / "t.jsonl.gz"
    text = "\n".join(json.dumps(s) for s in TRACE) + "\n"
    plain.write_text(text)
    packed.write_bytes(gzip.compress(text.encode()))
    assert load(plain) == load(packed) == TRACE
