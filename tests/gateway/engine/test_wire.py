"""The typed messages around the engine (gateway/engine/wire.py).

Pinned: `answer` dispatches each call type to its engine method with its arguments (no
method names), and refuses anything that is not a call; every message crosses a pickle (the
engine process's pipe, Ray) intact and is immutable.
"""

from __future__ import annotations

import dataclasses
import pickle
import typing
from typing import Any

import pytest

from gateway.engine.embed.request import Embed, EmbedItem
from gateway.engine.request import (
    EngineRequest,
    FinishEvent,
    FinishReason,
    SamplingParams,
    TokenEvent,
    Usage,
)
from gateway.engine.wire import (
    CacheEntries,
    CacheStats,
    Call,
    Cancel,
    ClearCaches,
    Events,
    Invoke,
    LoadFailed,
    MetricsText,
    Ready,
    ReplicaInfo,
    Reply,
    ResetCaches,
    Stop,
    Stopped,
    Submit,
    answer,
)

CALLS: dict[type, tuple[Any, str, tuple[Any, ...]]] = {
    CacheStats: (CacheStats(), "cache_stats", ()),
    CacheEntries: (CacheEntries(3, "vision"), "cache_entries", (3, "vision", None)),
    ClearCaches: (ClearCaches(), "clear_caches", ()),
    ResetCaches: (ResetCaches(), "reset_caches", ()),
    MetricsText: (MetricsText(), "metrics_text", ()),
    Embed: (Embed((EmbedItem(text="x"),)), "embed", (Embed((EmbedItem(text="x"),)),)),
}


class Recorder:
    """An engine that records which method a call reached, with what, and answers its name."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, tuple[Any, ...]]] = []

    def __getattr__(self, name: str) -> Any:
        def method(*args: Any) -> str:
            self.calls.append((name, args))
            return name

        return method


def test_every_call_type_reaches_its_method_with_its_arguments() -> None:
    assert set(typing.get_args(Call)) == set(CALLS)  # a new call type needs a case here
    for call, method, args in CALLS.values():
        engine = Recorder()
        assert answer(engine, call) == method  # type: ignore[arg-type]
        assert engine.calls == [(method, args)]


def test_anything_else_is_refused() -> None:
    """A command that is not a call (or a call's name as a string) reaches no method."""
    for wrong in (Stop(), Cancel("r"), "cache_stats", ("call", 0, "stop", ())):
        engine = Recorder()
        with pytest.raises(TypeError):
            answer(engine, wrong)  # type: ignore[arg-type]
        assert engine.calls == []


def test_messages_cross_a_pickle_intact_and_are_immutable() -> None:
    request = EngineRequest("r", (1, 2), (), SamplingParams(4), 0.0)
    finish = FinishEvent("length", Usage(2, 1, 0))
    events = Events((("r", TokenEvent("x", (7,))), ("r", finish)))
    messages = [
        Submit(request),
        Cancel("r"),
        Stop(),
        *(Invoke(k, call) for k, (call, _, _) in enumerate(CALLS.values())),
        Ready(True),
        Ready(False, None, 64 << 30),
        LoadFailed("no such model"),
        events,
        Reply(3, True, {"vision": {"hits": 1}}),
        Stopped(),
        ReplicaInfo(0, 12, "here", True, False, 1, 2, 3.5),
        ReplicaInfo(0, 12, "here", True, True, 1, 2, 3.5, 141 << 30),
    ]
    for message in messages:
        again = pickle.loads(pickle.dumps(message))
        assert again == message and type(again) is type(message)
        fields = dataclasses.fields(message)
        if fields:
            with pytest.raises(dataclasses.FrozenInstanceError):
                setattr(message, fields[0].name, None)
    assert pickle.loads(pickle.dumps(events)).batch[1][1].finish_reason is FinishReason.LENGTH
