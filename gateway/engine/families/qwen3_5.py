"""Qwen3.5 / Qwen3.6 (`model_type` "qwen3_5", "qwen3_5_moe") over mlx-vlm: natively
multimodal hybrid models.

What differs from Qwen-VL (checked against mlx-vlm 0.7.10), everything else is inherited
from `QwenVL` (prompt layout, image processor, Qwen3-VL vision tower without deepstack,
mRoPE positions and rope deltas):
- layers: 3 of every `full_attention_interval` (4) are gated-delta linear attention, whose
  cache is a fixed-size recurrent state (`engine/model/state_cache.RowStateCache`); the
  others keep ordinary KV (`RowKVCache`) with gated output and partial interleaved mRoPE;
- forward: our own loop over mlx-vlm's layers (`qwen3_5_forward.py`), unpadded, with the
  prompt's last token fed alone as mlx-vlm's generate feeds it (`last_token_apart`);
- the chat template opens a `<think>` block in the generation prompt (the checkpoint's own
  template; mlx-vlm's prompt helper renders it with `enable_thinking=False` by default);
- video: not served yet (the Qwen3-VL video path is not checked against this family).

Prefix reuse, exact: a recurrent state cannot be cut back to a block boundary, so every
prompt forward marks the recurrent layers' state where it ended, and the prefix cache stores
each block's snapshot (its end's mark) next to the attention layers' KV blocks; a hit
restores its last block's snapshot and prefills the rest (`engine/model/snapshots.py`,
docs/caching.md). Off with `--no-exact-cache` (no forward ends at a block boundary there).

Prompt side any thread, engine side engine thread only (see `ModelFamily`).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import mlx.core as mx

from gateway.engine.families.qwen3_5_forward import HybridTextCore, prefill, prefill_each
from gateway.engine.families.qwen_vl import QwenVL
from gateway.engine.model.kv import RowKVCache
from gateway.engine.model.prompt_forward import GroupPart, PrefillPlan
from gateway.engine.model.state_cache import RowStateCache
from gateway.processors.processor import PromptProcessor
from gateway.processors.qwen_vl import Qwen35Processor, QwenVLProcessor

MODEL_TYPES = ("qwen3_5", "qwen3_5_moe")


class Qwen35(QwenVL):
    """A loaded Qwen3.5 / Qwen3.6 checkpoint. Construct on the thread that will own MLX."""

    family = "qwen3_5"
    media = frozenset({"image"})
    prompt_split = True  # the prompt side is `Qwen35Processor` (`QwenVLProcessor`, images only)
    MODEL_TYPES = MODEL_TYPES
    state_snapshots = True
    last_token_apart = True
    kv_quant_off = "keeps recurrent-state layers (a hybrid model)"
    # mlx-vlm's gated-delta prefill off Metal scans in chunks of 64 tokens from the forward's
    # first row: blocks of 64k rows compute what its one-pass prefill computes.
    block_multiple = 64

    def __init__(self, path: str, lazy: bool = False) -> None:
        super().__init__(path, lazy=lazy)
        language_model = self.model.language_model
        self.text_core = HybridTextCore(language_model)
        self._linear = tuple(bool(layer.is_linear) for layer in language_model.model.layers)

    def own_prompt(self, tokenizer: Any, given: PromptProcessor | None) -> PromptProcessor:
        """`given` is Qwen-VL's processor (`QwenVL.__init__`): the same settings, as
        Qwen3.5's (`Qwen35Processor`: images only)."""
        assert isinstance(given, QwenVLProcessor)
        own = Qwen35Processor(self.path, self.model_type, tokenizer, given.settings)
        return own

    # ----- engine side (engine thread only) ---------------------------------------------------

    def new_cache(self, rope_delta: int = 0) -> list[Any]:  # type: ignore[override]
        """Per layer: a `RowStateCache` for a linear-attention layer, a `RowKVCache` else."""
        return [
            RowStateCache(2, rope_delta) if linear else RowKVCache(rope_delta)
            for linear in self._linear
        ]

    def prefill(
        self, plan: PrefillPlan, cache: list[Any], lo: int, hi: int, rows: int = 0
    ) -> mx.array:
        """Plan rows [lo, hi) into `cache`, never padded (`qwen3_5_forward.prefill`)."""
        return prefill(self.model.language_model, plan, cache, lo, hi)

    def prefill_group(self, parts: Sequence[GroupPart], rows: int) -> mx.array:
        """Each part alone (`qwen3_5_forward.prefill_each`)."""
        return prefill_each(self.model.language_model, parts, rows)
