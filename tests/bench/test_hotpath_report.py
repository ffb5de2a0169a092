"""The hotpath bench's arithmetic: ratios, targets, the table, stream timing (no MLX, no HTTP)."""

from __future__ import annotations

import asyncio
import math
from types import SimpleNamespace

import pytest

from bench.hotpath_client import Stream, aggregate_tok_s, median, server_timing
from bench.hotpath_report import Row, brief, failed, meets, ratio, report, table


def test_ratio_needs_two_finite_numbers_and_a_positive_reference() -> None:
    assert ratio(30.0, 20.0) == pytest.approx(1.5)
    assert ratio(None, 20.0) is None
    assert ratio(30.0, None) is None
    assert ratio(30.0, 0.0) is None
    assert ratio(math.nan, 20.0) is None
    assert ratio(30.0, math.inf) is None


def test_targets() -> None:
    assert meets(1.1, "<= 1.2") is True
    assert meets(1.3, "<= 1.2") is False
    assert meets(4.0, ">= 4") is True
    assert meets(None, "<= 1.2") is None
    assert meets(1.0, "") is None
    with pytest.raises(ValueError):
        meets(1.0, "about 1")


def test_row_ratio_met_and_json() -> None:
    row = Row("k", "decode", "tok/s", 90.0, 100.0)
    assert row.ratio == pytest.approx(0.9)
    assert row.met is None
    data = row.as_dict()
    assert data["ratio"] == pytest.approx(0.9) and data["raw"] == 100.0 and data["key"] == "k"
    gain = Row("g", "gain", "x", 5.0, target=">= 4")
    assert gain.ratio is None and gain.met is True


def test_failed_row_carries_the_error_and_no_value() -> None:
    row = failed("decode", "decode", "tok/s", RuntimeError("boom"))
    assert row.gateway is None and row.ratio is None
    assert row.note == "ERROR RuntimeError: boom"


def test_table_and_report() -> None:
    rows = [
        Row("a", "warm TTFT", "ms", 12.0, 10.0, note="n"),
        Row("b", "first / later", "x", 2.0, target="<= 1.5"),
        failed("c", "broken", "ms", "server said no"),
    ]
    text = table(rows)
    lines = text.splitlines()
    assert len(lines) == 2 + len(rows)
    assert "| warm TTFT | ms | 10.0 | 12.0 | 1.20x |  | n |" in lines
    assert "<= 1.5 MISSED" in lines[3]
    assert "| broken | ms | - | - | - |" in lines[4]
    payload = report(rows, model="m")
    assert payload["model"] == "m" and payload["table"] == text
    assert [r["ratio"] for r in payload["rows"]] == [pytest.approx(1.2), None, None]


def test_stream_timing() -> None:
    s = Stream(start=10.0, role=10.005, first=10.02, last=11.02, completion_tokens=101)
    assert s.ttft_ms == pytest.approx(20.0)
    assert s.role_ms == pytest.approx(5.0)
    assert s.tok_s == pytest.approx(100.0)  # 100 tokens after the first, in 1 s
    assert Stream(start=0.0).tok_s is None and Stream(start=0.0).ttft_ms is None


def test_aggregate_is_all_tokens_over_first_first_to_last_last() -> None:
    a = Stream(start=0.0, first=1.0, last=2.0, completion_tokens=10)
    b = Stream(start=0.0, first=1.5, last=3.0, completion_tokens=30)
    assert aggregate_tok_s([a, b]) == pytest.approx(40 / 2.0)
    assert aggregate_tok_s([a, Stream(start=0.0, error="x")]) is None
    assert aggregate_tok_s([]) is None


def test_helpers() -> None:
    assert server_timing("read;dur=1.5, media;dur=20.0,bogus") == {"read": 1.5, "media": 20.0}
    assert median([3.0, None, 1.0, 2.0]) == 2.0
    assert median([None]) is None


def test_plot_writes_a_png(tmp_path) -> None:
    pytest.importorskip("matplotlib")
    from bench.hotpath_report import plot

    rows = [Row("a", "t", "ms", 12.0, 10.0), Row("b", "g", "x", 0.5), Row("c", "n", "s", 1.0)]
    assert plot(rows, str(tmp_path / "p.png"))
    assert (tmp_path / "p.png").stat().st_size > 1000
    assert not plot([Row("c", "n", "s", 1.0)], str(tmp_path / "q.png"))


