"""mlx-vlm's multimodal rope apply, compiled, for image positions in prefill.

Text positions take one `mx.fast.rope` (gateway.engine.model.text_rope). Image blocks cannot: their
three mRoPE sections hold different positions. For them mlx-vlm's Qwen2/2.5-VL language
models build cos/sin once per forward and call their module-level
`apply_multimodal_rotary_pos_emb(q, k, cos, sin)` in every attention layer. On Metal that
dispatches to a custom kernel; everywhere else (CUDA, CPU) it runs ~7 separate elementwise
kernels per tensor (slice, rotate_half's negate and concatenate, two multiplies, an add, a
cast), so 14 launches per layer, ~400 per 28-layer forward. On an H200 a prefill forward is
bound by launches (docs/performance.md §8f: mRoPE blocks cost ~3.5 ms more than text blocks).

`install_compiled_mrope` replaces that module-level function with the same function under
`mx.compile`, which fuses the elementwise chain into a kernel or two per tensor. Same ops,
same dtypes per op: bit-identical on CPU in float32 and bfloat16 (pinned by
tests/gateway/engine/model/test_compiled_mrope.py). Qwen3-VL's interleaved style is already a
compiled function in mlx-vlm and is left alone. A new input shape costs one re-trace (ms of
Python), not a new kernel: the generated kernels do not depend on the sizes.

The swap is process-wide (a module attribute), idempotent, thread-safe, and only for mlx-vlm
modules whose function has the expected signature; `eager_mrope()` restores the original
inside a block (the bench's A/B). Where mlx-vlm's `fused_apply` is on (Metal), the models
call their own kernel and never this function: installing is then harmless and unused.
"""

from __future__ import annotations

import inspect
import sys
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import mlx.core as mx
import mlx.nn as nn

_NAME = "apply_multimodal_rotary_pos_emb"
# mlx-vlm language modules whose apply is a plain (uncompiled) Python chain on non-Metal.
_UNFUSED_MODULES = frozenset(
    {"mlx_vlm.models.qwen2_vl.language", "mlx_vlm.models.qwen2_5_vl.language"}
)
_installed: dict[str, Callable[..., Any]] = {}  # module name -> the original function
_lock = threading.Lock()  # two engines loading at once must not wrap the wrapper


def _compiled(original: Callable[..., Any]) -> Callable[..., Any]:
    """`original` under `mx.compile` for `unqueeze_dim == 1` (how the models call it); other
    values run `original` eagerly. The result's `__wrapped__` is `original`."""
    fused = mx.compile(lambda q, k, cos, sin: original(q, k, cos, sin, 1))

    def apply(
        q: mx.array, k: mx.array, cos: mx.array, sin: mx.array, unqueeze_dim: int = 1
    ) -> tuple[mx.array, mx.array]:
        if unqueeze_dim != 1:  # never called so by the models; keep the original's meaning
            return original(q, k, cos, sin, unqueeze_dim)
        return fused(q, k, cos, sin)

    apply.__wrapped__ = original  # type: ignore[attr-defined]
    return apply


def install_compiled_mrope(language_model: nn.Module) -> bool:
    """Compile the multimodal rope apply of `language_model`'s mlx-vlm module. Returns True
    when the compiled apply is installed (now or before), False when the module is not one
    this knows (it is then left alone). Process-wide and thread-safe; call before the model
    runs (a forward already traced keeps the function it saw)."""
    name = type(language_model).__module__
    with _lock:
        if name in _installed:
            return True
        module = sys.modules.get(name)
        original = getattr(module, _NAME, None) if module is not None else None
        if name not in _UNFUSED_MODULES or original is None:
            return False
        params = list(inspect.signature(original).parameters)
        if params != ["q", "k", "cos", "sin", "unqueeze_dim"]:
            return False  # a different mlx-vlm: do not guess what its function means
        _installed[name] = original
        setattr(module, _NAME, _compiled(original))
        return True


@contextmanager
def eager_mrope() -> Iterator[None]:
    """Within this block every installed module uses mlx-vlm's original apply (not
    thread-safe: a bench's A/B, never while serving)."""
    swapped = {name: getattr(sys.modules[name], _NAME) for name in _installed}
    try:
        for name, original in _installed.items():
            setattr(sys.modules[name], _NAME, original)
        yield
    finally:
        for name, compiled in swapped.items():
            setattr(sys.modules[name], _NAME, compiled)
