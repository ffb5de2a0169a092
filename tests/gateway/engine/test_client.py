"""The engine client contract (gateway/engine/client.py): every engine the HTTP side can be
given conforms to `EngineClient`, member by member, with compatible signatures.

Pinned: `Engine` (in-process), `RemoteEngine` (engine process) and `RoutedEngine` (Ray Serve
replicas; only where `ray` is importable) each have every member of the Protocol: methods with
the same parameters (names, kinds, defaults; extra ones optional), properties or plain
attributes for the rest. A class that lacks a member or changes a signature is caught.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import Any

import pytest

from gateway.config import EngineConfig
from gateway.engine.client import EngineClient

CONFIG = EngineConfig("m", "m")


def _in_process() -> Any:
    from gateway.engine.core import Engine
    from gateway.metrics import Metrics

    return Engine(CONFIG, Metrics())


def _remote() -> Any:
    from gateway.engine.remote.client import RemoteEngine

    return RemoteEngine(CONFIG)


def _routed() -> Any:
    pytest.importorskip("ray")
    from gateway.cluster.routed_engine import RoutedEngine
    from gateway.cluster.router import AffinityRouter

    return RoutedEngine(CONFIG, [object()], AffinityRouter(1))


def _members() -> dict[str, object]:
    """The Protocol's own members: name -> function, property, or None (a plain attribute)."""
    members: dict[str, object] = dict.fromkeys(EngineClient.__annotations__)
    for name, value in vars(EngineClient).items():
        if not name.startswith("_") and isinstance(value, (property, Callable)):
            members[name] = value
    return members


def _signature_problem(name: str, want: Callable[..., Any], got: object) -> str | None:
    if not callable(got) or isinstance(got, property):
        return f"{name}: not a method"
    params = list(inspect.signature(got).parameters.values())[1:]  # without self
    wanted = list(inspect.signature(want).parameters.values())[1:]
    for i, param in enumerate(wanted):
        if i >= len(params) or params[i].name != param.name or params[i].kind != param.kind:
            return f"{name}: parameter {param.name!r} missing or moved"
        if param.default is not params[i].default and param.default != params[i].default:
            return f"{name}: default of {param.name!r} differs"
    for extra in params[len(wanted) :]:
        optional = extra.default is not inspect.Parameter.empty
        if not optional and extra.kind not in (extra.VAR_POSITIONAL, extra.VAR_KEYWORD):
            return f"{name}: extra parameter {extra.name!r} is required"
    return None


def conformance_problems(engine: object) -> list[str]:
    """Why `engine` (an instance) does not conform to EngineClient; [] if it does."""
    problems = []
    for name, member in _members().items():
        static = inspect.getattr_static(type(engine), name, None)
        if isinstance(member, property) or member is None:
            if static is None and name not in vars(engine):
                problems.append(f"{name}: missing")
            elif callable(static) and not isinstance(static, property):
                problems.append(f"{name}: a method, not a value")
        else:
            problem = _signature_problem(name, member, static)  # type: ignore[arg-type]
            if problem is not None:
                problems.append(problem)
    return problems


@pytest.mark.parametrize("make", [_in_process, _remote, _routed], ids=lambda f: f.__name__[1:])
def test_every_engine_conforms_to_the_client_protocol(make: Callable[[], Any]) -> None:
    engine = make()
    try:
        assert isinstance(engine, EngineClient)
        assert conformance_problems(engine) == []
    finally:
        loop = getattr(engine, "_loop", None)  # RoutedEngine's, never started here
        if loop is not None:
            loop.close()


def test_the_check_catches_a_missing_member_and_a_changed_signature() -> None:
    """The conformance check can fail: a proxy without `metrics_text`, with `cache_entries`
    taking its arguments in another order and `running` turned into a method."""

    class Broken:
        def __init__(self) -> None:
            self.config, self.model, self.on_gpu, self.device_memory = CONFIG, None, False, None
            self.waiting, self.idle, self.alive = 0, True, True

        def running(self) -> int:
            return 0

        def cache_entries(self, kind: str | None = None, limit: int = 10) -> dict[str, Any]:
            return {}

    for name in ("start", "stop", "submit", "cancel", "cache_stats"):
        setattr(Broken, name, getattr(type(_remote()), name))
    Broken.clear_caches = Broken.reset_caches = lambda self: None  # type: ignore[attr-defined]
    problems = conformance_problems(Broken())
    assert problems == [
        "running: a method, not a value",
        "cache_entries: parameter 'limit' missing or moved",
        "metrics_text: not a method",
    ]
    assert not isinstance(Broken(), EngineClient)  # runtime_checkable sees the missing one
