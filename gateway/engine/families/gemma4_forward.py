"""Gemma 4's prompt forward over mlx-vlm's modules (`Gemma4Forward`): what a prompt range
feeds (`Gemma4Plan`), the attention masks with bidirectional image runs, and the layer loop
with KV-sharing layers. Engine thread only; nothing here is thread-safe.

How mlx-vlm 0.7.10's generate prefills a Gemma 4 prompt, which this reproduces row for row:
- a prompt holding image soft tokens, with `use_bidirectional_attention: "vision"`, is fed in
  ONE forward (its `chunked_prefill_policy` refuses chunks), the last token included, with
  every layer's mask (sliding and full) widened so that each soft token attends to every
  soft token of its own image (`_apply_blockwise_bidirectional_overlay`). Here a block forward
  whose range ends inside an image run reads ahead to the run's end (those extra rows' KV is
  trimmed again; the next block recomputes them from the same inputs), so every image row is
  computed with its whole image visible, and the KV a block stores is the reference's;
- any other prompt (text only, or a checkpoint without the vision overlay) is fed in chunks
  of all but the last token, then the last token as a one-row step (sliding layers read their
  ring in slot order: `window_kv.py`), exactly as Gemma 3 (`gemma3_forward.py`);
- `logits_to_keep=1`: the layers that share an earlier layer's KV (`num_kv_shared_layers`)
  write no KV, so they run on the one row whose logits are read (the prompt's last) and on
  no other; the same here (they run nowhere in a block that does not end the prompt).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import mlx.core as mx
import mlx.nn as nn
import numpy as np

from gateway.engine.families.gemma3_forward import set_ring_phase
from gateway.engine.model.kv import RowKVCache
from gateway.engine.model.prompt_forward import PrefillPlan
from gateway.engine.model.window_kv import shared_ring

Run = tuple[int, int]  # absolute [start, end) of one image's soft tokens


@dataclass(frozen=True)
class Gemma4Plan(PrefillPlan):
    """A prompt range's inputs plus what Gemma 4's forward needs beyond them: `start` (the
    absolute position of plan row 0), `layer_ids` ((1, L) ids for the per-layer input
    embeddings: media tokens as 0, as mlx-vlm's merge), `runs` (every image's soft-token run
    in the whole prompt), `whole` (the reference feeds this prompt in one forward: module doc)
    and `final` (the range ends the prompt)."""

    start: int = 0
    layer_ids: mx.array | None = None
    runs: tuple[Run, ...] = ()
    whole: bool = False
    final: bool = True


def soft_token_runs(ids: np.ndarray, image_token_id: int) -> tuple[Run, ...]:
    """Absolute [start, end) of each maximal run of `image_token_id` (mlx-vlm's
    `_block_sequence_ids_for_mask` groups soft tokens the same way)."""
    hits = np.flatnonzero(ids == image_token_id)
    if hits.size == 0:
        return ()
    breaks = np.flatnonzero(np.diff(hits) != 1)
    starts = np.concatenate([[hits[0]], hits[breaks + 1]])
    ends = np.concatenate([hits[breaks], [hits[-1]]]) + 1
    return tuple((int(a), int(b)) for a, b in zip(starts, ends))


class Gemma4Forward:
    """Prompt prefill over mlx-vlm's Gemma 4 language model (`language_model`: its
    `LanguageModel`; `window`: the sliding layers' window)."""

    def __init__(self, language_model: nn.Module, window: int) -> None:
        self.lm = language_model.model  # Gemma4TextModel: embeddings in, final norm out
        self.window = window
        self.first_shared = int(self.lm.first_kv_shared_layer_idx)

    def raw_layer_inputs(self, layer_ids: mx.array) -> mx.array | None:
        """The per-layer input embeddings of ids (None for a model without them)."""
        if not self.lm.hidden_size_per_layer_input:
            return None
        return self.lm.get_per_layer_inputs(layer_ids)

    def prefill(
        self, plan: Gemma4Plan, cache: list[RowKVCache], lo: int, hi: int, rows: int = 0
    ) -> mx.array:
        """Plan rows [lo, hi) into `cache` (module doc). Returns (1, max(rows, hi - lo), d)
        final hidden states, lazily, of which only the prompt's last row is computed (when
        the range ends the prompt; every other row is zeros: no caller reads it)."""
        ends_prompt = plan.final and hi == plan.length
        apart = ends_prompt and not plan.whole
        body = hi - 1 if apart else hi
        out = None
        if body > lo:
            last_row = hi - 1 - lo if ends_prompt and not apart else None
            if plan.whole:
                out = self._block(plan, cache, lo, body, rows, last_row)
            else:
                self._causal_block(plan, cache, lo, body, rows)
        if apart:
            set_ring_phase(cache)
            raw = self.raw_layer_inputs(plan.layer_ids[:, hi - 1 : hi])  # type: ignore[index]
            one = plan.embeds[:, hi - 1 : hi]  # type: ignore[index]
            with shared_ring(cache, 1):
                out = self.lm(
                    plan.ids[:, hi - 1 : hi], inputs_embeds=one, cache=cache, per_layer_inputs=raw
                )
            mx.eval([c.state for c in cache])
        elif ends_prompt:
            set_ring_phase(cache)  # the first decode step is the ring's first one-row update
        width = max(rows, hi - lo)
        if out is None:
            return mx.zeros((1, width, self.lm.config.hidden_size), plan.embeds.dtype)  # type: ignore[union-attr]
        before = mx.zeros((1, hi - 1 - lo, out.shape[2]), out.dtype)
        after = mx.zeros((1, width - (hi - lo), out.shape[2]), out.dtype)
        return mx.concatenate([before, out, after], axis=1)

    def _causal_block(
        self, plan: Gemma4Plan, cache: list[RowKVCache], lo: int, hi: int, rows: int
    ) -> None:
        """Rows [lo, hi) of a prompt the reference chunks, through the model's own forward
        (its masks from the caches, as Gemma 3's blocks), padded to `rows`."""
        embeds, layer_ids, pad = self._inputs(plan, lo, hi, rows)
        raw = self.raw_layer_inputs(layer_ids)
        self.lm(
            layer_ids, inputs_embeds=embeds, cache=cache, per_layer_inputs=raw, logits_to_keep=1
        )
        _trim(cache, pad)

    def _inputs(
        self, plan: Gemma4Plan, lo: int, hi: int, rows: int
    ) -> tuple[mx.array, mx.array, int]:
        """Embeddings and per-layer ids of rows [lo, hi), padded after the real rows to
        `rows` (zero embeddings, id 0); returns them and the pad's length."""
        embeds = plan.embeds[:, lo:hi]  # type: ignore[index]
        layer_ids = plan.layer_ids[:, lo:hi]  # type: ignore[index]
        pad = max(rows - (hi - lo), 0)
        if pad:
            embeds = mx.concatenate([embeds, mx.zeros((1, pad, embeds.shape[2]), embeds.dtype)], 1)
            layer_ids = mx.concatenate([layer_ids, mx.zeros((1, pad), layer_ids.dtype)], 1)
        return embeds, layer_ids, pad

    def _block(
        self,
        plan: Gemma4Plan,
        cache: list[RowKVCache],
        lo: int,
        hi: int,
        rows: int,
        last_row: int | None,
    ) -> mx.array | None:
        """Rows [lo, hi) of a prompt the reference feeds whole, reading ahead to the end of an
        image run that crosses `hi`; the KV-owning layers on every row, the sharing layers on
        `last_row` alone (if given). Returns that row's final states (1, 1, d), lazily."""
        end = hi
        for a, b in plan.runs:
            if a < plan.start + hi < b:
                end = b - plan.start
        embeds, layer_ids, pad = self._inputs(plan, lo, end, rows)
        h = embeds
        raw = self.raw_layer_inputs(layer_ids)
        pli = None if raw is None else self.lm.project_per_layer_inputs(h, raw)
        offset = plan.start + lo
        masks = self._masks(plan, offset, h.shape[1])
        layers = self.lm.layers
        shared: list[Any] = [None] * len(layers)
        for idx in range(self.first_shared):
            layer = layers[idx]
            h, kvs, off = layer(
                h,
                masks[layer.layer_type],
                cache[idx],
                per_layer_input=None if pli is None else pli[:, :, idx, :],
            )
            shared[idx] = (kvs, off)
        _trim(cache, pad + end - hi)
        if last_row is None:
            return None
        x = h[:, last_row : last_row + 1]
        for idx in range(self.first_shared, len(layers)):
            layer = layers[idx]
            kvs, off = shared[self.lm.previous_kvs[idx]]
            mask = masks[layer.layer_type][..., last_row : last_row + 1, :]
            row_input = None if pli is None else pli[:, last_row : last_row + 1, idx, :]
            x, _, _ = layer(
                x, mask, None, per_layer_input=row_input, shared_kv=kvs, offset=off + last_row
            )
        return self.lm.norm(x)

    def _masks(self, plan: Gemma4Plan, offset: int, n: int) -> dict[str, mx.array]:
        """(1, 1, n, offset + n) boolean masks per layer type for query rows at absolute
        positions [offset, offset + n): causal (sliding: within the window), widened to every
        pair of soft tokens of one image (mlx-vlm's overlay, on both layer types)."""
        q = np.arange(offset, offset + n)[:, None]
        k = np.arange(offset + n)[None, :]
        full = q >= k
        sliding = full & (q < k + self.window)
        for a, b in plan.runs:
            if b <= offset or a >= offset + n:
                continue
            same = (q >= a) & (q < b) & (k >= a) & (k < b)
            full = full | same
            sliding = sliding | same
        return {
            "full_attention": mx.array(full)[None, None],
            "sliding_attention": mx.array(sliding)[None, None],
        }


def _trim(cache: list[RowKVCache], extra: int) -> None:
    """Drop the last `extra` positions of every layer (pad and read-ahead rows), then
    evaluate the caches."""
    if extra:
        for layer in cache:
            layer.trim(extra)
    mx.eval([c.state for c in cache])
