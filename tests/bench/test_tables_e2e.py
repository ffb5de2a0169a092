"""`bench resolution | text-prefix | concurrency | repeat-image | stall` end to end on CPU.

Against our server (tiny model) through `--base-url`, exactly as a peer is measured, and once
with the server started by the bench. Pinned: every figure the table promises is there, the
metadata names the backend, model, dtype and cache state, warm requests really were served
from cache (cached tokens, not timings: speed claims live in docs), raw mlx-lm sits next to
the concurrency figures at the same batch sizes, and the JSON and markdown are written.
"""

from __future__ import annotations

import importlib.util
import json

import pytest
from support import LocalServer, tiny_model

from bench.cli import main

HAS_PLOT = importlib.util.find_spec("matplotlib") is not None


@pytest.fixture(scope="module")
def server():
    model = tiny_model("qwen2_vl")
    # 8-token exact-reuse blocks: these small images' prompts are a few dozen tokens.
    args = ["--model", str(model), "--served-model-name", "tiny", "--kv-block-tokens", "8"]
    with LocalServer(args) as s:
        yield s, model


def _run(tmp_path, argv: list[str]) -> dict:
    out = tmp_path / "out.json"
    main([*argv, "--out", str(out), "--markdown", str(tmp_path / "t.md")])
    data = json.loads(out.read_text())
    assert (tmp_path / "t.md").read_text().strip() == data["table"].strip()
    return data


def _remote(server) -> list[str]:
    s, model = server
    return ["--base-url", s.base_url, "--model", "tiny", "--raw-model", str(model)]


def test_resolution_through_base_url(server, tmp_path) -> None:
    png = tmp_path / "r.png"
    args = ["resolution", *_remote(server)[:4], "--sizes", "56", "112", "--reps", "2"]
    plot = ["--plot", str(png)] if HAS_PLOT else []  # without matplotlib --plot is refused
    data = _run(tmp_path, [*args, "--max-tokens", "4", *plot])
    assert data["backend"]["name"] == "vision-gateway" and data["backend"]["ours"] is True
    assert data["cache_state"]["cleared_at_start"] is True
    assert data["cache_state"]["stats_after"]["vision"]["misses"] > 0
    assert [r["image_size"] for r in data["rows"]] == [56, 112]
    for row in data["rows"]:
        assert row["cold_ttft_ms"] > 0 and row["warm_ttft_ms"] > 0 and not row["errors"]
        assert 0 < row["warm_cached_tokens"] < row["prompt_tokens"]  # the image came from cache
        assert row["generated_tokens"] == 4 and row["decode_tok_s"] > 0
    assert png.exists() == HAS_PLOT


def test_text_prefix_calibrates_and_hits(server, tmp_path) -> None:
    data = _run(
        tmp_path,
        ["text-prefix", *_remote(server)[:4], "--prefix-tokens", "96", "--reps", "2",
         "--max-tokens", "4"],
    )  # fmt: skip
    result = data["result"]
    assert 96 <= result["prompt_tokens"] <= 96 + 30  # system prompt + the question's turn
    assert result["warm_cached_tokens"] >= 90  # the shared system prompt came from cache
    assert result["cold_ttft_ms"] > 0 and result["warm_ttft_ms"] > 0 and not result["errors"]
    assert data["model"]["name"] == "tiny"


def test_concurrency_starts_its_server_and_measures_raw(tmp_path) -> None:
    model = tiny_model("qwen2_vl")
    data = _run(
        tmp_path,
        ["concurrency", "--model", str(model), "--levels", "1", "2", "--max-tokens", "8",
         "--image-size", "56", "--reps", "2"],
    )  # fmt: skip
    assert data["raw"]["settings"]["batches"] == [1, 2]
    assert data["model"]["architecture"] == "qwen2_vl" and data["model"]["dtype"]
    assert data["client_machine"]["cpus"] and data["settings"]["levels"] == [1, 2]
    rows = {(r["mode"], r["streams"]): r for r in data["rows"]}
    assert set(rows) == {("text", 1), ("text", 2), ("image", 1), ("image", 2)}
    for (mode, n), row in rows.items():
        assert row["ok"] == row["requests"] == 2 * n and row["waves"] == 2
        assert row["generated_tokens"] == 8  # ignore_eos honoured: exact lengths
        assert row["ttft_p95_ms"] >= row["ttft_p50_ms"] > 0
        assert row["aggregate_decode_tok_s"] > 0 and row["per_stream_decode_tok_s"] > 0
        assert (row["vs_raw"] is not None) == (mode == "text")
    assert rows[("text", 1)]["scaling_vs_1"] == 1.0


def test_repeat_image_and_stall_through_base_url(server, tmp_path) -> None:
    remote = _remote(server)[:4]
    data = _run(
        tmp_path,
        ["repeat-image", *remote, "--images", "1", "--image-size", "56", "--max-tokens", "4",
         "--think-ms", "20"],
    )  # fmt: skip
    result = data["results"]["as served"]
    assert result["cached_tokens"]["2"][0] > 0 and data["mismatches"] == {}
    assert data["think_ms"] == 20.0  # turns 2-5 paced as a person reads
    assert data["backend"]["ours"] is True and "as served" in data["table"]
    data = _run(
        tmp_path,
        ["stall", *remote, "--streams", "2", "--image-size", "56", "--max-tokens", "48"],
    )
    (row,) = data["rows"]
    assert row["prefill_chunk"] is None and len(row["image_ttft_ms"]) == 1
    assert row["image_ttft_ms"][0] > 0 and row["gap_ratio"] > 0
    assert row["tokens_per_step"] > 0  # our /metrics: available through --base-url too


def test_load_through_base_url(server, tmp_path) -> None:
    """The load bench drives a server it did not start (bounded: 2 clients, 3 s)."""
    s, _ = server
    out = tmp_path / "load.json"
    main(
        ["load", "--base-url", s.base_url, "--model", "tiny", "--clients", "2",
         "--seconds", "3", "--image-size", "56", "--image-pool", "2", "--out", str(out)]
    )  # fmt: skip
    data = json.loads(out.read_text())
    assert data["outcomes"].get("ok", 0) > 0 and data["server_errors"] == 0 and data["lost"] == 0
    assert data["clean_shutdown"] is None  # not ours to stop
    assert data["generation_tokens"] > 0  # our /metrics, read through --base-url