def test_brief_line_and_round_trip() -> None:
    row = Row("a", "warm TTFT", "ms", 12.0, 10.0)
    assert brief(row) == "warm TTFT: 12.0 ms (raw 10.0, 1.20x)"
    gain = Row("g", "gain", "x", 5.0, target=">= 4")
    assert brief(gain) == "gain: 5.00x [target >= 4: True]"
    assert Row.from_dict(gain.as_dict()) == gain
    assert "SKIPPED" in brief(failed("s", "late", "-", "SKIPPED: over the time budget"))


class _FakeCompletions:
    """`chat.completions.with_raw_response.create` of an SDK client, scripted: refuses
    `ignore_eos` (as a server without the field would, with a 400) and otherwise streams a
    role chunk, `max_tokens` content chunks and a usage chunk."""

    def __init__(self) -> None:
        self.with_raw_response = self
        self.calls: list[dict] = []

    async def create(self, **kw: object) -> SimpleNamespace:
        self.calls.append(kw)
        if "ignore_eos" in str(kw.get("extra_body")):
            raise RuntimeError("400: unknown field ignore_eos")
        n = int(kw["max_tokens"])  # type: ignore[call-overload]

        def chunk(role=None, content=None, usage=None) -> SimpleNamespace:
            delta = SimpleNamespace(role=role, content=content)
            choice = SimpleNamespace(delta=delta, logprobs=None, finish_reason=None)
            return SimpleNamespace(choices=[] if usage else [choice], usage=usage)

        async def chunks():  # noqa: ANN202
            yield chunk(role="assistant", content="")
            for i in range(n):
                yield chunk(content=f"t{i}")
            yield chunk(usage=SimpleNamespace(completion_tokens=n, prompt_tokens=9))

        headers = {"server-timing": "read;dur=0.5"}
        return SimpleNamespace(headers=headers, parse=chunks)


def _scenarios(deadline: float = float("inf")):  # noqa: ANN202
    from bench.hotpath import QUICK
    from bench.hotpath_client import ImageFiles
    from bench.hotpath_scenarios import Scenarios

    completions = _FakeCompletions()
    client = SimpleNamespace(chat=SimpleNamespace(completions=completions))
    lines: list[str] = []
    return Scenarios(client, ImageFiles(), QUICK, {}, lines.append, deadline), completions


def test_a_server_without_ignore_eos_degrades_to_plain_requests() -> None:
    bench, completions = _scenarios()
    streams = asyncio.run(bench.decode_wave(3, 5))
    assert bench.ignore_eos is False
    assert [s.error for s in streams] == [None] * 3
    assert [s.completion_tokens for s in streams] == [5] * 3
    assert streams[0].server_timing == {"read": 0.5} and streams[0].text == "t0t1t2t3t4"
    assert len(completions.calls) == 6  # refused once each, then resent without the field
    bench.files.close()


def test_scenarios_past_the_budget_are_skipped_not_run() -> None:
    bench, completions = _scenarios(deadline=-math.inf)
    rows = asyncio.run(bench.run_all())
    assert rows and all(r.gateway is None and r.note.startswith("SKIPPED") for r in rows)
    assert completions.calls == []
    bench.files.close()


def test_drift_rows_flag_a_machine_that_moved() -> None:
    """Invariant: raw decode after / before per batch; beyond 15% the note says the call's
    decode ratios are suspect; a failed re-check leaves the ratio empty with its error."""
    from bench.hotpath import drift_rows

    before = {"decode_tok_s_b1": 100.0, "decode_tok_s_b16": 1000.0}
    rows = drift_rows(before, {"decode_tok_s_b1": 95.0, "decode_tok_s_b16": 700.0}, (1, 16))
    assert [r.key for r in rows] == ["raw_drift_b1", "raw_drift_b16"]
    assert rows[0].gateway == 0.95 and "drifted" not in rows[0].note
    assert rows[1].gateway == 0.7 and "drifted" in rows[1].note
    failed = drift_rows(before, {"error": "raw ceiling exited with 1"}, (1,))
    assert failed[0].gateway is None and failed[0].note == "raw ceiling exited with 1"
