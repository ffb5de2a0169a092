"""What the engine has once its model is loaded: the model, its cache operations, the
prefiller, the structured-output grammars, and how to build a decode batch.

Built once, on the engine thread, by `Loaded.load`, and handed to the `Scheduler`; never
replaced (a cache reset swaps the caches inside `cache_ops`, not this object). Until the load
has finished the engine has no scheduler (None), so nothing here is ever seen half-built.

Thread contract: the fields are set once and may be read from any thread, and so may
`cache_stats` and `clear_caches`; `new_batch` and `use_caches` run on the engine thread. The
objects held are engine-thread objects except their documented thread-safe methods
(`CacheOps.needs_pixels` and `disk_stats`, `Grammars.stats` and its cache's `clear`, the
disk tier's `clear`).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import mlx.core as mx

from caches.prefix import PrefixCache
from caches.vision import VisionCache
from gateway.config import EngineConfig
from gateway.engine.cache_ops import CacheOps
from gateway.engine.families.family import ModelFamily
from gateway.engine.model.kv_check import enable_kv_quant, kv_format
from gateway.engine.model.quant_kv import KVQuant
from gateway.engine.scheduler.answer_store import AnswerStore
from gateway.engine.scheduler.decode_batch import DecodeBatch
from gateway.engine.scheduler.group_check import towers_group_exactly
from gateway.engine.scheduler.prefill import Prefiller
from gateway.engine.tokens.grammar import Grammars

SNAPSHOTS_NEED_EXACT = (
    "recurrent-state snapshots exist only at the exact-reuse rule's block ends (--no-exact-cache)"
)


@dataclass(frozen=True)
class Loaded:
    """The post-load state of one engine; see the module docstring."""

    model: ModelFamily
    on_gpu: bool  # the model computes on a GPU
    cache_ops: CacheOps
    prefiller: Prefiller
    grammars: Grammars
    # Several images may share one tower call: only where that keeps every image's bits
    # (gateway.engine.scheduler.group_check; measured at load on this device).
    group_images: bool = True
    # Answer prefill (gateway.engine.scheduler.answer_store); None: off (a Loaded built by hand)
    answers: AnswerStore | None = None

    @classmethod
    def load(
        cls,
        config: EngineConfig,
        loader: Callable[[], ModelFamily],
        vision: VisionCache,
        prefix: PrefixCache,
    ) -> Loaded:
        """Load the model with `loader` (on the engine thread: MLX state is per thread) and
        build what serves it over the caches `vision` and `prefix`. Raises what the load
        raises."""
        model = loader()
        bits, group = config.cache.kv_bits, config.cache.kv_group_size
        enable_kv_quant(model, KVQuant(bits, group) if bits else None)  # or refuse the model
        on_gpu = mx.default_device().type == mx.DeviceType.gpu
        block = config.cache.exact_block_tokens(on_gpu)  # 0: exact reuse off
        block = -(-block // model.block_multiple) * model.block_multiple  # family's chunks
        cache_ops = CacheOps(model, vision, prefix, block)
        # The disk tier stays off through the warm-up (activated by its reset_caches).
        cache_ops.open_disk(config.cache, active=not config.warmup)
        grammars = Grammars(
            model.tokenizer,
            model.vocab_size,
            model.eos_token_ids,
            config.cache.grammar_capacity_bytes,
        )
        prefiller = Prefiller(model, cache_ops, block)
        group = towers_group_exactly(model)
        answers = AnswerStore(cache_ops, block, config.cache.answer_prefill)
        return cls(model, on_gpu, cache_ops, prefiller, grammars, group, answers)

    def new_batch(self, config: EngineConfig) -> DecodeBatch:
        """A fresh, empty decode batch (at start, and to replace one whose step raised)."""
        return DecodeBatch(self.model, config, self.grammars.masker)

    def cache_stats(self) -> dict[str, dict[str, object]]:
        """The compiled grammars' and the disk tier's counters, and the model family with
        the caches it turned off and why and whether images share tower calls, JSON-able
        (any thread)."""
        off = {}
        if self.model.state_snapshots and not self.prefiller.exact:
            off["prefix_cache"] = f"off: {SNAPSHOTS_NEED_EXACT}"
        return {
            "grammar": self.grammars.stats(),
            "disk": self.cache_ops.disk_stats(),
            # vision_groups: whether images of several requests share a tower call here
            "family": {**self.model.describe(), "vision_groups": self.group_images, **off},
            "answers": self.answers.stats() if self.answers is not None else {"enabled": False},
        }

    def kv_format(self) -> dict[str, object]:
        """How KV is held (dtype, bits, group size): part of the prefix cache's stats."""
        return kv_format(self.model)

    def clear_caches(self) -> None:
        """Empty the disk tier and the compiled grammars (any thread)."""
        if self.cache_ops.disk is not None:
            self.cache_ops.disk.clear()
        self.grammars.cache.clear()

    def use_caches(self, vision: VisionCache, prefix: PrefixCache) -> None:
        """Serve from fresh caches from now on (a reset, engine thread), and start the disk
        tier (a reset ends the start-up warm-up); compiled grammars are forgotten too."""
        self.cache_ops.vision, self.cache_ops.prefix = vision, prefix
        self.cache_ops.activate_disk()
        self.grammars.reset()
        if self.answers is not None:
            self.answers.clear(reset=True)
