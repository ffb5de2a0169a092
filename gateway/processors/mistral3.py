"""The prompt side of Mistral 3 (Mistral Small 3.1 / 3.2, Pixtral vision): the checkpoint's
own chat template writes one `[IMG]` where each image part stands; it expands into Pixtral's
variable-resolution span: one row of `[IMG]` per row of `spatial_merge_size`-merged patch
cells, `[IMG_BREAK]` after each row but the last, `[IMG_END]` after that. The cell grid
comes from the image's size alone: mlx-vlm's Pixtral image processor scales an image down
(never up) until it fits `size.longest_edge`, then rounds each side up to whole cells
(`patch_size * spatial_merge_size` px).

`Mistral3Settings` is resolved once by the engine-side family from mlx-vlm's config and
processor (`gateway.engine.families.mistral3`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from gateway.processors.processor import Grid
from gateway.processors.vlm import VlmProcessor


@dataclass(frozen=True)
class Mistral3Settings:
    """A Mistral 3 checkpoint's prompt settings: the `[IMG]`, `[IMG_BREAK]` and `[IMG_END]`
    ids, the tower's patch (px) and the patches per cell side (`merge`), the cell side (px,
    as the processor is called), the size an image is scaled down to fit ((height, width);
    None when the processor does not resize) and the tower's largest side in patches."""

    image_token_id: int
    break_id: int
    end_id: int
    patch: int
    merge: int
    cell: int
    edge: tuple[int, int] | None
    max_side: int


class Mistral3Processor(VlmProcessor):
    """A Mistral 3 checkpoint's prompt side. See the module doc."""

    family = "mistral3"

    def __init__(self, path: str, model_type: str, tokenizer: Any, settings: Mistral3Settings):
        image_id = settings.image_token_id
        # The template writes one `[IMG]` per image: the placeholder is the image token.
        super().__init__(path, model_type, tokenizer, image_id, image_id)
        self.settings = settings

    def render(
        self,
        messages: list[dict[str, Any]],
        tools: list[dict[str, Any]] | None = None,
        template_kwargs: dict[str, Any] | None = None,
    ) -> str:
        """The checkpoint's template, with a leading system message's text given as one text
        part: Mistral Small 3.1's template reads a first system message as
        `content[0]['text']` whatever its type (a plain string fails to render) and writes
        exactly that text; other messages render their string content as it is."""
        if messages and messages[0]["role"] == "system":
            content = messages[0]["content"]
            if isinstance(content, str):
                first = {**messages[0], "content": [{"type": "text", "text": content}]}
                messages = [first, *messages[1:]]
        return super().render(messages, tools, template_kwargs)

    def image_grid(self, width: int, height: int) -> Grid:
        """(1, rows, cols) in tower patches of the processor's output for this size (the
        processor's own arithmetic). ValueError for an image so elongated that a side
        would scale to nothing, or one the processor leaves larger than the tower's
        `image_size` (a processor edge set past it: mlx-vlm would read past the tower's 2D
        position table)."""
        s = self.settings
        h, w = height, width
        if s.edge is not None:
            edge = s.edge
            scale = max(height / edge[0], width / edge[1])
            if scale > 1 and (int(height / scale) < 1 or int(width / scale) < 1):
                raise ValueError(f"a side would scale below 1 px to fit {edge[0]} px")
            h, w = _fitted(height, width, edge, s.cell)
        if h < s.cell or w < s.cell:
            raise ValueError(f"a side under {s.cell} px makes no image tokens")
        if max(h, w) > s.max_side * s.patch:
            raise ValueError(
                f"the processor makes it {w}x{h} px, over the vision tower's "
                f"{s.max_side * s.patch} px (its position table)"
            )
        return (1, h // s.patch, w // s.patch)

    def span_ids(self, grid: Grid) -> list[int]:
        """Rows of `[IMG]` cells, `[IMG_BREAK]` between rows, `[IMG_END]` last."""
        s = self.settings
        rows, cols = grid[1] // s.merge, grid[2] // s.merge
        run: list[int] = []
        for row in range(rows):
            run.extend([s.image_token_id] * cols)
            run.append(s.break_id if row < rows - 1 else s.end_id)
        return run


def _fitted(height: int, width: int, edge: tuple[int, int], cell: int) -> tuple[int, int]:
    """mlx-vlm 0.7.10's Pixtral `get_resize_output_image_size` with square cells, restated so
    that the prompt side imports no MLX: scaled down (never up) to fit `edge`, each side
    then rounded up to whole cells."""
    ratio = max(height / edge[0], width / edge[1])
    if ratio > 1:
        height = int(math.floor(height / ratio))
        width = int(math.floor(width / ratio))
    return ((height - 1) // cell + 1) * cell, ((width - 1) // cell + 1) * cell
