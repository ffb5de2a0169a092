"""`bench embeddings` on the tiny Qwen3-VL-Embedding at tiny sizes: every figure is measured
(positive), each distinct image costs exactly one tower pass (the repeats none: the vision
and embedding caches answer them), and the tables name every row."""

from __future__ import annotations

from support import tiny_model

from bench import embeddings


def test_embeddings_bench_measures_every_figure() -> None:
    result = embeddings.run(str(tiny_model("qwen3_vl_embedding")), 1, 32, (1, 2), clients=2)
    assert set(result.text_per_s) == set(result.image_per_s) == {1, 2}
    assert min(result.text_per_s.values()) > 0 and min(result.image_per_s.values()) > 0
    assert result.concurrent_per_s > 0 and result.rows_per_forward >= 1
    # warm-up 1 + throughput 1 + 2 + repeat 1 cold: the caption and identical repeats cost none
    assert result.tower_passes == 5
    text = embeddings.table(result, 32)
    for label, _ in embeddings.REPEAT_STEPS:
        assert label in text
    assert set(embeddings.quick(result)) >= {"text_inputs_per_s", "images_per_s", "concurrent"}
