"""One request's life inside the engine thread: from admission through image encoding and
prefill to its row in the batch and its final event. Owned by the engine thread.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from gateway.engine.model import PrefillPlan
from gateway.engine.output import OutputState
from gateway.engine.request import EngineRequest
from gateway.engine.vision import EncodedImage

Sink = Callable[[object], None]  # delivers one event to the request's async consumer


@dataclass
class Job:
    """Mutable per-request state. Stage order: queued -> encode -> prefill -> batch -> done."""

    request: EngineRequest
    sink: Sink
    output: OutputState
    stage: str = "queued"
    cached_tokens: int = 0  # prompt tokens whose KV came from the prefix cache
    vision_hits: int = 0
    vision_misses: int = 0
    encoded: list[EncodedImage | None] = field(default_factory=list)
    to_encode: list[int] = field(default_factory=list)  # image indices still to encode
    encoding: Any = None  # the vision tower of to_encode[0], mid-way (a generator)
    cache: list[Any] | None = None  # KV being built for the image part
    split: int = 0  # prompt tokens [0, split) prefilled by us; [split:] inserted in the batch
    plan: PrefillPlan | None = None
    prefilled: int = 0  # tokens of `plan` already fed
    uid: int | None = None  # BatchGenerator row id once inserted
    first_token_time: float | None = None
    sampler: Any = None

    @property
    def request_id(self) -> str:
        return self.request.request_id

    @property
    def prompt_len(self) -> int:
        return len(self.request.prompt_ids)

    def elapsed(self) -> float:
        return time.perf_counter() - self.request.arrival_time
