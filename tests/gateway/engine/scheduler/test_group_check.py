"""The vision tower groups images only where a group keeps every image's bits.

Pinned: on this CPU the check finds grouping exact for every vision family (so the
16-concurrent-images throughput path stays on here); a tower whose grouped features differ
(as an H200's do) is found out; with `max_images=1` every group holds one image, whatever is
pending; and the engine reports what it decided in `/v1/cache/stats`' family section.
"""

from __future__ import annotations

import pytest
from support import EngineHarness, tiny_model

from gateway.engine.families.registry import load_model
from gateway.engine.model.vision import EncodedImage
from gateway.engine.scheduler import group_check


@pytest.mark.parametrize(
    "arch", ["qwen2_vl", "qwen2_5_vl", "smolvlm", "gemma3", "mistral3", "lfm2_vl"]
)
def test_grouping_is_exact_on_this_cpu(arch: str) -> None:
    assert group_check.towers_group_exactly(load_model(str(tiny_model(arch))))


def test_a_tower_whose_groups_change_the_bits_is_found_out(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    model = load_model(str(tiny_model("qwen2_vl")))
    real = group_check._encode

    def drifting(m, group):  # noqa: ANN001, ANN202 - a group nudges the features
        out = real(m, group)
        if len(group) == 1:
            return out
        return [EncodedImage(e.features * (1 + 2**-10), e.deepstack) for e in out]

    monkeypatch.setattr(group_check, "_encode", drifting)
    assert not group_check.towers_group_exactly(model)


def test_text_models_need_no_check() -> None:
    assert group_check.towers_group_exactly(load_model(str(tiny_model("qwen3")), lazy=True))


def test_the_engine_reports_its_choice() -> None:
    h = EngineHarness("qwen2_vl")
    try:
        family = h.engine.cache_stats()["family"]
        assert family["vision_groups"] is True
    finally:
        h.engine.stop()
