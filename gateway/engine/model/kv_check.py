"""--kv-bits at load: turn quantized KV on for a model, or refuse the model with a sentence
that says why, before the server reports ready.

A family that says why it cannot be served so (`ModelFamily.kv_quant_off`) is refused before
its weights load, from the MLX-free copy of that reason (`check_checkpoint` in
`processors/checkpoint.py`), and here again from its class (the sentence: `kv_quant_refusal`
in `processors/families.py`). Otherwise quantized KV covers a family when every layer of its
`new_cache()` is a `RowQuantKVCache` (its attention is mlx-lm's or mlx-vlm's, which read such
a cache through quantized matmuls) and a prompt block and a decode step through its
`text_core` run on it: they fail when a head's width is not a multiple of the group size (MLX
quantizes groups of 32, 64 or 128 channels) or the attention cannot take a quantized cache on
this device. Families that keep other layers (sliding windows read in ring order, recurrent
states, their own attention kernels) are refused, not served half-quantized. Engine thread
only (it runs a forward).
"""

from __future__ import annotations

from typing import Any

import mlx.core as mx
from mlx_lm.models.base import quantized_scaled_dot_product_attention

from gateway.engine.model.quant_kv import KVQuant, RowQuantKVCache
from gateway.processors.families import kv_quant_refusal

# Quantized attention against the same KV dequantized, relative: rounding gives ~1e-3 in
# bfloat16 and ~1e-6 in float32; a wrong kernel gives order 1 (MLX 0.32.4 on an H200).
MAX_ATTENTION_ERROR = 0.05

# What a layer cache that quantized KV does not cover is, in words (by class name).
_KINDS = {
    "RowStateCache": "recurrent-state layers (a hybrid model)",
    "WindowKVCache": "sliding-window layers",
}
_OTHER = "attention layers computed by the family's own kernels"


class KVQuantUnsupported(ValueError):
    """The model cannot hold quantized KV; the message says why and what to do."""


def enable_kv_quant(model: Any, quant: KVQuant | None) -> None:
    """Make `model` (a ModelFamily, just loaded) build quantized KV caches from now on, or
    raise `KVQuantUnsupported` (leaving it unquantized). No-op for `quant` None."""
    if quant is None:
        return
    flags = f"--kv-bits {quant.bits} --kv-group-size {quant.group_size}"
    reason = getattr(type(model), "kv_quant_off", None)
    refusal = kv_quant_refusal(model.model_type, reason, quant.bits)
    if refusal is not None:
        raise KVQuantUnsupported(refusal)
    model.kv_quant = quant
    try:
        layers = _covered_layers(model, flags)
        _run(model, layers, flags)
        error = attention_error(layers[0])
        if error > MAX_ATTENTION_ERROR:  # a kernel that runs but computes something else
            raise KVQuantUnsupported(
                f"{flags}: quantized attention on this device differs from attention over the "
                f"same KV dequantized by {error:.3g} (relative; rounding gives < "
                f"{MAX_ATTENTION_ERROR}): its quantized matmuls are not usable here; serve "
                "without --kv-bits"
            )
    except KVQuantUnsupported:
        model.kv_quant = None
        raise


def _covered_layers(model: Any, flags: str) -> list[Any]:
    """The model's empty caches, all quantized, or KVQuantUnsupported naming what is not."""
    layers = model.new_cache()
    found = {_KINDS.get(type(c).__name__, _OTHER) for c in layers if not _covered(c)}
    kinds = sorted(found - {_OTHER}) + sorted(found & {_OTHER})  # the telling kind first
    if kinds:
        raise KVQuantUnsupported(
            f"{flags}: {model.model_type} keeps {' and '.join(kinds)}, which quantized KV "
            "does not cover yet; serve this model without --kv-bits"
        )
    return layers


def _run(model: Any, layers: list[Any], flags: str) -> None:
    """A block of 16 positions, then a decode step over 17, on `layers` (as served: MLX's
    CUDA quantized matmuls have no kernel for a single cached position, which never occurs).
    KVQuantUnsupported with MLX's own words when it cannot."""
    try:
        for ids in ([list(range(1, 17))], [[17]]):  # (distinct tokens: distinct values)
            logits = model.text_core(mx.array(ids, dtype=mx.int32), cache=layers)
            mx.eval(logits, [c.state for c in layers])
    except Exception as exc:
        raise KVQuantUnsupported(
            f"{flags}: {model.model_type}'s attention cannot run on quantized KV on this "
            f"device ({exc}); a head's width must be a multiple of --kv-group-size (32, 64 "
            "or 128)"
        ) from exc


def attention_error(cache: RowQuantKVCache) -> float:
    """The largest relative difference between mlx-lm's quantized attention over the cache's
    KV and plain attention over the same KV dequantized: the same arithmetic, so only
    rounding differs where the kernels are right. Decode (1 query row) and block (16 rows)
    shapes, with and without grouped queries (2 per KV head: the keys are broadcast)."""
    keys, values = cache.keys_and_values()
    group, bits = cache.group_size, cache.bits
    plain_k = mx.dequantize(*keys, group_size=group, bits=bits)
    plain_v = mx.dequantize(*values, group_size=group, bits=bits)
    heads, dim = plain_k.shape[1], plain_k.shape[3]
    worst = 0.0
    for repeat, rows in ((1, 1), (2, 1), (2, 16)):
        shape = (1, heads * repeat, rows, dim)
        queries = mx.random.normal(shape, key=mx.random.key(rows + repeat)).astype(plain_k.dtype)
        mask = "causal" if rows > 1 else None
        got = quantized_scaled_dot_product_attention(
            queries * 1, keys, values, scale=dim**-0.5, mask=mask, group_size=group, bits=bits
        )  # (a copy of the queries: it scales them in place)
        want = mx.fast.scaled_dot_product_attention(
            queries, plain_k, plain_v, scale=dim**-0.5, mask=mask
        )
        scale = mx.abs(want).max() + 1e-6
        worst = max(worst, (mx.abs(got - want).max() / scale).item())
    return worst


def _covered(cache: Any) -> bool:
    return type(cache) is RowQuantKVCache


def kv_format(model: Any) -> dict[str, object]:
    """How the model's KV is held, for /v1/cache/stats and /metrics: `kv_dtype` (of the
    values, or of the scales and biases when quantized), `kv_bits` per stored value (the
    dtype's width when not quantized), `kv_group_size` (0 when not quantized)."""
    dtype = model.embed_dtype
    quant: KVQuant | None = model.kv_quant
    return {
        "kv_dtype": str(dtype).replace("mlx.core.", ""),
        "kv_quantized": quant is not None,
        "kv_bits": quant.bits if quant is not None else dtype.size * 8,
        "kv_group_size": quant.group_size if quant is not None else 0,
    }
