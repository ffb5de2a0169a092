"""What the raw ceiling measures, on any mlx-lm-style text model (tokens in, logits out).

Discipline: every timed region starts after `mx.synchronize()` and ends with the result
evaluated, and every shape is run untimed first (kernels compiled, buffers pooled), so the
figures are the steady-state cost of the work and nothing else.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

import mlx.core as mx
from mlx_lm.models.cache import make_prompt_cache

T = TypeVar("T")

Log = Callable[[str], None]


@dataclass(frozen=True)
class RawSettings:
    """Sizes of the raw measurements (tokens unless named otherwise)."""

    batches: tuple[int, ...] = (1, 16, 32)  # decode batch sizes
    decode_tokens: int = 128  # timed tokens per row (after `skip_tokens`)
    skip_tokens: int = 10  # per row, left out of the timing (ramp-up)
    prompt_tokens: int = 128  # decode prompts
    decode_reps: int = 3  # timed decode waves per batch size (the median is reported)
    prefix_tokens: int = 1400  # P: warm-TTFT prefix already in the cache; prefill length
    suffix_tokens: int = 20  # warm-TTFT new tokens
    text_tokens: int = 30  # text first token: prompt from an empty cache
    prefill_chunk: int = 512  # prefix fill chunk (as the gateway's default --prefill-chunk)
    reps: int = 5  # timed repetitions per figure (the median is reported)
    warmups: int = 2  # untimed repetitions first
    decode_only: bool = False  # skip the TTFT and prefill figures (a drift re-check)


def steady_window(rows: Sequence[Sequence[float]], skip: int) -> tuple[int, float]:
    """(tokens, seconds) of the steady part of a batched decode.

    `rows[i]` are the arrival times (s) of row i's tokens. The window opens once every row has
    produced `skip` tokens and closes when the first row produces its last token, so every row
    is decoding throughout; tokens arriving inside (open, close] are counted. (0, 0.0) when
    there is no such window (a row shorter than `skip + 1` tokens).
    """
    if not rows or min(len(r) for r in rows) <= skip:
        return 0, 0.0
    opened = max(r[skip - 1] if skip else r[0] for r in rows)
    closed = min(r[-1] for r in rows)
    tokens = sum(1 for r in rows for t in r if opened < t <= closed)
    return (tokens, closed - opened) if closed > opened else (0, 0.0)


def wave_window(rows: Sequence[Sequence[float]]) -> tuple[int, float]:
    """(tokens, seconds) of a whole wave, ramp included: every token of every row over the
    time from the first row's first token to the last row's last token (how a server's
    `aggregate_tok_s` measures a wave of streams). (0, 0.0) for an empty wave."""
    rows = [r for r in rows if r]
    if not rows:
        return 0, 0.0
    seconds = max(r[-1] for r in rows) - min(r[0] for r in rows)
    return (sum(len(r) for r in rows), seconds) if seconds > 0 else (0, 0.0)


def median_wave(waves: Sequence[T], key: Callable[[T], Any] | None = None) -> T:
    """The middle of `waves` ordered by `key` (default: the waves themselves, e.g. tuples
    led by tok/s): the one figure reported of several decode waves. A lent GPU VM moves
    14-40% within minutes, so raw, engine and HTTP figures each take the median wave."""
    return sorted(waves, key=key)[len(waves) // 2]  # type: ignore[arg-type]


def token_ids(n: int, vocab: int, salt: int) -> list[int]:
    """`n` deterministic ordinary token ids (clear of the low and special ids of any vocab)."""
    span = min(vocab, 5000) - 20
    return [(7 * j + 13 * salt) % span + 10 for j in range(n)]


def cold_ms(model: Any, ids: list[int], settings: RawSettings) -> float:
    """Median wall ms of `first_token` on `ids` from an empty cache, after `warmups` untimed
    runs."""
    times = []
    for rep in range(settings.warmups + settings.reps):
        cache = make_prompt_cache(model)
        mx.synchronize()
        started = time.perf_counter()
        mx.eval(first_token(model, ids, cache))
        if rep >= settings.warmups:
            times.append(time.perf_counter() - started)
    return 1000 * statistics.median(times)


def first_token(model: Any, ids: list[int], cache: list[Any]) -> mx.array:
    """Forward `ids` (appending to `cache`, as a server would) and the last position's argmax."""
    return mx.argmax(model(mx.array([ids]), cache=cache)[:, -1, :], axis=-1)


