"""How a job's tokens leave the engine and how a job ends: emitted, finished (its KV queued
for the prefix cache), failed or cancelled.

A collaborator of `gateway.engine.scheduler.scheduler.Scheduler`, which owns the job tables:
the scheduler hands it `release`, the one operation that takes a job out of them and frees its
row; everything else it needs (metrics, cache operations) it is given at construction.

Engine thread only. Events go to each job's sink, which must not block (sinks may buffer
until the engine's `on_events` says a step's events should leave).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

import mlx.core as mx

from gateway.engine.cache_ops import CacheOps
from gateway.engine.request import (
    ErrorEvent,
    ErrorKind,
    FinishEvent,
    FinishReason,
    TokenEvent,
    Usage,
)
from gateway.engine.scheduler.job import Job
from gateway.engine.tokens.grammar import FailingRow
from gateway.engine.tokens.logprobs import LogprobValues, row_values
from gateway.metrics import Metrics
from gateway.processors.positions import rope_delta_at

# The engine's own name: every line about a request's life logs under it, as it did before
# the scheduler was split out of the engine.
log = logging.getLogger("gateway.engine.core")


class Endings:
    """Token emission and every way a job ends; see the module docstring.

    `release(job)` forgets the job wherever it is and frees its row (idempotent); it may
    raise when the decode batch is broken, which `finish` and `fail` survive."""

    def __init__(
        self, metrics: Metrics, cache_ops: CacheOps, release: Callable[[Job], None]
    ) -> None:
        self._metrics = metrics
        self._cache_ops = cache_ops
        self._release = release
        # Called with (job, its tokens) after a finished job's KV was stored (the scheduler
        # queues its answer prefill there: gateway.engine.scheduler.answer_store).
        self.after_store: Callable[[Job, list[int]], None] | None = None
        # Finished this step: (job, its KV, the tokens that KV holds), stored after the
        # step's events have left (`store_finished`).
        self._to_store: list[tuple[Job, object, list[int]]] = []

    def emit(
        self, job: Job, token: int, logprobs: mx.array, values: LogprobValues | None = None
    ) -> None:
        """Send `token` to the job's client. `values`: its log-probabilities computed with the
        step (gateway.engine.tokens.logprobs); else read from `logprobs`, the (vocab,) row,
        when the request asked for them. A token that leaves the job's grammar fails the job
        instead (the caller sees `job.stage is Stage.DONE`)."""
        grammar = getattr(job.sampler, "grammar", None)
        if grammar is not None:
            grammar.accept(job.output.completion_tokens, token)
            if grammar.error is not None:
                self._grammar_failed(job, grammar)
                return
        if job.first_token_time is None:
            job.first_token_time = time.perf_counter()
            self._metrics.ttft.observe(job.elapsed())
        text = job.output.push(token)
        lps = ()
        sampling = job.request.sampling
        if sampling.logprobs:
            if values is None:
                values = row_values(logprobs, token, sampling.top_logprobs)
            lps = (job.output.logprob(token, values),)
        reasoning = job.output.take_reasoning()
        job.sink(TokenEvent(text, (token,), lps, index=job.index, reasoning=reasoning))

    def _grammar_failed(self, job: Job, grammar: FailingRow) -> None:
        """The job's grammar row (`GrammarRow` or `ThinkingRow`) met an error: the schema
        beyond llguidance's limits (the request's), or a token that broke the grammar (never
        expected: every token is drawn under its mask)."""
        if grammar.limit:
            log.warning("request %s: its schema outgrew the grammar engine: %s",
                        job.request_id, grammar.error)  # fmt: skip
            message = (
                "this server cannot enforce the request's JSON Schema: the grammar engine gave "
                f"up while decoding ({grammar.error}); "
                "simplify it (long or nested bounded repetitions in `pattern`, huge `enum`s)"
            )
            field = job.request.sampling.grammar_field
            self.fail(job, ErrorKind.GRAMMAR_LIMIT, message, field)
            return
        log.error("request %s left its grammar: %s", job.request_id, grammar.error)
        self.fail(job, ErrorKind.INTERNAL, f"structured output failed: {grammar.error}")

    def finish(self, job: Job, reason: FinishReason | str, kv: object, all_tokens: object) -> None:
        """End the job normally with `reason` (STOP whenever a stop string ended it; mlx-lm's
        string reasons are converted); its `kv` (holding `all_tokens`), if any, is queued for
        the prefix cache."""
        try:
            self._release(job)
        except Exception:  # the final event below must still go out
            log.exception("releasing %s failed", job.request_id)
        tail = job.output.finish()
        reason = FinishReason.STOP if job.output.stopped else FinishReason(reason)
        usage = Usage(
            job.prompt_len,
            job.output.completion_tokens,
            job.cached_tokens,
            job.vision_hits,
            job.vision_misses,
            job.output.thinking_tokens,
        )
        final = _last_to_end(job)
        reasoning = job.output.take_reasoning()
        stopped_by = job.output.stopped_by
        job.sink(
            FinishEvent(
                reason, usage, tail, stopped_by, index=job.index, final=final, reasoning=reasoning
            )
        )
        if final:  # the request's counters: once, however many choices it had
            self._metrics.requests.labels("ok").inc()
            self._metrics.prompt_tokens.inc(job.prompt_len)
            self._metrics.latency.observe(job.elapsed())
        if kv is not None and all_tokens is not None:
            self._to_store.append((job, kv, list(all_tokens)))  # type: ignore[arg-type]

    def store_finished(self) -> None:
        """Store the prompt + answer KV of the requests finished in this step."""
        stores, self._to_store = self._to_store, []
        for job, kv, tokens in stores:
            try:
                delta = rope_delta_at([i.layout for i in job.request.images], job.prompt_len)
                self._cache_ops.store_finished(job, kv, tokens, delta)  # type: ignore[arg-type]
                if self.after_store is not None:
                    self.after_store(job, tokens)
            except Exception:  # a cache is an optimisation: a failed store is a later miss
                log.exception("storing the KV of %s failed", job.request_id)

    def drop_stores(self) -> None:
        """Forget this step's finished KV unstored (the step failed: its state is unknown)."""
        self._to_store.clear()

    def fail(self, job: Job, kind: ErrorKind, message: str, param: str | None = None) -> None:
        """End a job with an ErrorEvent (`param`: the request field at fault, if any); a
        choice of an n > 1 request ends every choice of it with one ErrorEvent. Never
        raises: it runs inside recovery paths."""
        family = job.choices
        others = []
        if family is not None:
            if family.failed:  # already reported: just let go of this one
                self._release_quietly(job)
                return
            family.failed = True
            others = [j for j in family.jobs if j is not job]
        for member in [job, *others]:
            self._release_quietly(member)
        job.sink(ErrorEvent(kind, message, param))
        self._metrics.requests.labels("error").inc()

    def fail_internal(self, job: Job, message: str) -> None:
        """`fail` for an error of the engine's own (ErrorKind.INTERNAL), not the request's."""
        self.fail(job, ErrorKind.INTERNAL, message)

    def cancel(self, job: Job) -> None:
        """End a job its client gave up on (it gets a CANCELLED FinishEvent)."""
        self._release(job)
        final = _last_to_end(job)
        job.sink(FinishEvent.cancelled(job.prompt_len, job.cached_tokens, job.index, final))
        if final:
            self._metrics.requests.labels("cancelled").inc()

    def _release_quietly(self, job: Job) -> None:
        try:
            self._release(job)
        except Exception:
            log.exception("releasing %s failed; dropping it", job.key)


def _last_to_end(job: Job) -> bool:
    """Count the job's choice as ended; is it the request's last (always, for one choice)?"""
    family = job.choices
    if family is None:
        return True
    family.open -= 1
    return family.open == 0
