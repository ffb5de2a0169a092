"""`bench sampling`: n > 1 choices and logit shaping figures, on the tiny model (tiny sizes).

Invariant: every figure is measured (positive) and reported; the shaping kernel is timed
for the model's vocabulary and Qwen's.
"""

from __future__ import annotations

from support import tiny_model

from bench import sampling


def test_every_figure_is_measured_and_reported() -> None:
    out = sampling.run(
        str(tiny_model("qwen2_vl")), n=2, batches=[2], prompt_tokens=16, tokens=4, reps=1
    )
    for key in ("ttft_n1_ms", "ttft_n_first_ms", "ttft_n_last_ms", "step_n_choices_ms",
                "step_n_requests_ms", "step_b2_plain_ms", "step_b2_shaped_ms"):  # fmt: skip
        assert out[key] > 0, key
    kernels = [k for k in out if k.startswith("kernel_b2_")]
    assert len(kernels) == 2 and all(out[k] > 0 for k in kernels)
    text = sampling.report(out)
    assert "n=2" in text and "batch 2" in text and "vocab 151936" in text
    assert sampling.quick(out)["n"] == 2
