"""`cost`: MACs of an image request, tower vs language-model prefill.

Invariant: the counts are the arithmetic the module doc states, checked by hand on shapes
small enough to count (a wrong term would move every preset's justification with it).
"""

from __future__ import annotations

import pytest

from gateway.offline_model.cost import ImageCost, image_cost, lm_macs, text_part, tower_macs

VISION = dict(hidden_size=4, intermediate_size=8, num_attention_heads=2, num_hidden_layers=3,
              patch_size=2)  # fmt: skip
TEXT = dict(hidden_size=8, intermediate_size=16, num_attention_heads=2, num_key_value_heads=1,
            head_dim=4, num_hidden_layers=2, vocab_size=10)  # fmt: skip


def test_tower_counts_projections_mlp_attention_and_patch_embedding() -> None:
    # per patch and layer: 4 * 4 * (2 * 2) q/k/v/o + 2 * 4 * 8 MLP = 64 + 64 = 128
    # per tile of n patches and layer: attention 2 * n^2 * 2 * 2; patch embedding n * 3*2*2 * 4
    n = 5
    want = n * 12 * 4 + 3 * (n * 128 + 2 * n * n * 4)
    assert tower_macs(VISION, [n]) == want
    assert tower_macs(VISION, [n, n]) == 2 * want  # tiles are independent sequences


def test_gated_towers_have_a_third_mlp_matrix() -> None:
    plain = tower_macs(VISION, [1])
    gated = tower_macs({**VISION, "model_type": "pixtral"}, [1])
    assert gated - plain == 3 * 4 * 8  # one more 4 x 8 matrix per layer


def test_language_model_counts_grouped_kv_gated_mlp_causal_attention_and_one_head_row() -> None:
    # per token and layer: q/o 8 * 4 * 2 each, k/v 8 * 4 * 1 each -> 8 * 4 * 6 = 192;
    # MLP 3 * 8 * 16 = 384; attention n^2 * 2 * 4; lm_head 8 * 10 once.
    n = 7
    assert lm_macs(TEXT, n) == 2 * (n * (192 + 384) + n * n * 8) + 80


def test_image_cost_reads_the_nested_text_config_over_the_top_level() -> None:
    config = {"hidden_size": 999, "text_config": TEXT, "vision_config": VISION}
    assert text_part(config)["hidden_size"] == 8
    cost = image_cost(config, [5], 7)
    assert cost == ImageCost(tower_macs(VISION, [5]), lm_macs(TEXT, 7))
    assert cost.ratio == pytest.approx(cost.tower_macs / cost.lm_macs)
