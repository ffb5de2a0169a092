"""Constrained decoding inside the shared batch: compiled grammars, one matcher per
constrained row, and the batched token mask.

A request with a `SamplingParams.grammar` (an llguidance grammar, built from the request's
JSON Schema at the HTTP edge by gateway.structured) decodes in the same batch as every other
row. Per step, the batch's one sampler asks each row for its `GrammarRow`; if any row has one,
the masks of all constrained rows are computed in one call into one (rows, vocab/32) bitmask
(free rows all ones) and applied to the batch's log-probabilities before the one batched
draw, so constrained and free rows cost one extra `where` per step, not a kernel per row.

Compilation runs once per grammar (keyed by its SHA-256) on a worker thread, before the
request is admitted, and the compiled matcher is kept in a byte-bounded LRU; each request gets
a cheap copy of it (`LLMatcher.deep_copy`).

llguidance builds its lexer lazily, while rows decode, and gives up on a schema whose regular
expressions grow past its limits (`pattern: "^(a{1000}){1000}$"`: "lexer error: too many
expressions constructed"). That state is shared by every copy of the compiled grammar, so a
row that meets such an error evicts its grammar from the cache (the next request compiles it
afresh and fails at the same point instead of starting broken), and the error is the
request's (`GrammarRow.limit`: the schema is beyond what the server can enforce), not the
server's.

Thread safety: `Grammars.prepare` and the row methods run on the engine thread; compilation
runs on the worker thread (llguidance drops the GIL while it compiles and computes masks);
`stats` may be called from any thread.
"""

from __future__ import annotations

import hashlib
import logging
import os
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, Protocol

import llguidance.hf
import mlx.core as mx
import numpy as np
from llguidance import LLExecutor, LLMatcher, LLTokenizer
from llguidance.numpy import fill_next_token_bitmask_par

from caches.lru import ByteLRU

log = logging.getLogger(__name__)

# llguidance does not report a compiled grammar's memory. Its lexer states cost ~1-2 kB each
# (llguidance's own figure) and grow with the grammar's text, so an entry is counted as a
# fixed overhead plus a multiple of the grammar's size: an estimate that keeps the cache
# bounded, not an exact figure (documented in docs/caching.md).
ENTRY_OVERHEAD_BYTES = 64 * 1024
BYTES_PER_GRAMMAR_BYTE = 32


class GrammarError(Exception):
    """A grammar that passed validation at the edge failed to compile for this tokenizer."""


# llguidance's words for a grammar outgrowing its budgets (the lexer's expressions and
# states, the parser's items and fuel): the schema's fault, not the server's.
_LIMIT_WORDS = ("lexer error", "too many", "too complex", "toocomplex", "limit", "fuel")


def first_line(error: str) -> str:
    """llguidance's error without what it appends on later lines (parser state, token dumps,
    JSON stats)."""
    return error.split("\n", 1)[0].strip()


def is_limit(error: str) -> bool:
    """Is this llguidance error the grammar outgrowing the engine's limits (the schema's
    fault: a 400) rather than anything else (a token that broke the grammar, which a token
    drawn under its mask never does, or an internal fault: a 500)?"""
    lowered = error.lower()
    return any(word in lowered for word in _LIMIT_WORDS)


class FailingRow(Protocol):
    """What the engine reads of a failed constrained row (`GrammarRow`, `ThinkingRow`)."""

    error: str | None

    @property
    def limit(self) -> bool: ...


@dataclass(frozen=True)
class Compiled:
    """A compiled grammar and its cache key (the SHA-256 of its text)."""

    key: str
    matcher: LLMatcher


