"""Gemma 3's forward passes over mlx-vlm's modules: the vision tower one unit at a time
(`encode_steps`), a prompt range's inputs and its prefill (`Gemma3Forward`), and the decode
module BatchGenerator steps (`Gemma3Core`). Engine thread only.

The prompt's last token is fed as a one-row step after the rest of its block, as mlx-vlm's
generate feeds it: a one-row step reads each sliding layer's window in ring order
(`engine/model/window_kv.py`), and that order is part of the reference's numerics. Every other
row is fed in block forwards, whose windowed attention over all cached keys is the
reference's chunk computation.
"""

from __future__ import annotations

from collections.abc import Callable, Generator, Sequence
from typing import Any

import mlx.core as mx
import mlx.nn as nn
import numpy as np

from gateway.engine.model.kv import RowBatchKVCache, RowKVCache, share_row_state
from gateway.engine.model.prompt_forward import PrefillPlan
from gateway.engine.model.vision import EncodedImage, Unit
from gateway.engine.model.window_kv import WindowKVCache, ring_phase, shared_ring
from gateway.processors.positions import ImageLayout


def set_ring_phase(cache: Sequence[Any]) -> None:
    """Give every sliding layer of a single-row cache the ring phase of a token fed next at
    position `offset` (the prompt's last token: `window_kv.ring_phase`)."""
    for layer in cache:
        if isinstance(layer, WindowKVCache):
            layer.phase = ring_phase(layer.offset, layer.window)


class Gemma3Forward:
    """Prompt inputs and prefill over mlx-vlm's Gemma 3 (`model`: the whole mlx-vlm model)."""

    def __init__(self, model: nn.Module, pad_id: int | None) -> None:
        self.lm = model.language_model.model  # Gemma3Model: embeddings in, final norm out
        self.embed = self.lm.embed_tokens
        self.pad_id = 0 if pad_id is None else int(pad_id)

    def plan(
        self,
        prompt_ids: Sequence[int],
        layouts: Sequence[ImageLayout],
        encoded: Sequence[EncodedImage | None],
        start: int,
        end: int,
    ) -> PrefillPlan:
        """Inputs of prompt tokens [start, end): text embeddings (zero for pad ids, as
        mlx-vlm's merge), image rows from the features (from row `start - span start` when the
        range starts inside a span), 1D positions."""
        ids = mx.array(list(prompt_ids[start:end]), dtype=mx.int32)
        host_ids = np.asarray(prompt_ids[start:end])
        text = self.embed(ids)
        text = mx.where(mx.array(host_ids == self.pad_id)[:, None], mx.zeros_like(text), text)
        pieces: list[mx.array] = []
        visual = np.zeros(end - start, dtype=bool)
        cursor = start
        for layout, image in zip(layouts, encoded):
            if layout.end <= start or layout.start >= end:
                continue
            assert image is not None, "image inside the prefill range was not encoded"
            if layout.start > cursor:
                pieces.append(text[cursor - start : layout.start - start])
            skip = max(start - layout.start, 0)
            rows = image.features[skip : skip + min(layout.end, end) - max(layout.start, start)]
            pieces.append(rows.astype(text.dtype))
            visual[max(layout.start, start) - start : min(layout.end, end) - start] = True
            cursor = min(layout.end, end)
        if cursor < end:
            pieces.append(text[cursor - start :])
        embeds = mx.concatenate(pieces, axis=0)[None]
        host = np.arange(start, end, dtype=np.int32)[None]
        return PrefillPlan(ids[None], embeds, mx.array(host)[:, None, :], visual, None, host)

    def prefill(
        self, plan: PrefillPlan, cache: list[RowKVCache], lo: int, hi: int, rows: int = 0
    ) -> mx.array:
        """Plan rows [lo, hi) into `cache`, padded to `rows` query rows (zero embeddings after
        the real rows, their KV trimmed); the plan's last row, when in range, is fed alone
        afterwards (module doc). Returns final hidden states (1, >= hi - lo, d), lazily,
        row i for plan row lo + i."""
        last = hi == plan.length
        body = hi - 1 if last else hi
        states = []
        if body > lo:
            embeds = plan.embeds[:, lo:body]  # type: ignore[index]
            pad = max(rows - (body - lo), 0)
            if pad:
                zeros = mx.zeros((1, pad, embeds.shape[2]), embeds.dtype)
                embeds = mx.concatenate([embeds, zeros], axis=1)
            ids = mx.zeros(embeds.shape[:2], dtype=mx.int32)  # unread: embeddings are given
            hidden = self.lm(ids, inputs_embeds=embeds, cache=cache)
            if pad:
                for layer in cache:
                    layer.trim(pad)
            mx.eval([c.state for c in cache])
            states.append(hidden[:, : body - lo] if last else hidden)
        if last:
            set_ring_phase(cache)
            one = plan.embeds[:, hi - 1 : hi]  # type: ignore[index]
            with shared_ring(cache, 1):
                states.append(self.lm(plan.ids[:, hi - 1 : hi], inputs_embeds=one, cache=cache))
            mx.eval([c.state for c in cache])
        return states[0] if len(states) == 1 else mx.concatenate(states, axis=1)


