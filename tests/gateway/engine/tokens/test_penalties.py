"""Logit shaping: penalties, biases and min_tokens, batched.

Pinned here: `shape` computes OpenAI's presence/frequency penalties, vLLM's repetition
penalty, logit_bias and the min_tokens mask as a plain per-row reference does; the batch
shaper leaves a batch without shaped rows untouched (the very same array), leaves unshaped
rows of a mixed batch bit for bit, shapes a row the same alone, batched, and after rows join
or leave, and counts the tokens it feeds.
"""

from __future__ import annotations

from types import SimpleNamespace

import mlx.core as mx
import numpy as np

from gateway.engine.request import SamplingParams
from gateway.engine.tokens.penalties import BatchShaper, RowShaping, shape_first

VOCAB = 12
STOPS = (11,)


def _row(prompt=(1, 2), **params: object) -> RowShaping:
    shaping = RowShaping.from_params(SamplingParams(64, **params), prompt)  # type: ignore[arg-type]
    assert shaping is not None
    return shaping


def _reference(logits: np.ndarray, row: RowShaping, output: list[int]) -> np.ndarray:
    """One row shaped the slow, obvious way (float32)."""
    x = logits.astype(np.float32).copy()
    counts = np.bincount(np.asarray(output, dtype=np.int64), minlength=VOCAB)
    for token in set(row.prompt) | set(output):
        if row.repetition != 1.0:
            x[token] = x[token] / row.repetition if x[token] > 0 else x[token] * row.repetition
    x -= row.frequency * counts + row.presence * (counts > 0)
    for token, bias in row.bias:
        x[token] += bias
    if len(output) < row.min_tokens:
        x[list(STOPS)] = -np.inf
    return x


class _Model:
    """Fixed logits per call: (rows, 1, vocab) from a seeded generator."""

    def __init__(self) -> None:
        self.calls = 0

    def __call__(self, inputs: mx.array, cache: object = None) -> mx.array:
        self.calls += 1
        rng = np.random.default_rng(self.calls)
        return mx.array(rng.normal(0, 3, (inputs.shape[0], 1, VOCAB)).astype(np.float32))


def _shaper(rows: dict[int, RowShaping | None]) -> tuple[BatchShaper, SimpleNamespace, _Model]:
    batch = SimpleNamespace(uids=list(rows))
    model = _Model()
    return BatchShaper(model, batch, rows.get, STOPS), batch, model


def test_shape_matches_the_reference_for_every_setting() -> None:
    """Invariant: each setting alone and all together shape a row as the reference does."""
    settings = [
        {"presence_penalty": 1.5},
        {"frequency_penalty": 0.7},
        {"repetition_penalty": 1.8},
        {"logit_bias": ((3, 100.0), (4, -100.0))},
        {"min_tokens": 3},
        {
            "presence_penalty": -0.5,
            "frequency_penalty": 1.1,
            "repetition_penalty": 0.6,
            "logit_bias": ((0, 5.0),),
            "min_tokens": 2,
        },
    ]
    fed = [5, 7, 5, 11, 5]
    for params in settings:
        row = _row(**params)
        shaper, batch, model = _shaper({0: row})
        for step, token in enumerate(fed):
            out = shaper(mx.array([[token]]))
            model_logits = np.array(_Model.__call__(SimpleNamespace(calls=step), mx.array([[0]])))
            expected = _reference(model_logits[0, 0], row, fed[: step + 1])
            got = np.array(out)[0, 0]
            np.testing.assert_allclose(got, expected, rtol=1e-6, err_msg=str(params))
        assert row.generated == len(fed)


def test_first_token_is_shaped_with_no_output_yet() -> None:
    """Invariant: the prefill's logits get the prompt's repetition penalty, the bias and the
    min_tokens mask, and no output penalty."""
    row = _row(prompt=(2, 3), repetition_penalty=2.0, presence_penalty=9.0,
               logit_bias=((6, 4.0),), min_tokens=1)  # fmt: skip
    logits = np.linspace(-3, 3, VOCAB, dtype=np.float32)[None]
    out = np.array(shape_first(mx.array(logits), row, STOPS))[0]
    np.testing.assert_allclose(out, _reference(logits[0], row, []), rtol=1e-6)
    same = shape_first(mx.array(logits), None, STOPS)
    np.testing.assert_array_equal(np.array(same), logits)


def test_a_batch_without_shaped_rows_is_untouched() -> None:
    """Invariant: no shaped row, no shaping: the forward's own array comes back (the same
    graph as before penalties existed)."""
    shaper, _, model = _shaper({0: None, 1: None})
    seen = []
    original = model.__call__

    def spy(inputs: mx.array, cache: object = None) -> mx.array:
        seen.append(original(inputs, cache))
        return seen[-1]

    shaper._model = spy
    out = shaper(mx.array([[1], [2]]))
    assert out is seen[0]


def test_unshaped_rows_keep_their_bits_beside_shaped_ones() -> None:
    """Invariant: in a mixed batch the unshaped rows' logits are the forward's, bit for bit,
    and the shaped row's are what it gets alone."""
    shaped = _row(frequency_penalty=1.0, logit_bias=((2, 3.0),))
    mixed, _, _ = _shaper({0: None, 1: shaped, 2: None})
    out = np.array(mixed(mx.array([[4], [4], [4]])))
    raw = np.array(_Model()(mx.array([[0], [0], [0]])))
    np.testing.assert_array_equal(out[[0, 2]], raw[[0, 2]])
    alone_row = _row(frequency_penalty=1.0, logit_bias=((2, 3.0),))
    np.testing.assert_array_equal(out[1, 0], _reference(raw[1, 0], alone_row, [4]))


def test_rows_joining_and_leaving_keep_each_rows_counts() -> None:
    """Invariant: a row's counts follow it when the batch's rows change: a row that stays
    keeps its history, a new row starts from none."""
    a = _row(frequency_penalty=1.0)
    b = _row(frequency_penalty=1.0)
    rows: dict[int, RowShaping | None] = {0: a}
    shaper, batch, _ = _shaper(rows)
    shaper(mx.array([[3]]))
    shaper(mx.array([[3]]))
    rows[1], batch.uids = b, [0, 1]
    shaper(mx.array([[3], [3]]))
    del rows[0]
    batch.uids = [1]
    shaper(mx.array([[3]]))
    counts = np.array(shaper._counts)
    assert counts.shape == (1, VOCAB) and counts[0, 3] == 2  # b fed 3 twice
    assert (a.generated, b.generated) == (3, 2)
