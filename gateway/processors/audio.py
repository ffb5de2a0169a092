"""Audio as the prompt side and the engine see it, without MLX: a decoded clip
(`AudioClip`: mono float32 PCM at the model's rate) and where it sits in the prompt
(`AudioGrid`: the clip's soft-token count).

An `AudioClip` rides in `ImageInput.image` as a decoded image does (the engine's caches are
keyed by the request's content hash, not by the object); the engine-side family turns it
into the tower's input features (`ModelFamily.preprocess`). An `AudioGrid` rides in
`ImageInput.grid_thw`: a (1, tokens, 1) triple, so the tower's work estimate (t * h * w) is
the clip's output rows, and a distinct type, so a family that takes images and audio can tell
which placeholder run it expands.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, NamedTuple

import numpy as np


class AudioGrid(NamedTuple):
    """One clip's place in the prompt: `tokens` soft tokens (t and w are always 1)."""

    t: int
    tokens: int
    w: int

    @classmethod
    def of(cls, tokens: int) -> AudioGrid:
        return cls(1, int(tokens), 1)


@dataclass(frozen=True)
class AudioClip:
    """A decoded clip: `samples` mono float32 in [-1, 1] at `rate` Hz (read-only; never
    modified after construction)."""

    samples: np.ndarray = field(repr=False)
    rate: int

    @property
    def seconds(self) -> float:
        return len(self.samples) / self.rate

    @property
    def nbytes(self) -> int:
        """Its size where decoded media are held by bytes (`engine.image_store`)."""
        return int(self.samples.nbytes)


def audio_tokens(num_samples: int, rate: int, ms_per_token: int, max_tokens: int) -> int:
    """Soft tokens of a clip of `num_samples` at `rate` Hz: ceil(duration / ms_per_token),
    at most `max_tokens` (mlx-vlm 0.7.10's `Gemma4Processor._compute_audio_num_tokens`,
    restated so that the prompt side imports no MLX). ValueError for an empty clip."""
    if num_samples < 1:
        raise ValueError("the clip holds no samples")
    duration_ms = num_samples / rate * 1000.0
    return min(math.ceil(duration_ms / ms_per_token), max_tokens)


def packed_log_mel(feature_extractor: Any, clip: AudioClip) -> np.ndarray:
    """(1, frames, mel bins + 1) float32: the checkpoint's own feature extractor's log-mel
    frames of `clip`, then 1.0 in the last column where a frame is padding (its mask,
    inverted: the packing Gemma 4's and Gemma 3n's towers take from mlx-vlm, so the mask
    travels with the features through the engine's one pixel array per input)."""
    out = feature_extractor([clip.samples])
    features = np.asarray(out["input_features"][0], dtype=np.float32)
    padding = ~np.asarray(out["input_features_mask"][0], dtype=bool)
    packed = np.concatenate([features, padding[:, None].astype(np.float32)], axis=1)
    return np.ascontiguousarray(packed[None])
