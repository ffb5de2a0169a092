"""A thinking model's answer, token by token: which tokens are thinking, which are markers,
which are the answer; the thinking budget; and grammars that wait for the thinking to end.

A request with `SamplingParams.thinking` (a model whose chat template thinks: Qwen3's
`<think>...</think>`, Gemma 4's `<|channel>thought\\n...<channel|>`) goes through three
phases, decided by its own tokens only (so the split is the same batched or alone):

    START     the answer may open its thinking: a first token equal to `start_id` does,
              any other first token is the answer's first token
    THINKING  free text until `end_id` (or until the budget forces `end_id`)
    ANSWER    everything else

`Phases` is that state machine (the output's text routing uses it too: the thinking's text
is `TokenEvent.reasoning`, the answer's is `TokenEvent.text`; markers are neither).
`ThinkingRow` is a constrained row of the batch's masker (gateway.engine.tokens.grammar):
all tokens allowed while thinking, only `end_id` once the budget is spent, and the
request's own grammar (if any) for the answer only. Engine thread only.
"""

from __future__ import annotations

import enum

import numpy as np
from llguidance import LLMatcher

from gateway.engine.request import ThinkingParams
from gateway.engine.tokens.grammar import GrammarRow


class Phase(enum.Enum):
    START = "start"
    THINKING = "thinking"
    ANSWER = "answer"


class Kind(enum.Enum):
    """What one generated token is."""

    MARKER = "marker"  # opens or closes the thinking: neither thinking nor answer text
    THINKING = "thinking"
    ANSWER = "answer"


class Phases:
    """The phase of one answer, advanced by its tokens in order (`step`)."""

    def __init__(self, params: ThinkingParams) -> None:
        self.params = params
        self.phase = Phase.THINKING if params.inside else Phase.START
        self.thought = 0  # thinking tokens so far (markers not counted)

    @property
    def must_end(self) -> bool:
        """The budget is spent: the next token must be `end_id`."""
        budget = self.params.budget
        return self.phase is Phase.THINKING and budget is not None and self.thought >= budget

    def step(self, token: int) -> Kind:
        if self.phase is Phase.START:
            if token == self.params.start_id:
                self.phase = Phase.THINKING
                return Kind.MARKER
            self.phase = Phase.ANSWER
            return Kind.ANSWER
        if self.phase is Phase.THINKING:
            if token == self.params.end_id:
                self.phase = Phase.ANSWER
                return Kind.MARKER
            self.thought += 1
            return Kind.THINKING
        return Kind.ANSWER


def needs_row(params: ThinkingParams | None, has_grammar: bool) -> bool:
    """Does a request need a `ThinkingRow`: a budget to enforce, or a grammar to hold back
    until the thinking ends? (Otherwise its tokens are drawn exactly as without thinking.)"""
    if params is None:
        return False
    return params.budget is not None or (has_grammar and params.grammar_waits)


def _one_bit(words: int, token: int) -> np.ndarray:
    row = np.zeros(words, dtype=np.uint32)
    row[token // 32] = np.uint32(1 << (token % 32))
    return row.view(np.int32)


class ThinkingRow:
    """The masker's row of a thinking request (see the module doc); the same protocol as
    `GrammarRow`: `drawn` / `consumed` / `ready`, `accept`, `catch_up`, `take_mask`,
    `after_fill`, `fail`, `error`, `limit`. `inner` is the request's grammar (None: free
    answer); its own counters cover the answer's tokens only."""

    def __init__(self, params: ThinkingParams, inner: GrammarRow | None) -> None:
        self.phases = Phases(params)
        self.inner = inner
        self.drawn = 0
        self.consumed = 0
        self.error: str | None = None
        self._answer = 0  # answer tokens read (the inner grammar's token index)
        self._or_start = False  # the last mask lets `start_id` through besides the grammar

    @property
    def ready(self) -> bool:
        return self.consumed == self.drawn

    @property
    def limit(self) -> bool:
        return self.inner is not None and self.inner.limit

    def fail(self, error: str) -> None:
        """The answer's grammar met `error` computing a mask (`GrammarRow.fail`)."""
        if self.inner is not None:
            self.inner.fail(error)
            self.error = self.inner.error

    def take_mask(self, out: np.ndarray, eos_row: np.ndarray) -> LLMatcher | None:
        """Count one draw; write the next token's mask into `out` (all ones on entry) or
        return the matcher whose mask llguidance should write there."""
        self.drawn += 1
        phases, inner = self.phases, self.inner
        if self.error is not None:
            out[:] = eos_row.view(np.int32)
            return None
        if phases.phase is Phase.THINKING:
            if phases.must_end:
                out[:] = _one_bit(out.shape[0], phases.params.end_id)
            return None
        if inner is None:
            return None
        matcher = inner.take_mask(out, eos_row)
        # Where the answer may still open a thinking, its opening marker is allowed too.
        self._or_start = (
            matcher is not None and phases.phase is Phase.START and phases.params.grammar_waits
        )
        return matcher

    def after_fill(self, out: np.ndarray) -> None:
        """After llguidance wrote the grammar's mask: let the thinking's opening through."""
        if self._or_start:
            self._or_start = False
            token = self.phases.params.start_id
            out.view(np.uint32)[token // 32] |= np.uint32(1 << (token % 32))

    def accept(self, index: int, token: int) -> None:
        """Read the `index`-th generated token (idempotent per index)."""
        if index < self.consumed or self.error is not None:
            return
        if index != self.consumed:
            raise RuntimeError(f"thinking row skipped tokens: at {self.consumed}, got {index}")
        self.consumed += 1
        was = self.phases.phase
        kind = self.phases.step(token)
        if self.inner is None:
            return
        if was is Phase.START and kind is Kind.MARKER:
            self.inner.drawn -= 1  # that mask went to the thinking's opening, not the grammar
        elif kind is Kind.ANSWER:
            self.inner.accept(self._answer, token)
            self._answer += 1
            self.error = self.inner.error

    def catch_up(self, fed_token: int) -> None:
        if self.consumed == self.drawn - 1:
            self.accept(self.consumed, fed_token)
