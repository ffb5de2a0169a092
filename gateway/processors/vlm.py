"""The prompt side the 1D-position mlx-vlm families share (the engine side is
`gateway.engine.families.vlm_base.VlmFamily`): the template writes one placeholder token per
image, and each expands into the family's run of tokens for that image (`span_ids`:
separators and image rows), one `ImageLayout.flat` span per image.

The placeholder is a special token, so the text on each side tokenizes the same whether the
run is expanded in text (the reference processor) or in ids (here).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Sequence
from typing import Any, ClassVar

from gateway.processors.positions import ImageLayout
from gateway.processors.processor import Grid, PromptProcessor
from gateway.processors.video_layout import VideoLayout


class VlmProcessor(PromptProcessor, ABC):
    """Base of the 1D-position mlx-vlm families' prompt sides: a subclass gives `span_ids`
    and `image_grid`; `image_token_id` marks the rows the tower's features replace and
    `placeholder_id` is what the rendered template puts where an image goes."""

    media = frozenset({"image"})
    # True for templates that render only list content (a plain string renders as nothing,
    # e.g. SmolVLM's): `render` passes every message's text as one text part, as mlx-vlm's
    # own prompt helper does.
    text_as_parts: ClassVar[bool] = False

    def __init__(
        self, path: str, model_type: str, tokenizer: Any, image_token_id: int, placeholder_id: int
    ) -> None:
        super().__init__(path, model_type, tokenizer)
        self.image_token_id = image_token_id
        self.placeholder_id = placeholder_id

    @abstractmethod
    def span_ids(self, grid: Grid) -> list[int]:
        """The token run one image placeholder expands to, for an image of this grid: its
        separators and `image_token_id` rows, as the reference processor expands it."""

    def render(
        self,
        messages: list[dict[str, Any]],
        tools: list[dict[str, Any]] | None = None,
        template_kwargs: dict[str, Any] | None = None,
    ) -> str:
        if self.text_as_parts:
            messages = [_as_parts(m) for m in messages]
        return super().render(messages, tools, template_kwargs)

    def layout_prompt(
        self, ids: Sequence[int], grids: Sequence[Grid | VideoLayout]
    ) -> tuple[list[int], list[ImageLayout]]:
        """Each `placeholder_id` -> `span_ids(grid)`, one flat span per image (1D positions)."""
        count = sum(1 for i in ids if i == self.placeholder_id)
        if any(isinstance(g, VideoLayout) for g in grids):
            raise self.no_video()
        if count != len(grids):
            raise ValueError(f"prompt has {count} image placeholders for {len(grids)} images")
        out: list[int] = []
        layouts: list[ImageLayout] = []
        items = iter(grids)
        for token in ids:
            if token != self.placeholder_id:
                out.append(token)
                continue
            run = self.span_ids(next(items))  # type: ignore[arg-type]
            layouts.append(ImageLayout.flat(len(out), len(run)))
            out.extend(run)
        return out, layouts


def _as_parts(message: dict[str, Any]) -> dict[str, Any]:
    """A message whose string content becomes one text part (list content unchanged)."""
    content = message.get("content")
    if isinstance(content, str):
        return {**message, "content": [{"type": "text", "text": content}]}
    return message
