"""End to end: the Python frameworks people build agents with, unmodified, against one gateway
on the tiny Qwen2-VL: the openai-agents SDK (Chat Completions and Responses models),
pydantic-ai, LangChain's ChatOpenAI, LiteLLM and instructor — each one's basic chat,
streaming, a tool round trip and structured output (and, for LangChain, an image message).

The server's engine is a `ScriptedEngine` (tests/clients/scripted_engine.py): a prompt that
offers the `get_weather` tool gets a scripted call of it, and the turn after its result a
scripted sentence, so each framework's own agent loop runs a real round trip; every other
request (chat, streaming, structured output, the image) is answered by the random-weight
model. Its text is noise, so what is pinned is what the framework hands its user: the tool
ran with the arguments the model sent, the loop ended on the model's final text, streamed
text equals the text of the stream's chunks, structured output validates as the user's
pydantic model.
"""

from __future__ import annotations

import asyncio
import json
import os
from collections.abc import Iterator

import pytest
from clients.agent_cli import scripted_server
from pydantic import BaseModel, ConfigDict, Field
from support import data_uri, noise_png, tiny_model

from bench.server import LocalServer

FINAL = "It is sunny in Paris."
CALL = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'
RULES = [
    {"prompt_contains": '"name": "get_weather"', "last_turn_lacks": "<tool_response>",
     "answer": CALL},
    {"prompt_contains": '"name": "get_weather"', "last_turn_contains": "<tool_response>",
     "answer": FINAL},
]  # fmt: skip

# No framework phones home from a test: tracing exports and remote price lists off.
os.environ.setdefault("OPENAI_AGENTS_DISABLE_TRACING", "1")
os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")


class Weather(BaseModel):
    # extra="forbid": additionalProperties false, else a random model may add keys forever
    model_config = ConfigDict(extra="forbid")

    city: str = Field(max_length=12)
    sunny: bool


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalServer]:
    args = ["--model", str(tiny_model("qwen2_vl")), "--served-model-name", "test", "--no-warmup"]
    with scripted_server(RULES, tmp_path_factory.mktemp("script"), *args) as proc:
        yield proc


# ----- openai-agents ------------------------------------------------------------------------


@pytest.mark.parametrize("api", ["chat", "responses"])
def test_openai_agents_tool_loop_ends_on_the_models_text(server: LocalServer, api: str) -> None:
    """Invariant: the agents SDK's Runner calls the tool with the model's arguments, sends the
    result back, and ends on the model's final text, over either API."""
    from agents import (
        Agent,
        OpenAIChatCompletionsModel,
        OpenAIResponsesModel,
        Runner,
        function_tool,
    )
    from openai import AsyncOpenAI

    calls: list[str] = []

    @function_tool
    def get_weather(city: str) -> str:
        """The weather in a city."""
        calls.append(city)
        return "sunny"

    client = AsyncOpenAI(base_url=server.base_url + "/v1", api_key="x", max_retries=0)
    kind = OpenAIChatCompletionsModel if api == "chat" else OpenAIResponsesModel
    agent = Agent(
        name="weather", instructions="Answer briefly.", tools=[get_weather],
        model=kind(model="test", openai_client=client),
    )  # fmt: skip
    result = Runner.run_sync(agent, "What is the weather in Paris?", max_turns=4)
    assert calls == ["Paris"]
    assert result.final_output == FINAL


def test_openai_agents_streams_and_gives_structured_output(server: LocalServer) -> None:
    """Invariant: a streamed run's text deltas add up to its final output; an `output_type`
    agent's answer validates as the pydantic model (the grammar enforces the schema)."""
    from agents import Agent, ModelSettings, OpenAIChatCompletionsModel, Runner
    from openai import AsyncOpenAI
    from openai.types.responses import ResponseTextDeltaEvent

    client = AsyncOpenAI(base_url=server.base_url + "/v1", api_key="x", max_retries=0)
    model = OpenAIChatCompletionsModel(model="test", openai_client=client)
    settings = ModelSettings(max_tokens=12, temperature=0)

    typed = Agent(name="t", model=model, output_type=Weather,
                  model_settings=ModelSettings(max_tokens=64, temperature=0))  # fmt: skip

    async def run() -> tuple[str, str, object]:  # one event loop: the client's connections
        streamed = Runner.run_streamed(Agent(name="a", model=model, model_settings=settings), "Hi")
        deltas = [
            e.data.delta async for e in streamed.stream_events()
            if e.type == "raw_response_event" and isinstance(e.data, ResponseTextDeltaEvent)
        ]  # fmt: skip
        structured = await Runner.run(typed, "Weather in Paris as JSON.")
        return "".join(deltas), streamed.final_output, structured.final_output

    text, final, weather = asyncio.run(run())
    assert text and text == final
    assert isinstance(weather, Weather)


# ----- pydantic-ai --------------------------------------------------------------------------


def _pydantic_model(server: LocalServer):  # noqa: ANN202
    from pydantic_ai.models.openai import OpenAIChatModel
    from pydantic_ai.providers.openai import OpenAIProvider

    provider = OpenAIProvider(base_url=server.base_url + "/v1", api_key="x")
    return OpenAIChatModel("test", provider=provider)


def test_pydantic_ai_tool_loop_and_structured_output(server: LocalServer) -> None:
    """Invariant: pydantic-ai runs the tool the model called and returns the model's final
    text; a typed agent's output (by its output tool, and by native JSON schema output)
    validates as the pydantic model."""
    from pydantic_ai import Agent, NativeOutput

    model = _pydantic_model(server)
    calls: list[str] = []
    agent = Agent(model, instructions="Answer briefly.")

    @agent.tool_plain
    def get_weather(city: str) -> str:
        """The weather in a city."""
        calls.append(city)
        return "sunny"

    assert agent.run_sync("Weather in Paris?").output == FINAL
    assert calls == ["Paris"]
    settings = {"max_tokens": 64, "temperature": 0.0}
    for output in (Weather, NativeOutput(Weather)):
        typed = Agent(model, output_type=output, model_settings=settings)
        assert isinstance(typed.run_sync("Weather in Paris.").output, Weather)


