"""Token sampling for the shared batch: one batched draw per step, per-request seeds.

mlx-lm's `GenerationBatch` calls one sampler for the whole batch when every row holds the same
sampler object, and otherwise one sampler per row on a (1, vocab) slice, which costs a dozen
small kernels and a Python call per row and step. So every row of the engine's batch holds one
`BatchSampler`, bound to that batch, which looks each row's settings up by uid and samples all
rows at once: greedy rows by argmax, sampled rows by temperature, top-k and top-p cuts, and a
Gumbel-max draw whose noise comes from the row's own key.

A row's key for its n-th draw is a pure function of (seed, n), so a request's tokens do not
depend on which other requests share its batch or on the order of rows: the same seed gives the
same tokens batched or alone. `RowSampler` samples one row with the same function (the first
token after the engine's own prefill, and a row's first step inside mlx-lm before the engine
re-binds the batch).

Constrained rows (structured output, gateway.engine.tokens.grammar) have their disallowed tokens set
to -inf before the draw, greedy or sampled, by one batched mask. mlx-lm builds step t+1's
draw before the engine has read token t, and a grammar's mask for t+1 depends on t; so when a
constrained row is in the batch the sampler first launches the step's forward pass
(`async_eval`), then reads the tokens this step feeds (a wait mlx-lm's own `eval` of the same
tokens makes right after anyway), advances the matchers and computes the masks on the CPU
while the forward pass runs, and only then queues the masked draw. Batches without a
constrained row are untouched.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import mlx.core as mx
import numpy as np
from mlx_lm.sample_utils import greedy_sampler

from gateway.engine.request import SamplingParams
from gateway.engine.tokens.grammar import GrammarRow, Masker
from gateway.engine.tokens.logprobs import StepLogprobs

GREEDY = greedy_sampler
_MASK64 = (1 << 64) - 1


def _splitmix64(x: int) -> int:
    """A 64-bit mixing function: consecutive inputs give unrelated outputs."""
    x = (x + 0x9E3779B97F4A7C15) & _MASK64
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & _MASK64
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & _MASK64
    return x ^ (x >> 31)


@dataclass
class RowSampling:
    """One sampled request's settings and draw counter. Engine thread only."""

    temperature: float
    top_k: int
    top_p: float
    seed: int
    draws: int = field(default=0)

    @classmethod
    def from_params(cls, params: SamplingParams, choice: int = 0) -> RowSampling:
        """Choice `choice` of the request (`SamplingParams.n`) draws with `seed + choice`:
        as a request with that seed would, alone or batched. No seed: a random one."""
        if params.seed is None:
            seed = random.getrandbits(63)
        else:
            seed = params.seed + choice
        return cls(params.temperature, params.top_k, params.top_p, seed & _MASK64)

    def next_key(self) -> tuple[int, int]:
        """The (hi, lo) 32-bit words of this row's key for its next draw."""
        word = _splitmix64(self.seed ^ _splitmix64(self.draws))
        self.draws += 1
        return word >> 32, word & 0xFFFFFFFF


def _gumbel_rows(keys: mx.array, vocab: int) -> mx.array:
    """(rows, vocab) Gumbel noise, row i drawn from keys[i] alone."""
    return mx.vmap(lambda key: mx.random.gumbel(shape=(vocab,), key=key))(keys)


def _top_k_threshold(order: mx.array, top_k: list[int]) -> mx.array:
    """Each row's top_k[i]-th largest value (0: the smallest), from the descending sort."""
    vocab = order.shape[-1]
    kth = mx.array([min(k, vocab) - 1 if k > 0 else vocab - 1 for k in top_k])[:, None]
    return mx.take_along_axis(order, kth, axis=-1)


def _top_p_threshold(order: mx.array, top_p: list[float]) -> mx.array:
    """Each row's smallest value inside its smallest most-likely set whose mass reaches
    top_p[i] (1: the whole row). `order` is the descending sort, -inf where already cut."""
    norm = order - mx.logsumexp(order, axis=-1, keepdims=True)
    probs = mx.exp(norm)
    mass_before = mx.cumsum(probs, axis=-1) - probs
    p = mx.array([q if 0.0 < q < 1.0 else 2.0 for q in top_p])[:, None]
    kept = (mass_before < p) & (order > -mx.inf)
    return mx.min(mx.where(kept, order, mx.inf), axis=-1, keepdims=True)


def sample_rows(
    logprobs: mx.array,
    rows: Sequence[RowSampling | None],
    allowed: Callable[[mx.array], mx.array] | None = None,
) -> mx.array:
    """Sample one token per row of (rows, vocab) log-probabilities; None rows are greedy.

    `allowed`, if given, maps the log-probabilities to the same with disallowed tokens at
    -inf (a grammar mask); it applies to greedy and sampled rows alike. Advances each
    sampled row's draw counter by one. Returns a lazy (rows,) uint32 array.
    """
    if allowed is not None:
        logprobs = allowed(logprobs)
    greedy = mx.argmax(logprobs, axis=-1)
    sampled = [i for i, row in enumerate(rows) if row is not None]
    if not sampled:
        return greedy
    live = [rows[i] for i in sampled]
    assert all(row is not None for row in live)
    part = logprobs[mx.array(sampled)] if len(sampled) < len(rows) else logprobs
    inv_t = mx.array([1.0 / row.temperature for row in live])[:, None]  # type: ignore[union-attr]
    scaled = part.astype(mx.float32) * inv_t
    scaled = scaled - mx.logsumexp(scaled, axis=-1, keepdims=True)
    top_k = [row.top_k for row in live]  # type: ignore[union-attr]
    top_p = [row.top_p for row in live]  # type: ignore[union-attr]
    if any(k > 0 for k in top_k) or any(0.0 < p < 1.0 for p in top_p):
        order = -mx.sort(-scaled, axis=-1)
        if any(k > 0 for k in top_k):
            threshold = _top_k_threshold(order, top_k)
            order = mx.where(order >= threshold, order, -mx.inf)
        if any(0.0 < p < 1.0 for p in top_p):
            threshold = _top_p_threshold(order, top_p)
        scaled = mx.where(scaled >= threshold, scaled, -mx.inf)
    words = np.array([row.next_key() for row in live], dtype=np.uint32)  # type: ignore[union-attr]
    drawn = mx.argmax(scaled + _gumbel_rows(mx.array(words), scaled.shape[-1]), axis=-1)
    if len(sampled) == len(rows):
        return drawn.astype(greedy.dtype)
    position = {row: n for n, row in enumerate(sampled)}
    pick = mx.array([position.get(i, 0) for i in range(len(rows))])
    is_sampled = mx.array([i in position for i in range(len(rows))])
    return mx.where(is_sampled, drawn[pick].astype(greedy.dtype), greedy)


