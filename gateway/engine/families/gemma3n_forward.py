"""Gemma 3n's language model forward over mlx-vlm's modules: what a prompt range feeds
(`Gemma3nPlan`), its prefill (`Gemma3nForward`) and the model BatchGenerator steps
(`SharedKVModel`, under `Gemma3Core`). Engine thread only; nothing here is thread-safe.

How mlx-vlm 0.7.10's generate runs a Gemma 3n prompt, which this reproduces row for row:
- the input embeddings come from `get_input_embeddings`: text ids through `embed_tokens`
  UNSCALED, ids of the vision block (`<end_of_image>`, the soft tokens) through
  `embed_vision`'s hard embedding, ids of the audio block through `embed_audio`'s, then the
  image features over the soft tokens' rows; per-layer inputs from the ids with every id
  past the text vocabulary as 0. Decode steps embed their ids with `embed_tokens *
  sqrt(hidden)` (the language model's own path), as mlx-vlm's decode does;
- the prompt is causal throughout and chunked: all but the last token in forwards of many
  rows, the last token a one-row step (sliding layers read their ring in slot order:
  `window_kv.py`), as Gemma 3 (`gemma3_forward.py`);
- the last `num_kv_shared_layers` layers attend over the keys and values the last earlier
  layer of their type fetched in the same forward (`cache.state` of mlx-vlm's caches, which
  equals what its `update_and_fetch` returned), with that cache's offset AFTER the update as
  their queries' RoPE offset. Here a sliding layer's one-row fetch is the ring's gather, not
  its `state`, so each forward hands the model `_Fetched` views that remember the fetch.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import mlx.core as mx
import mlx.nn as nn

from gateway.engine.families.gemma3_forward import set_ring_phase
from gateway.engine.model.kv import RowKVCache
from gateway.engine.model.prompt_forward import PrefillPlan
from gateway.engine.model.window_kv import shared_ring


@dataclass(frozen=True)
class Gemma3nPlan(PrefillPlan):
    """A prompt range's inputs plus its per-layer ids ((1, L): ids past the text vocabulary
    as 0, as mlx-vlm's merge)."""

    layer_ids: mx.array | None = None


class _Fetched:
    """One layer cache as mlx-vlm's Gemma 3n attention sees it in one forward: everything is
    the cache's, except that `state` is what its last `update_and_fetch` returned (what a
    KV-sharing layer must read: module doc)."""

    def __init__(self, cache: Any) -> None:
        self._cache = cache
        self._fetched: tuple[mx.array, mx.array] | None = None

    @property
    def offset(self) -> Any:
        return self._cache.offset

    @property
    def state(self) -> tuple[mx.array, mx.array]:
        assert self._fetched is not None, "a KV-sharing layer ran before its source layer"
        return self._fetched

    def update_and_fetch(self, keys: mx.array, values: mx.array) -> tuple[mx.array, mx.array]:
        self._fetched = self._cache.update_and_fetch(keys, values)
        return self._fetched

    def __getattr__(self, name: str) -> Any:
        return getattr(self._cache, name)


class SharedKVModel:
    """mlx-vlm's Gemma 3n text model (`Gemma3Model`: embeddings in, final norm out) called
    over `_Fetched` views of the caches (module doc); `layers` are its decoder layers."""

    def __init__(self, model: nn.Module) -> None:
        self.inner = model
        self.layers = model.layers

    def __call__(
        self,
        inputs: mx.array | None,
        inputs_embeds: mx.array | None = None,
        cache: list[Any] | None = None,
        per_layer_inputs: mx.array | None = None,
    ) -> mx.array:
        views = None if cache is None else [_Fetched(c) for c in cache]
        return self.inner(
            inputs, inputs_embeds=inputs_embeds, cache=views, per_layer_inputs=per_layer_inputs
        )


class SharedKVLanguageModel:
    """What `Gemma3Core` wraps: `.model` is the `SharedKVModel`."""

    def __init__(self, language_model: nn.Module) -> None:
        self.model = SharedKVModel(language_model.model)


class Gemma3nForward:
    """Prompt prefill over mlx-vlm's Gemma 3n language model (`language_model`: its
    `LanguageModel`)."""

    def __init__(self, language_model: nn.Module) -> None:
        self.lm = SharedKVModel(language_model.model)
        self.text = language_model.model

    def prefill(
        self, plan: Gemma3nPlan, cache: list[RowKVCache], lo: int, hi: int, rows: int = 0
    ) -> mx.array:
        """Plan rows [lo, hi) into `cache`, padded to `rows` query rows (the last real row
        repeated, its KV trimmed); the plan's last row, when in range, is
        fed alone afterwards. Returns final hidden states (1, >= hi - lo, d), lazily, row i
        for plan row lo + i."""
        assert plan.embeds is not None and plan.layer_ids is not None
        last = hi == plan.length
        body = hi - 1 if last else hi
        states = []
        if body > lo:
            embeds, layer_ids = plan.embeds[:, lo:body], plan.layer_ids[:, lo:body]
            pad = max(rows - (body - lo), 0)
            if pad:
                # Copies of the last real row, not zeros: AltUp rescales every stream by its
                # magnitude, and a zero row's 0 / 0 would put NaNs in KV that real rows
                # weigh by an exact 0 (0 * NaN is NaN).
                embeds = mx.concatenate([embeds, _repeat_last(embeds, pad)], axis=1)
                layer_ids = mx.concatenate([layer_ids, _repeat_last(layer_ids, pad)], axis=1)
            raw = self.text.get_per_layer_inputs(layer_ids)
            hidden = self.lm(None, inputs_embeds=embeds, cache=cache, per_layer_inputs=raw)
            if pad:
                for layer in cache:
                    layer.trim(pad)
            mx.eval([c.state for c in cache])
            states.append(hidden[:, : body - lo] if last else hidden)
        if last:
            set_ring_phase(cache)
            raw = self.text.get_per_layer_inputs(plan.layer_ids[:, hi - 1 : hi])
            one = plan.embeds[:, hi - 1 : hi]
            with shared_ring(cache, 1):
                states.append(self.lm(None, inputs_embeds=one, cache=cache, per_layer_inputs=raw))
            mx.eval([c.state for c in cache])
        return states[0] if len(states) == 1 else mx.concatenate(states, axis=1)


def _repeat_last(rows: mx.array, count: int) -> mx.array:
    """`count` copies of the last row (axis 1) of `rows`."""
    last = rows[:, -1:]
    return mx.broadcast_to(last, (last.shape[0], count, *last.shape[2:]))
