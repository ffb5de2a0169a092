"""The OpenAI Responses API's request body -> a typed `ResponsesRequest` (pure).

    input: "text" | [ {role, content: "text" | [input_text | input_image | output_text]}
                     | {type: function_call, call_id, name, arguments}
                     | {type: function_call_output, call_id, output: "text" | [input_text |
                        input_image]}
                     | {type: reasoning, content | summary: [{text}]} (earlier thinking) ]

`instructions` become a system message of this turn only (OpenAI does not carry them over
a `previous_response_id`). `text.format` maps onto the structured output of Chat
Completions' `response_format`. Function tools are parsed by `gateway.api.responses.tools`;
built-in tools, files and the features this server does not have are refused with a 400 that
names the field, never silently ignored.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

from gateway.api import fields
from gateway.api.accepted import RESPONSES, refuse_unapplied, unknown_fields
from gateway.api.responses.tools import (
    function_call,
    output_call_id,
    parse_tools,
    tool_message,
    with_calls,
)
from gateway.api.thinking_fields import responses_reasoning
from gateway.errors import APIError, invalid
from gateway.frontend.chat import ChatMessage, ImagePart, TextPart
from gateway.structured.response_format import response_format_grammar
from gateway.tools.spec import ToolSet

ROLES = ("system", "developer", "user", "assistant")
MAX_TOP_LOGPROBS = 20
LOGPROBS_INCLUDE = "message.output_text.logprobs"
MAX_METADATA = 16


@dataclass(frozen=True)
class ResponsesRequest:
    """One `POST /v1/responses`: the new turn's messages (`input`) and the settings; the
    conversation before it is found through `previous_response_id` by the route."""

    model: str
    input: tuple[ChatMessage, ...]
    instructions: str | None
    previous_response_id: str | None
    max_output_tokens: int | None
    temperature: float
    top_p: float
    seed: int | None
    logprobs: bool
    top_logprobs: int
    stream: bool
    store: bool
    grammar: str | None
    text_format: dict[str, Any]
    metadata: dict[str, str]
    truncation: str
    cache_salt: str = ""
    tools: ToolSet | None = None
    tools_echo: tuple[dict[str, Any], ...] = ()  # `tools` as the response body repeats them
    tool_choice_echo: Any = "auto"
    # The `call_id` field path of each function_call_output of `input`, in order (for the
    # 400 when it answers no call; checked once the stored conversation is known).
    output_params: tuple[str, ...] = ()
    # `reasoning`: the thinking switch (`effort`: "none" off, else on; None: the template's
    # default) and the `summary` asked for (None: none); echoed in the body.
    thinking: bool | None = None
    reasoning_summary: str | None = None
    ignored_fields: tuple[str, ...] = ()  # fields no table lists (gateway.api.accepted)


def parse_responses_request(body: Any) -> ResponsesRequest:
    """Validate a decoded JSON body (unknown fields are ignored, as in `parse_chat_request`)."""
    if not isinstance(body, dict):
        raise invalid("the request body must be a JSON object")
    model = body.get("model")
    if not isinstance(model, str) or not model:
        raise invalid("`model` is required and must be a string", "model")
    _refuse_unsupported(body)
    refuse_unapplied(body, RESPONSES)
    instructions = body.get("instructions")
    if instructions is not None and not isinstance(instructions, str):
        raise invalid("`instructions` must be a string", "instructions")
    previous = body.get("previous_response_id")
    if previous is not None and (not isinstance(previous, str) or not previous):
        raise invalid("`previous_response_id` must be a response id string", "previous_response_id")
    top_p = fields.opt_num(body, "top_p", 0.0, 1.0, default=1.0)
    if top_p == 0.0:
        raise invalid("`top_p` must be greater than 0 (use temperature 0 for greedy)", "top_p")
    include = body.get("include") or []
    if not isinstance(include, list) or not all(isinstance(i, str) for i in include):
        raise invalid("`include` must be an array of strings", "include")
    for item in include:
        if item != LOGPROBS_INCLUDE:
            raise invalid(
                f"`include` value {item!r} is not supported; this server can include only "
                f"{LOGPROBS_INCLUDE!r}",
                "include",
            )
    top_logprobs = fields.opt_int(body, "top_logprobs", 0, MAX_TOP_LOGPROBS) or 0
    seed = fields.opt_int(body, "seed", -(2**63), 2**64 - 1)
    text_format, grammar = _text_format(body.get("text"))
    tools, tools_echo = parse_tools(body)
    messages, output_params = _input(body.get("input"))
    thinking, summary = responses_reasoning(body)
    truncation = body.get("truncation") or "disabled"
    if truncation not in ("disabled", "auto"):
        raise invalid("`truncation` must be 'disabled' or 'auto'", "truncation")
    return ResponsesRequest(
        ignored_fields=unknown_fields(body, RESPONSES),
        model=model,
        input=messages,
        instructions=fields.text(instructions, "instructions") if instructions else None,
        previous_response_id=previous,
        max_output_tokens=fields.opt_int(body, "max_output_tokens", 1, 1_000_000),
        temperature=fields.opt_num(body, "temperature", 0.0, 2.0, default=1.0),
        top_p=top_p,
        seed=None if seed is None else seed % (2**63),
        logprobs=LOGPROBS_INCLUDE in include or top_logprobs > 0,
        top_logprobs=top_logprobs,
        stream=fields.opt_bool(body, "stream", False),
        store=fields.opt_bool(body, "store", True),
        grammar=grammar,
        text_format=text_format,
        metadata=_metadata(body.get("metadata")),
        truncation=truncation,
        cache_salt=fields.cache_salt(body),
        tools=tools,
        tools_echo=tuple(tools_echo),
        tool_choice_echo=body.get("tool_choice") or ("auto" if tools else "none"),
        output_params=output_params,
        thinking=thinking,
        reasoning_summary=summary,
    )


def _input(raw: Any) -> tuple[tuple[ChatMessage, ...], tuple[str, ...]]:
    """The input's messages (function calls joined to the assistant message they follow)
    and the field paths of its function_call_outputs' `call_id`s."""
    if isinstance(raw, str):
        return (ChatMessage("user", (TextPart(fields.text(raw, "input")),)),), ()
    if not isinstance(raw, list) or not raw:
        raise invalid("`input` must be a string or a non-empty array of message items", "input")
    messages: list[ChatMessage] = []
    params: list[str] = []
    for i, item in enumerate(raw):
        where = f"input[{i}]"
        kind = item.get("type", "message") if isinstance(item, dict) else None
        if kind == "function_call":
            with_calls(messages, function_call(item, where))
        elif kind == "reasoning":  # earlier thinking: the assistant turn after it owns it
            messages.append(ChatMessage("assistant", (), reasoning=_reasoning_item(item, where)))
        elif kind == "function_call_output":
            call_id = output_call_id(item, where)
            parts = _content(item.get("output"), f"{where}.output", "tool")
            messages.append(tool_message(call_id, parts))
            params.append(f"{where}.call_id")
        else:
            message = _item(item, where)
            last = messages[-1] if messages else None
            if last and message.role == "assistant" and last.role == "assistant" and not last.parts:
                message = replace(message, reasoning=last.reasoning, tool_calls=last.tool_calls)
                messages.pop()
            messages.append(message)
    for i, message in enumerate(messages):
        if message.role == "assistant" and not message.parts:  # thinking without a turn after it
            messages[i] = replace(message, parts=(TextPart(""),))
    return tuple(messages), tuple(params)


