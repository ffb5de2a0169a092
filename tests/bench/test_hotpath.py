"""`bench hotpath --quick` and `bench engine --raw` end to end on the tiny model (CPU).

Pinned: every figure is present, positive, and paired with raw MLX (a ratio) or a target; the
raw ceiling ran first in the same command, and its decode again after the server (the drift
check, a ratio of raw to raw); the JSON and the plot are written.
"""

from __future__ import annotations

import importlib.util
import json

from support import tiny_model

from bench.cli import main

RAW_ROWS = (
    "text_first_request_ms",
    "text_first_request_sdk_ms",
    "text_first_token_ms",
    "text_first_token_plain_ms",
    "image_first_request_ms",
    "image_cold_ms",
    "warm_ttft_path_ms",
    "warm_ttft_uri_ms",
    "warm_ttft_path_again_ms",
    "decode_agg_tok_s_1",
    "decode_steady_tok_s_1",
    "decode_stream_tok_s_1",
    "decode_agg_tok_s_4",
    "decode_steady_tok_s_4",
    "decode_stream_tok_s_4",
    "decode_agg_tok_s_4_t0.7",
    "decode_steady_tok_s_4_t0.7",
    "decode_agg_tok_s_4_plain",
    "decode_steady_tok_s_4_plain",
    "decode_stream_tok_s_4_plain",
)
TARGET_ROWS = (
    "text_first_vs_later",
    "image_first_vs_later",
    "wave_first_vs_second",
    "new_size_first_vs_later",
    "image_batch_gain",
)
DRIFT_ROWS = ("raw_drift_b1", "raw_drift_b4")


def test_hotpath_quick_reports_every_figure(tmp_path, capsys) -> None:
    out, png = tmp_path / "hotpath.json", tmp_path / "hotpath.png"
    model = str(tiny_model("qwen2_vl"))
    has_plot = importlib.util.find_spec("matplotlib") is not None  # the bench extra
    plot = ["--plot", str(png)] if has_plot else []  # without it --plot is refused up front
    main(["hotpath", "--quick", "--model", model, "--out", str(out), *plot])
    printed = capsys.readouterr().out
    data = json.loads(out.read_text())
    rows = {r["key"]: r for r in data["rows"]}
    assert set(RAW_ROWS) | set(TARGET_ROWS) | set(DRIFT_ROWS) | {"server_ready_s"} == set(rows)
    for key in RAW_ROWS:
        row = rows[key]
        assert row["gateway"] > 0 and row["raw"] > 0, row
        assert row["ratio"] == row["gateway"] / row["raw"]
        assert "ERROR" not in row["note"], row
    for key in TARGET_ROWS:
        assert rows[key]["gateway"] > 0 and rows[key]["met"] is not None, rows[key]
    assert data["raw"]["decode_tok_s_b4"] > 0 and data["raw"]["settings"]["batches"] == [1, 4]
    after = data["raw_after"]
    assert after["decode_tok_s_b4"] > 0 and "warm_ttft_ms" not in after  # decode only
    for key in DRIFT_ROWS:
        batch = key.rsplit("b", 1)[1]
        want = after[f"decode_tok_s_b{batch}"] / data["raw"][f"decode_tok_s_b{batch}"]
        assert rows[key]["gateway"] == want and rows[key]["raw"] is None, rows[key]
    assert printed.index("server ready") < printed.index("raw decode 4 rows: after")
    assert data["details"]["clean_shutdown"] is True
    assert data["machine"]["cpus"] and data["model"] == model and data["args"]["quick"] == "True"
    assert data["seconds"] < 240
    turns = data["details"]["conversation_path"]
    assert turns[1]["cached_tokens"] > 0  # turn 2 really was warm
    assert "read" in turns[1]["server_timing_ms"]
    # raw ran before the server: its progress comes first in the output
    assert printed.index("raw ceiling") < printed.index("server ready")
    assert "| what | unit | raw | gateway |" in printed
    if has_plot:
        assert png.stat().st_size > 1000


def test_engine_raw_prints_ratios(tmp_path, capsys) -> None:
    out = tmp_path / "engine.json"
    model = str(tiny_model("qwen2_vl"))
    argv = ["engine", "--raw", "--model", model, "--batch", "1", "2"]
    main([*argv, "--decode-tokens", "6", "--reps", "1", "--image-size", "56", "--out", str(out)])
    printed = capsys.readouterr().out
    data = json.loads(out.read_text())
    for key in ("text_first_token_ms", "decode_tok_s_b1", "decode_tok_s_b2"):
        assert data[key] > 0 and data["raw"][key] > 0, key
    assert data["decode_short_rows_b2"] >= 0
    assert "| decode, batch 2: aggregate | tok/s |" in printed
    assert printed.index("raw: decode batch") < printed.index("engine: decode batch")
