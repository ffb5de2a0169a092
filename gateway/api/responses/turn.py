"""One Responses-API turn: the conversation it continues, the images it needs, and what is
stored when it ends.

`Turn.parse` runs inside the intake (after the API key check): it parses the body, looks
up `previous_response_id` in the store (scoped to the caller's key: `Caller.owner`,
gateway/api/keys.py) and builds the whole
conversation as one `ChatRequest`: this turn's instructions, every stored message (images by
content hash), then the new input, exactly as Chat Completions would render the same
conversation sent in full. `Turn.resolve` hands the pipeline the stored decoded images and
loads only the new ones. `Turn.conversation` is what a continuation of this turn needs;
`Turn.items` what `GET /v1/responses/{id}/input_items` lists (gateway.api.responses.item_list).
Event loop only.
"""

from __future__ import annotations

from collections.abc import Container
from dataclasses import replace
from typing import Any

from gateway.api.responses.item_list import input_item_list
from gateway.api.responses.parse import ResponsesRequest, parse_responses_request
from gateway.api.responses.sealed import ReasoningSeal
from gateway.api.responses.store import HeldImage, ResponseStore, StoredResponse
from gateway.api.responses.tools import link_outputs
from gateway.errors import APIError
from gateway.frontend.chat import (
    AudioPart,
    ChatMessage,
    ChatRequest,
    ImagePart,
    TextPart,
    VideoPart,
)
from gateway.frontend.pipeline import ChatPipeline
from gateway.media import DecodedImage
from gateway.tools.spec import ToolCall

CONTINUABLE = ("completed", "incomplete")


def not_found(response_id: str, param: str | None = None) -> APIError:
    return APIError(
        404,
        f"no response with id '{response_id}' is stored here: it was never stored "
        "(`store: false`), was deleted, expired or was evicted (--responses-max-stored, "
        "--responses-store-mb, --responses-ttl-s), or belongs to another API key; send the "
        "conversation in full instead",
        "invalid_request_error",
        param,
        "response_not_found",
    )


class Turn:
    """The state of one `POST /v1/responses` while the pipeline admits it."""

    def __init__(
        self,
        pipeline: ChatPipeline,
        store: ResponseStore,
        running: Container[str],
        owner: str,
        seal: ReasoningSeal | None = None,
    ) -> None:
        self._pipeline = pipeline
        self._store = store
        self._running = running
        self.owner = owner
        self._seal = seal
        self.request: ResponsesRequest | None = None
        self.history: tuple[ChatMessage, ...] = ()
        self.images: list[DecodedImage] = []
        self.input: tuple[ChatMessage, ...] = ()  # this turn's input, tool outputs named
        self.items: tuple[dict[str, Any], ...] = ()  # the input items, as listed

    def parse(self, body: Any) -> ChatRequest:
        r = self.request = parse_responses_request(body, self._seal)
        earlier: tuple[dict[str, Any], ...] = ()
        if r.previous_response_id is not None:
            previous = self._continued(r.previous_response_id)
            self.history = previous.messages
            # The earlier items' own objects (and ids): the store counts each item once.
            earlier = (*previous.items, *previous.body["output"])
        self.input = link_outputs(self.history, r.input, r.output_params)
        if r.store:  # only a stored response is listed
            self.items = (*earlier, *input_item_list(body["input"]))
        system = (ChatMessage("system", (TextPart(r.instructions),)),) if r.instructions else ()
        summary_only = r.thinking is None and r.reasoning_summary is not None
        return ChatRequest(
            model=r.model,
            messages=(*system, *(_stored(m) for m in self.history), *self.input),
            max_tokens=r.max_output_tokens,
            temperature=r.temperature,
            top_p=r.top_p,
            top_k=0,
            seed=r.seed,
            stop=(),
            logprobs=r.logprobs,
            top_logprobs=r.top_logprobs,
            stream=r.stream,
            include_usage=True,
            grammar=r.grammar,
            grammar_field="text.format",
            cache_salt=r.cache_salt,
            keep_alive_s=r.keep_alive_s,
            # A summary without an effort asks for thinking where the model thinks: a model
            # that does not answers without (no reasoning item, no 400; Codex sends a summary
            # to every model). Only `reasoning.effort` is a switch such a model refuses.
            thinking=True if summary_only else r.thinking,
            thinking_optional=summary_only,
            thinking_field="reasoning.summary" if summary_only else "reasoning.effort",
            tools=r.tools,
            ignored_fields=r.ignored_fields,
        )

    def _continued(self, response_id: str) -> StoredResponse:
        where = "previous_response_id"
        if response_id in self._running:
            raise APIError(
                409,
                f"response '{response_id}' is still in progress; continue it once it has finished",
                "invalid_request_error",
                where,
                "response_in_progress",
            )
        previous = self._store.get(response_id, self.owner)
        if previous is None:
            raise not_found(response_id, where)
        status = previous.body["status"]
        if status not in CONTINUABLE:
            raise APIError(
                409,
                f"response '{response_id}' is {status}; only a completed or incomplete "
                "response can be continued",
                "invalid_request_error",
                where,
                "response_not_continuable",
            )
        return previous

    async def resolve(self, chat: ChatRequest) -> list[DecodedImage]:
        """The request's images: stored ones from the store's pool (taken before any await,
        so an eviction meanwhile cannot lose them), new ones through the media loader."""
        held: list[DecodedImage | None] = []
        for part in chat.images:
            image = self._store.image(part.content_hash) if isinstance(part, HeldImage) else None
            if isinstance(part, HeldImage) and image is None:
                raise APIError(
                    409,
                    "an image of the stored conversation is no longer held; send the "
                    "conversation in full",
                    "invalid_request_error",
                    "previous_response_id",
                    "response_state_gone",
                )
            held.append(image)
        fresh = iter(
            await self._pipeline.load_images(
                [p for p in chat.images if not isinstance(p, HeldImage)]
            )
        )
        self.images = [image if image is not None else next(fresh) for image in held]
        return self.images

    def conversation(
        self, answer: str, calls: tuple[ToolCall, ...] = (), reasoning: str = ""
    ) -> tuple[ChatMessage, ...]:
        """Every message up to and including the answer (its text and the calls it made),
        instructions excluded, this turn's images replaced by their content hash (the store
        keeps the decoded images)."""
        hashes = iter(i.content_hash for i in self.images[self._held_count() :])
        new = tuple(replace(m, parts=tuple(_held(p, hashes) for p in m.parts)) for m in self.input)
        said = ChatMessage("assistant", (TextPart(answer),), calls, reasoning=reasoning)
        return (*self.history, *new, said)

    def _held_count(self) -> int:
        return sum(isinstance(p, HeldImage) for m in self.history for p in m.parts)

    def image_map(self) -> dict[str, DecodedImage]:
        return {i.content_hash: i for i in self.images}


def _stored(message: ChatMessage) -> ChatMessage:
    """A stored message whose media name `previous_response_id` in refusals (a model that
    takes no audio, a clip no longer readable): their fields were an earlier request's."""
    media = (ImagePart, VideoPart, AudioPart)
    parts = tuple(
        replace(p, param="previous_response_id") if isinstance(p, media) else p
        for p in message.parts
    )
    return replace(message, parts=parts)


def _held(part: TextPart | ImagePart, hashes: Any) -> TextPart | ImagePart:
    if isinstance(part, ImagePart) and not isinstance(part, HeldImage):
        return HeldImage(url="", param=part.param, content_hash=next(hashes))
    return part
