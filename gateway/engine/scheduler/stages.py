"""The stages of one engine step: admit queued requests (cache lookups), encode images (one
tower unit for a group), prefill prompts (up to a budget, first token from the prefill
logits) and decode (one batched step of every row). The step's order and the loop around it
are in `gateway.engine.core`.

A mixin of `Engine` (it uses the engine's queues, caches, prefiller and decode batch, declared
below); split out so the loop, the stages and the endings each fit a module. Engine thread
only.
"""

from __future__ import annotations

import logging
import time
from concurrent.futures import FIRST_COMPLETED, wait

from gateway.config import EngineConfig
from gateway.engine.request import AdmittedEvent, ErrorKind
from gateway.engine.scheduler.encode_group import start_group, step_group
from gateway.engine.scheduler.endings import JobEndings
from gateway.engine.scheduler.job import Job, Stage
from gateway.engine.scheduler.prefill import FirstToken, Prefiller
from gateway.engine.scheduler.step_trace import StepTrace
from gateway.engine.tokens.grammar import Grammars
from gateway.engine.tokens.sampling import make_sampler

log = logging.getLogger("gateway.engine.core")


def prefill_budget(chunk: int, rows: int, waiting: int) -> int:
    """Query rows one step may prefill, given `--prefill-chunk`, the rows decoding and the
    requests waiting for their prefill.

    Nothing decoding, or a burst (two or more waiting, at least a quarter of the rows): 4x the
    chunk, in fewer, larger forwards (an H200 runs [8, 256] in ~2.6x the time of [2, 256];
    a wave of 32 prompts took 17 steps of ~50 ms to admit at one chunk, every decoding row
    waiting on each). A request arriving alone at a busy batch gets one chunk, so the rows'
    stall stays short. Bounded either way: attention memory grows with chunk x context.
    """
    if not rows or (waiting > 1 and 4 * waiting >= rows):
        return 4 * chunk
    return chunk


