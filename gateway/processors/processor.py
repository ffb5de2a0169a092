"""The prompt side of a model: what turns a conversation into token ids and media layouts,
without the weights and without MLX.

A `PromptProcessor` holds the checkpoint's tokenizer (its chat template included) and the
family's settings (placeholder ids, image sizes); it renders, tokenizes, computes each image's
or clip's patch grid from its size and expands placeholders into the family's runs of tokens.
It computes no pixels: the engine owns pixel preparation (`gateway.engine.pixels`).

The engine-side family (`gateway.engine.families`) builds its processor from what it loaded
and uses it for its own prompt methods; the engine process sends that very object to the HTTP
process when the model is ready (`wire.Ready`), so both sides build prompts with the same
tokenizer and settings, and the HTTP process never imports MLX (tests/gateway/processors pin
it). `PromptSide` is the interface the front end uses; an engine-side `ModelFamily` satisfies
it too (the in-process engine hands its model to the prompt builder).

Threads: every method may run in several threads at once: the tokenizer is guarded by a lock,
everything else is immutable after construction.
"""

from __future__ import annotations

import copy
import threading
from collections.abc import Mapping, Sequence
from typing import Any, ClassVar, Protocol

import numpy as np
from jinja2 import TemplateError

from gateway.processors.positions import ImageLayout
from gateway.processors.video_layout import VideoLayout
from gateway.processors.video_processor import VideoFrames

Grid = tuple[int, int, int]  # (t, h, w) in unmerged patches, as the vision tower takes it
_MLX_PACKAGES = frozenset({"mlx", "mlx_lm", "mlx_vlm"})


def _portable(tokenizer: Any) -> Any:
    """`tokenizer` without the attributes the MLX libraries hang on it (mlx-vlm's
    `stopping_criteria`), whose unpickling would import MLX: a shallow copy, the original
    untouched."""
    extra = [
        name
        for name, value in vars(tokenizer).items()
        if type(value).__module__.split(".")[0] in _MLX_PACKAGES
    ]
    if not extra:
        return tokenizer
    clone = copy.copy(tokenizer)
    for name in extra:
        delattr(clone, name)
    return clone


class PromptSide(Protocol):
    """What the front end uses of a model (`PromptProcessor`, or an engine-side family)."""

    family: str
    model_type: str
    path: str
    media: frozenset[str]
    tokenizer: Any

    @property
    def chat_template(self) -> str | None: ...

    @property
    def embed_bytes(self) -> int: ...

    def describe(self) -> dict[str, Any]: ...

    def render(
        self,
        messages: list[dict[str, Any]],
        tools: list[dict[str, Any]] | None = None,
        template_kwargs: dict[str, Any] | None = None,
    ) -> str: ...

    def tokenize(self, text: str, special_tokens: bool = False) -> list[int]: ...

    def decode(self, ids: Sequence[int]) -> str: ...

    def image_grid(self, width: int, height: int) -> Grid: ...

    def video_grid(self, frames: int, width: int, height: int) -> Grid: ...

    @property
    def audio_rate(self) -> int | None: ...

    def audio_grid(self, num_samples: int, rate: int) -> Grid: ...

    def video_layout(self, grid: Grid, times: Sequence[float]) -> VideoLayout: ...

    def video_clip(
        self, frames: np.ndarray, times: Sequence[float], grid: Grid, block: int | None = None
    ) -> VideoFrames: ...

    def layout_prompt(
        self, ids: Sequence[int], grids: Sequence[Grid | VideoLayout]
    ) -> tuple[list[int], list[ImageLayout]]: ...


