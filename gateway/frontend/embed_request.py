"""Embeddings and rerank requests as the front end takes them, below any wire format: the
model, the inputs (text, token ids, or content parts with images; a query and documents)
and the options that change the answer. Parsed by `gateway.api.openai.embeddings` and
`gateway.api.rerank`; run by `frontend.embed.EmbedPipeline`.
"""

from __future__ import annotations

from dataclasses import dataclass

from gateway.frontend.chat import ImagePart


@dataclass(frozen=True)
class EmbedInput:
    """One input: exactly one of `text`, `ids` or `parts` (strings and images in order).
    `param` is its field (`input[2]`), for error messages."""

    param: str
    text: str | None = None
    ids: tuple[int, ...] | None = None
    parts: tuple[str | ImagePart, ...] | None = None

    @property
    def images(self) -> tuple[ImagePart, ...]:
        return tuple(p for p in self.parts or () if isinstance(p, ImagePart))


@dataclass(frozen=True)
class EmbedRequest:
    """`inputs` embedded by `model`; `dimensions`: keep the first n (None: all);
    `encoding_format`: "float" or "base64" (the render's business); `cache_scope`: the
    caller's scope tag (caches/scope.py); `keep_alive_s`: the request's own model keep-alive."""

    model: str
    inputs: tuple[EmbedInput, ...]
    dimensions: int | None = None
    encoding_format: str = "float"
    user: str | None = None
    cache_scope: str = ""
    keep_alive_s: float | None = None


@dataclass(frozen=True)
class RerankInput:
    """A rerank query or document: its text ("" for none) and image (None for none), and
    its field (`documents[2]`) for error messages."""

    param: str
    text: str = ""
    image: ImagePart | None = None


@dataclass(frozen=True)
class RerankRequest:
    """`documents` scored against `query` by the reranker `model` (`instruction`: the
    task's wording, "" for the model's default); `top_n` and `return_documents` shape the
    answer (the render's business); `scope`: the caller's cache scope tag."""

    model: str
    query: RerankInput
    documents: tuple[RerankInput, ...]
    instruction: str = ""
    top_n: int | None = None
    return_documents: bool = False
    scope: str = ""
    keep_alive_s: float | None = None
