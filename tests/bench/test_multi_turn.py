"""`bench multi-turn`'s arithmetic on synthetic timings (the run itself needs servers: see
docs/performance.md 8i). Pinned: the table row's warm figures leave out turn 1, the cached
share sums tokens over warm turns, answers that differ in a token or a logprob are counted.
"""

from __future__ import annotations

from types import SimpleNamespace

from bench.multi_turn import answers_differ, per_turn, row
from bench.timing import StreamTiming


def _turn(ttft: float, cached: int, prompt: int, tokens: list[str]) -> StreamTiming:
    t = StreamTiming(start=0.0, token_times=[ttft, ttft + 0.01])
    t.usage = SimpleNamespace(
        prompt_tokens=prompt, prompt_tokens_details=SimpleNamespace(cached_tokens=cached)
    )
    t.token_ids, t.logprobs = tokens, [-0.5] * len(tokens)
    return t


def _result(warm_ttft: float, last: str = "b") -> dict:
    conv = [_turn(0.5, 0, 100, ["a"]), _turn(warm_ttft, 90, 100, ["a", last])]
    gaps = {"step_ms": 3.0, "median_gap_ms": 3.5, "p99_gap_ms": 9.0, "max_gap_ms": 12.0}
    return {"conversations": [conv], "during": [conv[1]], **gaps, "answer_blocks_during": 4}


def test_the_row_reports_warm_turns_only() -> None:
    line = row("answer prefill", _result(0.02))
    assert "| 500.0 | 20.0 | 90 / 100 (90.0%) |" in line
    assert line.endswith("| 3.0 | 3.5 | 9.0 | 12.0 | 4 |")
    assert [t["turn"] for t in per_turn(_result(0.02))] == [1, 2]


def test_differing_answers_are_counted() -> None:
    assert answers_differ(_result(0.02), _result(0.03)) == 0  # timing is no answer
    assert answers_differ(_result(0.02), _result(0.02, last="c")) == 2  # (turn and "during")
