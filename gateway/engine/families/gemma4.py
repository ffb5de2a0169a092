"""Gemma 4 (`model_type` "gemma4") over mlx-vlm: the only module that knows its tower and
cache layout. The prompt forward is in `gemma4_forward.py`; the prompt side (image layout,
token budget) is `gateway.processors.gemma4.Gemma4Processor`, which this family builds from
what mlx-vlm loaded and delegates to.

What differs from the other families (checked against mlx-vlm 0.7.10):
- prompt: the template writes `<|image|>` where an image part is; the processor replaces it
  by `<|image>` + one `<|image|>` soft token per pooled patch + `<image|>` (special tokens
  split the text, so expanding ids here gives the processor's ids: `VlmFamily`);
- token budget: each image is resized, aspect ratio kept, to the largest multiple of
  `pooling_kernel_size * patch_size` px per side within `max_soft_tokens * k^2` patches, so
  the count varies with the image's shape (<= `max_soft_tokens`); the budget and every
  resize / rescale setting are in `processor_fingerprint`;
- vision: patch embedding with 2D positions (the tower's 2D RoPE over the patch grid), the
  encoder layers, a k x k average pool, then `embed_vision` (norm + projection); each image
  goes through the tower alone, as mlx-vlm runs images of different sizes; the features are
  merged unscaled, text rows are `embed_tokens * sqrt(hidden)`;
- per-layer inputs: every layer also takes a slice of a per-layer embedding of the ids (media
  tokens as id 0) plus a projection of the merged embeddings;
- attention: inside one image the soft tokens attend to each other both ways, on sliding and
  full layers (`use_bidirectional_attention: "vision"`), so a prompt with images is prefilled
  as the reference does it, every image run whole (`gemma4_forward.py`); the cost is a
  read-ahead of at most one image run per block;
- audio (a checkpoint with an audio tower): the template writes `<|audio|>` per audio part;
  it becomes `<|audio>` + one `<|audio|>` per 40 ms + `<audio|>` (`Gemma4Processor`). The
  clip's input is the checkpoint's own feature extractor's log-mel spectrogram (`preprocess`
  of an `AudioClip`; the padding flags ride along as one more column), each clip alone
  through the Conformer tower and `embed_audio`, merged unscaled like image features. Audio
  runs are causal, and mlx-vlm chunks any prompt holding audio, so its image overlay never
  applies there: a prompt with audio (images or not) is prefilled causally in blocks, as a
  text prompt is. Two clips of one prompt equal mlx-vlm's when the longer comes first; after
  a shorter one, mlx-vlm's merge (one masked scatter over the padded batch) gives the later
  clip the earlier one's padding rows, which each clip alone here does not copy;
- KV: sliding layers (`WindowKVCache`: all positions kept, the window read in mlx-vlm's ring
  order) and full layers (`RowKVCache`); the last `num_kv_shared_layers` layers reuse the KV
  of the last earlier layer of their type, so there are fewer caches than layers (6 for 10
  in the tiny E2B-like checkpoint) and the sharing layers store nothing.

Prompt side any thread, engine side engine thread only (see `ModelFamily`, `VlmFamily`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import fields
from typing import Any

import mlx.core as mx
import mlx.nn as nn
import numpy as np

from gateway.engine.families.family import Grid
from gateway.engine.families.gemma3_forward import Gemma3Core, prefill_each
from gateway.engine.families.gemma4_forward import Gemma4Forward, Gemma4Plan, soft_token_runs
from gateway.engine.families.vlm_base import VlmFamily
from gateway.engine.model.kv import RowKVCache
from gateway.engine.model.prompt_forward import GroupPart, PrefillPlan
from gateway.engine.model.vision import EncodedImage
from gateway.engine.model.window_kv import layer_caches
from gateway.processors.audio import AudioClip, AudioGrid, packed_log_mel
from gateway.processors.gemma4 import Gemma4Audio, Gemma4Processor, Gemma4Settings
from gateway.processors.positions import ImageLayout
from gateway.processors.processor import PromptProcessor
from gateway.processors.video_processor import VideoFrames

MODEL_TYPES = ("gemma4",)
_SETTINGS = (
    "do_resize",
    "size",
    "resample",
    "do_rescale",
    "rescale_factor",
    "do_normalize",
    "image_mean",
    "image_std",
    "do_convert_rgb",
    "patch_size",
    "max_soft_tokens",
    "pooling_kernel_size",
)
# The feature extractor's settings that change an audio clip's features.
_AUDIO_SETTINGS = (
    "feature_size",
    "sampling_rate",
    "padding_value",
    "frame_length",
    "hop_length",
    "fft_length",
    "min_frequency",
    "max_frequency",
    "preemphasis",
    "preemphasis_htk_flavor",
    "fft_overdrive",
    "dither",
    "input_scale_factor",
)


class Gemma4(VlmFamily):
    """A loaded Gemma 4 checkpoint. Construct on the thread that will own MLX."""

    family = "gemma4"
    MODEL_TYPES = MODEL_TYPES
    EOS_MARKERS = ("<turn|>", "<eos>")
    # A text-only prompt's last token is a one-row step (as mlx-vlm feeds it); an image
    # prompt's is not, but the prefix cache never stores it either way.
    last_token_apart = True
    prompt_split = True  # the prompt side is `Gemma4Processor`
    prompt: Gemma4Processor
    kv_quant_off = "keeps sliding-window and KV-sharing layers under its own attention"

    def __init__(self, path: str, lazy: bool = False) -> None:
        super().__init__(path, lazy=lazy)
        config = self.model.config
        text = config.text_config
        settings = self.prompt.settings
        self.patch, self.pool, self.budget = settings.patch, settings.pool, settings.budget
        if self.patch != int(config.vision_config.patch_size):
            raise ValueError(f"processor patch {self.patch} != tower patch")
        if self.pool != int(config.vision_config.pooling_kernel_size):
            raise ValueError(f"processor pooling {self.pool} != tower pooling")
        self._image_id = settings.image_token_id
        self.media = self.prompt.media
        self._audio = settings.audio
        media = (config.image_token_id, config.audio_token_id, config.video_token_id)
        self._media_ids = np.asarray([int(t) for t in media if t is not None], dtype=np.int64)
        self.window = int(text.sliding_window)
        self.sliding = tuple(
            t == "sliding_attention"
            for t in text.layer_types[: self.language_model.model.first_kv_shared_layer_idx]
        )
        self.bidirectional = getattr(text, "use_bidirectional_attention", None) == "vision"
        self.forward = Gemma4Forward(self.language_model, self.window)
        self.text_core = Gemma3Core(
            self.language_model, self.new_cache, self.language_model.logits_from_hidden
        )

    def own_prompt(self, tokenizer: Any, given: PromptProcessor | None) -> PromptProcessor:
        """A `Gemma4Processor` over the settings resolved from mlx-vlm's config and processor
        (loaded by then: `_init_tokens` calls this)."""
        config, ip = self.model.config, self.image_processor
        settings = Gemma4Settings(
            image_token_id=int(config.image_token_id),
            boi_id=int(tokenizer.convert_tokens_to_ids(self.processor.boi_token)),
            eoi_id=int(tokenizer.convert_tokens_to_ids(self.processor.eoi_token)),
            patch=int(ip.patch_size),
            pool=int(ip.pooling_kernel_size),
            budget=int(ip.max_soft_tokens),
            do_resize=bool(ip.do_resize),
            audio=self._audio_settings(tokenizer),
        )
        own = Gemma4Processor(self.path, self.model_type, tokenizer, settings)
        return given or own

    def _audio_settings(self, tokenizer: Any) -> Gemma4Audio | None:
        """The audio prompt settings, or None for a checkpoint without an audio tower (or
        without a feature extractor to feed one)."""
        extractor = getattr(self.processor, "feature_extractor", None)
        if getattr(self.model, "audio_tower", None) is None or extractor is None:
            return None
        return Gemma4Audio(
            audio_token_id=int(self.model.config.audio_token_id),
            boa_id=int(tokenizer.convert_tokens_to_ids(self.processor.boa_token)),
            eoa_id=int(tokenizer.convert_tokens_to_ids(self.processor.eoa_token)),
            rate=int(extractor.sampling_rate),
            ms_per_token=int(self.processor.audio_ms_per_token),
            max_tokens=int(self.processor.audio_seq_length),
        )

    # ----- per family (VlmFamily) -------------------------------------------------------------

    @property
    def image_token_id(self) -> int:
        return self._image_id

    @property
    def placeholder_id(self) -> int:
        return self._image_id  # the template writes one `<|image|>` per image

    @property
    def feature_ids(self) -> tuple[int, ...]:
        audio = self.prompt.settings.audio
        return (self._image_id,) if audio is None else (self._image_id, audio.audio_token_id)

    def processor_settings(self) -> dict[str, Any]:
        settings = {k: getattr(self.image_processor, k, None) for k in _SETTINGS}
        extractor = getattr(self.processor, "feature_extractor", None)
        if self.prompt.settings.audio is not None and extractor is not None:
            settings["audio"] = {k: getattr(extractor, k, None) for k in _AUDIO_SETTINGS}
            settings["audio_tokens"] = (
                self.processor.audio_ms_per_token,
                self.processor.audio_seq_length,
            )
        return settings

    def tower_units(self) -> list[nn.Module]:
        """The vision tower's units, then the audio tower's (its convolutional front end,
        then each Conformer block): a group runs the units of the media it holds."""
        tower = self.model.vision_tower
        units = [tower.patch_embedder, *tower.encoder.layers]
        audio = getattr(self.model, "audio_tower", None)
        if audio is not None:
            units += [audio.subsample_conv_projection, *audio.layers]
        return units

    def tower_features(self, images: Sequence[tuple[np.ndarray, Grid]]) -> list[mx.array]:
        """Each image through the tower and `embed_vision` alone (its own size), as mlx-vlm
        runs a list of images: (soft tokens, text hidden) each."""
        out = []
        for pixels, grid in images:
            if isinstance(grid, AudioGrid):
                out.append(self._audio_features(pixels, grid.tokens))
                continue
            features = self.model.embed_vision(self.model.vision_tower(mx.array(pixels)))
            out.append(features[0])
        return out

    def _audio_features(self, packed: np.ndarray, tokens: int) -> mx.array:
        """One clip through the audio tower and `embed_audio` (`preprocess`'s packed
        features: the spectrogram, then a padding flag per frame): (tokens, text hidden).
        Row i is the tower's row i modulo its rows, as mlx-vlm's masked scatter reads them
        for one clip (its rows usually equal `tokens`: 40 ms each)."""
        features = mx.array(packed[..., :-1])
        padding = mx.array(packed[..., -1] != 0)
        encoded, _ = self.model.audio_tower(features, padding)
        embedded = self.model.embed_audio(encoded)[0]
        rows = embedded.shape[0]
        if rows == tokens:
            return embedded
        return embedded[mx.array(np.arange(tokens, dtype=np.int32) % rows)]

    def embed_ids(self, ids: mx.array) -> mx.array:
        """Text embeddings as mlx-vlm's merge makes them: scaled by sqrt(hidden)."""
        lm = self.language_model.model
        return lm.embed_tokens(ids) * lm.embed_scale

    def _check_layers(self) -> None:
        """Sliding (`RotatingKVCache`) and full (`KVCache`) layers only: both kept here as
        trimmable caches (`new_cache`)."""
        kinds = {type(c).__name__ for c in self.language_model.make_cache()}
        if not kinds <= {"KVCache", "RotatingKVCache"}:
            raise ValueError(f"{self.model_type} keeps {', '.join(sorted(kinds))} layers")

    # ----- prompt side (any thread) -----------------------------------------------------------

    def preprocess(self, image: Any) -> tuple[np.ndarray, Grid]:
        """PIL RGB image -> ((1, 3, H, W) float32 pixels, grid): the checkpoint's own image
        processor (aspect-preserving resize within the budget, rescale)."""
        if isinstance(image, VideoFrames):
            raise self.prompt.no_video()
        if isinstance(image, AudioClip):
            return self._preprocess_audio(image)
        data, _ = self.image_processor.preprocess([image])
        pixels = np.asarray(data["pixel_values"])
        grid = (1, pixels.shape[2] // self.patch, pixels.shape[3] // self.patch)
        return np.ascontiguousarray(pixels, dtype=np.float32), grid

    def _preprocess_audio(self, clip: AudioClip) -> tuple[np.ndarray, Grid]:
        """An `AudioClip` (mono, the model's rate) -> ((1, frames, mel bins + 1) float32,
        grid): `packed_log_mel`, as mlx-vlm hands it the tower."""
        grid = self.prompt.audio_grid(len(clip.samples), clip.rate)
        return packed_log_mel(self.processor.feature_extractor, clip), grid

    # ----- engine side (engine thread only) ---------------------------------------------------

    def new_cache(self, rope_delta: int = 0) -> list[RowKVCache]:
        """One cache per KV-owning layer: `WindowKVCache` for sliding, `RowKVCache` for full."""
        return layer_caches(self.sliding, self.window, rope_delta)

    def prefill_plan(
        self,
        prompt_ids: Sequence[int],
        layouts: Sequence[ImageLayout],
        encoded: Sequence[EncodedImage | None],
        start: int,
        end: int,
    ) -> PrefillPlan:
        """The base's embeddings and positions, plus Gemma 4's (`Gemma4Plan`)."""
        plan = super().prefill_plan(prompt_ids, layouts, encoded, start, end)
        ids = np.asarray(prompt_ids, dtype=np.int64)
        runs = soft_token_runs(ids, self._image_id)
        layer_ids = np.where(np.isin(ids[start:end], self._media_ids), 0, ids[start:end])
        base = {f.name: getattr(plan, f.name) for f in fields(PrefillPlan)}
        return Gemma4Plan(
            **base,
            start=start,
            layer_ids=mx.array(layer_ids.astype(np.int32))[None],
            runs=runs,
            # mlx-vlm chunks a prompt holding audio (its `chunked_prefill_policy`), and the
            # image overlay then never applies: such a prompt is causal throughout.
            whole=self.bidirectional and bool(runs) and not self._has_audio(ids),
            final=end == len(prompt_ids),
        )

    def _has_audio(self, ids: np.ndarray) -> bool:
        audio = self.prompt.settings.audio
        return audio is not None and bool(np.any(ids == audio.audio_token_id))

    def prefill(
        self, plan: PrefillPlan, cache: list[RowKVCache], lo: int, hi: int, rows: int = 0
    ) -> mx.array:
        assert isinstance(plan, Gemma4Plan)
        return self.forward.prefill(plan, cache, lo, hi, rows)

    def prefill_group(self, parts: Sequence[GroupPart], rows: int) -> mx.array:
        """Each part fed alone (`prefill`): a prompt's last row is its own computation."""
        return prefill_each(self.prefill, parts, rows)

    def logits(self, states: mx.array) -> mx.array:
        """Tied embeddings, soft-capped (the reference's `logits_from_hidden`)."""
        return self.language_model.logits_from_hidden(states)
