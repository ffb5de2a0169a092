"""Start-up warm-up: run the serving path once over the shapes it will meet, before /health
says ready, so no user request pays for kernel compilation.

On a GPU, MLX builds kernels the first time it meets an operation (and, for some, a shape):
the first request of a fresh process took ~47 s on an H200, and each new image size another
0.4-1.9 s. Warm-up sends synthetic requests through the real path (prompt building, image
preprocessing, vision tower, chunked prefill, first token, batched decode) with the caches
emptied (and their counters zeroed) afterwards, so nothing synthetic is ever served from
cache; only the request and token counters of `/metrics` count the warm-up:
- text: `max_batch` requests at once, of different lengths and budgets, so the decode batch
  passes through every size from `max_batch` down to 1, and one full prefill chunk; a third of
  them ask for log-probabilities with alternatives and a third sample (temperature, top-p,
  top-k, a seed), and one asks for JSON (a grammar): each of those paths builds kernels of
  its own on first use (the first request with `logprobs` took 2.65x a later one on an H200);
- on a GPU, bursts of 2..8 prompts joining a decoding row at each padded final-block size
  (a shared prefill forward of each group size: on an H200 each new one builds kernels; a
  batch that grows);
- one image per configured size (the tower's shapes depend on the image grid).
What cannot be warmed: image sizes not listed (each new grid compiles once).

The requests are built as the front end's `ChatRequest`s (`warmup_request`), as a chat
completion with the same messages and options would be parsed; no HTTP edge is involved.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np
from PIL import Image

from caches.hashing import pixel_hash
from gateway.engine.client import EngineClient
from gateway.engine.request import ErrorEvent, Event, TokenEvent, ends_request
from gateway.frontend.chat import ChatMessage, ChatRequest, ImagePart, Part, TextPart
from gateway.frontend.prompt import PromptBuilder
from gateway.media import DecodedImage
from gateway.structured.response_format import response_format_grammar

log = logging.getLogger(__name__)


# Request options (`ChatRequest` fields) of the text warm-up, by request index mod 3 (greedy,
# log-probabilities with alternatives, seeded sampling).
_OPTIONS: tuple[dict[str, Any], ...] = (
    {},
    {"logprobs": True, "top_logprobs": 5},
    {"temperature": 0.7, "top_p": 0.9, "top_k": 40, "seed": 1},
)
_BURST = (8, 40, 90, 200)  # words of each burst's prompts: one burst per padded size


@dataclass
class _Done:
    event: threading.Event = field(default_factory=threading.Event)
    token: threading.Event = field(default_factory=threading.Event)  # a first token came
    error: str | None = None

    def sink(self, event: Event) -> None:
        if isinstance(event, ErrorEvent):
            self.error = event.message
        if isinstance(event, TokenEvent):
            self.token.set()
        if ends_request(event):
            self.token.set()
            self.event.set()


def _noise_image(size: int, seed: int) -> DecodedImage:
    pixels = np.random.default_rng(seed).integers(0, 256, (size, size, 3), dtype=np.uint8)
    image = Image.fromarray(pixels, "RGB")
    digest = pixel_hash("RGB", size, size, image.tobytes())
    return DecodedImage(image, digest, size, size, "data", 0.0, 0.0)


class Warmup:
    """Runs warm-up requests through `engine` (started) with `prompts`. Blocking; call it off
    the event loop. Raises RuntimeError if a warm-up request fails."""

    def __init__(
        self,
        engine: EngineClient,
        prompts: PromptBuilder,
        timeout_s: float = 900.0,
        bursts: bool | None = None,
    ) -> None:
        self.engine = engine
        self.prompts = prompts
        self.timeout_s = timeout_s
        # Group sizes build kernels on a GPU only; on a CPU the bursts cost seconds for nothing.
        self.bursts = engine.on_gpu if bursts is None else bursts
        self._n = 0

    def run(self, image_sizes: Sequence[int]) -> float:
        """Warm text at every batch size, a full prefill chunk, then each image size, each
        path also as a cache hit; then empty the caches. Returns the seconds it took."""
        started = time.perf_counter()
        rows = self.engine.config.max_batch
        t = time.perf_counter()
        self._wait(
            [
                self._submit([f"warm-up {i} " + "word " * (i % 7)], 2 + i, options=_OPTIONS[i % 3])
                for i in range(rows)
            ]
        )
        json = {"grammar": response_format_grammar({"type": "json_object"}), "ignore_eos": False}
        self._wait([self._submit(["warm-up json"], 4, options=json)])
        self._wait([self._submit(["warm-up 0 ", "and a follow-up"], 2)])  # a prefix hit
        log.info("warm-up: decode at batch sizes 1..%d in %.1f s", rows, time.perf_counter() - t)
        if self.bursts:
            # A burst and its runner must fit in the engine's rows and queue (else EngineBusy).
            capacity = self.engine.config.max_batch + self.engine.config.max_waiting
            t, largest = time.perf_counter(), min(rows, 8, capacity - 1)
            self._bursts(largest)
            log.info("warm-up: bursts of 2..%d prompts in %.1f s", largest, time.perf_counter() - t)
        t = time.perf_counter()
        chunk = self.engine.config.prefill_chunk_tokens
        self._wait([self._submit(["long " * chunk], 2)])
        log.info("warm-up: a %d-token prompt in %.1f s", chunk, time.perf_counter() - t)
        for k, size in enumerate(image_sizes):
            t = time.perf_counter()
            image = _noise_image(size, k)
            self._wait([self._submit(["Describe the picture."], 2, image)])
            self._wait([self._submit(["Describe the picture.", "What else?"], 2, image)])
            self._wait([self._submit(["Look:", "Describe the picture."], 2, image, first=1)])
            log.info("warm-up: a %dx%d image in %.1f s", size, size, time.perf_counter() - t)
        self.engine.reset_caches()  # nothing synthetic is ever served, and stats start at 0
        return time.perf_counter() - started

    def _bursts(self, largest: int) -> None:
        """Bursts of 2..`largest` prompts joining a decoding row, at each padded final-block
        size (32 to 256 rows with exact reuse): one shared prefill forward of each group size,
        the joiners merged into a batch that grows (the text rounds only shrink it). On an
        H200 the first group forward of a new size took 1.7-3.5x a later one ([3, 256]: 101
        vs 29 ms) and a wave of 16 took 1.59x the next; a size warmed here did not."""
        for words in _BURST:
            for size in range(2, largest + 1):
                runner = self._submit([f"warm-up runner {words} {size}"], 16)
                if not runner.token.wait(self.timeout_s):  # decoding before the burst comes
                    raise RuntimeError("warm-up did not finish in time")
                burst = [
                    self._submit([f"warm-up burst {size} {i} " + "word " * words], 2)
                    for i in range(size)
                ]
                self._wait([runner, *burst])

    def _submit(
        self,
        turns: list[str],
        max_tokens: int,
        image: DecodedImage | None = None,
        first: int = 0,
        options: dict[str, Any] | None = None,
    ) -> _Done:
        """Submit `warmup_request(turns, ...)`, with `image` at the start of turn `first`."""
        self._n += 1
        chat = warmup_request(turns, max_tokens, first if image is not None else None, options)
        request = self.prompts.build(
            chat,
            [image] if image is not None else [],
            f"warm-up-{self._n}",
            time.perf_counter(),
        )
        done = _Done()
        self.engine.submit(request, done.sink)
        return done

    def _wait(self, runs: list[_Done]) -> None:
        deadline = time.monotonic() + self.timeout_s
        for run in runs:
            if not run.event.wait(max(0.0, deadline - time.monotonic())):
                raise RuntimeError("warm-up did not finish in time")
            if run.error is not None:
                raise RuntimeError(f"warm-up request failed: {run.error}")


def warmup_request(
    turns: Sequence[str],
    max_tokens: int,
    image_at: int | None = None,
    options: dict[str, Any] | None = None,
) -> ChatRequest:
    """A greedy conversation of user `turns` that ignores EOS, for `max_tokens` tokens; with
    an image placeholder at the start of turn `image_at` (the image itself is passed to the
    prompt builder). The earlier turns get a fixed assistant reply, so a later call extends an
    earlier one (a prefix-cache hit), and `image_at=1` puts text before the image (a
    vision-cache hit). `options` replace `ChatRequest` fields (sampling, logprobs, grammar)."""
    messages: list[ChatMessage] = []
    for k, text in enumerate(turns):
        parts: tuple[Part, ...] = (TextPart(text),)
        if k == image_at:
            parts = (ImagePart("warm-up", f"warm-up turn {k}"), *parts)
        if k:
            messages.append(ChatMessage("assistant", (TextPart("ok"),)))
        messages.append(ChatMessage("user", parts))
    chat = ChatRequest.greedy("warm-up", tuple(messages), max_tokens, ignore_eos=True)
    return replace(chat, **(options or {}))
