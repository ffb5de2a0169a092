"""The prompt side of Gemma 3n: the template writes `<image_soft_token>` where an image part
is; the reference processor replaces each by `\\n\\n<start_of_image>` + `image_seq_length` x
`<image_soft_token>` + `<end_of_image>\\n\\n` before tokenizing. `tokenize` writes the
newlines and both markers in the placeholder's place and Gemma 3's `layout_prompt` puts the
soft tokens between them (special tokens split the text, so the ids are the processor's); the
span is the soft tokens only. Every image is resized to the tower's square, so the token
count is fixed (256: the MobileNetV5 tower's 16 x 16 output).

Audio parts are not served yet (the family's `media` is images only: a request with one is
refused before it reaches the template).

`Gemma3nSettings` is resolved once by the engine-side family from mlx-vlm's config and
processor (`gateway.engine.families.gemma3n`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from gateway.processors.gemma3 import Gemma3Processor, Gemma3Settings


@dataclass(frozen=True)
class Gemma3nSettings(Gemma3Settings):
    """Gemma 3's settings plus the placeholder the template writes (`<image_soft_token>`,
    the soft token's own text)."""

    placeholder: str = "<image_soft_token>"


class Gemma3nProcessor(Gemma3Processor):
    """A Gemma 3n checkpoint's prompt side. See the module doc."""

    family = "gemma3n"
    settings: Gemma3nSettings

    def __init__(self, path: str, model_type: str, tokenizer: Any, settings: Gemma3nSettings):
        super().__init__(path, model_type, tokenizer, settings)

    def tokenize(self, text: str) -> list[int]:
        """Token ids of rendered text, each placeholder written out as the processor writes
        it (newlines and both markers; `layout_prompt` adds the soft tokens)."""
        s = self.settings
        expanded = text.replace(s.placeholder, f"\n\n{s.boi}{s.eoi}\n\n")
        return super(Gemma3Processor, self).tokenize(expanded)

    def no_video(self) -> ValueError:
        return ValueError("Gemma 3n takes no video")
