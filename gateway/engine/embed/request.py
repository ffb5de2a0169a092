"""What an embedding request is on its way to the engine and back: `Embed` (a `wire.Call`:
the inputs and options), `EmbedResult` (one vector per input, the tokens each took, how many
came from the cache) and `EmbedRefused` (an input the model cannot take: a 400 naming it).

No MLX: the HTTP process builds and reads these; they are pickled over the engine pipe.
"""

from __future__ import annotations

from concurrent.futures import Future, InvalidStateError
from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

import numpy as np

from caches.hashing import fingerprint


@dataclass(frozen=True)
class EmbedImage:
    """A decoded image of an input: its pixels (`image`, a PIL RGB image) and their hash
    (`caches.hashing.pixel_hash`, scoped like the vision cache's keys when the request has a
    cache scope). The same pixels in any delivery have one hash."""

    image: Any
    pixel_hash: str
    width: int
    height: int


@dataclass(frozen=True)
class RerankSide:
    """A rerank pair's query or document: its text ("" for none) and image (None for none),
    as mlx-vlm's reranker items are."""

    text: str = ""
    image: EmbedImage | None = None

    def key(self) -> tuple[str, str]:
        return (self.text, self.image.pixel_hash if self.image is not None else "")


@dataclass(frozen=True)
class EmbedItem:
    """One input to embed, one of three kinds:

    - `text`: a string, tokenized as is (no template), as mlx-vlm's server and
      sentence-transformers do;
    - `ids`: token ids, embedded as given;
    - `parts`: content parts (strings and `EmbedImage`s, in order) rendered with the model's
      chat template as one user turn, generation prompt opened (mlx-vlm's image embedding);
    - `pair`: (instruction, query, document) for a reranker, whose "vector" is the one score.
    """

    text: str | None = None
    ids: tuple[int, ...] | None = None
    parts: tuple[str | EmbedImage, ...] | None = None
    pair: tuple[str, RerankSide, RerankSide] | None = None

    def __post_init__(self) -> None:
        if sum(x is not None for x in (self.text, self.ids, self.parts, self.pair)) != 1:
            raise ValueError("an EmbedItem is exactly one of text, ids, parts or pair")

    @property
    def images(self) -> tuple[EmbedImage, ...]:
        """The item's images in prompt order (a pair's: the query's, then the document's)."""
        if self.pair is not None:
            return tuple(side.image for side in self.pair[1:] if side.image is not None)
        return tuple(p for p in self.parts or () if isinstance(p, EmbedImage))

    def content_key(self) -> str:
        """A hash of what the item holds (text, ids, or parts with images by pixel hash):
        equal items, and only they, share it."""
        if self.text is not None:
            return fingerprint("text", self.text)
        if self.ids is not None:
            return fingerprint("ids", self.ids)
        if self.pair is not None:
            instruction, query, document = self.pair
            return fingerprint("pair", instruction, query.key(), document.key())
        assert self.parts is not None
        return fingerprint(
            "parts", tuple(p if isinstance(p, str) else ("image", p.pixel_hash) for p in self.parts)
        )


@dataclass(frozen=True)
class Embed:
    """`EmbedEngine.embed`: embed `items` (answers an `EmbedResult`, or raises
    `EmbedRefused`). `dimensions`: keep the first n dimensions (Matryoshka; None: all), then
    normalize if the model does; `scope`: the request's cache scope tag ("" shared);
    `request_id`: what `cancel` names it by ("" cannot be cancelled)."""

    items: tuple[EmbedItem, ...]
    dimensions: int | None = None
    scope: str = ""
    request_id: str = ""


@dataclass(frozen=True)
class EmbedResult:
    """The vectors (float32, one row per item, in order), each item's token count, and how
    many items the embedding cache answered."""

    vectors: np.ndarray
    tokens: tuple[int, ...]
    cached: int = 0


class EmbedCancelled(Exception):
    """The call was cancelled (`EmbedEngine.cancel`: its client left) before it ran."""


class EmbedRefused(ValueError):
    """An input the model cannot embed: `index` is its position in `Embed.items` (None: the
    request as a whole), `field` the request field to blame (e.g. "dimensions")."""

    def __init__(self, message: str, index: int | None = None, field: str = "input") -> None:
        super().__init__(message)
        self.index = index
        self.field = field

    def __reduce__(self) -> tuple[Any, ...]:  # pickled across the engine pipe whole
        return (EmbedRefused, (str(self), self.index, self.field))


def settle(future: Future[Any], outcome: object) -> None:
    """Resolve an embedding call's `future` with `outcome` (an exception fails it), unless
    its waiter cancelled it meanwhile (a request cancelled at shutdown): that outcome is
    nobody's, and must not raise on the thread that delivers it."""
    try:
        if isinstance(outcome, BaseException):
            future.set_exception(outcome)
        else:
            future.set_result(outcome)
    except InvalidStateError:  # cancelled (or settled) already
        pass


@dataclass(frozen=True)
class EmbedCard:
    """What the HTTP process knows of a loaded embedder (shipped in `wire.Ready`, no MLX):
    its `family`, the `media` its inputs take ("image" or none), `dimensions` (the full
    vector's), `max_tokens` (the longest input), `matryoshka` (a shorter `dimensions` may be
    asked for) and `normalize` (vectors have unit length)."""

    family: str
    model_type: str
    media: frozenset[str]
    dimensions: int
    max_tokens: int
    matryoshka: bool
    normalize: bool
    task: str = "embed"

    def describe(self) -> dict[str, Any]:
        """The model card's part about it (/v1/models)."""
        return {
            "family": self.family,
            "model_type": self.model_type,
            "task": self.task,
            "media": sorted(self.media),
            "embedding_dimensions": self.dimensions,
            "matryoshka": self.matryoshka,
            "max_input_tokens": self.max_tokens,
        }


@runtime_checkable
class EmbeddingClient(Protocol):
    """An engine client that embeds: `EmbedEngine` in this process, `RemoteEngine` over an
    embedding model's engine process."""

    def embed(self, call: Embed) -> EmbedResult:
        """`call` answered (blocks). Raises EmbedRefused for an input the model cannot take,
        EngineUnavailable when the engine is gone."""
        ...

    def embed_future(self, call: Embed) -> Future[EmbedResult]:
        """`call` queued; its future resolves to the result or fails as `embed` raises (no
        thread waits meanwhile). Raises EngineUnavailable at once when the engine is gone."""
        ...

    def cancel(self, request_id: str) -> None:
        """Drop the call with this `Embed.request_id` if it has not started (its future then
        fails with `EmbedCancelled`); any thread, never raises for an unknown id."""
        ...
