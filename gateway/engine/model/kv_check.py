"""--kv-bits at load: turn quantized KV on for a model, or refuse the model with a sentence
that says why, before the server reports ready.

A family that says why it cannot be served so (`ModelFamily.kv_quant_off`) is refused before
its weights load (`kv_quant_refusal`, from `registry.check_checkpoint`). Otherwise quantized
KV covers a family when every layer of its `new_cache()` is a `RowQuantKVCache`
(its attention is mlx-lm's or mlx-vlm's, which read such a cache through quantized matmuls)
and one decode step through its `text_core` runs on it: that step fails when a head's width
is not a multiple of the group size (MLX quantizes groups of 32, 64 or 128 channels) or the
attention cannot take a quantized cache. Families that keep other layers (sliding windows read
in ring order, recurrent states, their own attention kernels) are refused, not served
half-quantized. Engine thread only (it runs a forward).
"""

from __future__ import annotations

from typing import Any

import mlx.core as mx

from gateway.engine.model.quant_kv import KVQuant, RowQuantKVCache

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
    refusal = kv_quant_refusal(type(model), model.model_type, quant.bits)
    if refusal is not None:
        raise KVQuantUnsupported(refusal)
    model.kv_quant = quant
    layers = model.new_cache()
    found = {_KINDS.get(type(c).__name__, _OTHER) for c in layers if not _covered(c)}
    kinds = sorted(found - {_OTHER}) + sorted(found & {_OTHER})  # the telling kind first
    if kinds:
        model.kv_quant = None
        raise KVQuantUnsupported(
            f"{flags}: {model.model_type} keeps {' and '.join(kinds)}, which quantized KV "
            "does not cover yet; serve this model without --kv-bits"
        )
    try:
        logits = model.text_core(mx.array([[0]], dtype=mx.int32), cache=layers)
        mx.eval(logits, [c.state for c in layers])
    except Exception as exc:  # MLX's own words say which constraint failed
        model.kv_quant = None
        raise KVQuantUnsupported(
            f"{flags}: {model.model_type}'s attention cannot run on quantized KV ({exc}); "
            "a head's width must be a multiple of --kv-group-size (32, 64 or 128)"
        ) from exc


def kv_quant_refusal(family: type, model_type: str, bits: int) -> str | None:
    """Why `--kv-bits bits` cannot serve a checkpoint of `family` (a ModelFamily class),
    known before loading (its `kv_quant_off`), or None."""
    reason = getattr(family, "kv_quant_off", None)
    if not bits or reason is None:
        return None
    return (
        f"--kv-bits {bits}: {model_type} {reason}, which quantized KV does not cover yet; "
        "serve this model without --kv-bits"
    )


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
