"""A test-only `EngineClient` whose answers follow a script, so that a random-weight model can
make a real agent call a tool.

`ScriptedEngine` wraps a real engine (the tiny model's `RemoteEngine` or `Engine`) and
delegates everything to it, except the requests a rule of its script matches: those it answers
itself with the rule's text, as the model's output tokens (tokenized by the model's own
tokenizer, one TokenEvent per token), after an `AdmittedEvent` that counts the prompt, and
a `FinishEvent` (`stop`). Everything above the engine stays real: the API parsers, the chat
template with the tools, the call splitter that turns `<tool_call>` text into the API's tool
calls, the renderers and the SSE framing. A request no rule matches goes to the real model,
with its caches (so one server serves both the scripted tool turns and cached real turns).

A script is a JSON list of rules, tried in order; a rule matches when every condition holds:

    {"prompt_contains": "...",   the rendered prompt holds this text (e.g. a tool's name)
     "last_turn_contains": "...", the text after the prompt's last `turn_marker` holds it
     "last_turn_lacks": "...",    ... and does not hold this
     "turn_marker": "<|im_start|>user",   (default: Qwen's user turn opening)
     "prefill": false,            true: the real engine prefills (and caches) the prompt first,
                                  and the admission and usage report its real cache hits
     "answer": "..."}             the model's output (may contain `<tool_call>` blocks)

With `prefill`, a test measures the real prefix cache on a real client's prompt while the
answer stays short and fixed (a random-weight model rarely ends before `max_tokens`).

Thread safety: `submit` may be called from any thread; scripted events are delivered from a
thread of this class, never the caller's (sinks must not be called re-entrantly).
"""

from __future__ import annotations

import json
import threading
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from gateway.engine.client import EngineClient
from gateway.engine.request import (
    AdmittedEvent,
    EngineRequest,
    FinishEvent,
    FinishReason,
    Sink,
    TokenEvent,
    Usage,
)

QWEN_USER_TURN = "<|im_start|>user"


@dataclass(frozen=True)
class Rule:
    answer: str
    prompt_contains: str = ""
    last_turn_contains: str = ""
    last_turn_lacks: str = ""
    turn_marker: str = QWEN_USER_TURN
    prefill: bool = False

    def matches(self, prompt: str) -> bool:
        last_turn = prompt.rpartition(self.turn_marker)[2]
        return (
            self.prompt_contains in prompt
            and self.last_turn_contains in last_turn
            and not (self.last_turn_lacks and self.last_turn_lacks in last_turn)
        )


def load_rules(path: Path) -> tuple[Rule, ...]:
    return tuple(Rule(**raw) for raw in json.loads(path.read_text()))


class ScriptedEngine:
    """An `EngineClient` over `inner` that answers the requests `rules` match itself.

    `answered` counts the scripted answers given (read it from any thread)."""

    def __init__(self, inner: EngineClient, rules: Sequence[Rule]) -> None:
        self._inner = inner
        self._rules = tuple(rules)
        self.config = inner.config
        self.answered = 0
        self._lock = threading.Lock()

    def __getattr__(self, name: str) -> Any:  # everything else is the real engine's
        return getattr(self._inner, name)

    @property
    def model(self) -> Any:
        return self._inner.model

    @property
    def on_gpu(self) -> bool:
        return self._inner.on_gpu

    @property
    def running(self) -> int:
        return self._inner.running

    @property
    def waiting(self) -> int:
        return self._inner.waiting

    @property
    def idle(self) -> bool:
        return self._inner.idle

    @property
    def alive(self) -> bool:
        return self._inner.alive

    def submit(self, request: EngineRequest, sink: Sink) -> None:
        rule = self._rule_for(request)
        if rule is None:
            self._inner.submit(request, sink)
            return
        with self._lock:
            self.answered += 1
        if rule.prefill:
            self._prefill_then_answer(request, rule.answer, sink)
            return
        threading.Thread(
            target=self._answer, args=(request, rule.answer, sink), daemon=True
        ).start()

    def _prefill_then_answer(self, request: EngineRequest, answer: str, sink: Sink) -> None:
        """The real engine prefills the prompt (one token, discarded); its admission goes to
        `sink` as it is, then the scripted answer with the real prompt and cache counts."""

        def relay(event: Any) -> None:
            if isinstance(event, AdmittedEvent):
                sink(event)
            elif isinstance(event, FinishEvent):
                usage = event.usage
                self._emit(request, answer, sink, usage.prompt_tokens, usage.cached_tokens)
            elif not isinstance(event, TokenEvent):  # an ErrorEvent: as it is
                sink(event)

        one_token = replace(request, sampling=replace(request.sampling, max_tokens=1))
        self._inner.submit(one_token, relay)

    def _rule_for(self, request: EngineRequest) -> Rule | None:
        if not request.use_caches:  # start-up warm-up requests: the real model's
            return None
        prompt = self.model.tokenizer.decode(list(request.prompt_ids))
        return next((rule for rule in self._rules if rule.matches(prompt)), None)

    def _answer(self, request: EngineRequest, answer: str, sink: Sink) -> None:
        prompt_tokens = len(request.prompt_ids)
        sink(AdmittedEvent(prompt_tokens, 0, 0, 0))
        self._emit(request, answer, sink, prompt_tokens, 0)

    def _emit(
        self, request: EngineRequest, answer: str, sink: Sink, prompt_tokens: int, cached: int
    ) -> None:
        """The answer's TokenEvents and the FinishEvent (at most max_tokens tokens)."""
        ids = self.model.tokenizer.encode(answer, add_special_tokens=False)
        ids = ids[: request.sampling.max_tokens]
        shown = ""
        for n in range(1, len(ids) + 1):
            text = self.model.tokenizer.decode(ids[:n])
            if text.endswith("\ufffd"):  # a partial UTF-8 sequence: wait for its end
                sink(TokenEvent("", (ids[n - 1],)))
                continue
            sink(TokenEvent(text[len(shown) :], (ids[n - 1],)))
            shown = text
        reason = FinishReason.STOP if len(ids) < request.sampling.max_tokens else "length"
        sink(FinishEvent(reason, Usage(prompt_tokens, len(ids), cached)))
