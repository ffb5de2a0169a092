"""The hotpath client's decode figures from per-token arrival times.

Pinned: the steady-window figure counts only tokens that arrive while every stream decodes,
each stream's first `skip` tokens left out (raw's window, so the ratio is like for like),
while the aggregate counts the whole wave from the first first-token; a failed or too short
stream gives no steady figure.
"""

from __future__ import annotations

import pytest

from bench.hotpath_client import Stream, aggregate_tok_s, steady_tok_s


def _stream(start: float, step: float, tokens: int, error: str | None = None) -> Stream:
    times = [start + step * i for i in range(tokens)]
    return Stream(0.0, first=times[0], last=times[-1], completion_tokens=tokens, times=times,
                  error=error)  # fmt: skip


def test_steady_window_leaves_out_the_wave_start() -> None:
    # Stream b joins 1 s late (admitted in a later step): the aggregate pays for that second,
    # the steady window starts once b has its first 2 tokens and ends at a's last token.
    a, b = _stream(0.0, 0.01, 300), _stream(1.0, 0.01, 100)
    assert steady_tok_s([a, b], skip=2) == pytest.approx(200.0, rel=0.02)  # 2 streams x 100/s
    assert aggregate_tok_s([a, b]) == pytest.approx(400 / 2.99, rel=0.01)


def test_no_steady_figure_for_failed_or_short_streams() -> None:
    assert steady_tok_s([_stream(0.0, 0.01, 50), _stream(0.0, 0.01, 50, error="boom")]) is None
    assert steady_tok_s([_stream(0.0, 0.01, 10)], skip=10) is None
    assert steady_tok_s([]) is None
