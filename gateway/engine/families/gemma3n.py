"""Gemma 3n (`model_type` "gemma3n") over mlx-vlm: the only module that knows its towers, its
input embeddings and its cache layout. The language model's forward is in
`gemma3n_forward.py`; the prompt side (markers, soft tokens) is
`gateway.processors.gemma3n.Gemma3nProcessor`, which this family builds from what mlx-vlm
loaded and delegates to.

What differs from the other families (checked against mlx-vlm 0.7.10):
- prompt: the template writes `<image_soft_token>` where an image part is; the processor
  replaces it by `\\n\\n<start_of_image>` + 256 soft tokens + `<end_of_image>\\n\\n`. Every
  image is resized to the processor's square, and the MobileNetV5 tower always gives a
  16 x 16 grid: 256 soft tokens per image;
- vision: the tower (convolution stem, four stages of residual / mobile-attention blocks,
  the multi-scale fusion adapter), then mlx-vlm's own `get_image_features` (its reshape,
  `* sqrt(vision hidden)`, `embed_vision`'s soft embedding), each image alone; stepwise by
  unit (the stem, each block, the adapter);
- input embeddings (`embed_ids`): text ids through `embed_tokens` unscaled, the vision and
  audio blocks' ids through `embed_vision` / `embed_audio`, as mlx-vlm's merge; per-layer
  inputs from the ids, media ids as 0 (`gemma3n_forward.py`);
- language model: AltUp, Laurel blocks and per-layer inputs inside mlx-vlm's own layers;
  sliding (`WindowKVCache`, read in mlx-vlm's ring order) and full (`RowKVCache`) layers;
  the last `num_kv_shared_layers` layers attend over the KV the last earlier layer of their
  type fetched, so there are fewer caches than layers and those layers store nothing. The
  prompt is causal; its last token is fed alone, as mlx-vlm feeds it (`last_token_apart`);
- logits: tied embeddings, soft-capped;
- audio (a checkpoint with an audio tower and a feature extractor): the template writes
  `<audio_soft_token>` per audio part, which becomes `<start_of_audio>` + 188 soft tokens +
  `<end_of_audio>` (`Gemma3nProcessor`) whatever the clip's length. A clip's input is the
  checkpoint's own feature extractor's log-mel frames (`preprocess` of an `AudioClip`; the
  padding flags ride along as one more column), each clip alone through the Conformer tower
  and `embed_audio` (mlx-vlm's `get_audio_features`), its padded rows and the rows after the
  tower's output made the padding embedding (`embed_audio` of the last id), as mlx-vlm's
  merge. Clips over 30 s are refused (the extractor would cut them there).

Prompt side any thread, engine side engine thread only (see `ModelFamily`).
"""

from __future__ import annotations

from collections.abc import Callable, Generator, Sequence
from dataclasses import fields
from typing import Any

import mlx.core as mx
import numpy as np

from caches.hashing import fingerprint
from gateway.engine.families.family import Grid, ModelFamily, eos_ids, model_fingerprint
from gateway.engine.families.gemma3_forward import Gemma3Core, prefill_each
from gateway.engine.families.gemma3n_forward import (
    Gemma3nForward,
    Gemma3nPlan,
    SharedKVLanguageModel,
)
from gateway.engine.families.vlm_base import UnitRecorder
from gateway.engine.model.kv import RowKVCache
from gateway.engine.model.prompt_forward import GroupPart, PrefillPlan, plan_inputs
from gateway.engine.model.vision import EncodedImage, Unit
from gateway.engine.model.window_kv import layer_caches
from gateway.processors.audio import AudioClip, AudioGrid, packed_log_mel
from gateway.processors.gemma3n import Gemma3nAudio, Gemma3nProcessor, Gemma3nSettings
from gateway.processors.positions import ImageLayout
from gateway.processors.video_processor import VideoFrames

MODEL_TYPES = ("gemma3n",)
# Image-processor settings that change pixels (part of cache keys).
_PROCESSOR_KEYS = (
    "size",
    "resample",
    "do_resize",
    "do_rescale",
    "rescale_factor",
    "do_normalize",
    "image_mean",
    "image_std",
    "do_convert_rgb",
)
# The feature extractor's settings that change a clip's features.
_AUDIO_KEYS = (
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
    "mel_floor",
)
# `Gemma3nAudioFeatureExtractor.__call__`'s `max_length` default: it cuts longer clips there.
_EXTRACTOR_MAX_SAMPLES = 480_000


