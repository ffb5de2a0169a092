"""`python -m docs.investigations.invariance`: batched == single measured at two levels.

Pinned: on CPU (whose kernels do not depend on the batch size) the bench finds every row of a
shared final-block forward bit-identical to the block alone, and every request run together
identical (token ids and logprobs) to the same request alone; the figures come from real
comparisons (a perturbed shared forward is reported as differing).
"""

from __future__ import annotations

import mlx.core as mx
from support import tiny_model

from docs.investigations import invariance
from gateway.engine.families.qwen_vl import QwenVL


def test_on_cpu_batched_equals_single_at_both_levels() -> None:
    result = invariance.run(str(tiny_model("qwen2_5_vl", "bfloat16")), 4, 6, (10, 24))
    assert result["block"] == 32
    assert result["forward"] == {
        "rows": 32, "prompts": 4, "hidden_identical": 4, "kv_identical": 4,
        "max_hidden_diff": 0.0,
    }  # fmt: skip
    assert result["engine"]["differing"] == 0 and result["engine"]["requests"] == 4


def test_a_difference_is_reported() -> None:
    model = QwenVL(str(tiny_model("qwen2_5_vl", "bfloat16")))
    prompts = invariance._prompts(model.vocab_size, 3, (10, 20))
    group = model.prefill_group
    model.prefill_group = lambda parts, rows: group(parts, rows) * 1.01  # type: ignore[method-assign]
    report = invariance.forward_level(model, prompts, 32)
    assert report["hidden_identical"] == 0 and report["max_hidden_diff"] > 0
    assert mx.default_device().type == mx.DeviceType.cpu