class PromptProcessor:
    """The prompt side shared by every family; a family's processor adds its grids and
    layout (`image_grid`, `layout_prompt`, the video methods). See the module doc.

    `card` is the family as /v1/models shows it (`ModelFamily.describe`, cache policy
    included) and `embed_bytes` the bytes of one KV value (the context's memory bound): the
    engine-side family knows both and sets them (`described`) before the processor leaves
    the engine process."""

    family: ClassVar[str]
    media: ClassVar[frozenset[str]] = frozenset()

    def __init__(self, path: str, model_type: str, tokenizer: Any) -> None:
        self.path = path
        self.model_type = model_type
        self.tokenizer = tokenizer
        self.tokenizer_lock = threading.Lock()
        self._card: Mapping[str, Any] = {}
        self._embed_bytes = 0

    # ----- pickling (the engine process sends it; a lock does not travel) ---------------------

    def __getstate__(self) -> dict[str, Any]:
        state = dict(self.__dict__)
        del state["tokenizer_lock"]
        state["tokenizer"] = _portable(self.tokenizer)
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self.tokenizer_lock = threading.Lock()

    # ----- what the engine knows ---------------------------------------------------------------

    def described(self, card: Mapping[str, Any], embed_bytes: int) -> PromptProcessor:
        """Set the family's card and KV value size (the engine-side family, once loaded)."""
        self._card, self._embed_bytes = dict(card), int(embed_bytes)
        return self

    def describe(self) -> dict[str, Any]:
        """The family as /v1/models and /v1/cache/stats show it."""
        return dict(self._card)

    @property
    def embed_bytes(self) -> int:
        """Bytes of one KV value (the embedding's dtype); 0 when not known."""
        return self._embed_bytes

    # ----- template and tokens -----------------------------------------------------------------

    @property
    def chat_template(self) -> str | None:
        """The chat template's text (which tool-call syntax it teaches is read from it)."""
        template = getattr(self.tokenizer, "chat_template", None)
        return template if isinstance(template, str) else None

    def render(
        self,
        messages: list[dict[str, Any]],
        tools: list[dict[str, Any]] | None = None,
        template_kwargs: dict[str, Any] | None = None,
    ) -> str:
        """The checkpoint's own chat template over `messages` with the generation prompt
        opened. Media parts are `{"type": "image"}` / `{"type": "video"}` and stay in place;
        `tools` (OpenAI-shaped function definitions) go to the template's tool section;
        `template_kwargs` are the template's own variables (`enable_thinking`, ...).

        Raises ValueError when the template refuses the conversation (its `raise_exception`,
        e.g. roles out of order or a role it does not know): the client's mistake, a 400."""
        with self.tokenizer_lock:
            try:
                return self.tokenizer.apply_chat_template(
                    messages,
                    tools=tools,
                    tokenize=False,
                    add_generation_prompt=True,
                    **(template_kwargs or {}),
                )
            except TemplateError as exc:
                raise ValueError(
                    f"the model's chat template refused the conversation: {exc}"
                ) from exc

    def tokenize(self, text: str, special_tokens: bool = False) -> list[int]:
        """Token ids of `text`. Rendered chat text takes no special tokens (the template has
        its own); a raw completion prompt (`special_tokens`) gets what the tokenizer's own
        encode adds (a BOS where the checkpoint has one), as vLLM and mlx-lm's server do."""
        with self.tokenizer_lock:
            # verbose=False: no "Token indices sequence length is longer than ..." warning; the
            # prompt builder refuses over-long prompts itself, against --max-context.
            return list(
                self.tokenizer.encode(text, add_special_tokens=special_tokens, verbose=False)
            )

    def decode(self, ids: Sequence[int]) -> str:
        """The text of token ids, special tokens left out (an echoed completion prompt)."""
        with self.tokenizer_lock:
            return str(self.tokenizer.decode(list(ids), skip_special_tokens=True))

    # ----- media (a family overrides what it takes) --------------------------------------------

    def no_media(self) -> ValueError:
        """The error of the media methods of a family without that medium."""
        return ValueError(f"{self.model_type} is a text-only model: it takes no images or video")

    def no_video(self) -> ValueError:
        """The error of the video methods of a family without video (each may say it its own
        way)."""
        return ValueError(f"{self.model_type} takes no video")

    def image_grid(self, width: int, height: int) -> Grid:
        """The patch grid of an image of this size (pixels), without touching pixels.
        Raises ValueError for an image the processor refuses."""
        raise self.no_media()

    def video_grid(self, frames: int, width: int, height: int) -> Grid:
        """The patch grid of a clip of `frames` sampled frames (ValueError: unsupported)."""
        raise self.no_video()

    def video_layout(self, grid: Grid, times: Sequence[float]) -> VideoLayout:
        """How a clip with this grid and these frame times (seconds) sits in the prompt."""
        raise self.no_video()

    def video_clip(
        self, frames: np.ndarray, times: Sequence[float], grid: Grid, block: int | None = None
    ) -> VideoFrames:
        """The frames the engine preprocesses for a clip (or one of its placeholder blocks)."""
        raise self.no_video()

    @property
    def audio_rate(self) -> int | None:
        """The rate (Hz) audio is resampled to for this model; None: it takes no audio."""
        return None

    def audio_grid(self, num_samples: int, rate: int) -> Grid:
        """The grid of a clip of `num_samples` at `rate` Hz (`processors.audio.AudioGrid`);
        ValueError for a clip the model cannot take (too long, another rate, no tower)."""
        raise ValueError(f"{self.model_type} takes no audio")

    def layout_prompt(
        self, ids: Sequence[int], grids: Sequence[Grid | VideoLayout]
    ) -> tuple[list[int], list[ImageLayout]]:
        """Expand each media placeholder of the tokenized prompt (one `grids` entry per image
        or video, in prompt order) into the family's run of tokens; returns the final ids and
        one `ImageLayout` per placeholder run, in order. ValueError when the placeholders and
        `grids` disagree. With no media: `(list(ids), [])`."""
        if grids:
            raise self.no_media()
        return list(ids), []