def warm_ttft_ms(model: Any, settings: RawSettings, vocab: int) -> float:
    """Prefix of P tokens already in a KV cache, then a suffix forward + argmax (untimed:
    filling the prefix)."""
    times = []
    for rep in range(settings.warmups + settings.reps):
        cache = make_prompt_cache(model)
        prefix = token_ids(settings.prefix_tokens, vocab, 1)
        for start in range(0, len(prefix), settings.prefill_chunk):
            model(mx.array([prefix[start : start + settings.prefill_chunk]]), cache=cache)
            mx.eval([c.state for c in cache])
        suffix = token_ids(settings.suffix_tokens, vocab, 100 + rep)
        mx.synchronize()
        started = time.perf_counter()
        mx.eval(first_token(model, suffix, cache))
        if rep >= settings.warmups:
            times.append(time.perf_counter() - started)
    return 1000 * statistics.median(times)


def decode(model: Any, batch: int, settings: RawSettings, vocab: int) -> tuple[float, float, float]:
    """(aggregate tok/s, ms per step, whole-wave tok/s) of mlx-lm's BatchGenerator decoding
    `batch` rows of `prompt_tokens`-token prompts for `skip + decode_tokens` tokens each: the
    first two over the `steady_window`, the third over the `wave_window` (its prefill ramp
    included, as a server's wave of new streams is measured)."""
    from mlx_lm.generate import BatchGenerator

    gen = BatchGenerator(model, completion_batch_size=batch, prefill_batch_size=min(batch, 8))
    prompts = [token_ids(settings.prompt_tokens, vocab, i) for i in range(batch)]
    uids = gen.insert(prompts, max_tokens=[settings.skip_tokens + settings.decode_tokens] * batch)
    arrivals: dict[int, list[float]] = {uid: [] for uid in uids}
    try:
        while responses := gen.next_generated():
            now = time.perf_counter()
            for r in responses:
                arrivals[r.uid].append(now)
    finally:
        gen.close()
    rows = list(arrivals.values())
    tokens, seconds = steady_window(rows, settings.skip_tokens)
    wave_tokens, wave_seconds = wave_window(rows)
    wave = wave_tokens / wave_seconds if wave_tokens else 0.0
    if not tokens:
        return 0.0, 0.0, wave
    # Every step inside the window decodes the full batch, so ms/step = batch / (tok/s).
    return tokens / seconds, 1000 * seconds * batch / tokens, wave


def measure(model: Any, settings: RawSettings, log: Log) -> dict[str, Any]:
    """All raw figures for `model`; keys end in their unit (_ms, _tok_s)."""
    vocab = int(model.args.vocab_size)
    out: dict[str, Any] = {"settings": settings.__dict__ | {"batches": list(settings.batches)}}
    if not settings.decode_only:
        _latencies(model, settings, vocab, out, log)
    for batch in settings.batches:
        decode(model, batch, settings, vocab)  # warm-up: this batch's shapes
        waves = sorted(decode(model, batch, settings, vocab) for _ in range(settings.decode_reps))
        tok_s, step_ms, wave = median_wave(waves)
        out[f"decode_tok_s_b{batch}"] = tok_s
        out[f"decode_step_ms_b{batch}"] = step_ms
        out[f"decode_wave_tok_s_b{batch}"] = wave
        out[f"decode_tok_s_b{batch}_waves"] = [w[0] for w in waves]
        spread = f"waves {waves[0][0]:.0f}..{waves[-1][0]:.0f}"
        log(
            f"raw: decode batch {batch:3d}: {tok_s:9.1f} tok/s aggregate, {step_ms:.2f} ms/step "
            f"(median; {spread})"
        )
    return out


def _latencies(model: Any, settings: RawSettings, vocab: int, out: dict, log: Log) -> None:
    """Text first token, warm-TTFT floor and prefill, into `out`."""
    text = token_ids(settings.text_tokens, vocab, 3)
    out["text_first_token_ms"] = cold_ms(model, text, settings)
    log(f"raw: text first token ({len(text)} tokens): {out['text_first_token_ms']:.1f} ms")
    out["warm_ttft_ms"] = warm_ttft_ms(model, settings, vocab)
    log(
        f"raw: warm TTFT floor (prefix {settings.prefix_tokens} + {settings.suffix_tokens}): "
        f"{out['warm_ttft_ms']:.1f} ms"
    )
    prompt = token_ids(settings.prefix_tokens, vocab, 5)
    out["prefill_ms"] = cold_ms(model, prompt, settings)
    log(f"raw: prefill of {settings.prefix_tokens} tokens: {out['prefill_ms']:.1f} ms")
