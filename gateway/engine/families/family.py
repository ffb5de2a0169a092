"""The model-family adapter: the one object through which the engine, the caches and the API
use a model. Everything that differs between model families lives behind it; nothing outside
`gateway/engine/families/` names a family or branches on a `model_type`.

A family is a subclass of `ModelFamily` registered by its checkpoints' `model_type`
(`gateway.engine.families.registry`). This module holds the contract every family keeps and
the parts that are the same for all of them (chat template, tokenizer, detokenizer, stop ids,
fingerprints).

Threads: prompt-side methods (marked "any thread") may run in worker threads at once (the
tokenizer is guarded by a lock; everything else they read is immutable after `__init__`).
Engine-side methods run only on the engine thread, which owns MLX. A family object is built
on the thread that will own MLX (`load_model`); a `lazy` one (weights unread) serves only the
prompt side. The prompt half is `prompt`, a `gateway.processors.PromptProcessor` (no MLX):
every family delegates its prompt methods to it (`prompt_split`, pinned for each family by
tests/gateway/processors/test_shipped.py) and the engine process ships it to the HTTP
process (`shipped_prompt`), which never imports MLX.

What the engine assumes of every family (read these before adding one):
- Prompts are token ids with every image's placeholder run already expanded
  (`layout_prompt`); an image is one `ImageLayout` span [start, end) of `num_tokens` tokens,
  and the caches never cut a prompt inside a span (a prefix hit or a stored block boundary
  may fall inside one only under the exact-reuse rule, where the family's `prefill_plan`
  resumes mid-image from the cached features).
- Positions: the token at index i >= `cut` sits at position `i + delta` with
  `delta = rope_delta_at(layouts, cut)` (`processors/positions.py`), the sum of each
  earlier span's `rope_shift`. Families with 1D positions (one position per token) build
  their spans with `ImageLayout.flat`, whose shift is 0; Qwen's mRoPE spans shift by
  `max(t, h, w) - t*h*w`. Each KV layer's cache carries the delta of its row
  (`RowKVCache.rope_delta`) into decode, where `text_core` reads it.
- KV layout: `new_cache()` gives one `RowKVCache` (a plain, trimmable full-attention
  `KVCache`, or a subclass that keeps every position's KV the same way, e.g.
  `window_kv.WindowKVCache` for a sliding-window layer) per layer; a prefix hit fills the
  family's own `new_cache()`. The prefix cache stores and restores plain KV blocks and the
  decode batch merges and filters them; a family whose layers keep anything else (a ring
  buffer that wraps, KV shared across layers) cannot be trimmed back to a block boundary
  and turns the prefix cache off through `cache_policy` (the reason shows in
  /v1/cache/stats). A recurrent (or convolution) state layer keeps a
  `state_cache.RowStateCache` instead: the family marks its state after every prompt
  forward, and the prefix cache stores that snapshot at each block's end next to the KV
  layers' blocks (`state_snapshots`; `engine/model/snapshots.py`).
- Cache keys: a vision-cache entry is keyed by (`fingerprint`, `processor_fingerprint`,
  KV dtype, pixel hash); `processor_fingerprint` must cover every processor setting that
  changes pixels or token count (resize, tiling, token budget). The prefix cache's key is the
  token ids plus each span's content hash, so the same pixels with different settings must
  give a different span length or a different content hash (`layout_prompt` decides).
- Exactness: a block of prompt rows is computed by `prefill` in one fixed shape (padded to
  `rows`) from the same inputs whether cold or recomputed after a hit, so a hit equals no
  cache; `prefill_group` must give each part what `prefill` gives it alone (on CPU: tested at
  tolerance zero).
"""

from __future__ import annotations

import json
import logging
from abc import ABC, abstractmethod
from collections.abc import Callable, Generator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

import mlx.core as mx
import numpy as np

