"""Chat request + decoded images -> a prepared `EngineRequest` (tokenizer and numpy work, run
in a worker thread so neither the event loop nor the engine thread does it).

The chat template is applied to our own message list with image parts exactly where the user
put them (mlx-vlm's prompt helper moves text before the image for Qwen2-VL, which would make an
image's KV depend on the question that follows it).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from caches.prefix import ImageSpan
from gateway.api.chat import ChatRequest, ImagePart, TextPart
from gateway.engine.model import VisionLanguageModel
from gateway.engine.positions import ImageLayout
from gateway.engine.request import EngineRequest, ImageInput, SamplingParams
from gateway.errors import invalid
from gateway.media import DecodedImage


class UnsupportedImage(ValueError):
    """An image the model's processor cannot take (e.g. too elongated); `index` is its place
    among the request's images, so the caller can name the field it came from."""

    def __init__(self, index: int, message: str) -> None:
        super().__init__(message)
        self.index = index


def template_messages(chat: ChatRequest) -> list[dict[str, Any]]:
    """OpenAI messages -> the chat template's format (`{"type": "image"}` placeholders)."""
    out: list[dict[str, Any]] = []
    for message in chat.messages:
        if all(isinstance(p, TextPart) for p in message.parts):
            text = "".join(p.text for p in message.parts)  # type: ignore[union-attr]
            out.append({"role": message.role, "content": text})
            continue
        content: list[dict[str, Any]] = []
        for part in message.parts:
            if isinstance(part, ImagePart):
                content.append({"type": "image"})
            else:
                content.append({"type": "text", "text": part.text})
        out.append({"role": message.role, "content": content})
    return out


class PromptBuilder:
    """Builds engine requests for one model. Thread-safe (the model guards its tokenizer).

    `needs_pixels(prompt_ids, spans)` tells, per image, whether the engine will run the
    vision tower on it (not covered by a prefix-cache hit, not in the vision cache). Other
    images skip pixel preprocessing; the engine preprocesses itself on the rare eviction in
    between.
    """

    def __init__(
        self,
        model: VisionLanguageModel,
        needs_pixels: Callable[[list[int], list[ImageSpan]], list[bool]],
        max_context_tokens: int,
        default_max_tokens: int,
    ) -> None:
        self.model = model
        self._needs_pixels = needs_pixels
        self._max_context = max_context_tokens
        self._default_max_tokens = default_max_tokens

    def count(self, chat: ChatRequest, images: Sequence[DecodedImage]) -> int:
        """The prompt's length in tokens, image tokens included (no pixel work)."""
        return len(self._layout(chat, images)[0])

    def _layout(
        self, chat: ChatRequest, images: Sequence[DecodedImage]
    ) -> tuple[list[int], list[ImageLayout], list[tuple[int, int, int]]]:
        # An assistant prefill continues the assistant turn the template just opened.
        text = self.model.render(template_messages(chat)) + chat.prefill
        ids = self.model.tokenize(text)
        grids = [self._grid(index, image) for index, image in enumerate(images)]
        prompt, layouts = self.model.layout_prompt(ids, grids)
        return prompt, layouts, grids

    def _grid(self, index: int, image: DecodedImage) -> tuple[int, int, int]:
        try:
            return self.model.image_grid(image.width, image.height)
        except ValueError as exc:
            size = f"{image.width}x{image.height} pixels"
            if "aspect ratio" in str(exc):  # Qwen-VL's processor: at most 200:1
                reason = f"the image is {size}; this model takes images up to 200:1"
                raise UnsupportedImage(index, f"{reason}: crop or pad it") from None
            raise UnsupportedImage(index, f"the image ({size}) cannot be processed") from None

    def build(
        self, chat: ChatRequest, images: Sequence[DecodedImage], request_id: str, arrival: float
    ) -> EngineRequest:
        prompt, layouts, grids = self._layout(chat, images)
        spans = [
            ImageSpan(layout.start, layout.end, image.content_hash)
            for image, layout in zip(images, layouts, strict=True)
        ]
        # Pixel preprocessing only for images the engine will actually encode.
        needed = self._needs_pixels(prompt, spans) if spans else []
        pixels: list[Any] = []
        for image, grid, need in zip(images, grids, needed, strict=True):
            values = None
            if need:
                values, processed_grid = self.model.preprocess(image.image)
                if processed_grid != grid:
                    raise RuntimeError(f"image grid {processed_grid} != predicted {grid}")
            pixels.append(values)
        inputs = tuple(
            ImageInput(
                content_hash=image.content_hash,
                layout=layout,
                grid_thw=grid,
                pixel_values=values,
                image=image.image,
            )
            for image, layout, grid, values in zip(images, layouts, grids, pixels, strict=True)
        )
        return EngineRequest(
            request_id=request_id,
            prompt_ids=tuple(prompt),
            images=inputs,
            sampling=self._sampling(chat, len(prompt)),
            arrival_time=arrival,
        )

    def _sampling(self, chat: ChatRequest, prompt_len: int) -> SamplingParams:
        room = self._max_context - prompt_len
        if room < 1:
            raise invalid(
                f"the prompt is {prompt_len} tokens (images included) but this server's context "
                f"is {self._max_context} tokens; shorten the conversation, send smaller or fewer "
                "images, or start the server with a larger --max-context",
                "messages",
                "context_length_exceeded",
            )
        if chat.max_tokens is not None and chat.max_tokens > room:
            raise invalid(
                f"max_tokens ({chat.max_tokens}) plus the prompt ({prompt_len} tokens) exceeds "
                f"the context of {self._max_context} tokens; ask for at most {room}",
                "max_tokens",
                "context_length_exceeded",
            )
        return SamplingParams(
            max_tokens=chat.max_tokens or min(self._default_max_tokens, room),
            temperature=chat.temperature,
            top_p=chat.top_p,
            top_k=chat.top_k,
            seed=chat.seed,
            stop=chat.stop,
            logprobs=chat.logprobs,
            top_logprobs=chat.top_logprobs,
            ignore_eos=chat.ignore_eos,
            grammar=chat.grammar,
        )
