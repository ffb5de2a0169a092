"""One-kernel rope for text positions inside mlx-vlm's Qwen-VL language models.

mlx-vlm applies multimodal rope (mRoPE) in every attention layer: off Metal it builds cos/sin
tables from (3, B, L) position ids, selects a section per frequency and rotates q and k with
several elementwise kernels. A token whose three sections share one position (every text
token: all decode steps and text-only prefill) gets exactly ordinary rope at that position,
which `mx.fast.rope` computes in one kernel, with one offset per batch row.

`install_text_rope` swaps each attention layer's rotary module to a subclass (same instance,
same state, no parameters involved, so checkpoints load identically). The subclass behaves
exactly like the original unless `text_rope(offsets)` is active on the calling thread; inside
it, the model skips the shared cos/sin tables and every layer rotates q and k with
`mx.fast.rope(offset=offsets)`. Image prefill never enters the context, so it keeps the
original mRoPE with its explicit three-section position ids.

Equivalence argument, checked at install time and pinned by tests/gateway/engine/
test_text_rope.py: mlx-vlm's text path rotates the first `dim` channels of q and k by
`position * inv_freq[i]` with half-split pairing (rotate_half) and no attention scaling, and
the section selector only picks which of three (here equal) positions feeds each frequency.
`mx.fast.rope(dims=dim, traditional=False, freqs=1 / inv_freq, scale=1)` is that rotation.
The frequencies come from the module's own `inv_freq` (= 1 / rope_theta ** (2i / dim)) rather
than `base=rope_theta`: the kernel's own power series differs by an ulp, which at position
30k already moves q/k by ~5e-3; with `freqs` the result is bit-identical on CPU.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from typing import Any

import mlx.core as mx
import mlx.nn as nn
from mlx_vlm.models.rope_utils import MRoPERotaryEmbedding

# Per-row rope offsets of the forward pass running on this thread / context (None: not text).
# A ContextVar, not a module flag: an image prefill on another thread must never see it.
_TEXT_OFFSETS: ContextVar[mx.array | int | None] = ContextVar("text_rope_offsets", default=None)

# mRoPE layouts whose text-position form is plain half-split rope (Qwen2/2.5-VL: chunked,
# Qwen3-VL: interleaved). Other styles (sectioned, even/odd pairing) stay on mlx-vlm's path.
_PLAIN_WHEN_TEXT = frozenset({"chunked", "interleaved"})


@contextmanager
def text_rope(offsets: mx.array | int) -> Iterator[None]:
    """Within this block, swapped rotary modules treat positions as text: row b's token j sits
    at `offsets[b] + j` in all three sections. `offsets` is an int or a (B,) integer array;
    the `position_ids` the model receives must describe the same positions (they are ignored
    by the fast path, used by any layer that was not swapped)."""
    token = _TEXT_OFFSETS.set(offsets)
    try:
        yield
    finally:
        _TEXT_OFFSETS.reset(token)


class _TextRope(MRoPERotaryEmbedding):
    """Mixed in front of an mlx-vlm rotary class by `install_text_rope`; never built directly.

    Outside `text_rope` every attribute and method is the original's. Inside it:
    `fused_apply` reads True, so the model skips its shared cos/sin tables (and each attention
    layer calls `apply_rotary`), and `apply_rotary` is one `mx.fast.rope` per tensor.
    """

    _text_freqs: mx.array  # 1 / inv_freq, evaluated at install

    @property
    def fused_apply(self) -> bool:  # type: ignore[override]
        if _TEXT_OFFSETS.get() is not None:
            return True
        return self.__dict__.get("fused_apply", False)

    @fused_apply.setter
    def fused_apply(self, value: bool) -> None:
        self.__dict__["fused_apply"] = value  # mlx-vlm's own choice, used outside text_rope

    def apply_rotary(
        self, q: mx.array, k: mx.array, position_ids: mx.array, **kwargs: Any
    ) -> tuple[mx.array, mx.array]:
        offsets = _TEXT_OFFSETS.get()
        if offsets is None or kwargs.get("unsqueeze_dim", 1) != 1 or q.ndim != 4:
            return super().apply_rotary(q, k, position_ids, **kwargs)

        def rope(x: mx.array) -> mx.array:  # x: (B, heads, L, head_dim)
            return mx.fast.rope(
                x,
                self.dim,
                traditional=False,
                base=None,
                scale=1.0,
                offset=offsets,
                freqs=self._text_freqs,
            )

        return rope(q), rope(k)


_SWAPPED: dict[type, type] = {}


def _fast_class(cls: type) -> type:
    if cls not in _SWAPPED:
        _SWAPPED[cls] = type(f"Text{cls.__name__}", (_TextRope, cls), {})
    return _SWAPPED[cls]


def _plain_when_text(attention: nn.Module) -> bool:
    """True when the text-position form of `attention`'s rope is exactly plain rope over the
    first `dim` channels of each head (see module doc)."""
    rotary = getattr(attention, "rotary_emb", None)
    head_dim = getattr(attention, "head_dim", None)
    if isinstance(rotary, _TextRope):
        return True
    if not isinstance(rotary, MRoPERotaryEmbedding) or not isinstance(head_dim, int):
        return False
    dim = int(rotary.dim)
    return (
        rotary.style in _PLAIN_WHEN_TEXT
        and float(rotary.attention_scaling) == 1.0
        and dim % 2 == 0
        and dim <= head_dim
        and tuple(rotary.inv_freq.shape) == (dim // 2,)
    )


def install_text_rope(language_model: nn.Module) -> bool:
    """Swap every attention layer's rotary module of an mlx-vlm Qwen-VL language model to the
    text-rope subclass. All or nothing: returns False (and changes nothing) when any layer's
    rope is not plain rope at text positions; the caller then keeps passing mRoPE position ids
    without `text_rope`. Idempotent."""
    attentions = [getattr(layer, "self_attn", None) for layer in language_model.model.layers]
    if not attentions or not all(_plain_when_text(attn) for attn in attentions):
        return False
    for rotary in (attn.rotary_emb for attn in attentions):
        if isinstance(rotary, _TextRope):
            continue
        freqs = mx.reciprocal(rotary.inv_freq.astype(mx.float32))
        mx.eval(freqs)  # a constant: never part of a step's graph
        rotary.__class__ = _fast_class(type(rotary))
        rotary.__dict__["_text_freqs"] = freqs  # not a Module key: stays out of parameters()
    return True