class Gemma3Core(nn.Module):
    """The language model as mlx-lm's BatchGenerator sees it: `(B, L)` ids and per-layer
    caches in, logits out; rope offsets from each row's cache. A single-row call of several
    tokens (a text chunk fed without the exact-reuse rule) feeds its last token apart, so a
    prompt's last token is always a one-row step (module doc)."""

    def __init__(
        self,
        language_model: nn.Module,
        new_cache: Callable[[], list[Any]],
        head: Callable[[mx.array], mx.array] | None = None,
    ) -> None:
        """`head`: final hidden states -> logits (default: the language model's `lm_head`;
        Gemma 4 ties them to the embeddings and soft-caps them)."""
        super().__init__()
        self.lm = language_model
        self._new_cache = new_cache
        self._head = head if head is not None else language_model.lm_head

    @property
    def layers(self) -> list[nn.Module]:
        return self.lm.model.layers

    def make_cache(self) -> list[Any]:
        return self._new_cache()

    def __call__(self, inputs: mx.array, cache: list[Any] | None = None, **_: Any) -> mx.array:
        batch = bool(cache) and isinstance(cache[0], RowBatchKVCache)
        if cache and not batch and inputs.shape[1] > 1:
            head = self.lm.model(inputs[:, :-1], cache=cache)
            set_ring_phase(cache)
            with shared_ring(cache, 1):
                last = self.lm.model(inputs[:, -1:], cache=cache)
            hidden = mx.concatenate([head, last], axis=1)
        elif batch:
            with shared_ring(cache, inputs.shape[1]):  # type: ignore[arg-type]
                hidden = self.lm.model(inputs, cache=cache)
        else:
            hidden = self.lm.model(inputs, cache=cache)
        if batch:
            share_row_state(cache)  # type: ignore[arg-type]
        return self._head(hidden)


def prefill_each(
    prefill: Callable[[PrefillPlan, list[RowKVCache], int, int, int], mx.array],
    parts: Sequence[Any],
    rows: int,
) -> mx.array:
    """`ModelFamily.prefill_group` for families whose prompt's last token is a one-row step of
    its own (`last_token_apart`): each part (a `GroupPart`) fed alone through `prefill`, its
    states padded or cut to `rows`; one batched forward would not be each part's own
    computation. Returns (len(parts), rows, d)."""
    out = []
    for part in parts:
        states = prefill(part.plan, part.cache, part.lo, part.hi, rows)
        pad = rows - states.shape[1]
        if pad > 0:
            states = mx.concatenate(
                [states, mx.zeros((1, pad, states.shape[2]), states.dtype)], axis=1
            )
        out.append(states[:, :rows])
    return mx.concatenate(out, axis=0)


def encode_steps(
    model: nn.Module,
    embed_dtype: mx.Dtype,
    images: Sequence[tuple[np.ndarray, Any]],
    stepwise: Callable[[], bool] = lambda: True,
) -> Generator[Unit, None, list[EncodedImage]]:
    """Several images through mlx-vlm's SigLIP tower in one batch, one unit (the patch
    embedding, then each encoder layer) evaluated per `next()` while `stepwise()`; then
    the projector. Returns each image's features divided by `sqrt(config.hidden_size)`, in
    `embed_dtype`: the rows mlx-vlm's merge writes into the input embeddings.

    As mlx-vlm does, pixels are cast to the embeddings' dtype before the tower."""
    tower = model.vision_tower.vision_model
    x = mx.concatenate([mx.array(p) for p, _ in images]).astype(embed_dtype)
    x = tower.embeddings(x.transpose(0, 2, 3, 1))
    rows = int(x.shape[0] * x.shape[1])
    if stepwise():
        yield Unit("embed", rows, tuple(x.shape))  # announced before it runs (step budget)
        mx.eval(x)
    for layer in tower.encoder.layers:
        x = layer(x, mask=None)
        if stepwise():
            yield Unit("block", rows, tuple(x.shape))
            mx.eval(x)
    features = model.multi_modal_projector(tower.post_layernorm(x))
    scaled = features / (model.config.hidden_size**0.5)
    encoded = [EncodedImage(scaled[k].astype(embed_dtype), None) for k in range(len(images))]
    mx.eval([e.features for e in encoded])
    return encoded