class GrammarRow:
    """One constrained request's matcher and how far it has read the request's own tokens.

    `drawn` counts masks handed out (one per sampled token), `consumed` the tokens the matcher
    has read. mlx-lm samples step t+1 before the engine has seen token t, so when a mask is
    due the matcher may be one token behind: `catch_up(token)` reads the token fed in this
    step (the last one drawn) and `accept(index, token)` (from the engine's emit) skips tokens
    already read. Engine thread only.
    """

    def __init__(self, matcher: LLMatcher, on_error: Callable[[], None] | None = None) -> None:
        self.matcher = matcher
        self.drawn = 0
        self.consumed = 0
        self.error: str | None = None
        self._on_error = on_error  # evicts the compiled grammar its state came from

    def fail(self, error: str) -> None:
        """The matcher met `error` (llguidance's message): the row ends at its next draw."""
        if self.error is None:
            self.error = first_line(error) or "the grammar failed"
            if self._on_error is not None:
                self._on_error()

    @property
    def limit(self) -> bool:
        """The row's error is the schema outgrowing llguidance's limits (`is_limit`)."""
        return self.error is not None and is_limit(self.error)

    @property
    def ready(self) -> bool:
        """The matcher has read every token drawn so far: the next mask can be computed."""
        return self.consumed == self.drawn

    def accept(self, index: int, token: int) -> None:
        """Read the request's `index`-th generated token (idempotent per index)."""
        if index < self.consumed or self.error is not None:
            return
        if index != self.consumed:
            raise RuntimeError(f"grammar row skipped tokens: at {self.consumed}, got {index}")
        self.consumed += 1
        if not self.matcher.consume_token(token):
            self.fail(self.matcher.get_error() or f"token {token} does not satisfy the grammar")

    def catch_up(self, fed_token: int) -> None:
        """Before a mask: read the token this step feeds, if it is the one not yet read."""
        if self.consumed == self.drawn - 1:
            self.accept(self.consumed, fed_token)

    def take_mask(self, out: np.ndarray, eos_row: np.ndarray) -> LLMatcher | None:
        """Count one draw and return the matcher whose mask goes into `out` (a row of the
        batch's bitmask, all ones on entry); after an error, end the row (`out` = EOS only)."""
        self.drawn += 1
        if self.error is not None:
            out[:] = eos_row.view(np.int32)
            return None
        return self.matcher

    def after_fill(self, out: np.ndarray) -> None:
        """Called after llguidance wrote this row's mask (a `ThinkingRow` widens it)."""