class RowSampler:
    """Samples one request's row with its own `RowSampling` (None: greedy) and, for
    structured output, its grammar's mask. Engine thread only."""

    def __init__(
        self,
        params: SamplingParams,
        grammar: GrammarRow | None = None,
        masker: Masker | None = None,
        choice: int = 0,
    ) -> None:
        self.row = None if params.greedy else RowSampling.from_params(params, choice)
        self.grammar = grammar
        self._masker = masker

    def __call__(self, logprobs: mx.array) -> mx.array:
        n = logprobs.shape[0]
        allowed = None
        if self.grammar is not None and self._masker is not None:
            # Alone (after the engine's prefill, or a row's first step in mlx-lm) the row's
            # previous token has always been read already: `bitmask` checks it.
            mask = self._masker.bitmask([self.grammar] * n)
            masker = self._masker
            allowed = lambda lp: masker.apply(lp, mask)  # noqa: E731
        return sample_rows(logprobs, [self.row] * n, allowed)


def make_sampler(
    params: SamplingParams,
    grammar: GrammarRow | None = None,
    masker: Masker | None = None,
    choice: int = 0,
) -> Callable[[mx.array], mx.array]:
    """The sampler for one request (or its choice `choice`) alone: the shared greedy
    sampler, or a private one for a seeded or constrained request."""
    if params.greedy and grammar is None:
        return GREEDY
    return RowSampler(params, grammar, masker, choice)


class BatchSampler:
    """The one sampler every row of a `GenerationBatch` holds, bound to that batch.

    `lookup(uid)` returns the row's `RowSampling`, or None for a greedy row; `grammar(uid)`
    the row's `GrammarRow`, or None for a free row. Called by mlx-lm on the engine thread with
    the batch's (rows, vocab) log-probabilities in `batch.uids` order.
    """

    def __init__(
        self,
        batch: object,
        lookup: Callable[[int], RowSampling | None],
        grammar: Callable[[int], GrammarRow | None] | None = None,
        masker: Masker | None = None,
        wants_logprobs: Callable[[int], int | None] | None = None,
    ) -> None:
        self._batch = batch
        self._lookup = lookup
        self._grammar = grammar
        self._masker = masker
        # uid -> None (no logprobs) or how many alternatives the row's request wants.
        self._wants_logprobs = wants_logprobs
        # The log-probabilities of the tokens sampled by the last call (read a step later).
        self.stash: StepLogprobs | None = None

    def __call__(self, logprobs: mx.array) -> mx.array:
        uids = self._batch.uids  # type: ignore[attr-defined]
        if logprobs.shape[0] != len(uids):
            raise RuntimeError(f"sampler bound to {len(uids)} rows got {logprobs.shape[0]}")
        rows = [self._lookup(uid) for uid in uids]
        grammars = [self._grammar(uid) for uid in uids] if self._grammar is not None else []
        if not any(g is not None for g in grammars) or self._masker is None:
            sampled = sample_rows(logprobs, rows)
        else:
            mask = self._constrain(logprobs, grammars)
            masker = self._masker
            sampled = sample_rows(logprobs, rows, lambda lp: masker.apply(lp, mask))
        self.stash = self._logprobs(uids, logprobs, sampled)
        return sampled

    def _logprobs(
        self, uids: list[int], logprobs: mx.array, sampled: mx.array
    ) -> StepLogprobs | None:
        """The rows' log-probability values, queued with this step, when any row asked."""
        if self._wants_logprobs is None:
            return None
        wants = [self._wants_logprobs(uid) for uid in uids]
        if all(w is None for w in wants):
            return None
        return StepLogprobs(uids, logprobs, sampled, with_top=any(w for w in wants))

    def _constrain(self, logprobs: mx.array, grammars: list[GrammarRow | None]) -> np.ndarray:
        """Read the tokens this step feeds into the matchers, then compute the next masks,
        while the step's forward pass (launched first) runs."""
        mx.async_eval(logprobs)
        fed = self._batch._current_tokens.tolist()  # type: ignore[attr-defined]
        for grammar, token in zip(grammars, fed, strict=True):
            if grammar is not None:
                grammar.catch_up(int(token))
        assert self._masker is not None
        return self._masker.bitmask(grammars)

    def bind_all_rows(self) -> None:
        """Make every row of the batch hold this sampler (rows join with their own)."""
        samplers = self._batch.samplers  # type: ignore[attr-defined]
        if len(samplers) != len(self._batch.uids) or any(s is not self for s in samplers):  # type: ignore[attr-defined]
            self._batch.samplers = [self] * len(self._batch.uids)  # type: ignore[attr-defined]
