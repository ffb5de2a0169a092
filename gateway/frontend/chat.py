"""The protocol-neutral chat request that every wire format is parsed into.

Typed and immutable: the wire parsers (`gateway.api.openai.parse`,
`gateway.api.anthropic.parse`) build it once at the edge; the pipeline, the prompt builder
and the warm-up only read it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from gateway.tools.spec import ToolCall, ToolSet


@dataclass(frozen=True)
class TextPart:
    text: str


@dataclass(frozen=True)
class ImagePart:
    """An image reference as `MediaLoader` takes it: an http(s) URL, a data URI or a path."""

    url: str
    param: str  # dotted path of the field it came from, for error messages


@dataclass(frozen=True)
class VideoPart:
    """A video reference (OpenAI-style `video_url` part): http(s) URL, data URI or path."""

    url: str
    param: str


@dataclass(frozen=True)
class AudioPart:
    """An audio clip: a data URI (an OpenAI `input_audio` part's base64 and format become
    `data:audio/<format>;base64,...`), an http(s) URL or a path (vLLM's `audio_url`)."""

    url: str
    param: str


Part = TextPart | ImagePart | VideoPart | AudioPart


@dataclass(frozen=True)
class ChatMessage:
    """One message. An assistant message may carry `tool_calls` (its parts then hold any text
    it wrote before them); a `tool` message is one call's result (`tool_call_id`, the called
    function's `name`), its parts text and images, as a user message's."""

    role: str  # system | user | assistant | tool
    parts: tuple[Part, ...]
    tool_calls: tuple[ToolCall, ...] = ()
    tool_call_id: str | None = None
    name: str | None = None
    # An assistant message's thinking, as the client sent it back (OpenAI-style
    # `reasoning_content`, Anthropic `thinking` blocks, Responses `reasoning` items): given to
    # the template as `reasoning_content`, which renders or drops it as the model was trained.
    reasoning: str = ""


@dataclass(frozen=True)
class ChatRequest:
    """One chat request, whatever API it came through.

    `max_tokens` None: the server's default (bounded by the context). `top_k` 0: off.
    `include_usage` and `logprobs` only change what a wire format renders; the engine
    computes the same tokens either way.
    """

    model: str
    messages: tuple[ChatMessage, ...]
    max_tokens: int | None
    temperature: float
    top_p: float
    top_k: int
    seed: int | None
    stop: tuple[str, ...]
    logprobs: bool
    top_logprobs: int
    stream: bool
    include_usage: bool
    ignore_eos: bool = False  # vLLM's extension: generate max_tokens tokens (benchmarks)
    grammar: str | None = None  # structured output (`response_format`), see gateway.structured
    grammar_field: str = "response_format"  # the field `grammar` came from (for errors)
    # Text the answer continues (Anthropic's final assistant message): appended after the
    # template's opening of the assistant turn; the response holds only what follows it.
    prefill: str = ""
    # vLLM's `cache_salt`, as the wire format sent it ("" none): scopes cache reuse further.
    cache_salt: str = ""
    # Ollama's `keep_alive`: seconds the model stays loaded once this request is done (-1:
    # until evicted, 0: unload once idle; None: the model's own; gateway.pool).
    keep_alive_s: float | None = None
    # The request's cache scope tag (caches/scope.py), set by the intake from the caller's
    # tenant and `cache_salt`; the prompt builder puts it into every cache key.
    cache_scope: str = ""
    # The tools offered (None: none); with a choice other than `none` the answer is decoded
    # under the model's tool grammar and split into text and calls (gateway.tools).
    tools: ToolSet | None = None
    # Logit shaping (gateway.engine.tokens.penalties); the defaults: none. `logit_bias`:
    # (token id, bias) pairs, ids checked against the vocabulary by the prompt builder.
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    repetition_penalty: float = 1.0
    logit_bias: tuple[tuple[int, float], ...] = ()
    min_tokens: int = 0
    n: int = 1  # choices (OpenAI chat only): one prefill, n decode rows
    # Thinking (gateway.frontend.reasoning): True / False switch the template's thinking on
    # or off (`enable_thinking`), None leaves the template's default. `thinking_field` names
    # the field that asked, for errors. `thinking_budget`: at most this many thinking tokens
    # (then the end of the thinking is forced). `template_kwargs`: the template's own
    # variables (`chat_template_kwargs`), as (name, JSON value) pairs.
    thinking: bool | None = None
    thinking_field: str = "thinking"
    # `thinking` True asked for where the model can think (Anthropic's adaptive thinking, an
    # effort): a model that does not think answers without thinking instead of a 400.
    thinking_optional: bool = False
    thinking_budget: int | None = None
    template_kwargs: tuple[tuple[str, Any], ...] = ()
    # Body fields the API's parser does not know and ignored (named back to the client in an
    # `x-ignored-fields` header: gateway.api.accepted.unknown_fields).
    ignored_fields: tuple[str, ...] = ()
    # A completion's prompt (OpenAI's legacy /v1/completions; `messages` is then empty): text,
    # tokenized as the tokenizer's own encode does (special tokens added), or token ids as
    # given; no chat template, media, tools or thinking.
    raw_prompt: str | tuple[int, ...] | None = None

    @classmethod
    def greedy(
        cls, model: str, messages: tuple[ChatMessage, ...], max_tokens: int | None, **fields: Any
    ) -> ChatRequest:
        """A greedy request with every sampling and rendering option off (what the warm-up
        and tests build without a wire format); `fields` override any other field."""
        off: dict[str, Any] = {
            "temperature": 0.0,
            "top_p": 1.0,
            "top_k": 0,
            "seed": None,
            "stop": (),
            "logprobs": False,
            "top_logprobs": 0,
            "stream": False,
            "include_usage": False,
        }
        return cls(model=model, messages=messages, max_tokens=max_tokens, **(off | fields))

    @property
    def images(self) -> list[ImagePart]:
        return [p for m in self.messages for p in m.parts if isinstance(p, ImagePart)]

    @property
    def videos(self) -> list[VideoPart]:
        return [p for m in self.messages for p in m.parts if isinstance(p, VideoPart)]

    @property
    def audio(self) -> list[AudioPart]:
        return [p for m in self.messages for p in m.parts if isinstance(p, AudioPart)]

    @property
    def media(self) -> list[ImagePart | VideoPart | AudioPart]:
        """Images, videos and audio in prompt order (the order of their placeholders)."""
        return [p for m in self.messages for p in m.parts if not isinstance(p, TextPart)]
