"""Plain text models through mlx-lm (`qwen3`, `llama`, and any mlx-lm checkpoint whose layers
all keep ordinary full-attention KV): loaded with mlx-lm's own loader and run by mlx-lm's own
model classes, so an answer is what mlx-lm's `generate` gives for the same prompt.

No media: `media` is empty, so the prompt builder refuses image and video parts with a 400
before anything reaches the engine. Positions are 1D (mlx-lm's rope reads each layer's cache
offset; every row's rope delta stays 0). Prefill feeds token ids through the model's own
`__call__`, whose output (logits, with whatever the model applies after its last layer, e.g.
soft-capping) is what `prefill` returns: `logits` is then the identity. That computes the
logits of every row of a prompt's final block (never of the others: their outputs are left
unevaluated), where mlx-lm's generate computes one row; the values of the row used are the
same computation.

Prompt side any thread, engine side engine thread only (see `ModelFamily`).
"""

from __future__ import annotations

from collections.abc import Callable, Generator, Sequence
from typing import Any

import mlx.core as mx
import mlx.nn as nn
import numpy as np
from mlx_lm.models.cache import KVCache

from caches.hashing import fingerprint
from gateway.engine.families.family import CachePolicy, Grid, ModelFamily, model_fingerprint
from gateway.engine.model.kv import RowBatchKVCache, RowKVCache, share_row_state
from gateway.engine.model.prompt_forward import GroupPart, PrefillPlan, join_caches, split_caches
from gateway.engine.model.vision import EncodedImage, Unit
from gateway.processors.positions import ImageLayout
from gateway.processors.text import TextProcessor


class UnsupportedLayers(ValueError):
    """The checkpoint's layers keep a cache the engine cannot batch and reuse exactly yet."""


class MlxLmCore(nn.Module):
    """An mlx-lm model as BatchGenerator sees it: `(B, L)` ids and per-layer caches in,
    logits out. The caches are our `RowKVCache` / `RowBatchKVCache` (plain mlx-lm KV caches
    whose rope delta is always 0 here), so a text row decodes exactly as in mlx-lm."""

    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        self.lm = model

    @property
    def layers(self) -> list[nn.Module]:
        return self.lm.layers

    def make_cache(self) -> list[RowKVCache]:
        return [RowKVCache() for _ in self.layers]

    def __call__(self, inputs: mx.array, cache: list[Any] | None = None, **_: Any) -> mx.array:
        logits = self.lm(inputs, cache=cache)
        if cache and isinstance(cache[0], RowBatchKVCache):
            share_row_state(cache)  # equal values; cuts every layer's lazy offset chain
        return logits


class TextModel(ModelFamily):
    """A loaded mlx-lm text checkpoint. Construct on the thread that will own MLX.

    Raises `UnsupportedLayers` when `make_cache()` gives anything but plain `KVCache`
    layers (rotating / sliding windows, recurrent or convolution states): those need
    snapshots at block boundaries, which the engine does not keep yet."""

    family = "text"
    media = frozenset()
    prompt_split = True  # the prompt side is `TextProcessor`
    cache_policy = CachePolicy(vision_off="a text model has no vision tower")

    def __init__(self, path: str, lazy: bool = False) -> None:
        from mlx_lm import load  # slow import: only when a model is actually loaded

        self.path = path
        self.model, wrapper = load(path, lazy=lazy)
        self.model_type = str(getattr(self.model, "model_type", "") or self.model.args.model_type)
        _check_layers(self.model, self.model_type)
        self.vocab_size = int(self.model.args.vocab_size)
        # mlx-lm's generate stops on exactly these: the config's and the tokenizer's eos.
        tokenizer = wrapper._tokenizer
        prompt = TextProcessor(path, self.model_type, tokenizer)
        self._init_tokens(tokenizer, sorted(wrapper.eos_token_ids), prompt)
        self.text_core = MlxLmCore(self.model)
        embed = self.model.model.embed_tokens
        self.embed_dtype = embed(mx.array([0], dtype=mx.int32)).dtype
        self.vision_dtype = self.embed_dtype  # no tower
        self.fingerprint = model_fingerprint(path, self.model_type)
        self.processor_fingerprint = fingerprint("text-only")

    # ----- prompt side (any thread) -----------------------------------------------------------

    def preprocess(self, image: Any) -> tuple[np.ndarray, Grid]:
        raise self.prompt.no_media()

    # ----- engine side (engine thread only) ---------------------------------------------------

    def new_cache(self, rope_delta: int = 0) -> list[RowKVCache]:
        return [self.kv_layer(rope_delta) for _ in self.text_core.layers]

    def encode_steps_many(
        self,
        images: Sequence[tuple[np.ndarray, Grid]],
        stepwise: Callable[[], bool] = lambda: True,
    ) -> Generator[Unit, None, list[EncodedImage]]:
        raise RuntimeError(f"{self.model_type} has no vision tower")

    def prefill_plan(
        self,
        prompt_ids: Sequence[int],
        layouts: Sequence[ImageLayout],
        encoded: Sequence[EncodedImage | None],
        start: int,
        end: int,
    ) -> PrefillPlan:
        """Token ids [start, end) and their 1D positions (no embeddings: ids are fed)."""
        if layouts:
            raise self.prompt.no_media()
        ids = mx.array([list(prompt_ids[start:end])], dtype=mx.int32)
        host = np.arange(start, end, dtype=np.int32)[None]
        visual = np.zeros(end - start, dtype=bool)
        return PrefillPlan(ids, None, mx.array(host)[:, None, :], visual, None, host)

    def prefill(
        self, plan: PrefillPlan, cache: list[RowKVCache], lo: int, hi: int, rows: int = 0
    ) -> mx.array:
        """Plan rows [lo, hi), padded to `rows` by repeating the last id (causal attention
        keeps pad rows out of every real row; their KV is trimmed); returns logits."""
        ids = _padded(plan.ids[:, lo:hi], rows)
        pad = ids.shape[1] - (hi - lo)
        logits = self.model(ids, cache=cache)
        if pad:
            for layer in cache:
                layer.trim(pad)
        mx.eval([c.state for c in cache])
        return logits

    def prefill_group(self, parts: Sequence[GroupPart], rows: int) -> mx.array:
        offset = parts[0].cache[0].offset
        assert all(p.cache[0].offset == offset for p in parts), "blocks at different positions"
        ids = mx.concatenate([_padded(p.plan.ids[:, p.lo : p.hi], rows) for p in parts], axis=0)
        joint = join_caches([p.cache for p in parts])
        logits = self.model(ids, cache=joint)
        mx.eval([c.state for c in joint])
        split_caches([p.cache for p in parts], [p.hi - p.lo for p in parts], joint)
        return logits

    def logits(self, states: mx.array) -> mx.array:
        return states  # `prefill` already returns the model's logits


def _padded(ids: mx.array, rows: int) -> mx.array:
    """(1, n) ids followed by copies of the last one up to `rows` columns."""
    pad = rows - ids.shape[1]
    if pad <= 0:
        return ids
    return mx.concatenate([ids, mx.broadcast_to(ids[:, -1:], (1, pad))], axis=1)


def _check_layers(model: nn.Module, model_type: str) -> None:
    make_cache = getattr(model, "make_cache", None)
    if make_cache is None:
        return  # mlx-lm's default: one KVCache per layer
    kinds = sorted({type(c).__name__ for c in make_cache() if type(c) is not KVCache})
    if kinds:
        raise UnsupportedLayers(
            f"model type {model_type!r} keeps {', '.join(kinds)} layers; this gateway serves "
            "text models whose layers all keep full-attention KV (KVCache)"
        )
