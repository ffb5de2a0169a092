"""Turning one request's sampled tokens into text: incremental detokenization, stop strings,
logprobs. One `OutputState` per request, owned by the engine thread.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from gateway.engine.request import SamplingParams, TokenLogprob
from gateway.engine.tokens.detokenizer import Detokenizer
from gateway.engine.tokens.holdback import held_length
from gateway.engine.tokens.logprobs import LogprobValues
from gateway.engine.tokens.thinking import Kind, Phase, Phases

Decode = Callable[[Sequence[int]], str]


class IncrementalDetokenizer:
    """The generic `Detokenizer` over any `decode` function (used when the tokenizer is not
    byte-level BPE; see gateway.engine.tokens.detokenizer for the fast path).

    Decodes a growing token list into text deltas that concatenate to `decode(all tokens)`.

    Keeps a small window (prefix_offset..read_offset) so each step decodes a few tokens, and
    holds back text that ends in an incomplete UTF-8 sequence (U+FFFD).
    """

    def __init__(self, decode: Decode) -> None:
        self._decode = decode
        self.tokens: list[int] = []
        self._prefix = 0
        self._read = 0

    def add(self, token: int) -> str:
        self.tokens.append(token)
        prefix_text = self._decode(self.tokens[self._prefix : self._read])
        new_text = self._decode(self.tokens[self._prefix :])
        if len(new_text) > len(prefix_text) and not new_text.endswith("\ufffd"):
            delta = new_text[len(prefix_text) :]
            self._prefix, self._read = self._read, len(self.tokens)
            return delta
        return ""

    def flush(self) -> str:
        """Text still held back (e.g. a dangling partial character) at the end."""
        prefix_text = self._decode(self.tokens[self._prefix : self._read])
        new_text = self._decode(self.tokens[self._prefix :])
        self._prefix = self._read = len(self.tokens)
        return new_text[len(prefix_text) :]


class _Lead:
    """Drops what opens a channel's text: `header` (when the text starts with it), then
    newlines (Qwen3 writes `<think>\n` and `</think>\n\n`), holding text back only while
    it could still be that opening."""

    def __init__(self, header: str = "") -> None:
        self._header = header
        self._held = ""
        self.done = False

    def feed(self, text: str) -> str:
        if self.done:
            return text
        self._held += text
        if self._header and self._header.startswith(self._held):
            return ""  # could still be the header
        if self._header and self._held.startswith(self._header):
            self._held = self._held[len(self._header) :]
        self._header = ""
        out, self._held = self._held.lstrip("\n"), ""
        self.done = bool(out)
        return out

    def flush(self) -> str:
        """The end of the channel: text held back as a possible header is text after all."""
        out, self._held, self.done = self._held.lstrip("\n"), "", True
        return out


class OutputState:
    """Text, stop strings and logprobs of one request's completion.

    `push(token, logprobs)` returns (text to emit now, finished-by-stop-string). Text that could
    be the start of a stop string is held back until it cannot be. With `params.stop_until` (a
    tool call's opening) stop strings apply only to the text before it.

    With `params.thinking` (gateway.engine.tokens.thinking) the thinking's text goes to
    `take_reasoning()` instead, through a detokenizer of its own; markers are dropped, and so
    are the newlines that open each part. Stop strings apply to the answer only. Without it,
    every token is answer text, as for any model.
    """

    def __init__(
        self,
        params: SamplingParams,
        new_detokenizer: Callable[[], Detokenizer],
        token_text: Callable[[int], str],
        token_bytes: Callable[[int, str], bytes] | None = None,
    ) -> None:
        self._params = params
        self._detok = new_detokenizer()
        self._token_text = token_text
        self._token_bytes = token_bytes or (lambda _token, text: text.encode("utf-8"))
        self._pending = ""  # decoded but not yet emitted (possible stop-string prefix)
        self.completion_tokens = 0
        self.stopped = False
        self.stopped_by: str | None = None  # the stop string that ended the completion
        self._past_marker = False  # the answer reached `params.stop_until`: stops are off
        thinking = params.thinking
        self._phases = Phases(thinking) if thinking is not None else None
        self._new_detokenizer = new_detokenizer
        self._think_detok: Detokenizer | None = None
        self._think_lead = _Lead(thinking.header if thinking is not None else "")
        self._answer_lead: _Lead | None = None  # after a thinking: drops its newlines
        self._reasoning = ""  # thinking text not yet taken
        self._emitted: list[str] = []  # every piece of answer text returned so far

    @property
    def text(self) -> str:
        """The completion's answer text as emitted so far (what the client received as
        content; a thinking's text is not in it)."""
        return "".join(self._emitted)

    def push(self, token: int) -> str:
        self.completion_tokens += 1
        if self._phases is not None:
            kind = self._phases.step(token)
            if kind is Kind.MARKER:
                if self._phases.phase is Phase.ANSWER:  # the thinking closed
                    self._end_thinking()
                return ""
            if kind is Kind.THINKING:
                if self._think_detok is None:
                    self._think_detok = self._new_detokenizer()
                self._reasoning += self._think_lead.feed(self._think_detok.add(token))
                return ""
        text = self._detok.add(token)
        if self._answer_lead is not None:
            text = self._answer_lead.feed(text)
        self._pending += text
        return self._emit(self._release(final=False))

    def _end_thinking(self) -> None:
        if self._think_detok is not None:
            self._reasoning += self._think_lead.feed(self._think_detok.flush())
        self._reasoning += self._think_lead.flush()
        self._answer_lead = _Lead()

    @property
    def thinking_tokens(self) -> int:
        """Tokens of the thinking so far (0 for a model without one)."""
        return self._phases.thought if self._phases is not None else 0

    def take_reasoning(self) -> str:
        """The thinking text produced since the last call ("" for a model without one)."""
        out, self._reasoning = self._reasoning, ""
        return out

    def finish(self) -> str:
        """Flush held-back text at the end of generation (stop strings still apply); a
        thinking cut short flushes into `take_reasoning()`."""
        if self._phases is not None and self._phases.phase is Phase.THINKING:
            self._end_thinking()
        if not self.stopped:
            self._pending += self._detok.flush()
        return self._emit(self._release(final=True))

    def _emit(self, out: str) -> str:
        if out:
            self._emitted.append(out)
        return out

    def _release(self, final: bool) -> str:
        if self.stopped:
            return ""
        if self.completion_tokens < self._params.min_tokens:
            # Stop strings end an answer only from its min_tokens-th token on (vLLM's rule);
            # the end-of-sequence tokens are masked until then (gateway.engine.tokens.penalties).
            out, self._pending = self._pending, ""
            return out
        stops = () if self._past_marker else self._params.stop
        text, marker = self._pending, self._params.stop_until
        # Stop strings may match only inside text[:free]: before the marker, and not in a tail
        # that may still turn out to begin it.
        free, maybe_marker = len(text), 0
        if stops and marker:
            at = text.find(marker)
            if at >= 0:
                free = at
            elif not final:
                maybe_marker = held_length(text, marker)
                free -= maybe_marker
        for stop in stops:
            at = text.find(stop, 0, free)
            if at >= 0:
                self.stopped, self.stopped_by = True, stop
                out, self._pending = text[:at], ""
                return out
        if stops and free < len(text) and not maybe_marker:
            self._past_marker = True  # the calls began: everything from here on is theirs
            stops = ()
        keep = 0 if final or not stops else max(maybe_marker, self._partial_stop_len(text))
        cut = len(text) - keep
        out, self._pending = text[:cut], text[cut:]
        return out

    def _partial_stop_len(self, text: str) -> int:
        """Length of the longest suffix of `text` that could begin a stop string."""
        return max((held_length(text, stop) for stop in self._params.stop), default=0)

    def logprob(self, token: int, values: LogprobValues) -> TokenLogprob:
        """The sampled token's logprob and the requested top alternatives, with their text
        (`values` from gateway.engine.tokens.logprobs, for this token)."""
        text = self._token_text(token)
        top = tuple(
            (t := self._token_text(tid), tid, lp, tuple(self._token_bytes(tid, t)))
            for tid, lp in values.top[: self._params.top_logprobs]
        )
        return TokenLogprob(text, token, values.chosen, tuple(self._token_bytes(token, text)), top)
