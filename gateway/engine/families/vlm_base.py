"""What the mlx-vlm families with a 1D-RoPE language model share: `VlmFamily`, the base for
families whose language model takes `inputs_embeds` (image features merged into the input
embeddings) and reads each token's position from its layer cache's offset (SmolVLM,
Gemma 3, Mistral 3 / Pixtral, ...).

Each such family keeps the parts that really differ and inherits the rest:
- it says how one image sits in the prompt: `image_grid` (sizes only), `span_ids` (the token
  run that replaces one image placeholder, separators included), `preprocess` (the
  reference processor's pixels) and the placeholder token that marks image rows;
- it runs its tower: `tower_features` (lazy features of a group of images, one row per
  image-placeholder token in span order) and `tower_units` (the tower's modules whose outputs
  are evaluated one per engine step);
- the base does the rest: prompt layout (`layout_prompt`: each placeholder -> `span_ids`, one
  `ImageLayout.flat` span per image), the merge (an image's cached "features" are the
  embeddings of its whole span: the separators' token embeddings with the tower's features
  scattered over the image-token rows, exactly what the reference's merge puts in those
  rows), 1D positions, prefill through the language model's own `__call__` (its logits are
  what `prefill` returns, so rows equal the reference's), batched decode (`VlmTextCore`) and
  one plain `RowKVCache` per layer.

Why the span's embeddings and not only the image rows: the engine's caches and the exact-reuse
rule cut prompts at block boundaries that may fall inside a span; with one embedding row per
span token, `prompt_forward.plan_inputs` resumes mid-span by row index with no family logic.

Threads: as `ModelFamily` (prompt side any thread, engine side engine thread only).
"""

from __future__ import annotations

from abc import abstractmethod
from collections.abc import Callable, Generator, Sequence
from dataclasses import replace
from typing import Any, ClassVar

import mlx.core as mx
import mlx.nn as nn
import numpy as np
from mlx_lm.models.cache import KVCache

from caches.hashing import fingerprint
from gateway.engine.families.family import Grid, ModelFamily, eos_ids, model_fingerprint
from gateway.engine.model.kv import RowBatchKVCache, RowKVCache, share_row_state
from gateway.engine.model.prompt_forward import (
    GroupPart,
    PrefillPlan,
    join_caches,
    plan_inputs,
    split_caches,
)
from gateway.engine.model.vision import EncodedImage, Unit
from gateway.processors.positions import ImageLayout


class VlmTextCore(nn.Module):
    """An mlx-vlm language model as mlx-lm's BatchGenerator sees it: `(B, L)` ids and per-layer
    caches in, logits out, through the model's own `__call__` (positions from each row's
    cache offset: 1D RoPE, rope delta always 0)."""

    def __init__(self, language_model: nn.Module, layers: list[nn.Module]) -> None:
        super().__init__()
        self.lm = language_model
        self._layers = layers

    @property
    def layers(self) -> list[nn.Module]:
        return self._layers

    def make_cache(self) -> list[RowKVCache]:
        return [RowKVCache() for _ in self._layers]

    def __call__(self, inputs: mx.array, cache: list[Any] | None = None, **_: Any) -> mx.array:
        logits = self.lm(inputs, cache=cache).logits
        if cache and isinstance(cache[0], RowBatchKVCache):
            share_row_state(cache)  # equal values; cuts every layer's lazy offset chain
        return logits


class UnitRecorder:
    """Reports the (lazy) outputs of chosen tower modules while a tower call builds its graph,
    so they can be evaluated one per engine step. Swaps only the modules' Python classes for
    subclasses whose `__call__` also records the output; parameters and numerics untouched."""

    def __init__(self, units: Sequence[nn.Module]) -> None:
        self.outputs: list[Any] | None = None
        recorder = self
        for unit in units:
            base = type(unit)

            def call(module: nn.Module, *args: Any, _base: type = base, **kwargs: Any) -> Any:
                out = _base.__call__(module, *args, **kwargs)
                if recorder.outputs is not None:
                    recorder.outputs.append(out)
                return out

            unit.__class__ = type(f"Recorded{base.__name__}", (base,), {"__call__": call})


