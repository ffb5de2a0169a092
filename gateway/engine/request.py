"""Typed, immutable messages between the HTTP layer and the engine thread.

The HTTP side builds an `EngineRequest` (prompt token ids with every image's placeholder run
already expanded, the images' preprocessed pixels and hashes, sampling settings) and receives
`TokenEvent`s, then exactly one `FinishEvent` or `ErrorEvent`.
"""

from __future__ import annotations

import enum
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from caches.scope import scope_of_hash
from gateway.processors.audio import AudioGrid
from gateway.processors.positions import ImageLayout


@dataclass(frozen=True)
class ThinkingParams:
    """How a thinking model's answer is split into its thinking and the answer after it.

    `start_id` / `end_id`: the one-token markers that open and close the thinking (Qwen3's
    `<think>` / `</think>`, Gemma 4's `<|channel>` / `<channel|>`); `inside`: the prompt
    already opened the thinking (the answer starts in it), else the answer may open it with
    `start_id` as its first token. `budget`: at most this many thinking tokens, then `end_id`
    is forced (None: no limit). `grammar_waits`: a grammar (structured output, tools)
    constrains only what follows the thinking (False: it applies from the first token, so
    thinking cannot start). `header`: text the thinking opens with that is not part of it
    (Gemma 4's channel name, `thought\n`). Token ids of the served model's vocabulary."""

    start_id: int
    end_id: int
    inside: bool = False
    budget: int | None = None
    grammar_waits: bool = False
    header: str = ""


@dataclass(frozen=True)
class SamplingParams:
    """Per-request sampling. temperature 0 means greedy (argmax)."""

    max_tokens: int
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0  # 0: no top-k cut
    seed: int | None = None
    stop: tuple[str, ...] = ()
    # Stop strings apply only to the answer's text before this marker (the opening of its first
    # tool call): a call is never cut by one (None: to the whole answer).
    stop_until: str | None = None
    logprobs: bool = False
    top_logprobs: int = 0
    ignore_eos: bool = False  # keep generating past end-of-sequence tokens (benchmarks)
    # Structured output: an llguidance grammar (serialized JSON, from gateway.structured) that
    # every generated token must follow; None: free text.
    grammar: str | None = None
    grammar_field: str = "response_format"  # the field it came from (errors name it)
    # Shaping of the logits before the draw (gateway.engine.tokens.penalties); the defaults
    # leave them untouched. logit_bias: (token id, bias) pairs, ids inside the vocabulary.
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    repetition_penalty: float = 1.0
    logit_bias: tuple[tuple[int, float], ...] = ()
    min_tokens: int = 0  # end-of-sequence tokens are masked until this many are generated
    # Choices: the prompt is prefilled once and its KV forked into `n` rows (at most the
    # engine's max_batch); with a seed, choice i draws as a request seeded `seed + i` would.
    n: int = 1
    # A thinking model's markers (None: the answer is all answer, as for any other model).
    thinking: ThinkingParams | None = None

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0 or self.top_k == 1

    @property
    def shaped(self) -> bool:
        """Does any penalty, bias or `min_tokens` apply (else the logits are the model's)?"""
        return bool(
            self.presence_penalty
            or self.frequency_penalty
            or self.repetition_penalty != 1.0
            or self.logit_bias
            or self.min_tokens
        )


@dataclass(frozen=True)
class ImageInput:
    """One image of a prompt (or one audio clip: `image` an `AudioClip`, `grid_thw` its
    `AudioGrid`, `pixel_values` its features).

    `pixel_values` is the processor's output (a numpy array, patches x features), or None
    when the request was built without preprocessing (the features were expected in a cache,
    or the engine runs in another process and preprocesses there); then the engine
    preprocesses `image` (the decoded RGB PIL image) itself if it has to run the tower.
    """

    content_hash: str
    layout: ImageLayout
    grid_thw: tuple[int, int, int]  # in patches, as the vision tower wants it
    pixel_values: Any | None = None
    image: Any | None = field(default=None, compare=False, repr=False)

    @property
    def media(self) -> str:
        """The medium its cache lookups are counted under: "audio" for an audio clip (its
        grid is an `AudioGrid`), else "image" (a video's blocks included)."""
        return "audio" if isinstance(self.grid_thw, AudioGrid) else "image"


@dataclass(frozen=True)
class EngineRequest:
    """A fully prepared chat request. `prompt_ids` already contains each image's placeholder run
    (images[i].layout says where)."""

    request_id: str
    prompt_ids: tuple[int, ...]
    images: tuple[ImageInput, ...]
    sampling: SamplingParams
    arrival_time: float  # time.perf_counter() when the HTTP request arrived
    use_caches: bool = True  # False: neither look up nor store (start-up warm-up requests)
    # Which replica should serve it when several do (`gateway.cluster`): the first image's
    # hash or the conversation opening's; "" for none. The engine itself ignores it.
    affinity_key: str = ""
    # The cache scope tag (caches/scope.py: tenant and cache_salt; "" shared): part of every
    # cache key. Each image's content_hash must carry it (`scoped_hash`), checked here.
    cache_scope: str = ""
    # The chat template's variables the prompt was rendered with (`enable_thinking`, ...), as
    # a JSON object with sorted keys ("" for none): the answer prefill renders the next turn
    # with the same ones (gateway.engine.tokens.answer_render).
    template_vars: str = ""

    def __post_init__(self) -> None:
        for image in self.images:
            if scope_of_hash(image.content_hash) != self.cache_scope:
                raise ValueError(
                    f"image {image.content_hash[:12]} is not in the request's cache scope "
                    f"{self.cache_scope!r}: build its hash with caches.scope.scoped_hash"
                )


