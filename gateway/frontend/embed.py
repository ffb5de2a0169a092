"""The embeddings and rerank paths below the wire format: the model (an embedding model, loaded on
demand by the pool and held while its request runs), the inputs' images (loaded, decoded
and hashed by the same media loader as chat, so the same pixels in any delivery have one
hash and one vision-cache entry), the call to the engine, and its refusals as 400s naming
the field. Event loop only; the engine call is handed over from a worker thread (its images
are pickled there) and awaited as a future (no worker thread is held while the engine works,
so embedding traffic never starves the chat path's threads). A model takes at most
--max-batch + --max-waiting requests at once; more are a 429.
"""

from __future__ import annotations

import asyncio
import contextlib
import uuid
from collections.abc import AsyncIterator, Iterator

from caches.scope import scoped_hash
from gateway.engine.client import EngineBusy, EngineUnavailable
from gateway.engine.embed.request import (
    Embed,
    EmbedCard,
    EmbeddingClient,
    EmbedImage,
    EmbedItem,
    EmbedRefused,
    EmbedResult,
    RerankSide,
)
from gateway.errors import APIError, invalid
from gateway.frontend.chat import ImagePart
from gateway.frontend.embed_request import EmbedInput, EmbedRequest, RerankInput, RerankRequest
from gateway.frontend.errors import engine_busy, engine_unavailable, model_not_found, wrong_task
from gateway.frontend.pipeline import ChatPipeline
from gateway.media import DecodedImage

ROUTES = {"embed": "/v1/embeddings", "rerank": "/v1/rerank"}


class EmbedPipeline:
    """Embeddings over the served models; shares the chat pipeline's pool, media loader
    and readiness (`accept`)."""

    def __init__(self, chat: ChatPipeline) -> None:
        self.chat = chat
        self.pool = chat.pool

    async def embed(self, request: EmbedRequest) -> EmbedResult:
        """The request's vectors. APIError: 404 for a model not served, 400 for one that does
        not embed (naming `model`), an input it cannot take (naming `input[i]`, or the image
        part) or bad `dimensions`; 503 when its engine is gone or it cannot be loaded."""
        async with self._held(request.model, "embed", request.keep_alive_s) as (engine, card):
            _check_media(request.inputs, card)
            parts = [p for i in request.inputs for p in i.images]
            loaded = await self.chat.load_images(parts) if parts else []
            call = Embed(
                _items(request, loaded), request.dimensions, request.cache_scope, _call_id()
            )
            try:
                return await _answered(engine, call)
            except EmbedRefused as refused:
                raise _refusal(refused, [i.param for i in request.inputs]) from None

    async def rerank(self, request: RerankRequest) -> EmbedResult:
        """Each document's relevance score to the query (`vectors[:, 0]`, in document order).
        APIError as `embed`, naming `documents[i]` for a document the model cannot take."""
        async with self._held(request.model, "rerank", request.keep_alive_s) as (engine, card):
            sides = (request.query, *request.documents)
            parts = [s.image for s in sides if s.image is not None]
            if parts and "image" not in card.media:
                raise invalid(
                    "this reranker reads text only; it takes no images",
                    parts[0].param,
                    "unsupported_image",
                )
            images = iter(await self.chat.load_images(parts) if parts else [])
            query, *documents = (_side(s, images, request.scope) for s in sides)
            pairs = tuple(EmbedItem(pair=(request.instruction, query, d)) for d in documents)
            try:
                call = Embed(pairs, None, request.scope, _call_id())
                return await _answered(engine, call)
            except EmbedRefused as refused:
                params = [f"documents[{i}]" for i in range(len(request.documents))]
                raise _refusal(refused, params) from None

    @contextlib.asynccontextmanager
    async def _held(
        self, name: str, kind: str, keep_alive_s: float | None
    ) -> AsyncIterator[tuple[EmbeddingClient, EmbedCard]]:
        """The model `name` (which must do `kind`) loaded and held, with its card; released
        after. 404 / 400 naming `model` / 503 as `embed` says."""
        slot = self.pool.find(name)
        if slot is None:
            raise model_not_found(name, self.pool.served_names)
        if slot.kind != kind:
            raise wrong_task(slot.name, slot.kind, ROUTES[kind])
        slot = await self.pool.acquire(slot)
        try:
            # As chat's queue: at most --max-batch + --max-waiting requests per model (this
            # one included); more are a 429, not decoded images piling up in memory.
            capacity = slot.config.max_batch + slot.config.max_waiting
            if slot.holders > capacity:
                ahead = slot.holders - 1
                running = min(ahead, slot.config.max_batch)
                raise engine_busy(EngineBusy(running, ahead - running, capacity))
            engine, card = slot.engine, slot.engine.model if slot.engine else None
            if not isinstance(engine, EmbeddingClient) or not isinstance(card, EmbedCard):
                raise engine_unavailable()
            yield engine, card
        except EngineUnavailable:
            raise engine_unavailable() from None
        finally:
            slot.release(keep_alive_s)


async def _answered(engine: EmbeddingClient, call: Embed) -> EmbedResult:
    """`call` handed to the engine from a worker thread (its images are pickled down the
    engine process's pipe there, not on the event loop: a large image would stall every
    stream), its answer awaited without a thread. Cancelled (the client left), the engine
    drops the call if it has not started (`EmbedEngine.cancel`)."""
    future = await asyncio.to_thread(engine.embed_future, call)
    try:
        return await asyncio.wrap_future(future)
    except asyncio.CancelledError:
        engine.cancel(call.request_id)
        raise


def _call_id() -> str:
    return f"embd-{uuid.uuid4().hex}"


def _check_media(inputs: tuple[EmbedInput, ...], card: EmbedCard) -> None:
    """400 naming the first image part sent to a model that takes none (before any fetch)."""
    if "image" in card.media:
        return
    for item in inputs:
        for part in item.images:
            raise invalid(
                f"this model embeds text only; it takes no images (`{part.param}`)",
                part.param,
                "unsupported_image",
            )


def _items(request: EmbedRequest, images: list[DecodedImage]) -> tuple[EmbedItem, ...]:
    """The engine's inputs, each image by its pixels and scoped pixel hash."""
    loaded = iter(images)
    items = []
    for item in request.inputs:
        if item.parts is None:
            items.append(EmbedItem(text=item.text, ids=item.ids))
            continue
        parts: list[str | EmbedImage] = []
        for part in item.parts:
            if isinstance(part, ImagePart):
                d = next(loaded)
                pixel = scoped_hash(d.content_hash, request.cache_scope)
                parts.append(EmbedImage(d.image, pixel, d.width, d.height))
            else:
                parts.append(part)
        items.append(EmbedItem(parts=tuple(parts)))
    return tuple(items)


def _side(side: RerankInput, images: Iterator[DecodedImage], scope: str) -> RerankSide:
    """A rerank query or document for the engine, its image (if any) the next of `images`."""
    if side.image is None:
        return RerankSide(side.text)
    d = next(images)
    return RerankSide(
        side.text, EmbedImage(d.image, scoped_hash(d.content_hash, scope), d.width, d.height)
    )


def _refusal(refused: EmbedRefused, params: list[str]) -> APIError:
    """The engine's refusal as a 400 naming the input (`params[index]`: its field) or the
    field at fault."""
    if refused.field == "input" and refused.index is not None:
        param = params[refused.index]
        return invalid(f"`{param}`: {refused}", param, "invalid_input")
    return invalid(str(refused), refused.field)