from caches.hashing import fingerprint
from gateway.engine.model.kv import RowKVCache
from gateway.engine.model.prompt_forward import GroupPart, PrefillPlan
from gateway.engine.model.quant_kv import KVQuant, RowQuantKVCache
from gateway.engine.model.vision import EncodedImage, Unit
from gateway.engine.tokens.detokenizer import (
    ByteStreamDetokenizer,
    Detokenizer,
    byte_table,
    token_bytes,
)
from gateway.engine.tokens.output import IncrementalDetokenizer
from gateway.processors.positions import ImageLayout
from gateway.processors.processor import PromptProcessor
from gateway.processors.video_layout import VideoLayout
from gateway.processors.video_processor import VideoFrames

log = logging.getLogger(__name__)

Grid = tuple[int, int, int]  # (t, h, w) in unmerged patches, as the vision tower takes it


@dataclass(frozen=True)
class CachePolicy:
    """Which of the engine's caches may serve a family. A reason (one sentence, shown in
    /v1/cache/stats under "family") turns that cache off for every request: lookups miss and
    nothing is stored, in memory and on disk. None: the cache is on (if configured)."""

    prefix_off: str | None = None  # KV prefix / radix blocks (and their disk tier)
    vision_off: str | None = None  # vision-tower features (and their disk tier)


