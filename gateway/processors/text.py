"""The prompt side of a plain text model: its tokenizer and chat template, no media (the
prompt builder refuses image and video parts with a 400 before anything reaches the engine)."""

from __future__ import annotations

from gateway.processors.processor import PromptProcessor


class TextProcessor(PromptProcessor):
    """A text checkpoint's prompt side (every media method raises ValueError)."""

    family = "text"

    def no_video(self) -> ValueError:
        return self.no_media()  # (no video, and no images either: say so)
