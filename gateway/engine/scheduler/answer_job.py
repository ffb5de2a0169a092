"""One answer job of the answer prefill (gateway.engine.scheduler.answer_store): a finished
request's next-turn tokens, and once started its private KV, fed one exact block at a time
and handed to the prefix cache. Engine thread only (`render` completes on the worker).
"""

from __future__ import annotations

import dataclasses
from concurrent.futures import Future
from dataclasses import dataclass
from typing import Any

import mlx.core as mx

from gateway.engine.cache_ops import CacheOps, delta_before
from gateway.engine.families.family import ModelFamily
from gateway.engine.model.kv import assemble
from gateway.engine.request import EngineRequest
from gateway.engine.scheduler.job import Job

MEMORY_SHARE = 0.85  # of the device's memory: above it in use, queued answer jobs are dropped


def memory_pressure() -> bool:
    """Is MLX's active memory above MEMORY_SHARE of the device's (when the device reports
    a size; a CPU does not, and its memory is bounded by the caches' budgets)?"""
    info = mx.device_info()
    size = info.get("max_recommended_working_set_size") or info.get("memory_size")
    return isinstance(size, int) and mx.get_active_memory() > MEMORY_SHARE * size


def _discard(event: object) -> None:
    """The answer job's sink: it has no client."""


@dataclass
class AnswerJob:
    """One finished request's answer job: its next-turn tokens (rendered on the worker once
    spare time came), then, once started, the job whose private KV the blocks are fed into."""

    request: EngineRequest  # the finished request (its images, scope, prompt)
    encoded: list[Any]  # its image features (for images the answer's first block overlaps)
    text: str  # the answer as the client received it
    # (prompt tokens dropped, tokens after): rendering on the worker, once spare time came
    render: Future[tuple[int, list[int]] | None] | None = None
    job: Job | None = None
    target: int = 0  # end of the last block to compute (a multiple of the block)
    stored: int = 0  # tokens up to which its blocks were handed to the cache

    def setup(self, ops: CacheOps, block: int, tokens: tuple[int, ...]) -> str | None:
        """Start over `tokens` (the next turn's, as far as they are known) from a hit on the
        stored blocks: None when started, else why not ("covered": its blocks are stored
        already; "skipped": an image it would need lost its features)."""
        model: ModelFamily = ops.model
        n = len(tokens)
        # A family feeding a prompt's last token as a one-row step computes the plan's last
        # row that way: it must not be in a stored block.
        target = (n - 1 if model.last_token_apart else n) // block * block
        request = dataclasses.replace(self.request, prompt_ids=tokens)
        job = Job(request=request, sink=_discard, output=None)  # type: ignore[arg-type]
        spans, scope = ops.spans(job), request.cache_scope
        if ops.prefix.stored_blocks(tokens, spans, scope) * block >= target:
            return "covered"
        hit = ops.prefix.find(tokens, spans, block, scope)
        start = hit.tokens if hit is not None else 0
        layouts = [i.layout for i in request.images]
        if any(lay.end > n for lay in layouts):  # never: only the generation prompt is dropped
            return "skipped"
        if any(lay.end > start and self.encoded[i] is None for i, lay in enumerate(layouts)):
            return "skipped"  # its features are gone (its prompt blocks were evicted)
        if hit is not None:
            delta = delta_before(layouts, start)
            job.cache = assemble(hit, delta, target - start, model.new_cache(delta))
        else:
            job.cache = model.new_cache()
        job.cached_tokens = job.fed = start
        job.encoded = self.encoded
        job.plan = model.prefill_plan(tokens, layouts, self.encoded, start, n)
        self.job, self.target, self.stored = job, target, start
        return None

    def feed_block(self, model: ModelFamily, block: int) -> None:
        """One whole block forward [fed, fed + block), as the uncached path computes it."""
        job = self.job
        assert job is not None and job.plan is not None
        lo, base = job.fed, job.cached_tokens
        model.prefill(job.plan, job.cache, lo - base, lo + block - base, rows=block)  # type: ignore[arg-type]
        job.fed = lo + block

    @property
    def done(self) -> bool:
        return self.job is not None and self.job.fed >= self.target

    def store(self, ops: CacheOps) -> None:
        """Hand the job's new whole blocks to the prefix cache (and its disk tier)."""
        job = self.job
        if job is None or job.fed <= self.stored:
            return
        # (`store_image_part` stores a job's blocks prefilled so far: here the answer job's)
        ops.store_image_part(job)
        self.stored = job.fed
