"""`python -m docs.investigations.block_cost` on the tiny model (CPU).

Pinned: every variant runs the whole prompt (one forward for raw_one, one per block for the
others, the last block partial), with positive times, and the report is one JSON object.
"""

from __future__ import annotations

import json

from support import tiny_model

from docs.investigations import block_cost


def test_every_variant_covers_the_prompt_block_by_block(capsys) -> None:
    block_cost.main(
        ["--model", str(tiny_model("qwen2_5_vl", "bfloat16")), "--prompt-tokens", "150",
         "--block", "64", "--reps", "1"]
    )  # fmt: skip
    out = json.loads(capsys.readouterr().out)
    assert out["compiled_mrope"] is True and out["mrope_bit_identical"] is True
    assert len(out["raw_one"]["per_block_ms"]) == 1
    blocks = ("raw_blocks", "engine_blocks", "engine_blocks_mrope", "engine_blocks_mrope_eager")
    for name in (*blocks, "textcore_blocks"):
        assert len(out[name]["per_block_ms"]) == 3, name  # 64 + 64 + 22 tokens
    for name in ("raw_one", *blocks, "textcore_blocks"):
        assert out[name]["total_ms"] > 0 and min(out[name]["per_block_ms"]) > 0, name
