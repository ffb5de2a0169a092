"""Penalties, biases and `min_tokens`: the logits a row's token is drawn from, shaped per row
in one batched computation.

What a row may ask for (OpenAI's and vLLM's semantics, on the model's raw logits):

    presence_penalty     subtract p from every token that appeared in the output so far
    frequency_penalty    subtract f x (times the token appeared in the output so far)
    repetition_penalty   (vLLM / Hugging Face) for every token of the prompt or the output so
                         far: divide its logit by r where positive, multiply where negative
    logit_bias           add bias[token] (token ids checked against the vocabulary upstream)
    min_tokens           end-of-sequence tokens at -inf until the row has generated that many

The order is repetition, then frequency and presence, then the bias, then the `min_tokens`
mask; the shaped logits go back in the model's dtype. Everything after that (log-softmax,
temperature, top-k, top-p, the grammar mask, the draw) is the sampler's, unchanged, and the
log-probabilities a request gets back are of this shaped distribution (vLLM's
`processed_logprobs`; before temperature and top-k/top-p, as always here).

How: `BatchShaper` stands in for the model inside mlx-lm's generation batch. It runs the
forward, and when some row of the batch is shaped it updates the shaped rows' output counts
on the device with the tokens this step feeds (one scatter, no host read: mlx-lm feeds the
tokens it sampled a step earlier, still lazy) and applies `shape` to those rows, all of them
in one set of (rows, vocab) array ops. A batch without a shaped row returns the forward's
logits untouched: the same graph as before, bit for bit. The state (counts, prompt tokens,
biases as (rows, vocab) arrays) is rebuilt only when the shaped rows change.

A row's first token comes from the prefill's logits (`shape_first`): the same `shape` on a
one-row state with no output yet, so a row draws the same alone, batched, cached or not.
Engine thread only.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import mlx.core as mx
import numpy as np

from gateway.engine.request import SamplingParams


@dataclass
class RowShaping:
    """One request's shaping settings, its prompt and how many tokens it has generated
    (counted by whoever feeds them). Engine thread only."""

    presence: float
    frequency: float
    repetition: float
    bias: tuple[tuple[int, float], ...]
    min_tokens: int
    prompt: tuple[int, ...]
    generated: int = field(default=0)

    @classmethod
    def from_params(cls, params: SamplingParams, prompt: Sequence[int]) -> RowShaping | None:
        """The row's shaping, None when it asks for none (the unshaped path)."""
        if not params.shaped:
            return None
        return cls(
            params.presence_penalty,
            params.frequency_penalty,
            params.repetition_penalty,
            params.logit_bias,
            params.min_tokens,
            tuple(prompt),
        )


@dataclass(frozen=True)
class Terms:
    """Which terms some row of the step uses; a term no row uses is left out of the graph
    (for a row that does not use a term it is the identity, exactly: x * 1, x - 0, x + 0)."""

    repetition: bool
    penalties: bool  # presence or frequency
    bias: bool
    hold: bool  # some row is still under min_tokens

    @classmethod
    def of(cls, rows: Sequence[RowShaping]) -> Terms:
        return cls(
            any(r.repetition != 1.0 for r in rows),
            any(r.presence or r.frequency for r in rows),
            any(r.bias for r in rows),
            any(r.generated < r.min_tokens for r in rows),
        )


def _shape(
    terms: Terms,
    logits: mx.array,
    counts: mx.array,
    prompt_seen: mx.array,
    bias: mx.array,
    settings: mx.array,
    stop_ids: mx.array,
) -> mx.array:
    """Shaped (rows, vocab) logits (see `shape`). Arithmetic, not `mx.where`, over the whole
    vocabulary: where is ~25x slower than a multiply on MLX's CPU backend (100 ms at 32 x
    152k). The repetition factor is exactly 1 for an unseen token, and the reciprocal of the
    penalty (positive logit) or the penalty (negative) for a seen one."""
    x = logits.astype(mx.float32)
    presence, frequency = settings[:, 0:1], settings[:, 1:2]
    repetition, hold = settings[:, 2:3], settings[:, 3:4]
    if terms.repetition:
        seen = ((counts > 0) | prompt_seen).astype(mx.float32)
        positive = (x > 0).astype(mx.float32)
        factor = positive * (1.0 / repetition) + (1.0 - positive) * repetition
        x = x * (seen * factor + (1.0 - seen))
    if terms.penalties:
        x = x - frequency * counts - presence * (counts > 0).astype(mx.float32)
    if terms.bias:
        x = x + bias
    if terms.hold and stop_ids.size:  # only the end tokens' columns
        x[:, stop_ids] = mx.where(hold > 0, -mx.inf, x[:, stop_ids])
    return x.astype(logits.dtype)


_COMPILED: dict[Terms, Callable[..., mx.array]] = {}


def shape(
    terms: Terms,
    logits: mx.array,
    counts: mx.array,
    prompt_seen: mx.array,
    bias: mx.array,
    settings: mx.array,
    stop_ids: mx.array,
) -> mx.array:
    """Shaped (rows, vocab) logits, one compiled graph per set of `terms`. `counts`: float32
    output counts per token; `prompt_seen`: bool, the prompt's tokens; `bias`: float32;
    `settings`: (rows, 4) float32 columns presence, frequency, repetition, hold (1.0 while
    `min_tokens` masks); `stop_ids`: the end-of-sequence token ids. Returns the logits'
    dtype."""
    compiled = _COMPILED.get(terms)
    if compiled is None:
        compiled = _COMPILED[terms] = mx.compile(lambda *a: _shape(terms, *a))
    return compiled(logits, counts, prompt_seen, bias, settings, stop_ids)


