"""`bench engine`: the engine alone, in-process, no HTTP: where does time go?

Measures prompt preparation (template, tokenize, preprocess), time to first token for a cold
image request, a warm one (same image, new question: a prefix-cache hit up to the question),
a text first token, the vision tower's step time, and batched decode at several batch sizes.

Text first token and decode submit the same token ids as the raw ceiling
(`bench.raw_measure`) straight to the engine, and decode is timed over the same
steady window (`steady_window`) from the engine's own event times (the sink runs on the
engine thread the moment a token is emitted), so `bench engine --raw` compares like with like.
"""

from __future__ import annotations

import dataclasses
import statistics
import threading
import time
from dataclasses import dataclass, field
from typing import Any

from bench.hotpath_report import Row
from bench.raw_measure import RawSettings, median_wave, steady_window, token_ids
from caches.hashing import pixel_hash
from gateway.api.openai.parse import parse_chat_request
from gateway.config import CacheConfig, EngineConfig
from gateway.engine.core import Engine
from gateway.engine.request import (
    EngineRequest,
    ErrorEvent,
    FinishEvent,
    SamplingParams,
    TokenEvent,
)
from gateway.frontend.prompt import PromptBuilder
from gateway.media import DecodedImage
from gateway.metrics import Metrics


@dataclass
class Probe:
    """One request's token arrival times (perf_counter s, stamped on the engine thread)."""

    submitted: float = 0.0
    times: list[float] = field(default_factory=list)
    done: threading.Event = field(default_factory=threading.Event)
    error: str | None = None

    def sink(self, event: object) -> None:
        if isinstance(event, TokenEvent):
            self.times.extend([time.perf_counter()] * len(event.token_ids))
        elif isinstance(event, FinishEvent):
            self.done.set()
        elif isinstance(event, ErrorEvent):
            self.error = event.message
            self.done.set()

    def wait(self, timeout: float = 600.0) -> Probe:
        self.done.wait(timeout)
        if self.error:
            raise RuntimeError(self.error)
        return self


def _image(size: int, seed: int) -> DecodedImage:
    import base64
    import io

    from PIL import Image

    from bench.timing import image_data_uri

    data = base64.b64decode(image_data_uri(size=size, seed=seed).split(",", 1)[1])
    img = Image.open(io.BytesIO(data)).convert("RGB")
    return DecodedImage(
        img, pixel_hash("RGB", *img.size, img.tobytes()), *img.size, "data", 0.0, 0.0
    )


def _image_body(question: str) -> dict[str, Any]:
    content = [
        {"type": "image_url", "image_url": {"url": "x"}},
        {"type": "text", "text": question},
    ]
    return {
        "model": "p",
        "temperature": 0,
        "max_tokens": 8,
        "messages": [{"role": "user", "content": content}],
    }


def _sampling(max_tokens: int) -> SamplingParams:
    """Greedy; EOS ignored where the engine supports it (a decode row must not stop early)."""
    names = {f.name for f in dataclasses.fields(SamplingParams)}
    extra = {"ignore_eos": True} if "ignore_eos" in names else {}
    return SamplingParams(max_tokens=max_tokens, temperature=0.0, **extra)