def _rows(array: Any) -> int:
    """Rows of a unit's output (all but the last axis): its share of the tower's work."""
    return int(array.size // array.shape[-1]) if array.ndim else 1


def _first_array(value: Any) -> Any:
    """The array(s) of a recorded output worth evaluating (a module may return a tuple)."""
    if isinstance(value, (tuple, list)):
        return [v for v in value if isinstance(v, mx.array)]
    return value


class VlmFamily(ModelFamily):
    """Base of the mlx-vlm families with 1D positions and an `inputs_embeds` language model.

    Subclasses set `family`, `MODEL_TYPES`, `EOS_MARKERS` and implement the abstract
    methods below plus `image_grid` / `preprocess`. Construct on the thread that will own MLX.
    """

    media = frozenset({"image"})
    MODEL_TYPES: ClassVar[tuple[str, ...]]
    EOS_MARKERS: ClassVar[tuple[str, ...]] = ()

    def __init__(self, path: str, lazy: bool = False) -> None:
        """`lazy`: weights unread (a prompt-side copy: tokenizer, processor, config only)."""
        from mlx_vlm import load  # slow import: only when a model is actually loaded

        self.path = path
        self.model, self.processor = load(path, lazy=lazy)
        config = self.model.config
        self.model_type = str(config.model_type)
        if self.model_type not in self.MODEL_TYPES:
            raise ValueError(f"not a {self.family} checkpoint: model type {self.model_type!r}")
        tokenizer = getattr(self.processor, "tokenizer", self.processor)
        self.image_processor = getattr(self.processor, "image_processor", None)
        self.vocab_size = int(config.text_config.vocab_size)
        config_eos = getattr(config, "eos_token_id", None)
        self._init_tokens(tokenizer, eos_ids(tokenizer, config_eos, self.EOS_MARKERS))
        self.language_model = self.model.language_model
        layers = self.decoder_layers()
        self._check_layers()
        self.text_core = VlmTextCore(self.language_model, layers)
        self.embed_dtype = self.embed_ids(mx.array([0], dtype=mx.int32)).dtype
        self.vision_dtype = self.tower_dtype()
        self._recorder = UnitRecorder(self.tower_units()) if not lazy else None
        self.fingerprint = model_fingerprint(path, self.model_type)
        self.processor_fingerprint = fingerprint(
            self.model_type, *sorted((k, _plain(v)) for k, v in self.processor_settings().items())
        )

    # ----- per family -------------------------------------------------------------------------

    @property
    @abstractmethod
    def image_token_id(self) -> int:
        """The placeholder id whose rows the tower's features replace (in the expanded run)."""

    @property
    @abstractmethod
    def placeholder_id(self) -> int:
        """The id the rendered template puts where an image goes (one per image)."""

    @property
    def feature_ids(self) -> tuple[int, ...]:
        """The ids whose rows a tower's features replace in a span: the image token's (a
        family with another tower, e.g. audio, adds its soft token)."""
        return (self.image_token_id,)

    def span_ids(self, grid: Grid) -> list[int]:
        """The token run one image placeholder expands to, for an image of this grid: its
        separators and `image_token_id` rows, as the reference processor expands it (the
        family's processor, `processors.vlm.VlmProcessor.span_ids`)."""
        return self.prompt.span_ids(grid)  # type: ignore[attr-defined]

    @abstractmethod
    def processor_settings(self) -> dict[str, Any]:
        """Every processor setting that changes pixels or token counts (the cache key)."""

    @abstractmethod
    def tower_units(self) -> list[nn.Module]:
        """The tower's modules, in call order, whose outputs are evaluated one per step."""

    @abstractmethod
    def tower_features(self, images: Sequence[tuple[np.ndarray, Grid]]) -> list[mx.array]:
        """The tower's features of each image, lazily: (image tokens, hidden) each, in the
        dtype the reference merges them in (cast to `embed_dtype` by the base's merge)."""

    def tower_dtype(self) -> mx.Dtype:
        """The dtype of the tower's weights (first parameter of the first unit)."""
        from mlx.utils import tree_flatten

        params = tree_flatten(self.tower_units()[0].parameters())
        return params[0][1].dtype if params else self.embed_dtype

    def decoder_layers(self) -> list[nn.Module]:
        """The language model's decoder layers (one KV cache each)."""
        lm = self.language_model
        return list(lm.layers if hasattr(lm, "layers") else lm.model.layers)

    def embed_ids(self, ids: mx.array) -> mx.array:
        """Input embeddings of text ids, as the reference's merge computes them."""
        lm = self.language_model
        embed = lm.embed_tokens if hasattr(lm, "embed_tokens") else lm.model.embed_tokens
        return embed(ids)

    def _check_layers(self) -> None:
        """Refuse a language model whose layers keep anything but plain KVCache (rotating
        windows, recurrent states): a family with those overrides `new_cache` and this.
        mlx-vlm's models make either mlx-lm's `KVCache` or mlx-vlm's own (mistral3's)."""
        from mlx_vlm.models.cache import KVCache as VlmKVCache

        make_cache = getattr(self.language_model, "make_cache", None)
        if make_cache is None:
            return  # mlx-vlm's default prompt cache: one KVCache per layer
        plain = (KVCache, VlmKVCache)
        kinds = sorted({type(c).__name__ for c in make_cache() if type(c) not in plain})
        if kinds:
            raise ValueError(f"{self.model_type} keeps {', '.join(kinds)} layers")

    # ----- prompt side (any thread) -----------------------------------------------------------

    # ----- engine side (engine thread only) ---------------------------------------------------

    def new_cache(self, rope_delta: int = 0) -> list[RowKVCache]:
        return [self.kv_layer(rope_delta) for _ in self.text_core.layers]

    def encode_steps_many(
        self,
        images: Sequence[tuple[np.ndarray, Grid]],
        stepwise: Callable[[], bool] = lambda: True,
    ) -> Generator[Unit, None, list[EncodedImage]]:
        """The group's tower graph is built once; each recorded unit output is evaluated in
        its own step while `stepwise()` (else the rest runs as one graph at the end). Returns,
        per image, the embeddings of its whole span (module doc), in `embed_dtype`."""
        assert self._recorder is not None, "a lazy family runs no tower"
        self._recorder.outputs = []
        try:
            features = self.tower_features(images)
        finally:
            units, self._recorder.outputs = self._recorder.outputs, None
        for k, hidden in enumerate(units):
            if stepwise():
                out = _first_array(hidden)
                head = out[0] if isinstance(out, list) else out  # a tuple's main output
                # Announced before it runs, so the step budget knows what the next() costs.
                yield Unit("embed" if k == 0 else "block", _rows(head), tuple(head.shape))
                mx.eval(out)
        encoded = [self._span_embeddings(f, grid) for f, (_, grid) in zip(features, images)]
        mx.eval([e.features for e in encoded])
        return encoded

    def _span_embeddings(self, features: mx.array, grid: Grid) -> EncodedImage:
        """The span's input embeddings: token embeddings of its ids with `features` put over
        the image-token rows (the reference's masked scatter, cast to the embedding dtype)."""
        run = np.asarray(self.span_ids(grid), dtype=np.int32)
        rows = np.flatnonzero(np.isin(run, self.feature_ids))
        if rows.size != features.shape[0]:
            raise RuntimeError(f"vision tower gave {features.shape[0]} features for {rows.size}")
        embeds = self.embed_ids(mx.array(run))
        embeds[mx.array(rows.astype(np.uint32))] = features.astype(embeds.dtype)
        return EncodedImage(embeds, None)

    def prefill_plan(
        self,
        prompt_ids: Sequence[int],
        layouts: Sequence[ImageLayout],
        encoded: Sequence[EncodedImage | None],
        start: int,
        end: int,
    ) -> PrefillPlan:
        """Embeddings of tokens [start, end) (span rows from the encoded spans) and their 1D
        positions (the language model reads them from the cache offset; these are for the
        engine's bookkeeping)."""
        plan = plan_inputs(
            self.embed_ids, self.feature_ids, prompt_ids, layouts, encoded, start, end
        )
        host = np.arange(start, end, dtype=np.int32)[None]
        return replace(plan, positions=mx.array(host)[:, None, :], host_positions=host)

    def prefill(
        self, plan: PrefillPlan, cache: list[RowKVCache], lo: int, hi: int, rows: int = 0
    ) -> mx.array:
        """Plan rows [lo, hi) through the language model's own `__call__`, padded to `rows`
        with zero embeddings after the real rows (causal attention keeps them out of every
        real row; their KV is trimmed); returns the logits, lazily."""
        ids, embeds = _padded(plan, lo, hi, rows)
        logits = self.language_model(ids, inputs_embeds=embeds, cache=cache).logits
        pad = ids.shape[1] - (hi - lo)
        if pad:
            for layer in cache:
                layer.trim(pad)
        mx.eval([c.state for c in cache])
        return logits

    def prefill_group(self, parts: Sequence[GroupPart], rows: int) -> mx.array:
        """Several requests' ranges at the same positions in one forward, each padded as
        `prefill` pads it; each cache ends holding its real rows."""
        offset = parts[0].cache[0].offset
        assert all(p.cache[0].offset == offset for p in parts), "blocks at different positions"
        inputs = [_padded(p.plan, p.lo, p.hi, rows) for p in parts]
        ids = mx.concatenate([i for i, _ in inputs], axis=0)
        embeds = mx.concatenate([e for _, e in inputs], axis=0)
        joint = join_caches([p.cache for p in parts])
        logits = self.language_model(ids, inputs_embeds=embeds, cache=joint).logits
        mx.eval([c.state for c in joint])
        split_caches([p.cache for p in parts], [p.hi - p.lo for p in parts], joint)
        return logits

    def logits(self, states: mx.array) -> mx.array:
        return states  # `prefill` already returns the language model's logits


def _padded(plan: PrefillPlan, lo: int, hi: int, rows: int) -> tuple[mx.array, mx.array]:
    """Plan rows [lo, hi) as (ids, embeds), padded after the real rows to `rows` rows (the
    last id repeated, zero embeddings)."""
    assert plan.embeds is not None
    ids, embeds = plan.ids[:, lo:hi], plan.embeds[:, lo:hi]
    pad = rows - (hi - lo)
    if pad > 0:
        ids = mx.concatenate([ids, mx.broadcast_to(ids[:, -1:], (1, pad))], axis=1)
        zeros = mx.zeros((1, pad, embeds.shape[2]), embeds.dtype)
        embeds = mx.concatenate([embeds, zeros], axis=1)
    return ids, embeds


def _plain(value: Any) -> Any:
    """A processor setting as a hashable, order-stable value."""
    if isinstance(value, dict):
        return tuple(sorted((str(k), _plain(v)) for k, v in value.items()))
    if isinstance(value, (list, tuple)):
        return tuple(_plain(v) for v in value)
    if isinstance(value, (str, int, float, bool)) or value is None:
        return value
    return repr(value)
