"""Every documented request field of each API, and what this server does with it.

A field is APPLIED (it changes the answer as the API documents), INFORMATIONAL (accepted; it
has no effect on the answer here: an end-user id, metadata, a cache hint the server's
automatic caches make moot, a latency or style hint the served model has no control for) or
REFUSED (ignoring it would change what the client gets and the server cannot honour it: a
400 naming the field whenever it is present with anything but its neutral value). Nothing a
client sends is accepted and silently ignored. `tests/gateway/api/test_accepted.py` walks
these tables against the real parsers, and docs/api.md lists them.

The thinking fields (OpenAI's `reasoning_effort` and `chat_template_kwargs`, Anthropic's
`thinking`, Responses' `reasoning`) are applied by their own parser (gateway/api/
thinking_fields.py; docs/api.md, "Thinking"). OTHER remains for a field whose parser lives
elsewhere and is walked by that parser's own tests. Unknown fields: the
parsers ignore them (clients send extras, as vLLM allows) and name them back in an
`x-ignored-fields` response header. Pure data and pure checks.
"""

from __future__ import annotations

from typing import Any

from gateway.api.fields import printable
from gateway.errors import invalid

APPLIED = "applied"
INFORMATIONAL = "informational"
REFUSED = "refused"
OTHER = "other"

# Values that mean "not asked for": a refused field sent with one of them is fine.
_NEUTRAL: tuple[Any, ...] = (None, False, {}, [], "")

OPENAI_CHAT: dict[str, tuple[str, str]] = {
    "model": (APPLIED, "the served model's name (404 for another)"),
    "messages": (
        APPLIED,
        "text, image_url, video_url, input_audio, audio_url parts; tool calls and results",
    ),
    "max_completion_tokens": (APPLIED, "the most tokens to generate"),
    "max_tokens": (APPLIED, "the same (the older name)"),
    "temperature": (APPLIED, "0 to 2; 0 is greedy"),
    "top_p": (APPLIED, "nucleus cut, (0, 1]"),
    "seed": (APPLIED, "a row's draws are a function of (seed, draw): batch-independent"),
    "stop": (APPLIED, "up to 16 stop strings"),
    "n": (APPLIED, "1 to --max-batch choices from one prefill"),
    "logprobs": (APPLIED, "the chosen token's log-probability"),
    "top_logprobs": (APPLIED, "0 to 20 alternatives"),
    "presence_penalty": (APPLIED, "-2 to 2, minus p for each token already in the output"),
    "frequency_penalty": (APPLIED, "-2 to 2, minus f x the token's count in the output"),
    "logit_bias": (APPLIED, "token id -> bias in [-100, 100], added to the logits"),
    "stream": (APPLIED, "server-sent events"),
    "stream_options": (APPLIED, "include_usage: a final usage chunk"),
    "response_format": (APPLIED, "json_object / json_schema, enforced by a grammar"),
    "tools": (APPLIED, "function tools, calls parsed from the output"),
    "tool_choice": (APPLIED, "none / auto / required / a named function"),
    "parallel_tool_calls": (APPLIED, "false: at most one call"),
    # vLLM's extensions (extra_body)
    "top_k": (APPLIED, "vLLM: keep the k most likely tokens"),
    "repetition_penalty": (APPLIED, "vLLM: (0, 10], 1 off; prompt and output tokens"),
    "min_tokens": (APPLIED, "vLLM: no end-of-sequence token or stop string before this many"),
    "ignore_eos": (APPLIED, "vLLM: generate max_tokens tokens"),
    "cache_salt": (APPLIED, "vLLM: scopes cache reuse"),
    "keep_alive": (APPLIED, "Ollama: how long the model stays loaded after the request"),
    "user": (INFORMATIONAL, "an end-user id; no effect on the answer"),
    "safety_identifier": (INFORMATIONAL, "an end-user id; no effect on the answer"),
    "metadata": (INFORMATIONAL, "stored nowhere; no effect on the answer"),
    "store": (INFORMATIONAL, "completions are not stored; no effect on the answer"),
    "service_tier": (INFORMATIONAL, "one tier; no effect on the answer"),
    "prompt_cache_key": (INFORMATIONAL, "prompt caching is automatic (docs/caching.md)"),
    "prompt_cache_retention": (INFORMATIONAL, "prompt caching is automatic"),
    "prompt_cache_options": (INFORMATIONAL, "prompt caching is automatic"),
    "prediction": (INFORMATIONAL, "predicted outputs only shorten the wait, never the answer"),
    "verbosity": (
        INFORMATIONAL,
        "a style hint the served model has no control for; the answer is the model's own length",
    ),
    "audio": (REFUSED, "audio output (ignored, the client would get no audio it asked for)"),
    "modalities": (REFUSED, "output modalities other than text (audio cannot be produced)"),
    "web_search_options": (REFUSED, "web search (the answer would lack the search it asked for)"),
    "moderation": (REFUSED, "moderation (blocking or scoring the answer is not done here)"),
    "functions": (REFUSED, "the deprecated `functions` (use `tools`)"),
    "function_call": (REFUSED, "the deprecated `function_call` (use `tool_choice`)"),
    # vLLM sampling extensions this server does not implement: each changes the answer
    "best_of": (REFUSED, "best_of"),
    "use_beam_search": (REFUSED, "beam search"),
    "length_penalty": (REFUSED, "length_penalty (beam search)"),
    "min_p": (REFUSED, "min_p"),
    "stop_token_ids": (REFUSED, "stop_token_ids"),
    "prompt_logprobs": (REFUSED, "prompt_logprobs (the prompt's log-probabilities)"),
    "reasoning_effort": (APPLIED, "none: thinking off; any other effort: on (docs/api.md)"),
    "chat_template_kwargs": (APPLIED, "vLLM: chat template variables, e.g. enable_thinking"),
}