class Stages(JobEndings):
    """Admission, encoding, prefill and decode; see the module docstring."""

    # Beyond the state JobEndings declares:
    config: EngineConfig
    _prefiller: Prefiller
    _grammars: Grammars | None
    _decoded: int
    _trace: StepTrace | None

    def _admit(self) -> None:
        while self._waiting and self._active < self.config.max_batch:
            job = self._next_ready()
            if job is None:
                return
            job.stage = Stage.PREFILL
            with self._count_lock:
                self._queued -= 1
                self._active += 1
            try:
                self._start(job)
            except Exception as exc:
                log.exception("request %s failed to start", job.request_id)
                self._fail(job, ErrorKind.INTERNAL, f"internal error starting the request: {exc}")

    def _next_ready(self) -> Job | None:
        """The oldest waiting job whose grammar (if any) is compiled and disk read (if any)
        done, taken off the queue. With nothing else to do, waits a little for one of them
        instead of spinning."""
        for attempt in range(2):
            for job in self._waiting:
                if job.ready():
                    self._waiting.remove(job)
                    return job
            if attempt or self._batch.rows or self._prefilling or self._encoding or self._group:
                return None
            # Idle: wait, then admit what got ready in this step rather than the next.
            wait([f for j in self._waiting for f in j.pending()], 0.05, FIRST_COMPLETED)
        return None

    def _start(self, job: Job) -> None:
        """Look the request up in the caches, then queue its image or prefill work."""
        grammar = None
        if job.grammar is not None:
            assert self._grammars is not None
            grammar = self._grammars.start(job.grammar.result())  # raises a compile error
        masker = self._grammars.masker if self._grammars is not None else None
        job.sampler = make_sampler(job.request.sampling, grammar, masker)
        self._cache_ops.admit(job)
        if self._trace is not None:
            self._trace.note("admitted", job.request_id)
        job.sink(
            AdmittedEvent(
                job.prompt_len,
                job.cached_tokens,
                job.vision_hits,
                job.vision_misses,
                job.vision_disk_hits,
                job.disk_cached_tokens,
            )
        )
        if job.to_encode:
            job.stage = Stage.ENCODE
            self._encoding.append(job)
        else:
            self._prefilling.append(job)

    def _encode(self) -> None:
        """One vision-tower unit for the current group of images (formed from the oldest
        requests' pending images when none is running; see
        gateway.engine.scheduler.encode_group)."""
        if self._group is None:
            if not self._encoding:
                return
            # Block by block only while rows decode (they must not stall); alone, the tower
            # runs as one graph.
            self._group, failed = start_group(
                self._cache_ops, self._encoding, stepwise=lambda: bool(self._batch.rows)
            )
            for job, exc in failed:  # e.g. preprocessing an evicted image without pixels
                log.error("preparing an image of %s failed: %s", job.request_id, exc)
                self._fail(job, ErrorKind.INTERNAL, f"internal error preparing the image: {exc}")
            if self._group is None:
                return
        group = self._group
        started = time.perf_counter()
        try:
            done = step_group(self._cache_ops, group)
        except Exception as exc:
            self._group = None
            log.exception("encoding a group of %d images failed", len(group.images))
            for job in group.jobs:
                self._fail(job, ErrorKind.INTERNAL, f"internal error encoding the image: {exc}")
            return
        self.metrics.vision_encode_seconds.observe(time.perf_counter() - started)
        if not done:
            return
        self._group = None
        for job in group.jobs:
            if job.stage is Stage.ENCODE and not job.to_encode:
                self._encoding.remove(job)
                job.stage = Stage.PREFILL
                self._prefilling.append(job)

    def _prefill(self) -> None:
        """Feed up to one prefill budget of prompt tokens, oldest request first.

        A burst (several requests whose remaining prompt is short text) is handed to the
        batch instead, which prefills them together in one forward per group; one request
        alone is prefilled here, so its first token comes from its own prefill logits."""
        budget = prefill_budget(
            self.config.prefill_chunk_tokens, len(self._batch.rows), len(self._prefilling)
        )
        burst = [
            job
            for job in self._prefilling
            if job.fed == max(job.split, job.cached_tokens)  # images done, no text fed yet
            and job.prompt_len - job.fed <= budget
        ]
        if len(burst) > 1 and not self._prefiller.exact:  # exact: every prompt in blocks here
            for job in burst:
                self._prefilling.remove(job)
                try:
                    self._insert_prompt(job)
                except Exception as exc:
                    log.exception("inserting %s failed", job.request_id)
                    self._fail(job, ErrorKind.INTERNAL, f"internal error admitting it: {exc}")
        shared = {id(j): g for g in self._prefiller.final_block_groups(self._prefilling) for j in g}
        for job in list(self._prefilling):
            if budget <= 0:
                return
            if job.stage is not Stage.PREFILL or job not in self._prefilling:
                continue  # fed with its group, or failed
            if id(job) in shared:
                budget = self._feed_group(shared[id(job)], budget)
                continue
            try:
                fed, first = self._prefiller.feed(job, budget)
                budget -= fed
                self.metrics.prefill_chunks.inc()
                if first is not None:
                    self._prefilling.remove(job)
                    self._first_token(job, first)
            except Exception as exc:
                log.exception("prefill of %s failed", job.request_id)
                self._fail(job, ErrorKind.INTERNAL, f"internal error in the prefill: {exc}")

    def _feed_group(self, group: list[Job], budget: int) -> int:
        """Exact reuse: the final partial blocks of as many of `group` (from
        `final_block_groups`; members already fed are skipped) as the budget allows, at least
        one, in one forward; returns the budget left. A request alone takes the usual path."""
        pending = [job for job in group if job in self._prefilling]
        rows = self._prefiller.final_rows(pending[0].prompt_len - pending[0].fed)
        jobs = pending[: max(budget // rows, 1)]
        try:
            if len(jobs) == 1:
                fed, first = self._prefiller.feed(jobs[0], budget)
                firsts: list[FirstToken | Exception | None] = [first]
            else:
                fed = rows * len(jobs)
                firsts = list(self._prefiller.feed_final_blocks(jobs))
        except Exception as exc:  # the forward itself: every request in it
            log.exception("the prefill of %s failed", ", ".join(j.request_id for j in jobs))
            for job in jobs:
                self._fail(job, ErrorKind.INTERNAL, f"internal error in the prefill: {exc}")
            return budget - rows * len(jobs)
        self.metrics.prefill_chunks.inc()
        for job, first in zip(jobs, firsts, strict=True):
            try:
                if isinstance(first, Exception):
                    raise first
                if first is not None:
                    self._prefilling.remove(job)
                    self._first_token(job, first)
            except Exception as exc:  # this request alone
                log.exception("prefill of %s failed", job.request_id)
                self._fail(job, ErrorKind.INTERNAL, f"internal error in the prefill: {exc}")
        return budget - fed

    def _first_token(self, job: Job, first: FirstToken) -> None:
        """Emit the token sampled at the end of the prefill; finish, or join the batch."""
        self.metrics.generation_tokens.inc()
        if self._trace is not None:
            self._trace.note("first", job.request_id)
        self._emit(job, first.token, first.logprobs)
        if job.stage is Stage.DONE:  # failed while emitting
            return
        sampling = job.request.sampling
        eos = not sampling.ignore_eos and first.token in self._batch.stop_ids
        if eos or job.output.stopped or sampling.max_tokens <= 1:
            # Done at its first token: the KV holds exactly the prompt (copied without the
            # buffer's spare capacity, as every stored entry must be).
            kv = [c.snapshot() for c in job.cache or []]
            reason = "stop" if eos or job.output.stopped else "length"
            self._finish(job, reason, kv, list(job.request.prompt_ids))
        else:
            self._batch.join(job, first.token, first.logprobs, list(job.request.prompt_ids))

    def _insert_prompt(self, job: Job) -> None:
        self._batch.insert_prompt(job)

    def _decode(self) -> None:
        if not self._batch.rows:
            return
        responses = self._batch.step()
        self._decoded = len(responses)
        if responses:
            self.metrics.decode_steps.inc()
            self.metrics.generation_tokens.inc(len(responses))
        stopped: list[Job] = []
        for job, r, values in responses:
            self._emit(job, r.token, r.logprobs, values)
            if job.stage is Stage.DONE:  # failed while emitting
                continue
            if r.finish_reason is not None:
                self._batch.finished(job)
                self._finish(job, r.finish_reason, r.prompt_cache, r.all_tokens)
            elif job.output.stopped:
                stopped.append(job)
        if stopped:  # by a stop string: the generator does not know, take the rows out
            caches = self._batch.remove(stopped)
            for job in stopped:
                kv, tokens = caches.get(job.uid, (None, None))
                self._finish(job, "stop", kv, tokens)
