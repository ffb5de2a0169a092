"""Chat request + decoded images -> a prepared `EngineRequest` (tokenizer and numpy work, run
in a worker thread so neither the event loop nor the engine thread does it).

The chat template is applied to our own message list with image parts exactly where the user
put them (mlx-vlm's prompt helper moves text before the image for Qwen2-VL, which would make an
image's KV depend on the question that follows it).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from caches.scope import scoped_hash
from gateway.engine.request import EngineRequest, ImageInput, SamplingParams, ThinkingParams
from gateway.errors import invalid
from gateway.frontend.chat import AudioPart, ChatRequest, ImagePart, TextPart, VideoPart
from gateway.frontend.reasoning import Reasoning, template_kwargs
from gateway.media import DecodedAudio, DecodedImage, DecodedVideo
from gateway.processors.audio import AudioClip
from gateway.processors.positions import ImageLayout
from gateway.processors.processor import PromptSide
from gateway.processors.video_layout import VideoLayout
from gateway.tools.fallback import fold, needs_folding, renders_tools
from gateway.tools.formats import ToolFormat, resolve
from gateway.tools.grammar import tool_grammar

Media = DecodedImage | DecodedVideo | DecodedAudio
Grid = tuple[int, int, int] | VideoLayout


class UnsupportedImage(ValueError):
    """An image or video the model's processor cannot take (e.g. too elongated); `index` is
    its place among the request's media (`ChatRequest.media`), so the caller can name the
    field it came from."""

    def __init__(self, index: int, message: str, kind: str = "image") -> None:
        super().__init__(message)
        self.index = index
        self.kind = kind  # "image", "video" or "audio"


def template_messages(chat: ChatRequest) -> list[dict[str, Any]]:
    """OpenAI messages -> the chat template's format (`{"type": "image"}` placeholders).

    Text-only content is one string (templates such as Qwen3's call string methods on it);
    an assistant message's calls go in `tool_calls` (transformers' shape, arguments as a
    mapping), a tool result carries `tool_call_id` and `name`, and its images stay parts in
    place, as a user message's (a template that renders tool content as a string only
    refuses them: a 400)."""
    out: list[dict[str, Any]] = []
    for message in chat.messages:
        entry: dict[str, Any] = {"role": message.role}
        if all(isinstance(p, TextPart) for p in message.parts):
            entry["content"] = "".join(p.text for p in message.parts)  # type: ignore[union-attr]
        else:
            content: list[dict[str, Any]] = []
            for part in message.parts:
                if isinstance(part, ImagePart):
                    content.append({"type": "image"})
                elif isinstance(part, VideoPart):
                    content.append({"type": "video"})
                elif isinstance(part, AudioPart):
                    content.append({"type": "audio"})
                else:
                    content.append({"type": "text", "text": part.text})
            entry["content"] = content
        if message.tool_calls:
            entry["tool_calls"] = [call.template_dict() for call in message.tool_calls]
        if message.reasoning:  # the template keeps or drops it (Qwen3: after the last query)
            entry["reasoning_content"] = message.reasoning
        if message.role == "tool":
            entry["tool_call_id"] = message.tool_call_id
            entry["name"] = message.name
        out.append(entry)
    return out


class PromptBuilder:
    """Builds engine requests for one model (any family). Thread-safe (the model guards its
    tokenizer).

    No pixel work: each image goes to the engine decoded, with its layout and grid (sizes
    only); the engine preprocesses the images its caches miss (`gateway.engine.pixels`, the
    one owner of pixel preparation).

    Every image's content hash is scoped with the request's `cache_scope` (caches/scope.py:
    tenant and cache_salt), which the `EngineRequest` carries too: that is how a scope enters
    every cache key.
    """

    def __init__(
        self,
        model: PromptSide,
        max_context_tokens: int,
        default_max_tokens: int,
        tool_parser: str = "auto",
    ) -> None:
        self.model = model
        self._max_context = max_context_tokens
        self._default_max_tokens = default_max_tokens
        # The tool-call syntax of this checkpoint (None: requests with tools get a 400).
        self.tool_format: ToolFormat | None = resolve(tool_parser, model.chat_template)
        # A template that renders no tools gets them, and the tool history, folded into plain
        # turns by the gateway (a call syntax forced with --tool-call-parser).
        self._fold_tools = not renders_tools(model.chat_template)
        self._added = frozenset(model.tokenizer.get_added_vocab())
        # The thinking markers of this checkpoint (None: it does not think; answers are whole).
        self.reasoning: Reasoning | None = Reasoning.of(model.chat_template, model.tokenize)

    @property
    def max_context(self) -> int:
        """Prompt + answer tokens a request may take (/v1/models' max_model_len)."""
        return self._max_context

    def count(self, chat: ChatRequest, media: Sequence[Media]) -> int:
        """The prompt's length in tokens, image and video tokens included (no pixel work)."""
        return len(self._layout(chat, media)[0])

    def _layout(
        self, chat: ChatRequest, media: Sequence[Media]
    ) -> tuple[list[int], list[ImageLayout], list[Grid], ThinkingParams | None, str]:
        """The prompt's ids, its media layouts and grids, its thinking parameters and the
        template variables it was rendered with (`EngineRequest.template_vars`)."""
        if chat.raw_prompt is not None:
            return self._raw_layout(chat.raw_prompt), [], [], None, ""
        self.check_media_kinds(chat)
        tools = None
        if chat.tools is not None:
            self._check_tools(chat)
            tools = [tool.template_dict() for tool in chat.tools.tools]
        # An assistant prefill continues the assistant turn the template just opened.
        kwargs = template_kwargs(chat, self.reasoning)
        messages = template_messages(chat)
        if self._fold_tools and self.tool_format is not None and needs_folding(messages, tools):
            messages, tools = fold(messages, tools, self.tool_format), None
        text = self.model.render(messages, tools, kwargs)
        thinking = self.reasoning.params(text, chat) if self.reasoning is not None else None
        text += chat.prefill
        ids = self.model.tokenize(text)
        grids = [self._grid(index, item) for index, item in enumerate(media)]
        prompt, layouts = self.model.layout_prompt(ids, grids)
        return prompt, layouts, grids, thinking, _template_vars(kwargs)

    def _raw_layout(self, prompt: str | tuple[int, ...]) -> list[int]:
        """A completion prompt's ids: text tokenized with the tokenizer's special tokens, or
        ids checked against the vocabulary. A placeholder of a media token in it is a 400
        (no media comes with it: `layout_prompt` refuses the run)."""
        if isinstance(prompt, str):
            ids = self.model.tokenize(prompt, special_tokens=True)
        else:
            vocab = len(self.model.tokenizer)
            bad = next((t for t in prompt if not 0 <= t < vocab), None)
            if bad is not None:
                raise invalid(
                    f"`prompt` holds token id {bad}, not a token of this model (0 to {vocab - 1})",
                    "prompt",
                )
            ids = list(prompt)
        if not ids:
            raise invalid("`prompt` is empty: send text or token ids to continue", "prompt")
        return self.model.layout_prompt(ids, [])[0]

    def check_media_kinds(self, chat: ChatRequest) -> None:
        """Refuse a media part the model does not take (an image sent to a text model): the
        message names the part's field (APIs without a `param`, like Anthropic's, show only
        the message) and the error carries its place among the request's media."""
        for index, part in enumerate(chat.media):
            kind = _kind(part)
            if kind not in self.model.media:
                model = self.model
                instead = "images or text" if "image" in model.media else "text only"
                raise UnsupportedImage(
                    index,
                    f"{part.param}: this model ({model.model_type}, family {model.family}) "
                    f"does not take {kind} input; send {instead}, or serve a model that reads "
                    f"{'audio' if kind == 'audio' else kind + 's'}",
                    kind,
                )

    def _check_tools(self, chat: ChatRequest) -> None:
        """Tools need a model whose template teaches a call syntax we can constrain; tools
        and `response_format` together are refused (one grammar per answer)."""
        if self.tool_format is None:
            model = self.model
            raise invalid(
                f"this model ({model.model_type}, family {model.family}) has no tool-call "
                "format this server knows in its chat template (hermes <tool_call>, Llama 3 "
                "JSON); send the request without `tools`, or start the server with "
                "--tool-call-parser hermes (or llama3_json) to force one the model may not "
                "have been trained on",
                "tools",
            )
        if chat.grammar is not None and chat.tools is not None and chat.tools.constrained:
            raise invalid(
                "`response_format` cannot be combined with tools unless `tool_choice` is 'none'",
                "response_format",
            )

    def tool_grammar(self, chat: ChatRequest) -> str | None:
        """The grammar this request decodes under: its tools' (when constrained), else its
        `response_format`'s, else None."""
        fmt = self.call_format(chat)
        if fmt is None or chat.tools is None:
            return chat.grammar
        return tool_grammar(fmt, chat.tools, self._added.__contains__)

    def call_format(self, chat: ChatRequest) -> ToolFormat | None:
        """The call syntax the answer decodes under (its tools constrain it), else None."""
        constrained = chat.tools is not None and chat.tools.constrained
        return self.tool_format if constrained else None

    def _grid(self, index: int, item: Media) -> Grid:
        if isinstance(item, DecodedAudio):
            try:
                return self.model.audio_grid(len(item.samples), item.rate)
            except ValueError as exc:
                raise UnsupportedImage(
                    index, f"the audio ({item.seconds:.2f} s) cannot be processed: {exc}", "audio"
                ) from None
        what = "video frames" if isinstance(item, DecodedVideo) else "image"
        try:
            if isinstance(item, DecodedVideo):
                grid = self.model.video_grid(item.num_frames, item.width, item.height)
                return self.model.video_layout(grid, item.times)
            return self.model.image_grid(item.width, item.height)
        except ValueError as exc:
            size = f"{item.width}x{item.height} pixels"
            if "aspect ratio" in str(exc):  # Qwen-VL's processor: at most 200:1
                reason = f"the {what} are {size}" if what != "image" else f"the image is {size}"
                reason += "; this model takes images and video frames up to 200:1"
                raise UnsupportedImage(index, f"{reason}: crop or pad it") from None
            raise UnsupportedImage(
                index, f"the {what} ({size}) cannot be processed: {exc}"
            ) from None

    def build(
        self, chat: ChatRequest, media: Sequence[Media], request_id: str, arrival: float
    ) -> EngineRequest:
        prompt, layouts, grids, thinking, template_vars = self._layout(chat, media)
        # One entry per layout: (media index, temporal block of a Qwen3-VL video or None).
        owners: list[tuple[int, int | None]] = []
        for index, grid in enumerate(grids):
            if isinstance(grid, VideoLayout) and grid.stamps is not None:
                owners.extend((index, b) for b in range(grid.blocks))
            else:
                owners.append((index, None))
        hashes = [scoped_hash(_block_hash(media[i], b), chat.cache_scope) for i, b in owners]
        inputs = []
        for layout, (index, block), content_hash in zip(layouts, owners, hashes, strict=True):
            item, grid = media[index], grids[index]
            if isinstance(item, DecodedImage):
                source, grid_thw = item.image, grid
            elif isinstance(item, DecodedAudio):
                source, grid_thw = AudioClip(item.samples, item.rate), grid
            else:
                assert isinstance(grid, VideoLayout)
                source = self.model.video_clip(item.frames, item.times, grid.grid, block)
                t, h, w = grid.grid
                grid_thw = (t, h, w) if block is None else (1, h, w)
            inputs.append(
                ImageInput(
                    content_hash=content_hash,
                    layout=layout,
                    grid_thw=grid_thw,  # type: ignore[arg-type]
                    image=source,
                )
            )
        return EngineRequest(
            request_id=request_id,
            prompt_ids=tuple(prompt),
            images=tuple(inputs),
            sampling=self._sampling(chat, len(prompt), thinking),
            arrival_time=arrival,
            cache_scope=chat.cache_scope,
            template_vars=template_vars,
        )

    def _sampling(
        self, chat: ChatRequest, prompt_len: int, thinking: ThinkingParams | None
    ) -> SamplingParams:
        # `prompt_len` is the count usage reports (the engine's prompt_tokens): one number.
        room = self._max_context - prompt_len
        if room < 1:
            raise invalid(
                f"the prompt is {prompt_len} tokens (images, tools and the chat template "
                f"included) and this server's context is {self._max_context} tokens (prompt + "
                "answer), which leaves no room for an answer; shorten the conversation, send "
                "smaller or fewer images, or start the server with a larger --max-context",
                "prompt" if chat.raw_prompt is not None else "messages",
                "context_length_exceeded",
            )
        grammar = self.tool_grammar(chat)
        if grammar is not None and chat.min_tokens:
            # A grammar may allow nothing but the end token; masking it would leave no token.
            raise invalid(
                "`min_tokens` cannot be combined with structured output or tools; omit it",
                "min_tokens",
            )
        # Agents send max_tokens as a ceiling (Claude Code: 32000 on every request): more than
        # the room left is capped to it, and the answer ends with the length reason there.
        max_tokens = min(chat.max_tokens or self._default_max_tokens, room)
        calls = self.call_format(chat)
        # Stop strings end only the text before the first call: a call is never cut into
        # invalid JSON.
        stop_until = (calls.open or calls.head) if calls is not None else None
        if chat.min_tokens > max_tokens:  # asks for more tokens than the answer may have
            raise invalid(
                f"`min_tokens` ({chat.min_tokens}) exceeds "
                + self._answer_limit(chat, max_tokens, prompt_len),
                "min_tokens",
            )
        return SamplingParams(
            max_tokens=max_tokens,
            temperature=chat.temperature,
            top_p=chat.top_p,
            top_k=chat.top_k,
            seed=chat.seed,
            stop=chat.stop,
            stop_until=stop_until,
            logprobs=chat.logprobs,
            top_logprobs=chat.top_logprobs,
            ignore_eos=chat.ignore_eos,
            grammar=grammar,
            grammar_field="tools" if calls is not None else chat.grammar_field,
            presence_penalty=chat.presence_penalty,
            frequency_penalty=chat.frequency_penalty,
            repetition_penalty=chat.repetition_penalty,
            logit_bias=self._logit_bias(chat),
            min_tokens=chat.min_tokens,
            n=chat.n,
            thinking=thinking,
        )

    def _answer_limit(self, chat: ChatRequest, max_tokens: int, prompt_len: int) -> str:
        """What limits the answer to `max_tokens`, in words: the room the prompt leaves in
        the context, else max_tokens (the request's or the server's default)."""
        if max_tokens < (chat.max_tokens or self._default_max_tokens):
            return (
                f"the {max_tokens} tokens the prompt ({prompt_len} tokens) leaves in this "
                f"server's context of {self._max_context}"
            )
        if chat.max_tokens is None:
            return f"the server's default max_tokens ({max_tokens}); send a larger max_tokens"
        return f"max_tokens ({max_tokens})"

    def _logit_bias(self, chat: ChatRequest) -> tuple[tuple[int, float], ...]:
        """`logit_bias` with every token id inside the tokenizer's vocabulary (else a 400
        naming the key)."""
        vocab = len(self.model.tokenizer)
        for token, _ in chat.logit_bias:
            if not 0 <= token < vocab:
                raise invalid(
                    f"`logit_bias` key {token} is not a token id of this model (0 to {vocab - 1})",
                    f"logit_bias.{token}",
                )
        return chat.logit_bias


def _kind(part: ImagePart | VideoPart | AudioPart) -> str:
    """The medium of a media part (a Responses continuation's held image is an image)."""
    return (
        "video"
        if isinstance(part, VideoPart)
        else "audio"
        if isinstance(part, AudioPart)
        else "image"
    )


def _block_hash(item: Media, block: int | None) -> str:
    """The content hash of one placeholder run: the medium's, or for one temporal block of a
    Qwen3-VL video the clip's hash and the block's index (blocks of one clip never collide)."""
    return item.content_hash if block is None else f"{item.content_hash}#{block}"


def _template_vars(kwargs: dict[str, Any]) -> str:
    """The template variables as `EngineRequest.template_vars` holds them."""
    return json.dumps(kwargs, sort_keys=True) if kwargs else ""
