"""Per-request token samplers and logprob extraction.

BatchGenerator calls one sampler per row with that row's log-probabilities (1, vocab) when
rows differ, and once for the whole batch when every row shares the same sampler object. All
greedy rows therefore share `GREEDY`, so an all-greedy batch samples in one argmax.

A seeded sampler owns its PRNG key, so a request's random draws do not depend on which other
requests share its batch: the same seed gives the same tokens, batched or alone.
"""

from __future__ import annotations

import random

import mlx.core as mx
from mlx_lm.sample_utils import apply_top_k, apply_top_p, greedy_sampler

from gateway.engine.request import SamplingParams

GREEDY = greedy_sampler


class SeededSampler:
    """Temperature, then top-k, then top-p, then a categorical draw with a private key.

    Not thread-safe: used only on the engine thread, one instance per request.
    """

    def __init__(self, params: SamplingParams) -> None:
        seed = params.seed if params.seed is not None else random.getrandbits(63)
        self._key = mx.random.key(seed)
        self._inv_temperature = 1.0 / params.temperature
        self._top_k = params.top_k
        self._top_p = params.top_p

    def __call__(self, logprobs: mx.array) -> mx.array:
        scaled = logprobs * self._inv_temperature
        scaled = scaled - mx.logsumexp(scaled, axis=-1, keepdims=True)
        if 0 < self._top_k < scaled.shape[-1]:
            scaled = apply_top_k(scaled, self._top_k)
        if 0.0 < self._top_p < 1.0:
            scaled = apply_top_p(scaled, self._top_p)
        self._key, draw = mx.random.split(self._key)
        return mx.random.categorical(scaled, key=draw)


def make_sampler(params: SamplingParams) -> object:
    """The sampler for one request: the shared greedy sampler or a private seeded one."""
    return GREEDY if params.greedy else SeededSampler(params)


def top_logprobs(logprobs: mx.array, k: int) -> list[tuple[int, float]]:
    """The k most likely (token id, logprob) pairs of one row's (vocab,) log-probabilities."""
    if k <= 0:
        return []
    k = min(k, logprobs.shape[-1])
    idx = mx.argpartition(-logprobs, kth=k - 1)[:k]
    vals = logprobs[idx]
    order = mx.argsort(-vals)
    idx, vals = idx[order], vals[order]
    return list(zip(idx.tolist(), vals.astype(mx.float32).tolist()))
