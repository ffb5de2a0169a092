"""`python -m bench sampling`: the cost of n > 1 choices and of logit shaping, engine alone.

In-process (no HTTP), caches off, fresh prompts every request (no prefix hit), greedy with
end tokens ignored (rows never stop early); token times are stamped on the engine thread.

  choices   time to first token of one request for n choices against n = 1 (to choice 0's
            first token, and to the last choice's), and the ms per decode step of those n
            rows against n separate requests decoding together: the fork must cost about
            nothing and the n rows must decode at batch speed.
  shaping   ms per decode step at each batch size with no row shaped, and with every row
            shaped (presence, frequency and repetition penalties, a logit_bias and
            min_tokens: every branch of `gateway.engine.tokens.penalties.shape`); the
            difference is the shaping's cost per step.
"""

from __future__ import annotations

import statistics
import threading
import time
from dataclasses import dataclass, field
from typing import Any

from bench.raw_measure import median_wave, steady_window, token_ids
from gateway.config import CacheConfig, EngineConfig
from gateway.engine.core import Engine
from gateway.engine.request import (
    EngineRequest,
    ErrorEvent,
    SamplingParams,
    TokenEvent,
    ends_request,
)
from gateway.metrics import Metrics

QWEN_VOCAB = 151936  # a real vocabulary (Qwen2/2.5/3-VL), for the shaping kernel figure
DECODE_PROMPT = 32  # prompt tokens of the decode figures' rows
SHAPED = {
    "presence_penalty": 0.5,
    "frequency_penalty": 0.5,
    "repetition_penalty": 1.2,
    "logit_bias": ((11, 2.0), (12, -2.0)),
    "min_tokens": 4,
}


@dataclass
class Probe:
    """Token arrival times (perf_counter s) per choice index of one request."""

    submitted: float
    times: dict[int, list[float]] = field(default_factory=dict)
    done: threading.Event = field(default_factory=threading.Event)
    error: str | None = None

    def sink(self, event: object) -> None:  # the engine thread
        if isinstance(event, TokenEvent):
            self.times.setdefault(event.index, []).append(time.perf_counter())
        if isinstance(event, ErrorEvent):
            self.error = event.message
        if ends_request(event):  # type: ignore[arg-type]
            self.done.set()

    def wait(self) -> Probe:
        self.done.wait(600)
        if self.error:
            raise RuntimeError(self.error)
        return self

    def rows(self) -> list[list[float]]:
        return [self.times[i] for i in sorted(self.times)]


class SamplingBench:
    """An engine on `model` with `max_batch` rows, caches off. Stop it with `close`."""

    def __init__(self, model: str, max_batch: int, log: Any = print) -> None:
        self.log = log
        config = EngineConfig(
            model=model, served_model_name="s", max_batch=max_batch, max_waiting=4 * max_batch,
            cache=CacheConfig(vision_enabled=False, prefix_enabled=False),
        )  # fmt: skip
        self.engine = Engine(config, Metrics())
        self.engine.start()
        assert self.engine.model is not None
        self.vocab = self.engine.model.vocab_size
        self._n = 0

    def submit(self, prompt_tokens: int, max_tokens: int, **params: Any) -> Probe:
        self._n += 1
        ids = token_ids(prompt_tokens, self.vocab, 7919 * self._n)
        sampling = SamplingParams(max_tokens, temperature=0.0, ignore_eos=True, **params)
        now = time.perf_counter()
        probe = Probe(now)
        self.engine.submit(EngineRequest(f"s{self._n}", tuple(ids), (), sampling, now), probe.sink)
        return probe

    def ttfts(self, prompt_tokens: int, n: int, reps: int) -> tuple[float, float, float]:
        """Median ms to the first token of a request for one choice, and of one for `n`
        choices to choice 0's first token and to the last choice's. The two kinds alternate
        (a busy host's drift hits both alike)."""
        single, first, last = [], [], []
        for rep in range(reps + 1):  # one untimed: kernels for these shapes
            alone = self.submit(prompt_tokens, 2).wait()
            probe = self.submit(prompt_tokens, 2, n=n).wait()
            starts = [row[0] - probe.submitted for row in probe.rows()]
            if rep:
                single.append(1000 * (alone.rows()[0][0] - alone.submitted))
                first.append(1000 * starts[0])
                last.append(1000 * max(starts))
        return statistics.median(single), statistics.median(first), statistics.median(last)

    def step_ms(self, requests: list[dict[str, Any]], tokens: int) -> float:
        """ms per decode step over the steady window of `requests` (SamplingParams fields
        each, short prompts) decoding together. The window opens once every row decodes
        (rows are admitted over several steps: a shaped row is prefilled on its own, not in
        the generator's burst), so each row first generates 2 x rows + 8 untimed tokens."""
        skip = 2 * sum(r.get("n", 1) for r in requests) + 8
        probes = [self.submit(DECODE_PROMPT, skip + tokens, **r) for r in requests]
        rows = [row for p in probes for row in p.wait().rows()]
        count, seconds = steady_window(rows, skip)
        return 1000 * seconds * len(rows) / count if count else 0.0

    def close(self) -> None:
        self.engine.stop()