class ModelFamily(ABC):
    """A loaded checkpoint of one model family. See the module doc for the contract.

    Attributes every family sets in `__init__`:
    - `family`: the family's name (a class constant, e.g. "qwen_vl", "text");
    - `model_type`: the checkpoint's `config.json` `model_type` (`arch` is the same);
    - `media`: the kinds of media parts the model takes ("image", "video"); empty for text;
    - `tokenizer`: the Hugging Face tokenizer (grammars and detokenizers read its vocabulary);
    - `vocab_size`, `eos_token_ids`: the logits' width and the ids that end an answer;
    - `embed_dtype`: the dtype the input embedding produces (KV and features are in it);
    - `vision_dtype`: the vision tower's weights' dtype (`embed_dtype` when there is none);
    - `text_core`: the `nn.Module` mlx-lm's BatchGenerator decodes with: `(B, L)` token ids
      and a list of per-layer caches in, `(B, L, vocab)` logits out; positions from each
      row's cache (`tokens in cache + rope_delta`);
    - `fingerprint`, `processor_fingerprint`: cache-key parts (module doc, "Cache keys");
    - `cache_policy`: which caches are off for this family and why.
    """

    family: ClassVar[str]
    media: ClassVar[frozenset[str]] = frozenset()
    model_type: str
    path: str
    tokenizer: Any
    vocab_size: int
    eos_token_ids: tuple[int, ...]
    embed_dtype: mx.Dtype
    vision_dtype: mx.Dtype
    text_core: Any
    fingerprint: str
    processor_fingerprint: str
    cache_policy: CachePolicy = CachePolicy()
    # True: `prefill` feeds the prompt's last token as a one-row step of its own (as the
    # reference library does, where that changes the numerics, e.g. a sliding window read in
    # ring order), so its KV is not what a block forward gives it: the prefix cache never
    # stores the prompt's last token (a longer prompt computes it in a block).
    last_token_apart: ClassVar[bool] = False
    # Exact-reuse blocks are rounded up to a multiple of this many tokens, so that each
    # block forward covers whole chunks of a layer that computes in fixed chunks (Qwen3.5's
    # chunked gated-delta scan: 64) and equals the reference's one-pass prefill.
    block_multiple: ClassVar[int] = 1
    # True: some layers keep a recurrent state (`RowStateCache`), reused through snapshots at
    # block ends, which exist only under the exact-reuse rule (else the prefix cache is off).
    state_snapshots: ClassVar[bool] = False
    # True: `encode_steps_many` runs each image through the tower alone whatever the group,
    # so the load-time check that a group keeps every image's bits has nothing to check
    # (`scheduler/group_check.py`; Gemma 3n, whose tower runs take tens of seconds on CPU).
    encodes_each_alone: ClassVar[bool] = False
    # --kv-bits: set by the engine once, right after loading, before any cache is made
    # (`engine/model/kv_check.py` refuses a family whose layers it does not cover).
    kv_quant: KVQuant | None = None
    # Why quantized KV cannot serve this family (None: it can, where its heads allow),
    # known from the class alone, so a server refuses before loading the weights.
    kv_quant_off: ClassVar[str | None] = None
    # True: `prompt` is this family's whole prompt side (a `PromptProcessor` subclass whose
    # grids and layout the family's own methods delegate to), so the engine process sends it
    # to the HTTP process, which needs no MLX. A family must set it: the HTTP process has no
    # other way to build its prompts (the engine process refuses to serve one without).
    prompt_split: ClassVar[bool] = False
    prompt: PromptProcessor

    @property
    def arch(self) -> str:
        """The checkpoint's `model_type` (log lines, bench labels)."""
        return self.model_type

    def _init_tokens(
        self,
        tokenizer: Any,
        eos_token_ids: Sequence[int],
        prompt: PromptProcessor | None = None,
    ) -> None:
        """Set up the shared prompt side over a Hugging Face tokenizer (call in `__init__`
        once `path`, `model_type` and `vocab_size` are set): `prompt`, the family's processor
        over `tokenizer` (`own_prompt`), renders and tokenizes."""
        self.tokenizer = tokenizer
        self.prompt = self.own_prompt(tokenizer, prompt)
        self._tokenizer_lock = self.prompt.tokenizer_lock  # one lock per tokenizer
        # Audio is the processor's alone (`PromptProcessor.audio_rate`, `audio_grid`).
        self.audio_rate, self.audio_grid = self.prompt.audio_rate, self.prompt.audio_grid
        self.eos_token_ids = tuple(sorted(set(eos_token_ids)))
        self._byte_table = byte_table(tokenizer, self.vocab_size)
        if self._byte_table is None:
            log.info("tokenizer is not plain byte-level BPE: generic streaming detokenizer")

    def own_prompt(self, tokenizer: Any, given: PromptProcessor | None) -> PromptProcessor:
        """The family's prompt side over `tokenizer`: `given` (what a base class built), else
        a plain `PromptProcessor`. A family whose prompt side has settings of its own builds
        it here from what it loaded (called once, from `_init_tokens`)."""
        return given or PromptProcessor(self.path, self.model_type, tokenizer)

    def describe(self) -> dict[str, Any]:
        """The family as /v1/models and /v1/cache/stats show it (JSON-able; any thread)."""
        policy = self.cache_policy

        def state(reason: str | None) -> str:
            return "on" if reason is None else f"off: {reason}"

        return {
            "family": self.family,
            "model_type": self.model_type,
            "media": sorted(self.media),
            "prefix_cache": state(policy.prefix_off),
            "vision_cache": state(policy.vision_off),
        }

    # ----- prompt side, shared (any thread) ---------------------------------------------------

    @property
    def chat_template(self) -> str | None:
        """The chat template's text (`PromptProcessor.chat_template`)."""
        return self.prompt.chat_template

    def render(
        self,
        messages: list[dict[str, Any]],
        tools: list[dict[str, Any]] | None = None,
        template_kwargs: dict[str, Any] | None = None,
    ) -> str:
        """The checkpoint's chat template over `messages` (`PromptProcessor.render`: media
        parts in place, ValueError when the template refuses the conversation)."""
        return self.prompt.render(messages, tools, template_kwargs)

    def tokenize(self, text: str, special_tokens: bool = False) -> list[int]:
        """Token ids of `text` (`PromptProcessor.tokenize`)."""
        return self.prompt.tokenize(text, special_tokens)

    @property
    def embed_bytes(self) -> int:
        """Bytes of one KV value (the context's memory bound reads it)."""
        return int(self.embed_dtype.size)

    def shipped_prompt(self) -> PromptProcessor | None:
        """The prompt side the engine process sends the HTTP process (`wire.Ready`), with the
        family's card and KV value size; None for a family that does not set `prompt_split`
        (the HTTP process then refuses to serve it)."""
        if not self.prompt_split:
            return None
        return self.prompt.described(self.describe(), self.embed_bytes)

    def decode(self, ids: Sequence[int]) -> str:
        with self._tokenizer_lock:
            return self.tokenizer.decode(list(ids), skip_special_tokens=True)

    def new_detokenizer(self) -> Detokenizer:
        """A streaming detokenizer for one request (any thread; the result is not shared)."""
        if self._byte_table is not None:
            return ByteStreamDetokenizer(self._byte_table)
        return IncrementalDetokenizer(self.decode)

    def token_text(self, token_id: int) -> str:
        """One token's text, special tokens included (for logprobs)."""
        with self._tokenizer_lock:
            return self.tokenizer.decode([token_id])

    def token_bytes(self, token_id: int, text: str) -> bytes:
        """One token's raw bytes (a logprob's `bytes`: part of a character for byte tokens),
        given its `token_text`; the vocabulary is read only where the byte table has none."""
        table = self._byte_table
        entry = table[token_id] if table is not None and 0 <= token_id < len(table) else None
        if entry:
            return entry
        with self._tokenizer_lock:
            piece = self.tokenizer.convert_ids_to_tokens(token_id)
        return token_bytes(None, piece, text)

    # ----- prompt side, per family (any thread; the processor's, but pixels) -----------------

    def image_grid(self, width: int, height: int) -> Grid:
        """The patch grid `preprocess` would give an image of this size (pixels), without
        touching pixels (the prompt side's: `PromptProcessor.image_grid`). Raises ValueError
        for an image the processor refuses."""
        return self.prompt.image_grid(width, height)

    @abstractmethod
    def preprocess(self, image: Any) -> tuple[np.ndarray, Grid]:
        """A PIL RGB image (or a `VideoFrames` clip) -> (pixel values as the tower takes
        them, grid); equal to the checkpoint's reference processor's output."""

    def video_grid(self, frames: int, width: int, height: int) -> Grid:
        """The patch grid of a clip of `frames` sampled frames (ValueError: unsupported)."""
        return self.prompt.video_grid(frames, width, height)

    def video_layout(self, grid: Grid, times: Sequence[float]) -> VideoLayout:
        """How a clip with this grid and these frame times (seconds) sits in the prompt."""
        return self.prompt.video_layout(grid, times)

    def video_clip(
        self, frames: np.ndarray, times: Sequence[float], grid: Grid, block: int | None = None
    ) -> VideoFrames:
        """The frames `preprocess` takes for a clip (or for one of its placeholder blocks)."""
        return self.prompt.video_clip(frames, times, grid, block)

    def layout_prompt(
        self, ids: Sequence[int], grids: Sequence[Grid | VideoLayout]
    ) -> tuple[list[int], list[ImageLayout]]:
        """Expand each media placeholder of the tokenized prompt (one `grids` entry per image
        or video, in prompt order) into the family's run of tokens; returns the final ids and
        one `ImageLayout` per placeholder run, in order. ValueError when the placeholders and
        `grids` disagree. With no media: `(list(ids), [])` (`PromptProcessor.layout_prompt`)."""
        return self.prompt.layout_prompt(ids, grids)

    # ----- engine side (engine thread only) ---------------------------------------------------

    @abstractmethod
    def new_cache(self, rope_delta: int = 0) -> list[RowKVCache]:
        """An empty KV cache, one entry per layer, for one sequence (module doc, KV layout)."""

    def kv_layer(self, rope_delta: int = 0) -> RowKVCache:
        """One full-attention layer's empty cache: quantized under --kv-bits (`kv_quant`).
        Families build `new_cache` from these where their attention is mlx-lm's or
        mlx-vlm's (which read a quantized cache through quantized matmuls)."""
        if self.kv_quant is None:
            return RowKVCache(rope_delta)
        return RowQuantKVCache(self.kv_quant, rope_delta)  # type: ignore[return-value]

    @abstractmethod
    def encode_steps_many(
        self, images: Sequence[tuple[np.ndarray, Grid]], stepwise: Callable[[], bool] = ...
    ) -> Generator[Unit, None, list[EncodedImage]]:
        """Several images through the vision tower in one call, a unit of work at a time while
        `stepwise()` (the engine decodes between units): each `next()` yields the `Unit` the
        following `next()` will evaluate (its cost key for the step budget) and evaluates the
        one yielded before (`gateway.engine.model.vision.VisionEncoder.steps_many`); returns
        each image's features (`EncodedImage.features`: (num_tokens, hidden) in
        `embed_dtype`, one row per placeholder token of its span)."""

    def encode_steps(self, pixel_values: np.ndarray, grid: Grid) -> Generator[Unit, None, Any]:
        """One image through the tower, one unit per `next()`; returns its `EncodedImage`."""
        [encoded] = yield from self.encode_steps_many([(pixel_values, grid)])
        return encoded

    def encode_image(self, pixel_values: np.ndarray, grid: Grid) -> EncodedImage:
        """One image through the whole tower at once."""
        steps = self.encode_steps(pixel_values, grid)
        while True:
            try:
                next(steps)
            except StopIteration as done:
                return done.value

    @abstractmethod
    def prefill_plan(
        self,
        prompt_ids: Sequence[int],
        layouts: Sequence[ImageLayout],
        encoded: Sequence[EncodedImage | None],
        start: int,
        end: int,
    ) -> PrefillPlan:
        """The inputs of prompt tokens [start, end): ids, embeddings with the image features
        merged in (None when the family feeds ids), positions on the host (`host_positions`,
        (axes, L): one axis for 1D families, three for mRoPE) and on the device. `end` never
        falls inside a span; `start` may (features then start at that row); `encoded[i]` is
        given for every image overlapping the range."""

    @abstractmethod
    def prefill(
        self, plan: PrefillPlan, cache: list[RowKVCache], lo: int, hi: int, rows: int = 0
    ) -> mx.array:
        """Feed plan rows [lo, hi) into `cache` in one forward padded to `rows` query rows
        (pad rows after the real ones, their KV trimmed again); returns the states
        (1, max(rows, hi - lo), d), lazily, that `logits` maps to logits. Evaluates `cache`.
        The engine reads only the prompt's last row, so a family may compute that row alone
        (the others then hold zeros; e.g. Gemma 4's KV-sharing layers, as mlx-vlm)."""

    @abstractmethod
    def prefill_group(self, parts: Sequence[GroupPart], rows: int) -> mx.array:
        """Several requests' ranges at the same absolute positions in one forward, each padded
        to `rows`; returns states (len(parts), rows, d); each part's cache ends holding its
        real rows. Each row must equal what `prefill` gives that part alone."""

    @abstractmethod
    def logits(self, states: mx.array) -> mx.array:
        """Logits (..., vocab) of states returned by `prefill` / `prefill_group`."""


