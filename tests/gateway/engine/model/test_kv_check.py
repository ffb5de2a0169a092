"""--kv-bits at load (`engine/model/kv_check.py`): quantized KV is turned on only where it is
covered, and refused with a sentence that says why otherwise.

Pinned: a model whose every layer keeps full-attention KV through mlx-lm's or mlx-vlm's
attention gets quantized caches and its format in the stats; a hybrid model (Qwen3.5:
recurrent states) and a sliding-window one (Gemma 3) are refused by name (by their class,
before loading: `registry.check_checkpoint`; by their layers otherwise), as is a model whose
heads the group size does not divide (MLX cannot quantize them), each left unquantized; the
engine does not start on a refused model and says why.
"""

from __future__ import annotations

import mlx.core as mx
import pytest
from kv_support import wide_heads
from support import EngineHarness, tiny_model

from gateway.config import CacheConfig
from gateway.engine.families.registry import load_model
from gateway.engine.model.kv_check import KVQuantUnsupported, enable_kv_quant, kv_format
from gateway.engine.model.quant_kv import KVQuant, RowQuantKVCache


def test_a_covered_model_holds_quantized_kv() -> None:
    """Invariant: every layer's cache is quantized at the asked bits; the format says so."""
    model = load_model(str(wide_heads("qwen2_vl")))
    assert kv_format(model) == {
        "kv_dtype": "float32", "kv_quantized": False, "kv_bits": 32, "kv_group_size": 0,
    }  # fmt: skip
    enable_kv_quant(model, KVQuant(4, 32))
    layers = model.new_cache(-5)
    assert all(type(c) is RowQuantKVCache and c.bits == 4 and c.rope_delta == -5 for c in layers)
    assert kv_format(model)["kv_bits"] == 4 and kv_format(model)["kv_group_size"] == 32


@pytest.mark.parametrize(
    ("arch", "words"),
    [
        ("qwen3_5", "recurrent-state layers (a hybrid model)"),
        ("gemma3", "sliding-window layers"),
    ],
)
@pytest.mark.parametrize("known", [True, False], ids=["by-class", "by-layers"])
def test_uncovered_layers_are_refused_by_name(
    arch: str, words: str, known: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Invariant: a family keeping layers quantized KV does not cover is refused, with what
    they are and what to do, whether its class says so (`kv_quant_off`) or only its
    layers show it; the model stays unquantized."""
    model = load_model(str(tiny_model(arch)))
    if not known:
        monkeypatch.setattr(type(model), "kv_quant_off", None)
    with pytest.raises(KVQuantUnsupported, match="serve this model without --kv-bits") as err:
        enable_kv_quant(model, KVQuant(8, 64))
    assert words in str(err.value) and arch in str(err.value)
    assert model.kv_quant is None


@pytest.mark.parametrize(("path", "group"), [("narrow", 32), ("wide", 64)])
def test_heads_the_group_does_not_divide_are_refused(path: str, group: int) -> None:
    """Invariant: heads of 16 channels (the tiny Qwen2-VL) at any group, or of 32 at a group
    of 64, cannot be quantized: refused, naming the flag to change."""
    checkpoint = tiny_model("qwen2_vl") if path == "narrow" else wide_heads("qwen2_vl")
    model = load_model(str(checkpoint))
    with pytest.raises(KVQuantUnsupported, match="multiple of --kv-group-size"):
        enable_kv_quant(model, KVQuant(8, group))
    assert model.kv_quant is None and type(model.new_cache()[0]) is not RowQuantKVCache


def test_the_engine_does_not_start_on_a_refused_model() -> None:
    """Invariant: `serve --kv-bits 8` on a hybrid model fails at start with the reason."""
    with pytest.raises(RuntimeError, match="hybrid model"):
        EngineHarness("qwen3_5", cache=CacheConfig(kv_bits=8), warmup=False)


def test_a_kernel_that_computes_something_else_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    """Invariant: quantized attention that runs but disagrees with attention over the same KV
    dequantized (seen on an H200: MLX 0.32.4's CUDA kernels with grouped queries) refuses the
    model; right kernels differ by rounding only (float32 here: not at all)."""
    from gateway.engine.model import kv_check

    model = load_model(str(wide_heads("qwen2_vl")))
    enable_kv_quant(model, KVQuant(8, 32))
    layers = model.new_cache()
    for ids in ([list(range(1, 17))], [[17]]):
        model.text_core(mx.array(ids), cache=layers)
    assert kv_check.attention_error(layers[0]) == 0.0
    right = kv_check.quantized_scaled_dot_product_attention

    def heads_swapped(queries, *args, **kwargs):  # noqa: ANN001, ANN002, ANN003, ANN202
        return right(queries, *args, **kwargs)[:, ::-1]

    monkeypatch.setattr(kv_check, "quantized_scaled_dot_product_attention", heads_swapped)
    model.kv_quant = None
    with pytest.raises(KVQuantUnsupported, match="differs from attention over the same KV"):
        enable_kv_quant(model, KVQuant(8, 32))
    assert model.kv_quant is None
