"""A thinking model's answer token by token (no model: a toy byte vocabulary, markers 300 and
301 as the one-token `<think>` / `</think>`).

Pinned: the phases follow the answer's own tokens (a first `start_id` opens the thinking, an
`end_id` closes it); the thinking's text goes to `take_reasoning`, never into the answer, and
stop strings apply to the answer only; the budget forces `end_id` (one bit in the mask)
exactly once the thinking has that many tokens; a grammar waits for the thinking's end, its
first mask also letting the opening marker through when the answer may open a thinking.
"""

from __future__ import annotations

import numpy as np

from gateway.engine.request import SamplingParams, ThinkingParams
from gateway.engine.tokens.grammar import GrammarRow
from gateway.engine.tokens.output import IncrementalDetokenizer, OutputState
from gateway.engine.tokens.thinking import Kind, Phase, Phases, ThinkingRow, needs_row

START, END, EOS = 300, 301, 302
WORDS = (303 + 31) // 32


def _decode(ids: list[int]) -> str:
    return bytes(i for i in ids if i < 256).decode("utf-8", errors="replace")


def _ids(text: str) -> list[int]:
    return list(text.encode("utf-8"))


def _state(thinking: ThinkingParams | None, *stop: str) -> OutputState:
    params = SamplingParams(max_tokens=100, stop=tuple(stop), thinking=thinking)
    return OutputState(params, lambda: IncrementalDetokenizer(_decode), lambda t: _decode([t]))


def _run(out: OutputState, ids: list[int]) -> tuple[str, str]:
    text = reasoning = ""
    for t in ids:
        text += out.push(t)
        reasoning += out.take_reasoning()
        if out.stopped:
            break
    text += out.finish()
    return text, reasoning + out.take_reasoning()


def test_phases_follow_the_answers_own_tokens() -> None:
    free = Phases(ThinkingParams(START, END))
    kinds = [free.step(t) for t in [START, 65, 66, END, 67]]
    assert kinds == [Kind.MARKER, Kind.THINKING, Kind.THINKING, Kind.MARKER, Kind.ANSWER]
    assert free.thought == 2 and free.phase is Phase.ANSWER
    direct = Phases(ThinkingParams(START, END))
    assert [direct.step(t) for t in [65, START, END]] == [Kind.ANSWER] * 3  # no thinking
    inside = Phases(ThinkingParams(START, END, inside=True))
    assert [inside.step(t) for t in [65, END, 66]] == [Kind.THINKING, Kind.MARKER, Kind.ANSWER]


def test_thinking_text_is_routed_apart_and_its_opening_newlines_dropped() -> None:
    ids = [START, *_ids("\nhmm, STOP?\n"), END, *_ids("\n\nyes STOP no")]
    text, reasoning = _run(_state(ThinkingParams(START, END), "STOP"), ids)
    assert reasoning == "hmm, STOP?\n"  # a stop string in the thinking does not end it
    assert text == "yes "
    plain, none = _run(_state(None, "STOP"), _ids("a STOP"))
    assert (plain, none) == ("a ", "")


def test_a_header_opens_the_thinking_and_a_cut_thinking_is_flushed() -> None:
    params = ThinkingParams(START, END, header="thought\n")
    text, reasoning = _run(_state(params), [START, *_ids("thought\nsee")])
    assert (text, reasoning) == ("", "see")
    _, kept = _run(_state(params), [START, *_ids("though it")])
    assert kept == "though it"  # not the header: kept whole
    _, cut = _run(_state(params), [START, *_ids("thou"), END])
    assert cut == "thou"  # held as a possible header, then released when the thinking ends


def _row(params: ThinkingParams, inner: GrammarRow | None = None) -> ThinkingRow:
    return ThinkingRow(params, inner)


def _mask(row: ThinkingRow) -> np.ndarray:
    out = np.full(WORDS, -1, dtype=np.int32)
    eos = np.zeros(WORDS, dtype=np.uint32)
    eos[EOS // 32] = np.uint32(1 << (EOS % 32))
    matcher = row.take_mask(out, eos)
    assert matcher is None  # these rows need no llguidance mask
    return out


def _allowed(mask: np.ndarray) -> list[int]:
    bits = np.unpackbits(mask.view(np.uint8), bitorder="little")
    return [int(i) for i in np.flatnonzero(bits)]


def test_the_budget_forces_the_end_marker_exactly_when_spent() -> None:
    row = _row(ThinkingParams(START, END, inside=True, budget=2))
    forced = []
    for index, token in enumerate([65, 66, END, 67]):
        allowed = _allowed(_mask(row))
        forced.append(allowed == [END])
        row.accept(index, token)
    assert forced == [False, False, True, False]
    assert row.phases.phase is Phase.ANSWER and row.ready and row.error is None


def test_needs_row_only_for_a_budget_or_a_waiting_grammar() -> None:
    assert not needs_row(None, True)
    assert not needs_row(ThinkingParams(START, END), False)
    assert not needs_row(ThinkingParams(START, END), True)  # the grammar starts at once
    assert needs_row(ThinkingParams(START, END, budget=3), False)
    assert needs_row(ThinkingParams(START, END, grammar_waits=True), True)


class _Matcher:
    """Stands in for an LLMatcher: accepts every token, records them."""

    def __init__(self) -> None:
        self.tokens: list[int] = []

    def consume_token(self, token: int) -> bool:
        self.tokens.append(token)
        return True

    def get_error(self) -> str:
        return ""


def test_a_waiting_grammar_reads_only_the_answer_and_lets_the_opening_through() -> None:
    matcher = _Matcher()
    inner = GrammarRow(matcher)  # type: ignore[arg-type]
    row = _row(ThinkingParams(START, END, grammar_waits=True), inner)
    out = np.zeros(WORDS, dtype=np.int32)
    assert row.take_mask(out, out.view(np.uint32)) is matcher  # the grammar's mask ...
    row.after_fill(out)
    assert _allowed(out) == [START]  # ... widened by the opening (llguidance wrote none here)
    row.accept(0, START)
    assert inner.drawn == 0 and inner.ready  # that draw went to the thinking
    for index, token in enumerate([65, END], start=1):
        assert _allowed(_mask(row)) == list(range(WORDS * 32))  # thinking: free
        row.accept(index, token)
    out = np.full(WORDS, -1, dtype=np.int32)
    assert row.take_mask(out, out.view(np.uint32)) is matcher
    row.after_fill(out)
    assert _allowed(out) == list(range(WORDS * 32))  # no widening after the start
    row.accept(3, 123)
    assert matcher.tokens == [123] and inner.ready and row.ready


def test_grammar_row_protocol_is_unchanged_for_plain_grammars() -> None:
    """A `GrammarRow` hands its matcher to the masker and ends the row after an error."""
    row = GrammarRow(_Matcher())  # type: ignore[arg-type]
    out = np.full(WORDS, -1, dtype=np.int32)
    assert row.take_mask(out, out.view(np.uint32)) is row.matcher and row.drawn == 1
    row.error = "bad"
    eos = np.zeros(WORDS, dtype=np.uint32)
    eos[0] = 1
    assert row.take_mask(out, eos) is None and _allowed(out) == [0]