class Masker:
    """Computes the batch's bitmask and applies it to log-probabilities. Engine thread only.

    `seconds` and `masks` accumulate the CPU time spent computing masks and the number of
    row-masks computed (read by the benchmark).
    """

    def __init__(self, vocab_size: int, eos_ids: Sequence[int], threads: int | None = None) -> None:
        self.vocab_size = vocab_size
        self.words = (vocab_size + 31) // 32
        self._eos_row = np.zeros(self.words, dtype=np.uint32)
        for t in eos_ids:
            self._eos_row[t // 32] |= np.uint32(1 << (t % 32))
        # Masks of a batch's rows are computed in parallel by llguidance's own threads (no GIL).
        self._executor = LLExecutor(num_threads=threads or max(1, min(8, os.cpu_count() or 1)))
        self._shifts = mx.arange(32, dtype=mx.uint32)
        self.seconds = 0.0
        self.masks = 0

    def bitmask(self, rows: Sequence[GrammarRow | None]) -> np.ndarray:
        """The (len(rows), words) int32 bitmask of the next token: all ones for None rows.
        Counts one draw on every constrained row (each row's matcher must be `ready`). A row
        is a `GrammarRow` or anything with its protocol (`ThinkingRow`)."""
        started = time.perf_counter()
        mask = np.full((len(rows), self.words), -1, dtype=np.int32)
        live = []
        for i, row in enumerate(rows):
            if row is None:
                continue
            if not row.ready:
                raise RuntimeError("a grammar row is asked for a mask before reading its token")
            # A row after an error is ended at once (EOS only); the engine fails the request
            # when it sees the error. A thinking row writes its own mask while it thinks.
            matcher = row.take_mask(mask[i], self._eos_row)
            if matcher is not None:
                live.append((matcher, i))
        if live:
            fill_next_token_bitmask_par(self._executor, live, mask)
            for matcher, i in live:
                if matcher.is_error():  # the lexer gave up computing this mask
                    rows[i].fail(matcher.get_error())  # type: ignore[union-attr]
                    mask[i] = self._eos_row.view(np.int32)
                    continue
                rows[i].after_fill(mask[i])  # type: ignore[union-attr]
                if not mask[i].any():  # never leave a row without a token: end it instead
                    mask[i] = self._eos_row.view(np.int32)
        self.seconds += time.perf_counter() - started
        self.masks += len(live)
        return mask

    def apply(self, logprobs: mx.array, mask: np.ndarray) -> mx.array:
        """`logprobs` (rows, vocab) with disallowed tokens at -inf (lazy)."""
        words = mx.array(mask.view(np.uint32))
        bits = (words[:, :, None] >> self._shifts) & 1
        allowed = bits.reshape(words.shape[0], -1)[:, : logprobs.shape[-1]]
        return mx.where(allowed.astype(mx.bool_), logprobs, -mx.inf)


class Grammars:
    """Compiled grammars for one model's tokenizer, cached by hash; per-request matchers."""

    def __init__(
        self, hf_tokenizer: Any, vocab_size: int, eos_ids: Sequence[int], capacity_bytes: int
    ) -> None:
        self._hf_tokenizer = hf_tokenizer
        self._vocab_size = vocab_size
        self._eos_ids = list(eos_ids)
        self._tokenizer: LLTokenizer | None = None
        self.cache: ByteLRU[str, Compiled] = ByteLRU(capacity_bytes)
        self._pool = ThreadPoolExecutor(1, thread_name_prefix="grammar-compile")
        # llguidance's view of the vocabulary takes ~1 s for 150k tokens: build it now, on the
        # worker thread, rather than in the first structured request's time to first token.
        self._pool.submit(self._llg_tokenizer)
        self._inflight: dict[str, Future[Compiled]] = {}
        self._lock = threading.Lock()
        self.masker = Masker(vocab_size, self._eos_ids)

    def prepare(self, grammar: str) -> Future[Compiled]:
        """The compiled grammar: from the cache (done at once), joined to a compilation under
        way, or compiled now on the worker thread. Engine thread."""
        key = hashlib.sha256(grammar.encode()).hexdigest()
        compiled = self.cache.get(key)
        if compiled is not None:
            done: Future[Compiled] = Future()
            done.set_result(compiled)
            return done
        with self._lock:
            running = self._inflight.get(key)
            if running is None:
                running = self._pool.submit(self._compile, key, grammar)
                self._inflight[key] = running
        return running

    def start(self, compiled: Compiled) -> GrammarRow:
        """A fresh row state for one request from a compiled grammar."""
        return GrammarRow(compiled.matcher.deep_copy(), lambda: self._evict(compiled))

    def _evict(self, compiled: Compiled) -> None:
        """Drop `compiled` from the cache (if it is still the entry of its key): its lexer
        state met an error that every copy of it would now start with."""
        if self.cache.peek(compiled.key) is compiled:
            self.cache.pop(compiled.key)

    def _compile(self, key: str, grammar: str) -> Compiled:
        try:
            matcher = LLMatcher(self._llg_tokenizer(), grammar, log_level=0)
            if matcher.is_error():
                raise GrammarError(first_line(matcher.get_error()))
            compiled = Compiled(key, matcher)
            self.cache.put(
                key, compiled, ENTRY_OVERHEAD_BYTES + BYTES_PER_GRAMMAR_BYTE * len(grammar)
            )
            return compiled
        finally:
            with self._lock:
                self._inflight.pop(key, None)

    def _llg_tokenizer(self) -> LLTokenizer:
        """llguidance's tokenizer for the model (worker thread only: built once there)."""
        if self._tokenizer is None:
            self._tokenizer = llguidance.hf.from_tokenizer(
                self._hf_tokenizer, n_vocab=self._vocab_size, eos_token=self._eos_ids
            )
        return self._tokenizer

    def stats(self) -> dict[str, object]:
        s = self.cache.stats()
        return {
            "queries": s.hits + s.misses,
            "hits": s.hits,
            "misses": s.misses,
            "hit_rate": s.hit_rate,
            "evictions": s.evictions,
            "entries": s.entries,
            "bytes": s.bytes,
            "capacity_bytes": s.capacity_bytes,
        }

    def reset(self) -> None:
        """Forget every compiled grammar and zero the counters (engine thread)."""
        self.cache = ByteLRU(self.cache.capacity_bytes)
