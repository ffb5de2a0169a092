"""The OpenAI Responses API's request body -> a typed `ResponsesRequest` (pure).

`input` is parsed by gateway.api.responses.input_items, `tools` by gateway.api.responses.
tool_list. `instructions` become a system message of this turn only (OpenAI does not carry
them over a `previous_response_id`). `text.format` maps onto the structured output of Chat
Completions' `response_format`. What the server cannot do and would change the answer is a
400 naming the field (gateway.api.accepted); parts of a field that are left out (built-in
tools, `include` values about built-in tools' output, `text.verbosity`) are named back with
the unknown fields in `x-ignored-fields`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from gateway.api import fields
from gateway.api.accepted import RESPONSES, refuse_unapplied, unknown_fields
from gateway.api.responses.input_items import parse_input
from gateway.api.responses.sealed import ReasoningSeal
from gateway.api.responses.tool_list import ToolNames, parse_tool_list
from gateway.api.thinking_fields import effort_switch, responses_reasoning
from gateway.errors import APIError, invalid
from gateway.frontend.chat import ChatMessage
from gateway.structured.response_format import response_format_grammar
from gateway.tools.spec import ToolSet

MAX_TOP_LOGPROBS = 20
LOGPROBS_INCLUDE = "message.output_text.logprobs"
REASONING_INCLUDE = "reasoning.encrypted_content"
# Output of items this server never makes (built-in tools' calls), and the input images' URLs
# (a response body holds no input items: GET /v1/responses/{id}/input_items takes that value):
# asking for it here changes nothing, and the value is named in x-ignored-fields.
NO_OP_INCLUDES = (
    "file_search_call.results",
    "web_search_call.results",
    "web_search_call.action.sources",
    "message.input_image.image_url",
    "computer_call_output.output.image_url",
    "code_interpreter_call.outputs",
)
VERBOSITY = ("low", "medium", "high")
MAX_METADATA = 16
MAX_IGNORED = 16


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
    keep_alive_s: float | None = None
    tools: ToolSet | None = None
    tools_echo: tuple[dict[str, Any], ...] = ()  # `tools` as the response body repeats them
    tool_choice_echo: Any = "auto"
    tool_names: ToolNames = ToolNames()  # the calls' wire names (namespaced, custom tools)
    # The `call_id` field path of each function_call_output of `input`, in order (for the
    # 400 when it answers no call; checked once the stored conversation is known).
    output_params: tuple[str, ...] = ()
    # `reasoning`: the thinking switch of `effort` ("none" off, else on; None: the
    # template's default, or with a summary thinking where the model thinks: gateway.api.
    # responses.turn) and the `summary` asked for (None: none); echoed in the body.
    thinking: bool | None = None
    reasoning_summary: str | None = None
    encrypted_reasoning: bool = False  # `include: ["reasoning.encrypted_content"]`
    ignored_fields: tuple[str, ...] = ()  # fields and parts left out (x-ignored-fields)


def parse_responses_request(body: Any, seal: ReasoningSeal | None = None) -> ResponsesRequest:
    """Validate a decoded JSON body (unknown fields are ignored, as in `parse_chat_request`);
    `seal` opens the reasoning items' `encrypted_content` (gateway.api.responses.sealed)."""
    if not isinstance(body, dict):
        raise invalid("the request body must be a JSON object")
    model = fields.model_name(body)
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
    include, no_ops = _include(body.get("include"))
    top_logprobs = fields.opt_int(body, "top_logprobs", 0, MAX_TOP_LOGPROBS) or 0
    seed = fields.opt_int(body, "seed", -(2**63), 2**64 - 1)
    text_format, grammar, hints = _text(body.get("text"))
    tools = parse_tool_list(body)
    messages, output_params = parse_input(body.get("input"), seal)
    _, summary = responses_reasoning(body)  # validates `reasoning`
    effort = body["reasoning"].get("effort") if body.get("reasoning") else None
    truncation = body.get("truncation") or "disabled"
    if truncation not in ("disabled", "auto"):
        raise invalid("`truncation` must be 'disabled' or 'auto'", "truncation")
    ignored = (*unknown_fields(body, RESPONSES), *tools.dropped, *no_ops, *hints)
    return ResponsesRequest(
        ignored_fields=ignored[:MAX_IGNORED],
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
        keep_alive_s=fields.keep_alive(body),
        tools=tools.tools,
        tools_echo=tools.echo,
        tool_choice_echo=body.get("tool_choice") or ("auto" if tools.tools else "none"),
        tool_names=tools.names,
        output_params=output_params,
        thinking=effort_switch(effort, "reasoning.effort"),
        reasoning_summary=summary,
        encrypted_reasoning=REASONING_INCLUDE in include,
    )


def _include(raw: Any) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """`include`: its values, and the field paths of those that ask for nothing here."""
    include = raw or []
    if not isinstance(include, list) or not all(isinstance(i, str) for i in include):
        raise invalid("`include` must be an array of strings", "include")
    for j, item in enumerate(include):
        if item not in (LOGPROBS_INCLUDE, REASONING_INCLUDE, *NO_OP_INCLUDES):
            raise invalid(
                f"`include[{j}]` {item!r} is not one of the Responses API's values: "
                f"{LOGPROBS_INCLUDE!r}, {REASONING_INCLUDE!r} or a built-in tool's output",
                f"include[{j}]",
            )
    no_ops = tuple(f"include[{j}]" for j, item in enumerate(include) if item in NO_OP_INCLUDES)
    return tuple(include), no_ops


def _text(raw: Any) -> tuple[dict[str, Any], str | None, tuple[str, ...]]:
    """`text`: its format (echo, grammar), and `text.verbosity` named when sent: a style hint
    the served model has no control for (the answer is the model's own length)."""
    if raw is not None and not isinstance(raw, dict):
        raise invalid('`text` must be an object such as {"format": {"type": "text"}}', "text")
    verbosity = (raw or {}).get("verbosity")
    if verbosity is not None and verbosity not in VERBOSITY:
        raise invalid(f"`text.verbosity` must be one of {', '.join(VERBOSITY)}", "text.verbosity")
    fmt, grammar = _text_format((raw or {}).get("format"))
    return fmt, grammar, ("text.verbosity",) if verbosity is not None else ()


def _refuse_unsupported(body: dict[str, Any]) -> None:
    for name, why in (
        ("background", "background responses"),
        ("conversation", "the Conversations API (use `previous_response_id`)"),
        ("prompt", "stored prompt templates"),
    ):
        if body.get(name) not in (None, False, {}):
            raise invalid(f"`{name}`: {why} are not supported by this server; omit it", name)


def _text_format(fmt: Any) -> tuple[dict[str, Any], str | None]:
    """`text.format` (flat: {type, name, schema, strict}) -> (echo, grammar)."""
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
