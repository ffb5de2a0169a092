"""The batched sampler: one draw for all rows, each row reproducible from its own seed.

Pinned here: a row's tokens depend only on its own settings, seed and draw count (not on the
other rows, their order, or greedy rows beside it); draws follow the distribution; top-k and
top-p keep exactly the tokens they should; the one-per-batch sampler refuses a batch it is not
bound to.
"""

from __future__ import annotations

import copy
from collections import Counter
from types import SimpleNamespace

import mlx.core as mx
import numpy as np
import pytest

from gateway.engine.request import SamplingParams
from gateway.engine.tokens.sampling import BatchSampler, RowSampling, sample_rows

VOCAB = 6
PROBS = np.array([0.4, 0.25, 0.15, 0.1, 0.06, 0.04])


def _logprobs(rows: int) -> mx.array:
    return mx.log(mx.array(np.tile(PROBS, (rows, 1)), dtype=mx.float32))


def _row(seed: int, temperature: float = 1.0, top_k: int = 0, top_p: float = 1.0) -> RowSampling:
    params = SamplingParams(32, temperature=temperature, top_k=top_k, top_p=top_p, seed=seed)
    return RowSampling.from_params(params)


def _draw(rows: list[RowSampling | None], steps: int) -> list[list[int]]:
    out = []
    for _ in range(steps):
        out.append(sample_rows(_logprobs(len(rows)), rows).tolist())
    return [list(col) for col in zip(*out, strict=True)]


def test_a_row_draws_the_same_alone_and_in_any_batch() -> None:
    """Invariant: same seed, same tokens, whatever else shares the batch and in what order."""
    rows = [_row(1, 0.7), _row(2, 1.3, top_p=0.8), None, _row(3, top_k=3)]
    alone = [_draw([copy.deepcopy(r)], 20)[0] if r else None for r in rows]
    together = _draw([copy.deepcopy(r) for r in rows], 20)
    reversed_ = _draw([copy.deepcopy(r) for r in reversed(rows)], 20)[::-1]
    for i, expected in enumerate(alone):
        if expected is None:
            assert together[i] == [0] * 20  # greedy: the most likely token every time
            continue
        assert together[i] == expected
        assert reversed_[i] == expected
    assert len({tuple(t) for t in together}) == len(rows)


def test_other_seeds_give_other_draws() -> None:
    """Guard: the equality above could hold for a sampler that ignores the seed."""
    draws = _draw([_row(seed) for seed in range(8)], 16)
    assert len({tuple(d) for d in draws}) == 8


def test_draws_follow_the_distribution() -> None:
    """Invariant: at temperature 1 token frequencies match the probabilities."""
    rows = [_row(seed) for seed in range(4000)]
    counts = Counter(sample_rows(_logprobs(len(rows)), rows).tolist())
    freq = np.array([counts[t] for t in range(VOCAB)]) / len(rows)
    assert np.abs(freq - PROBS).max() < 0.03


def test_temperature_sharpens_and_flattens() -> None:
    """Invariant: low temperature concentrates draws on the top token, high spreads them."""

    def top_share(temperature: float) -> float:
        rows = [_row(seed, temperature) for seed in range(2000)]
        return sample_rows(_logprobs(len(rows)), rows).tolist().count(0) / len(rows)

    assert top_share(0.2) > 0.9
    assert top_share(3.0) < 0.3


@pytest.mark.parametrize(
    ("top_k", "top_p", "allowed"),
    [(2, 1.0, {0, 1}), (0, 0.6, {0, 1}), (0, 0.35, {0}), (0, 0.66, {0, 1, 2}), (2, 0.9, {0, 1})],
)
def test_top_k_and_top_p_keep_exactly_their_tokens(
    top_k: int, top_p: float, allowed: set[int]
) -> None:
    """Invariant: top-k keeps the k most likely tokens; top-p keeps the smallest most-likely
    set whose probability reaches p; all of the kept tokens stay reachable."""
    rows = [_row(seed, top_k=top_k, top_p=top_p) for seed in range(3000)]
    drawn = set(sample_rows(_logprobs(len(rows)), rows).tolist())
    assert drawn == allowed


def test_cut_rows_do_not_cut_their_neighbours() -> None:
    """Invariant: one row's top-k/top-p does not leak into an uncut row of the same batch."""
    rows = [_row(seed, top_k=1 + seed % 2) if seed % 3 == 0 else _row(seed) for seed in range(3000)]
    tokens = sample_rows(_logprobs(len(rows)), rows).tolist()
    uncut = {t for t, r in zip(tokens, rows, strict=True) if r.top_k == 0}
    cut = {t for t, r in zip(tokens, rows, strict=True) if r.top_k > 0}
    assert uncut == set(range(VOCAB))
    assert cut == {0, 1}


def test_batch_sampler_follows_the_batch_order_and_checks_its_size() -> None:
    """Invariant: the bound sampler reads rows in the batch's uid order, and a call with a
    different number of rows than the batch holds is refused instead of mis-assigning seeds."""
    states = {10: _row(1), 11: None, 12: _row(2)}
    batch = SimpleNamespace(uids=[12, 11, 10], samplers=[])
    sampler = BatchSampler(batch, states.get)
    sampler.bind_all_rows()
    assert batch.samplers == [sampler] * 3
    expected = sample_rows(_logprobs(3), [copy.deepcopy(states[u]) for u in batch.uids])
    assert sampler(_logprobs(3)).tolist() == expected.tolist()
    with pytest.raises(RuntimeError):
        sampler(_logprobs(2))
