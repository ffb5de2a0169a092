"""`bench engine` on a text model (mlx-lm's classes): text first token and decode only.

Invariant: a model that takes no images is profiled without image requests (which it would
refuse), and `--raw`'s table holds only rows with both an engine and a raw figure to divide.
"""

from __future__ import annotations

from support import tiny_model

from bench.engine_profile import Profiler, compare_rows
from bench.raw_measure import RawSettings
from gateway.config import CacheConfig


def test_text_model_profile_measures_text_and_decode_only() -> None:
    profiler = Profiler(str(tiny_model("qwen3")), log=lambda _line: None, cache=CacheConfig())
    assert not profiler.takes_images
    settings = RawSettings(
        batches=(2,), decode_tokens=6, skip_tokens=2, prompt_tokens=8, reps=1, warmups=1,
        decode_reps=1, text_tokens=5,
    )  # fmt: skip
    results = profiler.run(448, settings)
    assert not [k for k in results if k.startswith(("ttft_", "prepare_", "vision_"))]
    assert results["text_first_token_ms"] > 0
    assert results["decode_tok_s_b2"] > 0
    assert results["decode_short_rows_b2"] == 0  # every row decoded its whole budget
    raw = {"text_first_token_ms": 2.0, "decode_tok_s_b2": 2 * results["decode_tok_s_b2"]}
    rows = {row.key: row for row in compare_rows(results, raw)}
    assert set(rows) == {"text_first_token_ms", "decode_tok_s_b2"}
    assert rows["decode_tok_s_b2"].ratio == 0.5


def test_image_model_rows_keep_the_image_figures() -> None:
    results = {"text_first_token_ms": 3.0, "ttft_warm_ms": 20.0, "ttft_cold_ms": 300.0}
    raw = {"text_first_token_ms": 2.0, "warm_ttft_ms": 10.0, "prefill_ms": 100.0,
           "settings": {"prefix_tokens": 280}}  # fmt: skip
    rows = {row.key: row for row in compare_rows(results, raw)}
    assert rows["ttft_warm_ms"].ratio == 2.0
    assert rows["ttft_cold_ms"].ratio == 3.0
    assert "280-token prefix" in rows["ttft_warm_ms"].note