# Values of a refused OpenAI field that ask for nothing beyond what is served.
_OPENAI_NEUTRAL = {"modalities": (["text"],)}

ANTHROPIC_MESSAGES: dict[str, tuple[str, str]] = {
    "model": (APPLIED, "the served model's name"),
    "messages": (APPLIED, "text, image, tool, thinking blocks; system turns; an assistant prefill"),
    "system": (APPLIED, "a string or text blocks"),
    "max_tokens": (APPLIED, "required: the most tokens to generate"),
    "temperature": (APPLIED, "0 to 1; 0 is greedy"),
    "top_p": (APPLIED, "nucleus cut"),
    "top_k": (APPLIED, "keep the k most likely tokens"),
    "stop_sequences": (APPLIED, "up to 16 stop strings"),
    "stream": (APPLIED, "server-sent events"),
    "tools": (APPLIED, "client tools; server tools are dropped and named in x-ignored-fields"),
    "tool_choice": (APPLIED, "auto / any / tool / none"),
    "cache_salt": (APPLIED, "vLLM: scopes cache reuse"),
    "keep_alive": (APPLIED, "Ollama: how long the model stays loaded after the request"),
    "context_management": (APPLIED, "clear_thinking / clear_tool_uses edits (docs/api.md)"),
    "output_config": (APPLIED, "effort: thinking on where the model thinks; format: a grammar"),
    "output_format": (APPLIED, "the deprecated name of output_config.format"),
    "metadata": (INFORMATIONAL, "user_id; no effect on the answer"),
    "service_tier": (INFORMATIONAL, "one tier; no effect on the answer"),
    "cache_control": (INFORMATIONAL, "prompt caching is automatic (docs/caching.md)"),
    "speed": (INFORMATIONAL, "one speed; no effect on the answer"),
    "inference_geo": (INFORMATIONAL, "where it runs; no effect on the answer"),
    "diagnostics": (INFORMATIONAL, "no cache-miss report; no effect on the answer"),
    "user_profile_id": (INFORMATIONAL, "attribution; no effect on the answer"),
    "workspace_id": (INFORMATIONAL, "one workspace; no effect on the answer"),
    "billing_policy": (INFORMATIONAL, "nothing is billed; no effect on the answer"),
    "fallback_credit_token": (INFORMATIONAL, "nothing is billed; no effect on the answer"),
    "fallbacks": (INFORMATIONAL, "one model, which never declines; no effect on the answer"),
    "mcp_servers": (REFUSED, "MCP servers (the model would lack their tools)"),
    "container": (REFUSED, "code execution containers"),
    "compaction": (REFUSED, "compaction requests (the answer would be no summary)"),
    "thread": (REFUSED, "server-held threads (send the whole conversation)"),
    "thinking": (APPLIED, "enabled (budget_tokens) / disabled / adaptive; display omitted"),
}