def _reasoning_item(item: dict[str, Any], where: str) -> str:
    """A `reasoning` input item's text: its `content` (reasoning_text parts), else its
    `summary` (summary_text parts); `encrypted_content` is not readable here and dropped."""
    for key in ("content", "summary"):
        parts = item.get(key) or []
        if not isinstance(parts, list):
            raise invalid(f"`{where}.{key}` must be an array", f"{where}.{key}")
        texts = []
        for j, part in enumerate(parts):
            text = part.get("text") if isinstance(part, dict) else None
            if not isinstance(text, str):
                raise invalid(f"`{where}.{key}[{j}].text` must be a string", f"{where}.{key}[{j}]")
            texts.append(fields.text(text, f"{where}.{key}[{j}].text"))
        if texts:
            return "\n\n".join(texts)
    return ""


def _item(item: Any, where: str) -> ChatMessage:
    if not isinstance(item, dict):
        raise invalid(f"`{where}` must be a message object with `role` and `content`", where)
    kind = item.get("type", "message")
    if kind != "message":
        raise invalid(
            f"`{where}.type` {kind!r}: this server accepts message, function_call, "
            "function_call_output and reasoning items (continue a conversation with "
            "`previous_response_id`)",
            f"{where}.type",
        )
    role = item.get("role")
    if role not in ROLES:
        raise invalid(f"`{where}.role` must be one of {', '.join(ROLES)}", f"{where}.role")
    role = "system" if role == "developer" else role
    return ChatMessage(role, _content(item.get("content"), f"{where}.content", role))