@dataclass(frozen=True)
class TokenLogprob:
    token: str
    token_id: int
    logprob: float
    bytes: tuple[int, ...]
    top: tuple[tuple[str, int, float, tuple[int, ...]], ...] = ()  # (token, id, logprob, bytes)


@dataclass(frozen=True)
class TokenEvent:
    """New output: `text` may be empty (held back for a possible stop string or a partial
    UTF-8 sequence) while `token_ids` is not. `reasoning`: new text of the model's thinking
    (`SamplingParams.thinking`), which never appears in `text`."""

    text: str
    token_ids: tuple[int, ...]
    logprobs: tuple[TokenLogprob, ...] = ()
    index: int = 0  # the choice it belongs to (`SamplingParams.n`)
    reasoning: str = ""


@dataclass(frozen=True)
class Usage:
    prompt_tokens: int
    completion_tokens: int
    cached_tokens: int  # prompt tokens whose KV came from the prefix cache
    vision_hits: int = 0
    vision_misses: int = 0
    reasoning_tokens: int = 0  # of completion_tokens: the thinking's (markers not counted)

    @property
    def total_tokens(self) -> int:
        return self.prompt_tokens + self.completion_tokens


class FinishReason(str, enum.Enum):  # noqa: UP042 - StrEnum would change its str()
    """Why a request ended normally. A str: compares equal to its value ("stop" == STOP) and
    JSON-encodes as it (json, orjson), as the APIs' `finish_reason` fields want."""

    STOP = "stop"  # an end-of-sequence token or a stop string
    LENGTH = "length"  # max_tokens reached
    CANCELLED = "cancelled"  # the client went away (`cancel`)

    def __str__(self) -> str:  # the value, also in f-strings and metric labels (not the name)
        return self.value


@dataclass(frozen=True)
class FinishEvent:
    finish_reason: FinishReason  # a bare string ("stop", mlx-lm's own) is converted
    usage: Usage
    text: str = ""  # any text flushed at the end
    stop_sequence: str | None = None  # the stop string that ended it (None: EOS or other)
    # With n > 1 choices every choice ends with its own FinishEvent (its usage counts the
    # prompt and its own completion); only the last one to end is `final`.
    index: int = 0
    final: bool = True
    reasoning: str = ""  # any thinking text flushed at the end (the answer ended inside it)

    def __post_init__(self) -> None:
        if not isinstance(self.finish_reason, FinishReason):  # ValueError if it is none
            object.__setattr__(self, "finish_reason", FinishReason(self.finish_reason))

    @classmethod
    def cancelled(
        cls, prompt_tokens: int, cached_tokens: int = 0, index: int = 0, final: bool = True
    ) -> FinishEvent:
        """The end of a request (or of one choice) cancelled before it generated anything."""
        usage = Usage(prompt_tokens, 0, cached_tokens)
        return cls(FinishReason.CANCELLED, usage, index=index, final=final)


class ErrorKind(enum.Enum):
    """Why the engine could not answer; the HTTP edge maps each kind to a status code."""

    INTERNAL = "internal"  # a fault in the engine or the model while serving this request
    # The request's schema (response_format, tools) outgrew the grammar engine's limits
    # while decoding: the client's to simplify (400), found only once rows decode.
    GRAMMAR_LIMIT = "grammar_limit"
    SHUTTING_DOWN = "shutting_down"  # the server stopped before the request finished


@dataclass(frozen=True)
class ErrorEvent:
    kind: ErrorKind
    message: str
    param: str | None = None  # the request field at fault (GRAMMAR_LIMIT: the schema's)


@dataclass(frozen=True)
class AdmittedEvent:
    """Sent once, when the engine has looked the request up in its caches and started it."""

    prompt_tokens: int
    cached_tokens: int
    vision_hits: int
    vision_misses: int
    vision_disk_hits: int = 0  # of vision_hits: features read from the disk tier
    disk_cached_tokens: int = 0  # of cached_tokens: KV read from the disk tier


Event = AdmittedEvent | TokenEvent | FinishEvent | ErrorEvent
"""Everything a request's sink receives: one AdmittedEvent (unless it fails first), any number
of TokenEvents, then exactly one FinishEvent or ErrorEvent; with n > 1 choices, one
FinishEvent per choice (the last `final`) or one ErrorEvent."""


def ends_request(event: Event) -> bool:
    """Is this the request's last event (an ErrorEvent, or its final FinishEvent)?"""
    return isinstance(event, ErrorEvent) or (isinstance(event, FinishEvent) and event.final)


Sink = Callable[[Event], None]  # delivers one event to the request's consumer; never blocks
