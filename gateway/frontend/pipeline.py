"""The one request path every chat API shares, below the wire formats: neutral request ->
media -> prompt -> engine submit -> admission.

`ChatPipeline.admit` takes a parsed `ChatRequest` and does everything up to the engine's
admission event, handing back an `Admission` (the event, the stream of the request's later
events, and where the time went); the API then renders the stream as JSON or SSE. Nothing
here knows HTTP or a wire format: API keys, request bodies and connections are the caller's
(gateway.api.intake), and failures are `APIError`s (gateway.frontend.errors) the caller
renders.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
import uuid
import weakref
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import replace
from typing import TypeVar

from gateway.engine.client import EngineBusy, EngineClient, EngineUnavailable
from gateway.engine.request import AdmittedEvent, ErrorEvent, ErrorKind, Event, Sink, ends_request
from gateway.errors import invalid
from gateway.frontend.admission import Admission, Timings
from gateway.frontend.affinity import affinity_key
from gateway.frontend.chat import AudioPart, ChatRequest, ImagePart, VideoPart
from gateway.frontend.errors import (
    ClientGone,
    engine_busy,
    engine_error,
    engine_unavailable,
    model_not_found,
    prompt_error,
    shutting_down,
    wrong_task,
)
from gateway.frontend.prompt import Media, PromptBuilder
from gateway.frontend.streams import EventStream, LoopDelivery
from gateway.media import DecodedAudio, DecodedImage, MediaLoader
from gateway.metrics import EdgeMetrics
from gateway.pool.pool import ModelPool
from gateway.pool.slot import ModelSlot

# Images of a parsed request, in `ChatRequest.images` order. The default loads every image
# part through the media loader; the Responses API passes its own, which takes the images of
# a stored conversation from its store (no fetch, no decode, no hash) and loads only new ones.
ImageResolver = Callable[[ChatRequest], Awaitable[list[DecodedImage]]]

# Awaits the admission event unless the client has gone (then None, the work cancelled); the
# HTTP edge watches its connection, other callers await plainly.
Watch = Callable[[Awaitable[Event]], Awaitable[Event | None]]

_A = TypeVar("_A")
_B = TypeVar("_B")


class ChatPipeline:
    """The shared request path over the served models (`pool`). Lives on the event loop
    thread.

    `open` (from the lifespan, once the default model is loaded) makes it ready; `close`
    makes every later request a 503 (`accept`) while running ones finish.
    """

    def __init__(self, pool: ModelPool, media: MediaLoader, metrics: EdgeMetrics) -> None:
        self.pool = pool
        self.media = media
        self._metrics = metrics
        self._delivery: LoopDelivery | None = None
        self.draining = False
        # Admitted requests whose events may still be read, for `interrupt_all` at shutdown,
        # and the engine each runs in (for `cancel`).
        self._live: weakref.WeakValueDictionary[str, EventStream[Event]] = (
            weakref.WeakValueDictionary()
        )
        self._engines: dict[str, EngineClient] = {}

    def open(self, delivery: LoopDelivery) -> None:
        self._delivery = delivery

    def close(self) -> None:
        self.draining = True

    @property
    def ready(self) -> bool:
        return self._delivery is not None and not self.draining

    @property
    def prompts(self) -> PromptBuilder | None:
        """The default model's prompt builder (None while it is not loaded)."""
        return self.pool.default.prompts

    def prompts_for(self, name: str) -> PromptBuilder | None:
        """The prompt builder of the model served as `name`, if it is loaded."""
        slot = self.pool.find(name)
        return None if slot is None else slot.prompts

    def accept(self) -> None:
        """Raise the 503 of a server that is not ready or is shutting down. Call it when a
        request arrives, before reading it: one accepted before the drain began is served
        (`admit` does not ask again)."""
        if not self.ready:
            raise shutting_down()

    async def preload(self, name: object) -> None:
        """Load the model named `name` (a request body's `model`) unless it is loaded, so its
        prompt side can read the request (an unknown name is left to `admit`'s 404)."""
        slot = self.pool.find(name) if isinstance(name, str) else None
        if slot is not None and slot.kind == "chat" and slot.prompts is None:
            self.pool.release_now(await self.pool.acquire(slot))

    def cancel(self, request_id: str) -> None:
        engine = self._engines.get(request_id)
        if engine is not None:
            engine.cancel(request_id)

    def interrupt_all(self, message: str) -> int:
        """End every admitted request's event stream with a shutting-down error (each API
        renders it: an SSE error event, or a 503) and cancel it in its engine; returns how
        many streams were still open. Event loop only."""
        live = list(self._live.items())
        self._live.clear()
        for request_id, stream in live:
            stream.interrupt(ErrorEvent(ErrorKind.SHUTTING_DOWN, message))
            with contextlib.suppress(EngineUnavailable):
                self.cancel(request_id)
        return len(live)

    async def load_images(self, parts: Sequence[ImagePart]) -> list[DecodedImage]:
        """Fetch, decode and hash `parts` under the media limits (APIError on failure)."""
        images = await self.media.load_all([(p.url, p.param) for p in parts])
        for image in images:
            self._metrics.image_decode_seconds.observe(image.decode_seconds)
            self._metrics.image_hash_seconds.observe(image.hash_seconds)
        return images

    async def _load_audio(self, slot: ModelSlot, chat: ChatRequest) -> list[DecodedAudio]:
        """The request's audio parts decoded at the model's rate; a model without audio
        gets a 400 naming the first audio part before anything is decoded."""
        if not chat.audio:
            return []
        prompts = slot.prompts
        assert prompts is not None  # held: loaded until released
        rate = prompts.model.audio_rate
        if rate is None:
            try:
                prompts.check_media_kinds(chat)
            except ValueError as exc:
                raise prompt_error(exc, chat) from None
        return await self.media.load_audio([(p.url, p.param) for p in chat.audio], rate or 16000)

    async def _prepare(
        self, chat: ChatRequest, resolve: ImageResolver | None
    ) -> tuple[ModelSlot, LoopDelivery, list[Media]]:
        """Find and hold the model (loading it if needed), check the media count, load the
        media (in prompt order). The caller releases the model (`ModelSlot.release`), also
        when this raises after the hold (it releases then itself)."""
        delivery = self._delivery
        if delivery is None:
            raise shutting_down()  # never opened: the default model did not load
        slot = self.pool.find(chat.model)
        if slot is None:
            raise model_not_found(chat.model, self.pool.served_names)
        if slot.kind != "chat":
            raise wrong_task(slot.name, slot.kind, "a chat route")
        slot = await self.pool.acquire(slot)
        try:
            rows = slot.config.max_batch if chat.n > 1 else 1
            if chat.n > rows:  # its n rows decode together: more could never be admitted
                raise invalid(
                    f"`n` ({chat.n}) exceeds this server's {rows} decode rows (--max-batch); "
                    f"ask for at most {rows} choices",
                    "n",
                )
            self.media.check_media_count(len(chat.images), len(chat.videos), len(chat.audio))
            images, videos = await _both(
                resolve(chat) if resolve else self.load_images(chat.images),
                self.media.load_videos([(p.url, p.param) for p in chat.videos]),
            )
            audio = await self._load_audio(slot, chat)
        except BaseException:
            slot.release(chat.keep_alive_s)
            raise
        # Back into prompt order: the placeholders of images, videos and audio interleave.
        image_iter, video_iter, audio_iter = iter(images), iter(videos), iter(audio)
        media: list[Media] = [
            next(video_iter)
            if isinstance(p, VideoPart)
            else next(audio_iter)
            if isinstance(p, AudioPart)
            else next(image_iter)
            for p in chat.media
        ]
        return slot, delivery, media

    async def count_tokens(self, chat: ChatRequest) -> int:
        """The prompt length (tokens, images included) `chat` would have; nothing runs on the
        engine. Same errors as `admit` up to the prompt."""
        slot, _, media = await self._prepare(chat, None)
        try:
            assert slot.prompts is not None
            return await asyncio.to_thread(slot.prompts.count, chat, media)
        except ValueError as exc:
            raise prompt_error(exc, chat) from None
        finally:
            slot.release(chat.keep_alive_s)

    async def admit(
        self,
        chat: ChatRequest,
        id_prefix: str,
        *,
        arrival: float,
        read: float,
        resolve: ImageResolver | None = None,
        watch: Watch | None = None,
    ) -> Admission:
        """Load media, build the prompt, submit, and wait for admission. `arrival` and `read`
        are the perf_counter() marks of the request's arrival and of its body read (the
        Timings' first two). Raises APIError (4xx for the client's mistakes; `Overloaded`
        when the engine queue is full; 503 when the engine is gone) or ClientGone when
        `watch` says the client left. `resolve` supplies the images (default: `load_images`
        of every image part)."""
        slot, delivery, media = await self._prepare(chat, resolve)
        engine, prompts = slot.engine, slot.prompts
        assert engine is not None and prompts is not None  # held: loaded until released
        request_id = f"{id_prefix}{uuid.uuid4().hex}"
        t_media = time.perf_counter()
        stream: EventStream[Event] = EventStream(delivery)
        self._engines[request_id] = engine  # before submit: its end may come at once
        try:
            prepared = await asyncio.to_thread(prompts.build, chat, media, request_id, arrival)
            prepared = replace(prepared, affinity_key=affinity_key(chat, prepared))
            t_prompt = time.perf_counter()
            engine.submit(prepared, self._ending(request_id, slot, chat, stream.sink))
        except BaseException as exc:  # nothing started: the model's hold ends here
            self._engines.pop(request_id, None)
            slot.release(chat.keep_alive_s)
            if isinstance(exc, ValueError):
                raise prompt_error(exc, chat) from None
            if isinstance(exc, EngineBusy):
                raise engine_busy(exc) from None
            if isinstance(exc, EngineUnavailable):
                raise engine_unavailable() from None
            raise
        first = await (watch(stream.get()) if watch else stream.get())
        if first is None:
            engine.cancel(request_id)
            raise ClientGone(request_id)
        if isinstance(first, ErrorEvent):
            raise engine_error(first)
        assert isinstance(first, AdmittedEvent)
        timings = Timings(arrival, read, t_media, t_prompt, time.perf_counter())
        self._live[request_id] = stream
        calls = chat.tools is not None and chat.tools.constrained
        fmt = prompts.tool_format if calls else None
        thinks = prepared.sampling.thinking is not None
        cap = prepared.sampling.max_tokens
        return Admission(request_id, chat, first, stream, timings, fmt, thinks, cap)

    def _ending(self, request_id: str, slot: ModelSlot, chat: ChatRequest, sink: Sink) -> Sink:
        """`sink`, which on the request's last event releases its model and forgets its
        engine (runs on the engine client's thread)."""
        engines = self._engines

        def forward(event: Event) -> None:
            if ends_request(event):
                engines.pop(request_id, None)
            sink(event)

        return slot.releasing(forward, chat.keep_alive_s)


async def _both(first: Awaitable[_A], second: Awaitable[_B]) -> tuple[_A, _B]:
    """Await two loads concurrently; the first failure cancels the other and is raised (the
    image loads' error first when both have failed)."""
    tasks = [asyncio.ensure_future(first), asyncio.ensure_future(second)]
    done, pending = await asyncio.wait(tasks, return_when=asyncio.FIRST_EXCEPTION)
    for task in pending:
        task.cancel()
    if pending:
        await asyncio.gather(*pending, return_exceptions=True)
    for task in tasks:
        if task in done and task.exception() is not None:
            raise task.exception()  # type: ignore[misc]
    return tasks[0].result(), tasks[1].result()