def _row_arrays(row: RowShaping, vocab: int) -> tuple[np.ndarray, np.ndarray]:
    """A new row's prompt-token mask and bias vector (host arrays, built once per row)."""
    seen = np.zeros(vocab, dtype=np.bool_)
    if row.repetition != 1.0 and row.prompt:
        seen[np.asarray(row.prompt, dtype=np.int64)] = True
    bias = np.zeros(vocab, dtype=np.float32)
    for token, value in row.bias:
        if not 0 <= token < vocab:
            raise ValueError(f"logit_bias token {token} is outside the vocabulary ({vocab})")
        bias[token] = value
    return seen, bias


def _settings(rows: Sequence[RowShaping]) -> mx.array:
    return mx.array(
        [
            [r.presence, r.frequency, r.repetition, 1.0 if r.generated < r.min_tokens else 0.0]
            for r in rows
        ],
        dtype=mx.float32,
    )


def _stop_ids(stop_ids: Sequence[int], vocab: int) -> mx.array:
    return mx.array(sorted({t for t in stop_ids if 0 <= t < vocab}), dtype=mx.int32)


def shape_first(logits: mx.array, row: RowShaping | None, stop_ids: Sequence[int]) -> mx.array:
    """A row's (1, vocab) prefill logits, shaped for its first token (None: unchanged)."""
    if row is None:
        return logits
    vocab = logits.shape[-1]
    seen, bias = _row_arrays(row, vocab)
    counts = mx.zeros((1, vocab), dtype=mx.float32)
    return shape(
        Terms.of([row]),
        logits,
        counts,
        mx.array(seen[None]),
        mx.array(bias[None]),
        _settings([row]),
        _stop_ids(stop_ids, vocab),
    )


class BatchShaper:
    """The model as mlx-lm's generation batch calls it, shaping the batch's shaped rows.

    `model(inputs, cache=...)` is the text core; `batch` the generation batch (its `uids`
    are the rows, in order); `lookup(uid)` a row's `RowShaping` or None. Counts each shaped
    row's fed tokens (`RowShaping.generated`). Engine thread only.
    """

    def __init__(
        self,
        model: Callable[..., mx.array],
        batch: Any,
        lookup: Callable[[int], RowShaping | None],
        stop_ids: Sequence[int],
    ) -> None:
        self._model = model
        self._batch = batch
        self._lookup = lookup
        self._stop_ids = tuple(stop_ids)
        self._order: tuple[int, ...] = ()  # the uids the state's rows belong to, in order
        self._counts: mx.array | None = None
        self._seen: mx.array | None = None
        self._bias: mx.array | None = None
        self._stops: mx.array | None = None

    def __getattr__(self, name: str) -> Any:  # anything else mlx-lm reads off the model
        return getattr(self._model, name)

    def __call__(self, inputs: mx.array, cache: Any = None, **kwargs: Any) -> mx.array:
        logits = self._model(inputs, cache=cache, **kwargs)
        uids = self._batch.uids
        rows = [self._lookup(uid) for uid in uids]
        live = [i for i, row in enumerate(rows) if row is not None]
        if not live:
            self._order, self._counts = (), None  # the unshaped path: logits untouched
            return logits
        shaped_rows: list[RowShaping] = [rows[i] for i in live]  # type: ignore[misc]
        last = logits[:, -1, :]
        self._track(tuple(uids[i] for i in live), shaped_rows, last.shape[-1])
        every = len(live) == len(uids)
        index = None if every else mx.array(live)
        fed = inputs[:, -1] if index is None else inputs[index, -1]
        assert self._counts is not None
        self._counts = self._counts.at[mx.arange(len(live)), fed].add(1.0)
        for row in shaped_rows:
            row.generated += 1  # the fed token is one the row generated
        part = last if index is None else last[index]
        terms = Terms.of(shaped_rows)
        settings = _settings(shaped_rows)
        out = shape(terms, part, self._counts, self._seen, self._bias, settings, self._stops)
        if index is None:
            return out[:, None, :]
        last[index] = out
        return last[:, None, :]

    def _track(self, order: tuple[int, ...], rows: list[RowShaping], vocab: int) -> None:
        """Make the state's rows those of `order`: kept rows keep their counts; new rows
        start from their prompt and bias with no output counted."""
        if order == self._order and self._counts is not None:
            return
        old = {uid: i for i, uid in enumerate(self._order)} if self._counts is not None else {}
        counts, seen, bias = [], [], []
        for uid, row in zip(order, rows, strict=True):
            if uid in old:
                i = old[uid]
                counts.append(self._counts[i])  # type: ignore[index]
                seen.append(self._seen[i])  # type: ignore[index]
                bias.append(self._bias[i])  # type: ignore[index]
                continue
            row_seen, row_bias = _row_arrays(row, vocab)
            counts.append(mx.zeros((vocab,), dtype=mx.float32))
            seen.append(mx.array(row_seen))
            bias.append(mx.array(row_bias))
        self._counts, self._seen, self._bias = mx.stack(counts), mx.stack(seen), mx.stack(bias)
        if self._stops is None:
            self._stops = _stop_ids(self._stop_ids, vocab)
        self._order = order