def test_pydantic_ai_streams_text(server: LocalServer) -> None:
    """Invariant: pydantic-ai's streamed text ends as the run's output."""
    from pydantic_ai import Agent

    agent = Agent(_pydantic_model(server), model_settings={"max_tokens": 12, "temperature": 0.0})

    async def stream() -> tuple[list[str], str]:
        async with agent.run_stream("Hi") as run:
            pieces = [text async for text in run.stream_text(delta=True)]
            return pieces, await run.get_output()

    pieces, output = asyncio.run(stream())
    assert pieces and "".join(pieces) == output


# ----- LangChain ----------------------------------------------------------------------------


def _chat_openai(server: LocalServer, **kwargs: object):  # noqa: ANN202
    from langchain_openai import ChatOpenAI

    return ChatOpenAI(
        model="test", base_url=server.base_url + "/v1", api_key="x", max_retries=0, **kwargs
    )


def test_langchain_chat_stream_image_tools_and_structured_output(server: LocalServer) -> None:
    """Invariant: LangChain's ChatOpenAI gets text, a stream whose chunks add up, an answer
    about an image (data URI), the model's tool call as `tool_calls`, and structured output
    as the pydantic model."""
    from langchain_core.messages import HumanMessage, ToolMessage

    llm = _chat_openai(server, max_tokens=12, temperature=0)
    text = llm.invoke("Hi").content
    assert isinstance(text, str) and text
    assert "".join(chunk.content for chunk in llm.stream("Hi")) == text
    question = {"type": "text", "text": "What is in this picture?"}
    picture = {"type": "image_url", "image_url": {"url": data_uri(noise_png(7, 112, 112))}}
    answer = llm.invoke([HumanMessage(content=[question, picture])])
    plain = llm.invoke([HumanMessage(content=[question])])
    # the image's placeholder tokens are in the prompt
    assert answer.content and answer.usage_metadata["input_tokens"] > plain.usage_metadata[
        "input_tokens"
    ] + 8

    def get_weather(city: str) -> str:
        """The weather in a city."""
        return "sunny"

    tooled = _chat_openai(server, max_tokens=64).bind_tools([get_weather])
    asked = HumanMessage(content="Weather in Paris?")
    call = tooled.invoke([asked])
    assert [(c["name"], c["args"]) for c in call.tool_calls] == [("get_weather", {"city": "Paris"})]
    result = ToolMessage(content="sunny", tool_call_id=call.tool_calls[0]["id"])
    assert tooled.invoke([asked, call, result]).content == FINAL
    typed = _chat_openai(server, max_tokens=64, temperature=0).with_structured_output(Weather)
    assert isinstance(typed.invoke("Weather in Paris."), Weather)


# ----- LiteLLM ------------------------------------------------------------------------------


def test_litellm_chat_stream_tools_and_structured_output(server: LocalServer) -> None:
    """Invariant: LiteLLM's OpenAI-compatible provider gets text, a stream whose deltas add
    up, the model's tool call, and structured output (a pydantic `response_format`) that
    validates as the model."""
    import litellm

    common = {"model": "openai/test", "api_base": server.base_url + "/v1", "api_key": "x"}
    hi = [{"role": "user", "content": "Hi"}]
    text = litellm.completion(messages=hi, max_tokens=12, temperature=0, **common)
    content = text.choices[0].message.content
    assert content
    chunks = litellm.completion(messages=hi, max_tokens=12, temperature=0, stream=True, **common)
    assert "".join(c.choices[0].delta.content or "" for c in chunks) == content
    tool = {"type": "function", "function": {
        "name": "get_weather", "description": "The weather in a city.",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                       "required": ["city"]}}}  # fmt: skip
    asked = [{"role": "user", "content": "Weather in Paris?"}]
    call = litellm.completion(messages=asked, tools=[tool], max_tokens=64, **common)
    calls = call.choices[0].message.tool_calls
    assert [(c.function.name, json.loads(c.function.arguments)) for c in calls] == [
        ("get_weather", {"city": "Paris"})
    ]
    typed = litellm.completion(
        messages=[{"role": "user", "content": "Weather in Paris."}], response_format=Weather,
        max_tokens=64, temperature=0, **common,
    )  # fmt: skip
    Weather.model_validate_json(typed.choices[0].message.content)


# ----- instructor ---------------------------------------------------------------------------


@pytest.mark.parametrize("mode", ["TOOLS", "JSON_SCHEMA"])
def test_instructor_returns_the_pydantic_model(server: LocalServer, mode: str) -> None:
    """Invariant: instructor's TOOLS mode (a named tool_choice: exactly one call) and
    JSON_SCHEMA mode (response_format) both give a valid `Weather` at the first try, at
    temperature 1 too."""
    import instructor
    from openai import OpenAI

    raw = OpenAI(base_url=server.base_url + "/v1", api_key="x", max_retries=0)
    client = instructor.from_openai(raw, mode=getattr(instructor.Mode, mode))
    for seed in (3, 5):
        weather = client.chat.completions.create(
            model="test", response_model=Weather, max_retries=0, max_tokens=96, seed=seed,
            temperature=1.0, messages=[{"role": "user", "content": "Weather in Paris."}],
        )  # fmt: skip
        assert isinstance(weather, Weather)