def _content(content: Any, where: str, role: str) -> tuple[TextPart | ImagePart, ...]:
    if isinstance(content, str):
        return (TextPart(fields.text(content, where)),)
    if not isinstance(content, list) or not content:
        raise invalid(f"`{where}` must be a string or an array of parts", where)
    return tuple(_part(p, f"{where}[{j}]", role) for j, p in enumerate(content))


def _part(part: Any, at: str, role: str) -> TextPart | ImagePart:
    kind = part.get("type") if isinstance(part, dict) else None
    if kind in ("input_text", "output_text", "text"):
        if not isinstance(part.get("text"), str):
            raise invalid(f"`{at}.text` must be a string", f"{at}.text")
        return TextPart(fields.text(part["text"], f"{at}.text"))
    if kind == "input_image":
        if role not in ("user", "tool"):  # a tool's output: the agent's screenshot
            raise invalid(
                f"`{at}`: images are only accepted in user messages and function call outputs",
                at,
            )
        if part.get("file_id") is not None:
            raise invalid(
                f"`{at}.file_id`: this server has no Files API; send the image as "
                "`image_url` (an http(s) URL or a data:image/... URI)",
                f"{at}.file_id",
            )
        url = part.get("image_url")
        if not isinstance(url, str) or not url:
            raise invalid(
                f"`{at}.image_url` must be a string: an http(s) URL, a data:image/... URI "
                "or a file path",
                f"{at}.image_url",
            )
        return ImagePart(url, f"{at}.image_url")
    if kind == "input_file":
        raise invalid(f"`{at}`: file inputs are not supported; send text or images", at)
    raise invalid(f"`{at}.type` must be 'input_text', 'input_image' or 'output_text'", at)


def _refuse_unsupported(body: dict[str, Any]) -> None:
    for name, why in (
        ("background", "background responses"),
        ("conversation", "the Conversations API (use `previous_response_id`)"),
        ("prompt", "stored prompt templates"),
    ):
        if body.get(name) not in (None, False, {}):
            raise invalid(f"`{name}`: {why} are not supported by this server; omit it", name)


def _text_format(raw: Any) -> tuple[dict[str, Any], str | None]:
    """`text.format` (flat: {type, name, schema, strict}) -> (echo, grammar)."""
    if raw is None:
        return {"type": "text"}, None
    if not isinstance(raw, dict):
        raise invalid('`text` must be an object such as {"format": {"type": "text"}}', "text")
    fmt = raw.get("format")
    if fmt is None:
        return {"type": "text"}, None
    if not isinstance(fmt, dict):
        raise invalid("`text.format` must be an object with `type`", "text.format")
    if fmt.get("type") == "json_schema":
        spec = {k: fmt[k] for k in ("name", "schema", "strict", "description") if k in fmt}
        chat_format: dict[str, Any] = {"type": "json_schema", "json_schema": spec}
    else:
        chat_format = fmt
    try:
        return fmt, response_format_grammar(chat_format)
    except APIError as error:  # name the Responses field, not Chat Completions'
        error.message = _rename(error.message)
        error.param = _rename(error.param) if error.param else "text.format"
        raise


def _rename(text: str) -> str:
    return text.replace("response_format.json_schema", "text.format").replace(
        "response_format", "text.format"
    )


def _metadata(raw: Any) -> dict[str, str]:
    if raw is None:
        return {}
    if (
        not isinstance(raw, dict)
        or len(raw) > MAX_METADATA
        or not all(isinstance(k, str) and isinstance(v, str) for k, v in raw.items())
    ):
        raise invalid(
            f"`metadata` must be an object of at most {MAX_METADATA} string values", "metadata"
        )
    return dict(raw)