def eos_ids(tokenizer: Any, config_eos: Any, markers: Sequence[str]) -> tuple[int, ...]:
    """The config's eos ids, the tokenizer's, and those of the `markers` (chat end tokens)
    the vocabulary has."""
    ids: set[int] = set()
    if isinstance(config_eos, int):
        ids.add(config_eos)
    elif config_eos:
        ids.update(int(e) for e in config_eos)
    if getattr(tokenizer, "eos_token_id", None) is not None:
        ids.add(int(tokenizer.eos_token_id))
    for special in markers:
        tid = tokenizer.convert_tokens_to_ids(special)
        if isinstance(tid, int) and tid >= 0 and tid != tokenizer.unk_token_id:
            ids.add(tid)
    return tuple(sorted(ids))


def model_fingerprint(path: str, model_type: str) -> str:
    """A checkpoint's identity for cache keys: its config and weight files' names, sizes and
    modification times (a hub id when there is no local config)."""
    root = Path(path)
    parts: list[object] = [model_type]
    config = root / "config.json"
    if config.is_file():
        parts.append(json.dumps(json.loads(config.read_text()), sort_keys=True))
        for f in sorted(root.glob("*.safetensors")):
            st = f.stat()
            parts.append((f.name, st.st_size, st.st_mtime_ns))
    else:
        parts.append(path)
    return fingerprint(*parts)
