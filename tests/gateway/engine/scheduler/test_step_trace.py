"""The engine's step trace (`serve --step-trace FILE`, gateway.engine.scheduler.step_trace).

Pinned here: one JSON line per engine step, with every stage's time, and counts that add up
to what was served (tokens emitted by decode steps + first tokens == completion tokens; rows
joined == requests that decoded past their first token; each request admitted and given its
first token once; idle wake-ups leave no record); a write failure never fails serving; an
image request's prefill is split into its forwards, the store of its image part and its first
token, in the step that gave it.
"""

from __future__ import annotations

import json
from pathlib import Path

from support import EngineHarness, chat_body, noise_image

from gateway.config import CacheConfig
from gateway.engine.scheduler.step_trace import STAGES, StepTrace


def test_trace_counts_add_up_to_what_was_served(tmp_path: Path) -> None:
    path = tmp_path / "trace" / "steps.jsonl"
    harness = EngineHarness(
        "qwen2_5_vl", cache=CacheConfig(prefix_enabled=False), max_batch=4, step_trace=path
    )
    try:
        runs = [harness.submit(chat_body(f"story number {i}", max_tokens=6)) for i in range(3)]
        done = [r.wait() for r in runs]
    finally:
        harness.close()  # stop() flushes the trace
    records = [json.loads(line) for line in path.read_text().splitlines()]
    assert records, "no steps traced"
    for record in records:
        assert set(STAGES) <= record.keys()
        assert all(record[s] >= 0 for s in STAGES)
    counts = ("rows", "joined", "prefilling", "encoding", "waiting", "tokens")
    assert all(any(r[k] for k in counts) or "admitted" in r or "first" in r for r in records)
    times = [r["t"] for r in records]
    assert times == sorted(times)
    completion = sum(run.finish.usage.completion_tokens for run in done)
    # Each request's first token comes from its prefill, the rest from decode steps.
    assert sum(r["tokens"] for r in records) == completion - len(done)
    assert sum(r["joined"] for r in records) == len(done)
    assert records[-1]["rows"] == 0
    ids = {f"req-{i + 1}" for i in range(3)}
    assert {i for r in records for i in r.get("admitted", [])} == ids
    assert sorted(i for r in records for i in r.get("first", [])) == sorted(ids)


def test_the_prefill_splits_into_forwards_store_and_first_token(tmp_path: Path) -> None:
    path = tmp_path / "steps.jsonl"
    harness = EngineHarness("qwen2_5_vl", max_batch=4, step_trace=path)
    try:
        harness.run(chat_body("what is it?", images=1, max_tokens=4), [noise_image(1, 112, 112)])
    finally:
        harness.close()
    records = [json.loads(line) for line in path.read_text().splitlines()]
    [first] = [r for r in records if r.get("first")]
    # The image part is stored in the step of its last block here (a tiny prompt): that
    # step's forwards, store and first token are each timed apart.
    assert first["prefill"] > 0 and first["store"] > 0 and first["first_token"] > 0
    assert all(r["store"] == 0 and r["first_token"] == 0 for r in records if r is not first)


def test_an_unwritable_trace_never_fails_serving(tmp_path: Path) -> None:
    trace = StepTrace(tmp_path / "steps.jsonl", flush_every=1)
    trace.path = tmp_path  # a directory: every write fails
    trace.begin()
    trace.stage("admit")
    trace.end(rows=1)  # flushes, logs a warning, keeps going
    assert trace._pending == []
