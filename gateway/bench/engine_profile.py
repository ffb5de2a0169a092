"""`bench engine`: the engine alone, in-process, no HTTP: where does time go?

Measures prompt preparation (template, tokenize, preprocess), time to first token for a cold
image request, the same request warm (prefix hit), a vision-cache-only hit, and batched decode
step times at several batch sizes. Useful to separate engine cost from HTTP and decode cost.
"""

from __future__ import annotations

import statistics
import threading
import time
from dataclasses import dataclass, field
from typing import Any

from caches.hashing import pixel_hash
from gateway.config import EngineConfig
from gateway.engine.core import Engine
from gateway.engine.request import ErrorEvent, FinishEvent, TokenEvent
from gateway.media import DecodedImage
from gateway.metrics import Metrics
from gateway.openai_api import parse_chat_request
from gateway.prompt import PromptBuilder


@dataclass
class _Probe:
    submitted: float = 0.0
    times: list[float] = field(default_factory=list)
    done: threading.Event = field(default_factory=threading.Event)
    error: str | None = None

    def sink(self, event: object) -> None:
        if isinstance(event, TokenEvent):
            self.times.append(time.perf_counter())
        elif isinstance(event, FinishEvent):
            self.done.set()
        elif isinstance(event, ErrorEvent):
            self.error = event.message
            self.done.set()


def _image(size: int, seed: int) -> DecodedImage:
    import base64
    import io

    from PIL import Image

    from gateway.bench.timing import image_data_uri

    data = base64.b64decode(image_data_uri(size=size, seed=seed).split(",", 1)[1])
    img = Image.open(io.BytesIO(data)).convert("RGB")
    return DecodedImage(
        img, pixel_hash("RGB", *img.size, img.tobytes()), *img.size, "data", 0.0, 0.0
    )


class Profiler:
    def __init__(self, model: str, log: Any = print) -> None:
        self.log = log
        self.metrics = Metrics()
        self.engine = Engine(
            EngineConfig(model=model, served_model_name="p", max_batch=64, max_waiting=256),
            self.metrics,
        )
        started = time.perf_counter()
        self.engine.start()
        log(f"model loaded in {time.perf_counter() - started:.1f} s")
        self.prompts = PromptBuilder(self.engine.model, self.engine.needs_pixels, 65536, 64)
        self._n = 0

    def submit(self, body: dict, images: list[DecodedImage]) -> tuple[_Probe, float]:
        self._n += 1
        started = time.perf_counter()
        request = self.prompts.build(parse_chat_request(body), images, f"p{self._n}", started)
        prepared = time.perf_counter() - started
        probe = _Probe(submitted=time.perf_counter())
        self.engine.submit(request, probe.sink)
        return probe, prepared

    def one(self, body: dict, images: list[DecodedImage]) -> tuple[float, float]:
        probe, prepared = self.submit(body, images)
        probe.done.wait(600)
        if probe.error:
            raise RuntimeError(probe.error)
        return prepared, probe.times[0] - probe.submitted

    def run(self, image_size: int, batch_sizes: list[int]) -> dict[str, Any]:
        out: dict[str, Any] = {}
        body = {
            "model": "p",
            "temperature": 0,
            "max_tokens": 8,
            "messages": [
                {
                    "role": "user",
                    "content": [
                        {"type": "image_url", "image_url": {"url": "x"}},
                        {"type": "text", "text": "What is in this picture?"},
                    ],
                }
            ],
        }
        for i in range(2):  # warm-up: kernels for these shapes
            self.one(body, [_image(image_size, 1000 + i)])
        cold = [self.one(body, [_image(image_size, 10 + i)]) for i in range(3)]
        warm = [self.one(body, [_image(image_size, 10 + i)]) for i in range(3)]
        out["prepare_cold_ms"] = 1000 * statistics.median(p for p, _ in cold)
        out["ttft_cold_ms"] = 1000 * statistics.median(t for _, t in cold)
        out["prepare_warm_ms"] = 1000 * statistics.median(p for p, _ in warm)
        out["ttft_warm_ms"] = 1000 * statistics.median(t for _, t in warm)
        enc = self.metrics.vision_encode_seconds
        out["vision_block_step_ms_mean"] = 1000 * enc._sum.get() / max(1, _count(enc))
        for batch in batch_sizes:
            probes = []
            for i in range(batch):
                text = {
                    "model": "p",
                    "temperature": 0,
                    "max_tokens": 64,
                    "messages": [{"role": "user", "content": f"Story {i}: once upon a time"}],
                }
                probes.append(self.submit(text, [])[0])
            for p in probes:
                p.done.wait(600)
            gaps = [b - a for p in probes for a, b in zip(p.times[8:], p.times[9:])]
            out[f"decode_step_ms_batch{batch}"] = 1000 * statistics.median(gaps)
            out[f"decode_tok_s_batch{batch}"] = batch / statistics.median(gaps)
        self.engine.stop()
        return out


def _count(histogram: Any) -> int:
    return int(sum(b.get() for b in histogram._buckets))
