"""The table benches' arithmetic and reports (no server, no MLX).

Invariants: percentiles interpolate between ranks and skip what was not measured; a wave's
aggregate is the median wave's, scaling is relative to the same mode's lowest level and the
raw ratio only exists where raw measured the same batch; unmeasured cells read n/a; cold
images never share pixels across seeds or runs; side-by-side tables keep every column.
"""

from __future__ import annotations

import base64
import io
import json

import pytest
from PIL import Image

from bench import compare, concurrency, resolution, text_prefix
from bench.hotpath_client import Stream
from bench.report import fmt, percentile, ratio
from bench.workload import image_uri


def test_percentile_interpolates_and_skips_missing() -> None:
    assert percentile([1, 2, 3, 4, 5], 0.5) == 3
    assert percentile([10, 20], 0.95) == pytest.approx(19.5)
    assert percentile([None, 5.0, float("nan")], 0.95) == 5.0
    assert percentile([None], 0.5) is None


def test_missing_figures_read_na() -> None:
    assert fmt(None) == "n/a" and fmt(float("nan")) == "n/a" and fmt(2.345, 2, "x") == "2.35x"
    assert ratio(1.0, None) is None and ratio(1.0, 0.0) is None and ratio(3.0, 2.0) == 1.5


def _stream(start: float, first: float, last: float, tokens: int, error: str | None = None):
    return Stream(
        start=start, first=first, last=last, completion_tokens=tokens, prompt_tokens=50, error=error
    )


def test_wave_summary_median_wave_and_raw_ratio() -> None:
    fast = (0.0, [_stream(0.0, 0.1, 1.1, 101), _stream(0.0, 0.1, 1.1, 101)])  # 202 tok / 1 s
    slow = (5.0, [_stream(5.0, 5.2, 7.2, 101), _stream(5.0, 5.2, 7.2, 101)])  # 101 tok/s
    mid = (9.0, [_stream(9.0, 9.1, 10.6, 101), _stream(9.0, 9.1, 10.6, 101)])
    row = concurrency.wave_summary("text", 2, [fast, slow, mid], {"decode_tok_s_b2": 269.33})
    assert row["aggregate_decode_tok_s"] == pytest.approx(202 / 1.5)
    assert row["vs_raw"] == pytest.approx(202 / 1.5 / 269.33)
    assert row["ttft_p50_ms"] == pytest.approx(100.0)
    assert row["ok"] == row["requests"] == 6
    image = concurrency.wave_summary("image", 2, [fast], {"decode_tok_s_b2": 1.0})
    assert image["raw_decode_tok_s"] is None and image["vs_raw"] is None


def test_failed_stream_is_counted_not_averaged() -> None:
    broken = (0.0, [_stream(0.0, 0.1, 1.1, 101), Stream(start=0.0, error="HTTP 500: boom")])
    row = concurrency.wave_summary("text", 2, [broken], {})
    assert row["ok"] == 1 and row["requests"] == 2 and row["errors"] == ["HTTP 500: boom"]
    assert row["aggregate_decode_tok_s"] is None  # a wave with a failure has no aggregate
    assert "1/2" in concurrency.markdown(concurrency.add_scaling([row]))


def test_scaling_is_per_mode_from_the_lowest_level() -> None:
    rows = [
        {"mode": "text", "streams": 1, "aggregate_decode_tok_s": 100.0},
        {"mode": "text", "streams": 16, "aggregate_decode_tok_s": 400.0},
        {"mode": "image", "streams": 1, "aggregate_decode_tok_s": 50.0},
        {"mode": "image", "streams": 16, "aggregate_decode_tok_s": None},
    ]
    scaled = concurrency.add_scaling(rows)
    assert [r["scaling_vs_1"] for r in scaled] == [1.0, 4.0, 1.0, None]


def _pixels(uri: str) -> bytes:
    data = base64.b64decode(uri.split(",", 1)[1])
    return Image.open(io.BytesIO(data)).convert("RGB").tobytes()


def test_cold_images_never_share_pixels() -> None:
    assert _pixels(image_uri(64, 1, nonce=7)) == _pixels(image_uri(64, 1, nonce=7))
    seen = {_pixels(image_uri(64, seed, nonce=7)) for seed in range(40)}
    seen.add(_pixels(image_uri(64, 1, nonce=8)))  # another run, same seed
    assert len(seen) == 41


def test_tables_say_na_where_a_server_reports_nothing() -> None:
    empty = {k: None for k in ("prompt_tokens", "warm_cached_tokens", "generated_tokens")}
    row = {
        **empty, "image_size": 224, "cold_ttft_ms": 30.0, "warm_ttft_ms": None,
        "cold_over_warm": None, "decode_tok_s": None,
    }  # fmt: skip
    assert "| 224x224 | n/a | 30.0 | n/a | n/a |" in resolution.markdown([row])
    summary = {
        **empty, "cold_ttft_ms": 90.0, "cold_ttft_p95_ms": 99.0, "warm_ttft_ms": 9.0,
        "warm_ttft_p95_ms": 10.0, "cold_over_warm": 10.0, "decode_tok_s": 5.0,
    }  # fmt: skip
    assert "| n/a | 90.0 / 99.0 | 9.0 / 10.0 | 10.0x |" in text_prefix.markdown(summary)


def test_side_by_side_adds_a_backend_column(tmp_path) -> None:
    table = "| a | b |\n|---|---|\n| 1 | 2 |\n| 3 | 4 |"
    merged = compare.side_by_side({"ours 1": table, "peer 2": "| a | b |\n|---|---|\n| 5 | 6 |"})
    assert merged.splitlines() == [
        "| backend | a | b |",
        "|---|---|---|",
        "| ours 1 | 1 | 2 |",
        "| ours 1 | 3 | 4 |",
        "| peer 2 | 5 | 6 |",
    ]
    a, b = tmp_path / "a.json", tmp_path / "b.json"
    a.write_text(json.dumps({"scenario": "resolution", "table": table}))
    b.write_text(json.dumps({"scenario": "stall", "table": table}))
    with pytest.raises(SystemExit, match="one scenario"):
        compare.main([str(a), str(b)])