class Profiler:
    """An engine on `model`, driven in-process. `run()` once, then it is stopped."""

    def __init__(
        self, model: str, log: Any = print, max_batch: int = 64, cache: CacheConfig | None = None
    ) -> None:
        self.log = log
        self.metrics = Metrics()
        config = EngineConfig(
            model=model, served_model_name="p", max_batch=max_batch, max_waiting=256,
            cache=cache or CacheConfig(),
        )  # fmt: skip
        self.engine = Engine(config, self.metrics)
        started = time.perf_counter()
        self.engine.start()
        log(f"model loaded in {time.perf_counter() - started:.1f} s")
        assert self.engine.model is not None
        self.vocab = self.engine.model.vocab_size
        self.prompts = PromptBuilder(self.engine.model, 65536, 64)
        self._n = 0

    @property
    def takes_images(self) -> bool:
        """False for a text model (mlx-lm's own classes): its figures are text and decode."""
        assert self.engine.model is not None
        return "image" in self.engine.model.media

    def submit(self, body: dict, images: list[DecodedImage]) -> tuple[Probe, float]:
        """Build (timed: the returned seconds) and submit a chat body."""
        self._n += 1
        started = time.perf_counter()
        request = self.prompts.build(parse_chat_request(body), images, f"p{self._n}", started)
        prepared = time.perf_counter() - started
        probe = Probe(submitted=time.perf_counter())
        self.engine.submit(request, probe.sink)
        return probe, prepared

    def submit_ids(self, ids: list[int], max_tokens: int) -> Probe:
        """Submit raw prompt token ids (no template), as the raw ceiling feeds its model."""
        self._n += 1
        now = time.perf_counter()
        request = EngineRequest(f"p{self._n}", tuple(ids), (), _sampling(max_tokens), now)
        probe = Probe(submitted=now)
        self.engine.submit(request, probe.sink)
        return probe

    def one(self, body: dict, images: list[DecodedImage]) -> tuple[float, float]:
        """(prepare s, TTFT s) of one chat request, run to the end."""
        probe, prepared = self.submit(body, images)
        probe.wait()
        return prepared, probe.times[0] - probe.submitted

    def image_ttfts(self, image_size: int, out: dict[str, Any]) -> None:
        """Cold (new image) and warm (same image, new question) TTFT, medians of 3."""
        for i in range(2):  # warm-up: kernels for these shapes
            self.one(_image_body("What is in this picture?"), [_image(image_size, 1000 + i)])
        cold = [
            self.one(_image_body("What is in this picture?"), [_image(image_size, 10 + i)])
            for i in range(3)
        ]
        warm = [
            self.one(
                _image_body(f"Question {i}: which colour is the largest shape?"),
                [_image(image_size, 10 + i)],
            )
            for i in range(3)
        ]
        out["prepare_cold_ms"] = 1000 * statistics.median(p for p, _ in cold)
        out["ttft_cold_ms"] = 1000 * statistics.median(t for _, t in cold)
        out["prepare_warm_ms"] = 1000 * statistics.median(p for p, _ in warm)
        out["ttft_warm_ms"] = 1000 * statistics.median(t for _, t in warm)

    def text_first_token_ms(self, settings: RawSettings) -> float:
        """Submit -> first token of a `text_tokens` prompt (distinct ids: no prefix hit)."""
        times = []
        for rep in range(settings.warmups + settings.reps):
            probe = self.submit_ids(token_ids(settings.text_tokens, self.vocab, 50 + rep), 1)
            probe.wait()
            if rep >= settings.warmups:
                times.append(probe.times[0] - probe.submitted)
        return 1000 * statistics.median(times)

    def decode(self, batch: int, settings: RawSettings) -> tuple[float, float, int]:
        """(aggregate tok/s, ms/step, rows that stopped early) over the steady window of
        `batch` rows of the raw ceiling's prompts (see module doc)."""
        budget = settings.skip_tokens + settings.decode_tokens
        salt = 1000 * batch + self._n  # new prompts each call: no prefix-cache hits
        probes = [
            self.submit_ids(token_ids(settings.prompt_tokens, self.vocab, salt + i), budget)
            for i in range(batch)
        ]
        rows = [p.wait().times for p in probes]
        short = sum(1 for r in rows if len(r) < budget)
        tokens, seconds = steady_window(rows, settings.skip_tokens)
        if not tokens:
            return 0.0, 0.0, short
        return tokens / seconds, 1000 * seconds * batch / tokens, short

    def run(self, image_size: int, settings: RawSettings) -> dict[str, Any]:
        """Every figure (keys end in their unit); stops the engine. A text model has no
        image figures (no `ttft_*`, `prepare_*` or `vision_*` keys)."""
        out: dict[str, Any] = {}
        try:
            if self.takes_images:
                self.image_ttfts(image_size, out)
                seconds, steps = histogram_sum_count(self.metrics.vision_encode_seconds)
                out["vision_block_step_ms_mean"] = 1000 * seconds / max(1, steps)
            out["text_first_token_ms"] = self.text_first_token_ms(settings)
            self.log(f"engine: text first token {out['text_first_token_ms']:.1f} ms")
            for batch in settings.batches:
                self.decode(batch, settings)  # warm-up, as the raw ceiling does
                waves = [self.decode(batch, settings) for _ in range(settings.decode_reps)]
                tok_s, step_ms, short = median_wave(waves)
                out[f"decode_tok_s_b{batch}"] = tok_s
                out[f"decode_step_ms_b{batch}"] = step_ms
                out[f"decode_short_rows_b{batch}"] = short
                self.log(f"engine: decode batch {batch:3d}: {tok_s:9.1f} tok/s, {step_ms:.2f} ms")
        finally:
            self.engine.stop()
        return out


def compare_rows(results: dict[str, Any], raw: dict[str, Any]) -> list[Row]:
    """`bench engine --raw`'s table: each engine figure next to its raw counterpart."""
    prefix = raw.get("settings", {}).get("prefix_tokens")
    rows = [
        Row("text_first_token_ms", "text first token", "ms",
            results.get("text_first_token_ms"), raw.get("text_first_token_ms")),
    ]  # fmt: skip
    if "ttft_warm_ms" in results:  # an image model (a text model has no image figures)
        rows += [
            Row("ttft_warm_ms", "image warm TTFT (same image, new question)", "ms",
                results.get("ttft_warm_ms"), raw.get("warm_ttft_ms"),
                note=f"raw: {prefix}-token prefix + 20 new"),
            Row("ttft_cold_ms", "image cold TTFT", "ms", results.get("ttft_cold_ms"),
                raw.get("prefill_ms"), note=f"raw: LM prefill of {prefix} tokens only"),
        ]  # fmt: skip
    for key in sorted(k for k in results if k.startswith("decode_tok_s_b")):
        batch = key.removeprefix("decode_tok_s_b")
        short = results.get(f"decode_short_rows_b{batch}")
        note = f"{short} rows stopped early (EOS)" if short else ""
        what = f"decode, batch {batch}: aggregate"
        rows.append(Row(key, what, "tok/s", results[key], raw.get(key), note=note))
    return rows


def histogram_sum_count(histogram: Any) -> tuple[float, int]:
    """(sum, count) of an unlabelled prometheus_client Histogram, read through its public
    `collect()` (the samples `/metrics` would print), not its private fields."""
    total, count = 0.0, 0
    for family in histogram.collect():
        for sample in family.samples:
            if sample.name.endswith("_sum"):
                total = float(sample.value)
            elif sample.name.endswith("_count"):
                count = int(sample.value)
    return total, count