class Gemma3n(ModelFamily):
    """A loaded Gemma 3n checkpoint. Construct on the thread that will own MLX."""

    family = "gemma3n"
    media = frozenset({"image"})
    prompt_split = True  # the prompt side is `Gemma3nProcessor`
    last_token_apart = True
    # Each image alone through the tower (`encode_steps_many`): the load-time check that a
    # group keeps every image's bits (`scheduler/group_check.py`, which reads this) would
    # run the tower 4 times (minutes on a CPU).
    encodes_each_alone = True
    kv_quant_off = "keeps sliding-window and KV-sharing layers under its own attention"

    def __init__(self, path: str, lazy: bool = False) -> None:
        from mlx_vlm import load  # slow import: only when a model is actually loaded

        self.path = path
        self.model, self.processor = load(path, lazy=lazy)
        config = self.model.config
        self.model_type: str = config.model_type
        if self.model_type not in MODEL_TYPES:
            raise ValueError(f"not a Gemma 3n checkpoint: model type {self.model_type!r}")
        tokenizer = self.processor.tokenizer
        self.image_processor = self.processor.image_processor
        self.tokens_per_image = int(self.processor.image_seq_length)
        if self.tokens_per_image != int(config.vision_soft_tokens_per_image):
            raise ValueError(
                f"processor expands {self.tokens_per_image} image tokens, the model makes "
                f"{config.vision_soft_tokens_per_image}"
            )
        side = int(round(self.tokens_per_image**0.5))
        self.grid: Grid = (1, side, self.tokens_per_image // side)
        self.image_token_id = int(config.image_token_id)
        text = config.text_config
        self.vocab_size = int(text.vocab_size)
        self._init_tokens(
            tokenizer,
            eos_ids(tokenizer, config.eos_token_id, ("<end_of_turn>", "<eos>")),
            Gemma3nProcessor(path, self.model_type, tokenizer, self._settings(tokenizer)),
        )
        self.media = self.prompt.media
        lm = self.model.language_model
        self.language_model = lm
        self._text_vocab = int(text.vocab_size_per_layer_input)
        self._vision = self.model.embed_vision
        self._audio = self.model.embed_audio
        self.window = int(text.sliding_window)
        shared = int(lm.model.first_kv_shared_layer_idx)
        self.sliding = tuple(t == "sliding_attention" for t in text.layer_types[:shared])
        self._check_layers()
        self.forward = Gemma3nForward(lm)
        self.text_core = Gemma3Core(SharedKVLanguageModel(lm), self.new_cache, self.logits)
        self.embed_dtype = self.embed_ids(mx.array([0], dtype=mx.int32)).dtype
        stem = self.model.vision_tower.timm_model.conv_stem
        self.vision_dtype = stem.conv.weight.dtype
        self._recorder = UnitRecorder(self.tower_units()) if not lazy else None
        self.fingerprint = model_fingerprint(path, self.model_type)
        self.processor_fingerprint = fingerprint(
            ("image_seq_length", self.tokens_per_image),
            *((k, repr(getattr(self.image_processor, k, None))) for k in _PROCESSOR_KEYS),
            *self._audio_fingerprint(),
        )

    def _settings(self, tokenizer: Any) -> Gemma3nSettings:
        """The prompt settings of this checkpoint."""
        return Gemma3nSettings.read(
            tokenizer,
            self.image_token_id,
            self.grid,
            placeholder=str(tokenizer.image_token),
            audio=self._audio_settings(tokenizer),
        )

    def _audio_settings(self, tokenizer: Any) -> Gemma3nAudio | None:
        """The audio prompt settings, or None for a checkpoint without an audio tower (or
        without a feature extractor to feed one)."""
        extractor = getattr(self.processor, "feature_extractor", None)
        if getattr(self.model, "audio_tower", None) is None or extractor is None:
            return None
        config = self.model.config
        tokens = int(self.processor.audio_seq_length)
        if tokens != int(config.audio_soft_tokens_per_image):
            raise ValueError(
                f"processor expands {tokens} audio tokens, the model makes "
                f"{config.audio_soft_tokens_per_image}"
            )
        rate = int(extractor.sampling_rate)
        # One tower row per `hop * time strides * reduction` samples: the clip the soft
        # tokens cover, and at most what the extractor keeps.
        audio = config.audio_config
        strides = int(np.prod([s[0] for s in audio.sscp_conv_stride_size]))
        per_token = int(extractor.hop_length) * strides * int(audio.conf_reduction_factor)
        covered = min(tokens * per_token, _EXTRACTOR_MAX_SAMPLES)
        boa, eoa = str(tokenizer.boa_token), str(tokenizer.eoa_token)
        return Gemma3nAudio(
            placeholder=str(tokenizer.audio_token),
            audio_token_id=int(config.audio_token_id),
            boa=boa,
            eoa=eoa,
            boa_id=int(tokenizer.convert_tokens_to_ids(boa)),
            eoa_id=int(tokenizer.convert_tokens_to_ids(eoa)),
            rate=rate,
            tokens=tokens,
            max_seconds=covered / rate,
        )

    def _audio_fingerprint(self) -> list[tuple[str, str]]:
        """The audio settings in the cache key (none without audio)."""
        audio = self.prompt.settings.audio  # type: ignore[attr-defined]
        if audio is None:
            return []
        extractor = self.processor.feature_extractor
        keys = [(f"audio.{k}", repr(getattr(extractor, k, None))) for k in _AUDIO_KEYS]
        return [*keys, ("audio_seq_length", repr(audio.tokens))]

    def _check_layers(self) -> None:
        """Sliding (`RotatingKVCache`) and full (`KVCache`) layers only: both kept here as
        trimmable caches (`new_cache`)."""
        kinds = {type(c).__name__ for c in self.language_model.make_cache()}
        if not kinds <= {"KVCache", "RotatingKVCache"}:
            raise ValueError(f"{self.model_type} keeps {', '.join(sorted(kinds))} layers")

    def tower_units(self) -> list[Any]:
        """The vision tower's units in call order: the stem, every block, the adapter."""
        timm = self.model.vision_tower.timm_model
        return [timm.conv_stem, *(block for stage in timm.blocks for block in stage), timm.msfa]

    def embed_ids(self, ids: mx.array) -> mx.array:
        """Input embeddings of prompt ids as mlx-vlm's `get_input_embeddings` makes them:
        `embed_tokens` (unscaled) for text ids, the vision and audio blocks' ids through
        `embed_vision` / `embed_audio` (module doc)."""
        out = self.language_model.model.embed_tokens(ids)
        for embedder, upper in ((self._vision, self._audio.vocab_offset), (self._audio, None)):
            lower = embedder.vocab_offset
            inside = ids >= lower if upper is None else mx.logical_and(ids >= lower, ids < upper)
            dummy = lower + embedder.vocab_size - 1
            hard = embedder(input_ids=mx.where(inside, ids, dummy))
            out = mx.where(inside[..., None], hard, out)
        return out

    # ----- prompt side (any thread) -----------------------------------------------------------

    def preprocess(self, image: Any) -> tuple[np.ndarray, Grid]:
        """PIL RGB image -> ((1, 3, side, side) float32 pixels, grid): the checkpoint's own
        image processor (resize to its square, rescale)."""
        if isinstance(image, VideoFrames):
            raise self.prompt.no_video()
        if isinstance(image, AudioClip):
            return self._preprocess_audio(image)
        out = self.image_processor(images=[image], return_tensors="np")
        return np.ascontiguousarray(out["pixel_values"], dtype=np.float32), self.grid

    def _preprocess_audio(self, clip: AudioClip) -> tuple[np.ndarray, Grid]:
        """An `AudioClip` (mono, the model's rate) -> ((1, frames, mel bins + 1) float32,
        grid): `packed_log_mel`, as mlx-vlm hands it the tower."""
        grid = self.prompt.audio_grid(len(clip.samples), clip.rate)
        return packed_log_mel(self.processor.feature_extractor, clip), grid

    # ----- engine side (engine thread only) ---------------------------------------------------

    def new_cache(self, rope_delta: int = 0) -> list[RowKVCache]:
        """One cache per KV-owning layer: `WindowKVCache` for sliding, `RowKVCache` for full."""
        return layer_caches(list(self.sliding), self.window, rope_delta)

    def encode_steps_many(
        self,
        images: Sequence[tuple[np.ndarray, Grid]],
        stepwise: Callable[[], bool] = lambda: True,
    ) -> Generator[Unit, None, list[EncodedImage]]:
        """Each image alone through the tower and mlx-vlm's `get_image_features`, one unit
        evaluated per `next()` while `stepwise()`: (256, text hidden) features each, in
        `embed_dtype`; each clip alone through the audio tower (`_audio_features`, one
        graph)."""
        assert self._recorder is not None, "a lazy family runs no tower"
        model = self.model
        encoded = []
        for pixels, grid in images:
            if isinstance(grid, AudioGrid):
                encoded.append(EncodedImage(self._audio_features(pixels, grid.tokens), None))
                mx.eval(encoded[-1].features)
                continue
            self._recorder.outputs = []
            try:
                features = model.get_image_features(
                    mx.array(pixels), model.vision_tower, model.config, model.embed_vision
                )
            finally:
                units, self._recorder.outputs = self._recorder.outputs, None
            for k, out in enumerate(units):
                if stepwise():
                    # Announced before it runs, so the step budget knows what next() costs.
                    yield Unit("embed" if k == 0 else "block", out.size // out.shape[-1], out.shape)
                    mx.eval(out)
            encoded.append(EncodedImage(features[0].astype(self.embed_dtype), None))
            mx.eval(encoded[-1].features)
        return encoded

    def _audio_features(self, packed: np.ndarray, tokens: int) -> mx.array:
        """One clip through mlx-vlm's `get_audio_features` (`preprocess`'s packed features),
        its padded rows and `tokens` - its rows more as the padding embedding (`embed_audio`
        of the vocabulary's last id), as mlx-vlm's merge: (tokens, text hidden)."""
        features = mx.array(packed[..., :-1])
        padding = mx.array(packed[..., -1] != 0)
        encoded, mask = self.model.get_audio_features(features, padding)
        pad = self._audio(input_ids=mx.array([[self.vocab_size - 1]]))
        encoded = mx.where(mask[..., None], pad, encoded)
        extra = mx.broadcast_to(pad, (1, tokens - encoded.shape[1], encoded.shape[2]))
        return mx.concatenate([encoded, extra], axis=1)[0].astype(self.embed_dtype)

    def prefill_plan(
        self,
        prompt_ids: Sequence[int],
        layouts: Sequence[ImageLayout],
        encoded: Sequence[EncodedImage | None],
        start: int,
        end: int,
    ) -> PrefillPlan:
        """Embeddings of tokens [start, end) (image rows from the features), 1D positions (for
        the engine's bookkeeping: the model reads them from the cache offset) and per-layer
        ids (every id past the text vocabulary as 0)."""
        audio = self.prompt.settings.audio  # type: ignore[attr-defined]
        feature_ids = (self.image_token_id,) + (() if audio is None else (audio.audio_token_id,))
        plan = plan_inputs(self.embed_ids, feature_ids, prompt_ids, layouts, encoded, start, end)
        host = np.arange(start, end, dtype=np.int32)[None]
        ids = np.asarray(prompt_ids[start:end], dtype=np.int64)
        layer_ids = np.where((ids >= 0) & (ids < self._text_vocab), ids, 0).astype(np.int32)
        base = {f.name: getattr(plan, f.name) for f in fields(PrefillPlan)}
        base.update(positions=mx.array(host)[:, None, :], host_positions=host)
        return Gemma3nPlan(**base, layer_ids=mx.array(layer_ids)[None])

    def prefill(
        self, plan: PrefillPlan, cache: list[RowKVCache], lo: int, hi: int, rows: int = 0
    ) -> mx.array:
        assert isinstance(plan, Gemma3nPlan)
        return self.forward.prefill(plan, cache, lo, hi, rows)

    def prefill_group(self, parts: Sequence[GroupPart], rows: int) -> mx.array:
        """Each part fed alone (`prefill`): every part's last token is a one-row step at its
        own position, so one batched forward would not be each part's own computation."""
        return prefill_each(self.prefill, parts, rows)

    def logits(self, states: mx.array) -> mx.array:
        """Tied embeddings, soft-capped (mlx-vlm's `LanguageModel.__call__`)."""
        from mlx_vlm.models.gemma3n.language import logit_softcap

        out = self.language_model.model.embed_tokens.as_linear(states)
        cap = self.language_model.final_logit_softcapping
        return out if cap is None else logit_softcap(cap, out)
