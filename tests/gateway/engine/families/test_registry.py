"""The family registry: `model_type` -> family class.

Pinned: the three Qwen-VL types load as the Qwen-VL family; a config without a vision part
whose type mlx-lm knows loads as a text model; a vision-language type no family serves, or
a type nothing knows, is refused with an error naming the supported families; the loaded
family describes itself (/v1/models, /v1/cache/stats); with --kv-bits a family quantized KV
does not cover is refused before loading.
"""

from __future__ import annotations

import pytest
from support import tiny_model

from gateway.engine.families import UnsupportedModel, load_model
from gateway.engine.families.gemma3 import Gemma3
from gateway.engine.families.qwen3_5 import Qwen35
from gateway.engine.families.qwen_vl import QwenVL
from gateway.engine.families.registry import family_for, read_config
from gateway.engine.families.text import TextModel


@pytest.mark.parametrize("model_type", ["qwen2_vl", "qwen2_5_vl", "qwen3_vl"])
def test_qwen_vl_types_map_to_the_qwen_family(model_type: str) -> None:
    assert family_for({"model_type": model_type, "vision_config": {}}) is QwenVL


def test_gemma3_maps_to_the_gemma3_family() -> None:
    assert family_for({"model_type": "gemma3", "vision_config": {}}) is Gemma3


@pytest.mark.parametrize("model_type", ["qwen3_5", "qwen3_5_moe"])
def test_qwen3_5_types_map_to_the_hybrid_family(model_type: str) -> None:
    assert family_for({"model_type": model_type, "vision_config": {}}) is Qwen35


@pytest.mark.parametrize("model_type", ["qwen3", "llama", "mistral", "qwen2"])
def test_text_types_mlx_lm_knows_map_to_the_text_family(model_type: str) -> None:
    assert family_for({"model_type": model_type}) is TextModel


@pytest.mark.parametrize(
    "config",
    [
        {"model_type": "mllama", "vision_config": {}},  # a VLM no family serves yet
        {"model_type": "no_such_model"},
        {},
    ],
)
def test_unsupported_types_are_refused_naming_the_families(config: dict) -> None:
    with pytest.raises(UnsupportedModel) as err:
        family_for(config)
    message = str(err.value)
    assert repr(config.get("model_type", "")) in message
    for named in ("qwen2_vl", "qwen2_5_vl", "qwen3_vl", "qwen3", "llama"):
        assert named in message


def test_a_loaded_qwen_checkpoint_describes_its_family() -> None:
    path = str(tiny_model("qwen2_5_vl"))
    assert read_config(path)["model_type"] == "qwen2_5_vl"
    model = load_model(path, lazy=True)
    assert isinstance(model, QwenVL)
    assert model.describe() == {
        "family": "qwen_vl",
        "model_type": "qwen2_5_vl",
        "media": ["image", "video"],
        "prefix_cache": "on",
        "vision_cache": "on",
    }


def test_kv_bits_refuses_uncovered_families_before_loading() -> None:
    """Invariant: with --kv-bits, a checkpoint whose family quantized KV does not cover (a
    hybrid Qwen3.5) is refused by `check_checkpoint`, from its config alone, with the reason;
    without it, or for a covered family, the check passes."""
    from gateway.engine.families.registry import check_checkpoint

    hybrid = str(tiny_model("qwen3_5"))
    with pytest.raises(ValueError, match=r"--kv-bits 8: qwen3_5 keeps recurrent-state layers"):
        check_checkpoint(hybrid, kv_bits=8)
    check_checkpoint(hybrid)
    check_checkpoint(str(tiny_model("qwen3")), kv_bits=4)