RESPONSES: dict[str, tuple[str, str]] = {
    "model": (APPLIED, "the served model's name"),
    "input": (
        APPLIED,
        "text, input_image, input_audio, function/custom tool call and output, reasoning items",
    ),
    "instructions": (APPLIED, "a system message"),
    "previous_response_id": (APPLIED, "continues a stored response"),
    "max_output_tokens": (APPLIED, "the most tokens to generate"),
    "temperature": (APPLIED, "0 to 2; 0 is greedy"),
    "top_p": (APPLIED, "nucleus cut"),
    "seed": (APPLIED, "batch-independent draws"),
    "top_logprobs": (APPLIED, "0 to 20 alternatives"),
    "include": (
        APPLIED,
        "message.output_text.logprobs, reasoning.encrypted_content; built-in tools' outputs: "
        "none made (x-ignored-fields)",
    ),
    "text": (APPLIED, "format: text / json_object / json_schema; verbosity: a hint, ignored"),
    "tools": (
        APPLIED,
        "function, namespace and custom (text) tools; built-in tools left out (x-ignored-fields)",
    ),
    "tool_choice": (APPLIED, "none / auto / required / a named function"),
    "parallel_tool_calls": (APPLIED, "false: at most one call"),
    "stream": (APPLIED, "server-sent events"),
    "store": (APPLIED, "false: not kept for previous_response_id"),
    "truncation": (APPLIED, "disabled / auto"),
    "metadata": (APPLIED, "echoed in the response object"),
    "cache_salt": (APPLIED, "vLLM: scopes cache reuse"),
    "keep_alive": (APPLIED, "Ollama: how long the model stays loaded after the request"),
    "user": (INFORMATIONAL, "an end-user id; no effect on the answer"),
    "safety_identifier": (INFORMATIONAL, "an end-user id; no effect on the answer"),
    "service_tier": (INFORMATIONAL, "one tier; no effect on the answer"),
    "stream_options": (INFORMATIONAL, "include_obfuscation: events carry no padding"),
    "prompt_cache_key": (
        INFORMATIONAL,
        "a routing hint: prompt caching is automatic, a conversation keeps its replica",
    ),
    "client_metadata": (INFORMATIONAL, "Codex's bookkeeping (session, turn ids); no effect"),
    "max_tool_calls": (INFORMATIONAL, "caps built-in tool calls; this server runs none"),
    "context_management": (
        INFORMATIONAL,
        "compaction: the model reads the whole conversation (too long for the context: a 400)",
    ),
    "prompt_cache_retention": (INFORMATIONAL, "prompt caching is automatic"),
    "prompt_cache_options": (INFORMATIONAL, "prompt caching is automatic"),
    "background": (REFUSED, "background responses"),
    "background_options": (REFUSED, "background responses"),
    "conversation": (REFUSED, "the Conversations API (use `previous_response_id`)"),
    "prompt": (REFUSED, "stored prompt templates"),
    "moderation": (REFUSED, "moderation"),
    "image": (REFUSED, "image generation options"),
    "access_programs": (REFUSED, "access programs"),
    "reasoning": (
        APPLIED,
        "effort: thinking on / off (none); summary: the thinking as a summary part, on a "
        "model that thinks (none on one that does not)",
    ),
}


