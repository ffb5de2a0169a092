"""How a job's tokens leave the engine and how a job ends: emitted, finished (its KV queued
for the prefix cache), failed, cancelled or released, and the recovery after a step fails.

A mixin of `gateway.engine.core.Engine` (it uses the engine's job tables, decode batch and
metrics, declared below); split out so the scheduling loop and the endings each fit a
module. Engine thread only.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from collections.abc import Callable

import mlx.core as mx

from gateway.engine.cache_ops import CacheOps
from gateway.engine.model.positions import rope_delta_at
from gateway.engine.request import ErrorEvent, ErrorKind, FinishEvent, TokenEvent, Usage
from gateway.engine.scheduler.decode_batch import DecodeBatch
from gateway.engine.scheduler.encode_group import EncodeGroup
from gateway.engine.scheduler.job import Job, Stage
from gateway.engine.tokens.logprobs import LogprobValues, row_values
from gateway.metrics import Metrics

log = logging.getLogger("gateway.engine.core")


class JobEndings:
    """Token emission and every way a job ends; see the module docstring."""

    metrics: Metrics
    _jobs: dict[str, Job]
    _waiting: deque[Job]
    _encoding: deque[Job]
    _prefilling: deque[Job]
    _group: EncodeGroup | None
    _batch: DecodeBatch
    _cache_ops: CacheOps
    _to_store: list[tuple[Job, object, list[int]]]
    _count_lock: threading.Lock
    _queued: int
    _active: int
    _new_batch: Callable[[], DecodeBatch]
    _ship: Callable[[], None]

    def _emit(
        self, job: Job, token: int, logprobs: mx.array, values: LogprobValues | None = None
    ) -> None:
        """Send `token` to the job's client. `values`: its log-probabilities computed with the
        step (gateway.engine.tokens.logprobs); else read from `logprobs`, the (vocab,) row,
        when the request asked for them."""
        grammar = getattr(job.sampler, "grammar", None)
        if grammar is not None:
            grammar.accept(job.output.completion_tokens, token)
            if grammar.error is not None:  # never expected: every token was drawn under its mask
                log.error("request %s left its grammar: %s", job.request_id, grammar.error)
                self._fail(job, ErrorKind.INTERNAL, f"structured output failed: {grammar.error}")
                return
        if job.first_token_time is None:
            job.first_token_time = time.perf_counter()
            self.metrics.ttft.observe(job.elapsed())
        text = job.output.push(token)
        lps = ()
        sampling = job.request.sampling
        if sampling.logprobs:
            if values is None:
                values = row_values(logprobs, token, sampling.top_logprobs)
            lps = (job.output.logprob(token, values),)
        job.sink(TokenEvent(text, (token,), lps))

    def _finish(self, job: Job, reason: str, kv: object, all_tokens: object) -> None:
        try:
            self._release(job)
        except Exception:  # the final event below must still go out
            log.exception("releasing %s failed", job.request_id)
        tail = job.output.finish()
        reason = "stop" if job.output.stopped else reason
        usage = Usage(
            job.prompt_len,
            job.output.completion_tokens,
            job.cached_tokens,
            job.vision_hits,
            job.vision_misses,
        )
        job.sink(FinishEvent(reason, usage, tail, job.output.stopped_by))
        self.metrics.requests.labels("ok").inc()
        self.metrics.prompt_tokens.inc(job.prompt_len)
        self.metrics.latency.observe(job.elapsed())
        if kv is not None and all_tokens is not None:
            self._to_store.append((job, kv, list(all_tokens)))  # type: ignore[arg-type]

    def _store_finished(self) -> None:
        """Store the prompt + answer KV of the requests finished in this step."""
        stores, self._to_store = self._to_store, []
        for job, kv, tokens in stores:
            try:
                delta = rope_delta_at([i.layout for i in job.request.images], job.prompt_len)
                self._cache_ops.store_finished(job, kv, tokens, delta)  # type: ignore[arg-type]
            except Exception:  # a cache is an optimisation: a failed store is a later miss
                log.exception("storing the KV of %s failed", job.request_id)

    def _fail(self, job: Job, kind: ErrorKind, message: str) -> None:
        """End a job with an ErrorEvent. Never raises: it runs inside recovery paths."""
        try:
            self._release(job)
        except Exception:
            log.exception("releasing %s failed; dropping it", job.request_id)
        job.sink(ErrorEvent(kind, message))
        self.metrics.requests.labels("error").inc()

    def _cancel(self, request_id: str) -> None:
        job = self._jobs.get(request_id)
        if job is None:
            return
        self._release(job)
        job.sink(FinishEvent("cancelled", Usage(job.prompt_len, 0, job.cached_tokens)))
        self.metrics.requests.labels("cancelled").inc()

    def _release(self, job: Job) -> None:
        """Forget a job wherever it is and free its row (idempotent). The bookkeeping is
        undone before the batch is touched, so a failing batch cannot leave a half-released
        job (or a leaked row count) behind."""
        if self._jobs.pop(job.request_id, None) is None:
            return
        stage, job.stage = job.stage, Stage.DONE
        if job.prefetch is not None:  # its disk read's buffers: not needed any more
            job.prefetch.release()
            job.prefetch = None
        if stage is Stage.QUEUED:
            self._waiting.remove(job)
            with self._count_lock:
                self._queued -= 1
            return
        with self._count_lock:
            self._active -= 1
        for pending in (self._encoding, self._prefilling):
            if job in pending:
                pending.remove(job)
        job.cache = job.plan = None
        self._batch.release(job)

    def _fail_active(self) -> None:
        """After an unexpected error in a step: fail every request holding a row (their state
        is unknown), with a fresh batch; queued requests are served as usual."""
        for job in [*self._encoding, *self._prefilling]:
            self._fail(job, ErrorKind.INTERNAL, "internal error in the engine step")
        self._group = None
        self._to_store.clear()
        self._fail_batch()
        self._ship()

    def _fail_batch(self) -> None:
        """The decode step raised: the batch's state is unknown. Replace it first, then fail
        its rows (releasing them no longer touches the broken batch)."""
        failed = self._batch.forget_rows()
        try:
            self._batch = self._new_batch()
        except Exception:
            log.exception("could not build a new batch")
        for job in failed:
            self._fail(job, ErrorKind.INTERNAL, "internal error in the decode step")
