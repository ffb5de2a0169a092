"""One request's life inside the engine thread: from admission through image encoding and
prefill to its row in the batch and its final event. Owned by the engine thread.
"""

from __future__ import annotations

import enum
import time
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Any

from gateway.engine.disk.reader import Prefetch
from gateway.engine.model.prompt_forward import PrefillPlan
from gateway.engine.model.vision import EncodedImage
from gateway.engine.request import EngineRequest, Sink
from gateway.engine.tokens.output import OutputState
from gateway.engine.tokens.penalties import RowShaping


class Stage(enum.Enum):
    """Where a job is. Order: QUEUED -> (ENCODE) -> PREFILL -> DECODE -> DONE."""

    QUEUED = "queued"  # submitted, waiting for a row
    ENCODE = "encode"  # holds a row; images go through the vision tower
    PREFILL = "prefill"  # holds a row; the prompt's uncached tokens are being fed
    DECODE = "decode"  # a row of the shared BatchGenerator
    DONE = "done"  # finished, failed or cancelled; nothing refers to it any more


@dataclass
class Job:
    """Mutable per-request state."""

    request: EngineRequest
    sink: Sink
    output: OutputState
    stage: Stage = Stage.QUEUED
    cached_tokens: int = 0  # prompt tokens whose KV came from the prefix cache
    vision_hits: int = 0
    vision_misses: int = 0
    vision_disk_hits: int = 0  # of vision_hits, those read from the disk tier
    disk_cached_tokens: int = 0  # of cached_tokens, those whose KV was read from disk
    encoded: list[EncodedImage | None] = field(default_factory=list)
    to_encode: list[int] = field(default_factory=list)  # image indices still to encode
    cache: list[Any] | None = None  # this request's KV while it is prefilled by the engine
    split: int = 0  # prompt tokens [cached_tokens, split) hold images: fed with embeddings
    plan: PrefillPlan | None = None  # inputs for [cached_tokens, split)
    fed: int = 0  # prompt tokens whose KV is in `cache` (starts at cached_tokens)
    uid: int | None = None  # BatchGenerator row id once inserted
    first_token_time: float | None = None
    sampler: Any = None
    shaping: RowShaping | None = None  # penalties, biases, min_tokens (None: none)
    grammar: Future[Any] | None = None  # the compiled grammar (structured output), once ready
    prefetch: Prefetch | None = None  # its disk-tier read, until admitted (or cancelled)
    index: int = 0  # the choice it generates (`SamplingParams.n`; 0 for the prefilled job)
    rows: int = 1  # decode rows it holds (or will): its request's n until forked, then 1
    choices: Choices | None = None  # its request's choices once forked (n > 1)

    @property
    def key(self) -> str:
        """Its key in the scheduler's jobs table: the request id, plus the choice after 0."""
        return self.request.request_id if not self.index else f"{self.request_id}#{self.index}"

    def ready(self) -> bool:
        """May it be admitted: its grammar compiled and its disk read done (if any)?"""
        return (self.grammar is None or self.grammar.done()) and (
            self.prefetch is None or self.prefetch.done()
        )

    def pending(self) -> list[Future[Any]]:
        """What it waits for before admission."""
        futures = [self.grammar] if self.grammar is not None else []
        if self.prefetch is not None:
            futures.append(self.prefetch.future)
        return futures

    @property
    def request_id(self) -> str:
        return self.request.request_id

    @property
    def prompt_len(self) -> int:
        return len(self.request.prompt_ids)

    def elapsed(self) -> float:
        return time.perf_counter() - self.request.arrival_time


@dataclass
class Choices:
    """The jobs of one request's n > 1 choices, in index order: choice 0 prefilled the prompt
    and the others were forked from its KV (`Scheduler.fork`). `open`: choices not ended
    yet (the last to end sends the final FinishEvent); `failed`: an ErrorEvent ended them all.
    Engine thread only."""

    jobs: list[Job]
    open: int
    failed: bool = False
