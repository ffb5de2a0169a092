"""The prompt side of Gemma 3n: the template writes `<image_soft_token>` where an image part
is and `<audio_soft_token>` where an audio part is; the reference processor replaces each by
`\\n\\n<start_of_image>` + `image_seq_length` x `<image_soft_token>` + `<end_of_image>\\n\\n`,
resp. `\\n\\n<start_of_audio>` + `audio_seq_length` x `<audio_soft_token>` +
`<end_of_audio>\\n\\n`, before tokenizing. `tokenize` writes the newlines and both markers in
each placeholder's place and `layout_prompt` puts the soft tokens between them (special
tokens split the text, so the ids are the processor's); a span is the soft tokens only.

Every image is resized to the tower's square, so its token count is fixed (256: the
MobileNetV5 tower's 16 x 16 output); every clip takes `audio_seq_length` soft tokens (188
upstream) whatever its length, the tower's rows first and padding embeddings after them, so
a clip may last at most as long as those tokens cover (upstream: 30 s).

`Gemma3nSettings` is resolved once by the engine-side family from mlx-vlm's config and
processor (`gateway.engine.families.gemma3n`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from gateway.processors.audio import AudioGrid
from gateway.processors.gemma3 import Gemma3Processor, Gemma3Settings
from gateway.processors.positions import ImageLayout
from gateway.processors.processor import Grid
from gateway.processors.video_layout import VideoLayout


@dataclass(frozen=True)
class Gemma3nAudio:
    """A checkpoint's audio prompt settings: the soft token (text and id), the markers, the
    feature extractor's rate (Hz; clips are resampled to it), the soft tokens every clip
    takes and the longest clip they cover (seconds)."""

    placeholder: str  # `<audio_soft_token>`
    audio_token_id: int
    boa: str  # `<start_of_audio>`
    eoa: str  # `<end_of_audio>`
    boa_id: int
    eoa_id: int
    rate: int
    tokens: int
    max_seconds: float


@dataclass(frozen=True)
class Gemma3nSettings(Gemma3Settings):
    """Gemma 3's settings plus the placeholder the template writes (`<image_soft_token>`,
    the soft token's own text) and the audio settings (None: no audio tower)."""

    placeholder: str = "<image_soft_token>"
    audio: Gemma3nAudio | None = None


class Gemma3nProcessor(Gemma3Processor):
    """A Gemma 3n checkpoint's prompt side. See the module doc."""

    family = "gemma3n"
    settings: Gemma3nSettings

    def __init__(self, path: str, model_type: str, tokenizer: Any, settings: Gemma3nSettings):
        super().__init__(path, model_type, tokenizer, settings)
        if settings.audio is not None:
            self.media = frozenset({"image", "audio"})

    def tokenize(self, text: str, special_tokens: bool = False) -> list[int]:
        """Token ids of `text`, each placeholder written out as the processor writes it
        (newlines and both markers; `layout_prompt` adds the soft tokens)."""
        s, a = self.settings, self.settings.audio
        expanded = text.replace(s.placeholder, f"\n\n{s.boi}{s.eoi}\n\n")
        if a is not None:
            expanded = expanded.replace(a.placeholder, f"\n\n{a.boa}{a.eoa}\n\n")
        return super(Gemma3Processor, self).tokenize(expanded, special_tokens)

    @property
    def audio_rate(self) -> int | None:
        """The rate (Hz) audio is resampled to; None: the checkpoint takes no audio."""
        return None if self.settings.audio is None else self.settings.audio.rate

    def audio_grid(self, num_samples: int, rate: int) -> AudioGrid:
        """Every clip's grid (`tokens` soft tokens). ValueError for an empty clip, one
        longer than the tokens cover, or another rate."""
        audio = self.settings.audio
        if audio is None:
            raise ValueError(f"{self.model_type} has no audio tower: it takes no audio")
        if rate != audio.rate:
            raise ValueError(f"audio at {rate} Hz; this model reads {audio.rate} Hz")
        if num_samples < 1:
            raise ValueError("the clip holds no samples")
        if num_samples > audio.max_seconds * rate:
            raise ValueError(
                f"the clip is {num_samples / rate:.2f} s long; this model reads at most "
                f"{audio.max_seconds:g} s a clip"
            )
        return AudioGrid.of(audio.tokens)

    def no_video(self) -> ValueError:
        return ValueError("Gemma 3n takes no video")

    def layout_prompt(
        self, ids: Sequence[int], grids: Sequence[Grid | VideoLayout]
    ) -> tuple[list[int], list[ImageLayout]]:
        """Put each medium's soft tokens between its marker pair (`<start_of_image>
        <end_of_image>` for an image grid, `<start_of_audio><end_of_audio>` for an
        `AudioGrid`, `grids` in prompt order); one flat span per medium (its soft tokens)."""
        s, a = self.settings, self.settings.audio
        if any(isinstance(g, VideoLayout) for g in grids):
            raise self.no_video()
        pairs = {s.boi_id: (s.eoi_id, "image")}
        if a is not None:
            pairs[a.boa_id] = (a.eoa_id, "audio")
        starts = [i for i, t in enumerate(ids) if t in pairs]
        wanted = [pairs[ids[i]][1] for i in starts]
        given = ["audio" if isinstance(g, AudioGrid) else "image" for g in grids]
        if wanted != given:
            raise ValueError(f"prompt has media markers {wanted} for media {given}")
        out: list[int] = []
        layouts: list[ImageLayout] = []
        cursor = 0
        for start, grid in zip(starts, grids):
            end_id, kind = pairs[ids[start]]
            if start + 1 >= len(ids) or ids[start + 1] != end_id:
                raise ValueError(f"an {kind} marker is not followed by its end marker")
            out.extend(ids[cursor : start + 1])
            if isinstance(grid, AudioGrid):
                assert a is not None
                count, token = grid.tokens, a.audio_token_id
            else:
                count, token = grid[0] * grid[1] * grid[2], s.image_token_id  # type: ignore[index]
            layouts.append(ImageLayout.flat(len(out), count))
            out.extend([token] * count)
            cursor = start + 1
        out.extend(ids[cursor:])
        return out, layouts