def kernel_ms(batch: int, vocab: int, steps: int = 30) -> tuple[float, float]:
    """ms per step of the shaping alone, on (batch, vocab) float32 logits, every row shaped:
    (the shaper's whole step: count update, settings, `shape`; the unshaped pass-through).
    Each step is evaluated, so this is its device time plus its dispatch."""
    import mlx.core as mx
    import numpy as np

    from gateway.engine.tokens.penalties import BatchShaper, RowShaping

    logits = mx.array(np.random.default_rng(0).normal(size=(batch, 1, vocab)).astype(np.float32))
    prompt = tuple(range(10, 522))
    params = SamplingParams(1 << 20, **SHAPED)  # type: ignore[arg-type]
    figures = []
    for shaped in (True, False):
        rows = {i: RowShaping.from_params(params, prompt) if shaped else None for i in range(batch)}
        holder = type("Batch", (), {"uids": list(range(batch))})()
        shaper = BatchShaper(lambda inputs, cache=None: logits, holder, rows.get, (2,))
        fed = mx.array([[5]] * batch)
        mx.eval(shaper(fed))  # builds the state, compiles
        started = time.perf_counter()
        for _ in range(steps):
            mx.eval(shaper(fed))
        figures.append(1000 * (time.perf_counter() - started) / steps)
    return figures[0], figures[1]


def run(
    model: str, n: int, batches: list[int], prompt_tokens: int, tokens: int, reps: int
) -> dict[str, Any]:
    """Every figure (keys end in their unit)."""
    bench = SamplingBench(model, max(n, *batches))
    out: dict[str, Any] = {"n": n, "prompt_tokens": prompt_tokens, "decode_tokens": tokens}
    try:
        one, first, last = bench.ttfts(prompt_tokens, n, 3 * reps)
        out |= {"ttft_n1_ms": one, "ttft_n_first_ms": first, "ttft_n_last_ms": last}
        waves = [
            (
                bench.step_ms([{"n": n}], tokens),
                bench.step_ms([{}] * n, tokens),
            )
            for _ in range(reps)
        ]
        out["step_n_choices_ms"], out["step_n_requests_ms"] = median_wave(waves)
        for batch in batches:
            plain, shaped = median_wave(
                [
                    (
                        bench.step_ms([{}] * batch, tokens),
                        bench.step_ms([SHAPED] * batch, tokens),
                    )
                    for _ in range(reps)
                ],
                key=lambda w: w[1] - w[0],
            )
            out[f"step_b{batch}_plain_ms"] = plain
            out[f"step_b{batch}_shaped_ms"] = shaped
            for vocab in (bench.vocab, QWEN_VOCAB):
                out[f"kernel_b{batch}_v{vocab}_shaped_ms"] = kernel_ms(batch, vocab)[0]
    finally:
        bench.close()
    return out


def report(out: dict[str, Any]) -> str:
    """The figures as a short table."""
    n = out["n"]
    lines = [
        f"TTFT, {out['prompt_tokens']}-token prompt: n=1 {out['ttft_n1_ms']:.1f} ms; "
        f"n={n}: first choice {out['ttft_n_first_ms']:.1f} ms "
        f"({out['ttft_n_first_ms'] / out['ttft_n1_ms']:.2f}x), last choice "
        f"{out['ttft_n_last_ms']:.1f} ms ({out['ttft_n_last_ms'] / out['ttft_n1_ms']:.2f}x)",
        f"decode step: n={n} choices {out['step_n_choices_ms']:.2f} ms, "
        f"{n} separate requests {out['step_n_requests_ms']:.2f} ms",
    ]
    for key in sorted(k for k in out if k.endswith("_plain_ms")):
        batch = key.split("_")[1][1:]
        plain, shaped = out[key], out[key.replace("plain", "shaped")]
        lines.append(
            f"decode step, batch {batch}: plain {plain:.2f} ms, every row shaped "
            f"{shaped:.2f} ms (+{shaped - plain:.2f} ms)"
        )
    for key in sorted(k for k in out if k.startswith("kernel_")):
        _, batch, vocab, _, _ = key.split("_")
        lines.append(
            f"shaping alone, batch {batch[1:]}, vocab {vocab[1:]}: {out[key]:.2f} ms per step"
        )
    return "\n".join(lines)


def quick(out: dict[str, Any]) -> dict[str, Any]:
    """The figures rounded for JSON."""
    return {k: round(v, 3) if isinstance(v, float) else v for k, v in out.items()}
