"""The log-probabilities a request asked for, computed inside the decode step's graph.

Reading a token's log-probability after a step (`row[token].item()`, a top-k over the row)
puts new work on the engine's stream behind the step mlx-lm has already queued (it computes
one step ahead), so the engine thread waits for that step before it emits the next row's
token: with `logprobs` on, the step's Python and device time add up instead of overlapping.
On the 2-core CPU that wait was 345 us per token per row, most of a 32-row step's time.

Instead the batch's sampler (gateway.engine.tokens.sampling.BatchSampler) computes, in the step
that samples the tokens, every row's chosen log-probability and, when some row asked for
alternatives, the top TOP_K of every row, and queues them with the step (`StepLogprobs`);
the engine reads them one step later, when the tokens they belong to are reported and the
values are long computed.

Alternatives are always the top TOP_K (the API's maximum), sorted, of which a request gets
its first `top_logprobs`: one procedure for a row alone or in any batch, and for the first
token (from the prefill's logits, `row_values`), so the batch never changes what a request
sees. Engine thread only.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import mlx.core as mx

TOP_K = 20  # OpenAI's largest `top_logprobs`


@dataclass(frozen=True)
class LogprobValues:
    """One generated token's log-probability and the most likely alternatives, as
    (token id, log-probability), most likely first (at most TOP_K; none unless asked)."""

    chosen: float
    top: tuple[tuple[int, float], ...]


def _top(logprobs: mx.array) -> tuple[mx.array, mx.array]:
    """Lazily, the TOP_K most likely (ids, float32 log-probabilities) of each row of a
    (rows, vocab) array, most likely first."""
    k = min(TOP_K, logprobs.shape[-1])
    ids = mx.argpartition(-logprobs, kth=k - 1, axis=-1)[:, :k]
    values = mx.take_along_axis(logprobs, ids, axis=-1)
    order = mx.argsort(-values, axis=-1)
    ids = mx.take_along_axis(ids, order, axis=-1)
    return ids, mx.take_along_axis(values, order, axis=-1).astype(mx.float32)


class StepLogprobs:
    """The values of one decode step's rows, queued on the stream with the step (lazy until
    read); rows by uid. `with_top`: compute the alternatives too (some row asked)."""

    def __init__(
        self, uids: Sequence[int], logprobs: mx.array, sampled: mx.array, with_top: bool
    ) -> None:
        self._rows = {uid: i for i, uid in enumerate(uids)}
        self._sampled = sampled
        index = sampled.astype(mx.int32).reshape(-1, 1)
        self._chosen = mx.take_along_axis(logprobs, index, axis=-1)[:, 0].astype(mx.float32)
        self._top = _top(logprobs) if with_top else None
        mx.async_eval(self._chosen, *(self._top or ()))
        self._host: tuple[list[int], list[float], list[list[int]], list[list[float]]] | None = None

    def get(self, uid: int, token: int, top: int) -> LogprobValues | None:
        """Row `uid`'s values if this step sampled `token` for it (else None), with its first
        `top` alternatives."""
        row = self._rows.get(uid)
        if row is None:
            return None
        if self._host is None:  # one read for the whole step
            ids, values = self._top if self._top is not None else (None, None)
            self._host = (
                self._sampled.tolist(),
                self._chosen.tolist(),
                ids.tolist() if ids is not None else [],
                values.tolist() if values is not None else [],
            )
        sampled, chosen, ids, values = self._host
        if sampled[row] != token or (top and not ids):
            return None
        pairs = tuple(zip(ids[row][:top], values[row][:top])) if top else ()
        return LogprobValues(chosen[row], pairs)


def row_values(row: mx.array, token: int, top: int) -> LogprobValues:
    """The values of `token` in one (vocab,) row of log-probabilities, now (evaluates: for the
    prefill's first token, which is evaluated anyway, and rare fallbacks)."""
    chosen = row[token].astype(mx.float32)
    if not top:
        return LogprobValues(float(chosen.item()), ())
    ids, values = _top(row[None])
    mx.eval(chosen, ids, values)
    pairs = tuple(zip(ids[0, :top].tolist(), values[0, :top].tolist()))
    return LogprobValues(float(chosen.item()), pairs)