# The legacy Completions API shares the chat's sampling fields and their meaning.
_SHARED_WITH_CHAT = (
    "model", "temperature", "top_p", "seed", "stop", "presence_penalty", "frequency_penalty",
    "logit_bias", "stream", "stream_options", "top_k", "repetition_penalty", "min_tokens",
    "ignore_eos", "cache_salt", "keep_alive", "user", "use_beam_search", "length_penalty",
    "min_p", "stop_token_ids", "prompt_logprobs",
)  # fmt: skip
OPENAI_COMPLETIONS: dict[str, tuple[str, str]] = {
    **{name: OPENAI_CHAT[name] for name in _SHARED_WITH_CHAT},
    "prompt": (APPLIED, "text or token ids; a list of them: one set of choices each"),
    "max_tokens": (APPLIED, "the most tokens to generate (default 16, as OpenAI's)"),
    "n": (APPLIED, "1 to --max-batch choices per prompt from one prefill"),
    "best_of": (INFORMATIONAL, "equal to n: no effect (another value is a 400)"),
    "logprobs": (APPLIED, "0 to 20: the chosen token's log-probability and alternatives"),
    "echo": (APPLIED, "the prompt's text before the completion (without logprobs)"),
    "suffix": (REFUSED, "suffix (fill in the middle)"),
    "response_format": (REFUSED, "response_format on completions (use /v1/chat/completions)"),
    "guided_json": (REFUSED, "guided decoding on completions (use chat's response_format)"),
}

OPENAI_EMBEDDINGS: dict[str, tuple[str, str]] = {
    "model": (APPLIED, "an embedding model's served name (400 for a chat model)"),
    "input": (APPLIED, "strings, token ids, image parts (docs/api.md)"),
    "dimensions": (APPLIED, "the first n dimensions, renormalized (Matryoshka models)"),
    "encoding_format": (APPLIED, "float or base64"),
    "user": (INFORMATIONAL, "an end-user id"),
    "cache_salt": (APPLIED, "vLLM's: scopes the caches"),
    "keep_alive": (APPLIED, "Ollama's: how long the model stays loaded"),
}

RERANK: dict[str, tuple[str, str]] = {
    "model": (APPLIED, "a reranker's served name (400 for another model)"),
    "query": (APPLIED, "the query text"),
    "documents": (APPLIED, "strings or {text} objects"),
    "top_n": (APPLIED, "the best n results"),
    "return_documents": (APPLIED, "each result's document"),
    "instruction": (APPLIED, "mlx-vlm's: the task's wording"),
    "cache_salt": (APPLIED, "vLLM's: scopes the caches"),
    "keep_alive": (APPLIED, "Ollama's: how long the model stays loaded"),
    "max_tokens_per_doc": (REFUSED, "truncating documents (an over-long one is a 400)"),
    "max_chunks_per_doc": (REFUSED, "chunking documents"),
    "rank_fields": (REFUSED, "ranking by fields of structured documents"),
}


def refuse_unapplied(body: dict[str, Any], table: dict[str, tuple[str, str]]) -> None:
    """A 400 naming the first REFUSED field of `table` that `body` sends with a value that
    asks for something."""
    for name, value in body.items():
        kind, what = table.get(name, (None, ""))
        if kind != REFUSED or _neutral(name, value):
            continue
        raise invalid(f"`{name}`: {what} is not supported by this server; omit it", name)


def unknown_fields(body: dict[str, Any], table: dict[str, tuple[str, str]]) -> tuple[str, ...]:
    """The fields of `body` that `table` does not list (sorted, at most 16, each cut to 64
    characters, printable ASCII): the OpenAI-style parsers ignore them, and the response names
    them in an `x-ignored-fields` header, so a typo (`max_token`) does not pass unseen."""
    names = sorted(printable(str(k), 64) for k in body if k not in table)
    return tuple(names[:16])


def _neutral(name: str, value: Any) -> bool:
    if any(value is v or (type(value) is type(v) and value == v) for v in _NEUTRAL):
        return True
    return value in _OPENAI_NEUTRAL.get(name, ())
