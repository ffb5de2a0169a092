"""Where every request of the engine is, and the stages of one engine step.

The scheduler owns the jobs table, the queues (waiting for a row, encoding images,
prefilling), the group of images in the vision tower, the decode batch and the queued/active
counts, and moves jobs through them:

    admit    queued requests into free rows: prefix-cache lookup, vision-cache lookups
    prefill  prompt tokens, oldest first, up to the step's time budget while rows decode
             (PrefillStage); before encode: these requests are older than the tower's group
    encode   vision-tower units for a group of pending images: idle, the oldest requests'
             images together as one graph; while rows decode, the oldest request's images
             only (a wave: all, see StepBudget), as many units as the step's time budget
             allows (gateway.engine.scheduler.encode_group)
    decode   one batched step of every running row; emit tokens; finish rows
    answer   answer prefill in the step's spare time (gateway.engine.scheduler.answer_store):
             a finished answer's KV recomputed in exact blocks and stored for the next turn

The time budget (`--admission-budget` x the decode step, gateway.engine.scheduler.budget) is
shared by the prefill and encode stages of a step; each stage with work pending does at
least one unit, so admission never stops. `begin_step` / `end_step` bracket a step and feed
the decode-step estimate.

`gateway.engine.core.Engine` runs them in order, one step per loop; how jobs end is the
`Endings`'; the queues' one exit is `release`. Failure isolation: an exception while
starting, encoding or prefilling one request fails that request; when the decode step raises,
`fail_batch` replaces the batch and fails its rows; after any other error in a step,
`fail_active` fails every request holding a row.

Engine thread only, except the `Occupancy` it shares with the engine (thread-safe).
"""

from __future__ import annotations

import logging
import time
from collections import deque
from collections.abc import Callable
from concurrent.futures import FIRST_COMPLETED, wait

import mlx.core as mx

from gateway.config import EngineConfig
from gateway.engine.request import AdmittedEvent, EngineRequest, ErrorKind, FinishReason
from gateway.engine.scheduler.budget import CostModel, StepBudget
from gateway.engine.scheduler.choices import fork
from gateway.engine.scheduler.decode_batch import DecodeBatch
from gateway.engine.scheduler.encode_group import EncodeGroup, start_group, step_group
from gateway.engine.scheduler.endings import Endings
from gateway.engine.scheduler.job import Choices, Job, Sink, Stage
from gateway.engine.scheduler.loaded import Loaded
from gateway.engine.scheduler.occupancy import Occupancy
from gateway.engine.scheduler.prefill_stage import PrefillStage
from gateway.engine.scheduler.step_trace import StepTrace
from gateway.engine.tokens.output import OutputState
from gateway.engine.tokens.penalties import RowShaping
from gateway.engine.tokens.sampling import make_sampler
from gateway.engine.tokens.thinking import ThinkingRow, needs_row
from gateway.metrics import Metrics

log = logging.getLogger("gateway.engine.core")  # the engine's name (see endings.py)


class Scheduler:
    """The engine's jobs and the stages that move them; see the module docstring. Built once
    the model is loaded (its `loaded` state), with the engine's `occupancy` (counted from
    `submit` on, before the load) and step trace (None: off)."""

    def __init__(
        self,
        config: EngineConfig,
        metrics: Metrics,
        loaded: Loaded,
        occupancy: Occupancy,
        trace: StepTrace | None,
    ) -> None:
        self.config = config
        self.metrics = metrics
        self.loaded = loaded
        self.occupancy = occupancy
        self.trace = trace
        self.jobs: dict[str, Job] = {}  # every job not yet ended, by `Job.key`
        self.families: dict[str, Choices] = {}  # forked n > 1 requests, by request id
        self.waiting: deque[Job] = deque()  # submitted, waiting for a row
        self.encoding: deque[Job] = deque()  # holding a row, images still to encode
        self.group: EncodeGroup | None = None  # images going through the tower now
        self.prefilling: deque[Job] = deque()  # holding a row, prompt being fed
        self._batch: DecodeBatch | None = loaded.new_batch(config)  # None once shut down
        self.endings = Endings(metrics, loaded.cache_ops, self.release)
        self._answers = loaded.answers
        if self._answers is not None:
            self.endings.after_store = self._answers.offer
        self._answer_rows = 0  # query rows of answer prefill in this step (for the trace)
        self._prefill = PrefillStage(
            config, metrics, loaded.prefiller, self.endings, trace, self.fork
        )
        if trace is not None:  # the prefill's forwards, stores and first tokens timed apart
            loaded.prefiller.lap = trace.stage
        self._inserted = 0  # the batch's insert count when the step began (for the trace)
        self._decoded = 0  # tokens emitted by this step's decode (for the trace)
        self.costs = CostModel()  # running cost estimates (this engine: one model, one device)
        self.budget = StepBudget(self.costs, config.admission_budget)
        self._step_started = 0.0  # perf_counter seconds at `begin_step`

    @property
    def batch(self) -> DecodeBatch:
        """The rows decoding together (replaced when a decode step raises)."""
        assert self._batch is not None, "the scheduler was shut down"
        return self._batch

    @property
    def idle(self) -> bool:
        """Nothing waiting here and no request holding a row: the loop may block."""
        answers = self._answers is not None and self._answers.pending
        return not (self.waiting or self.occupancy.active or answers)

    def enqueue(self, request: EngineRequest, sink: Sink) -> None:
        """A submitted request (already counted as queued) joins the waiting queue."""
        model, ops = self.loaded.model, self.loaded.cache_ops
        output = OutputState(
            request.sampling, model.new_detokenizer, model.token_text, model.token_bytes
        )
        job = Job(request=request, sink=sink, output=output, rows=request.sampling.n)
        if request.sampling.grammar is not None:
            # Compiled on a worker thread while the request waits; admitted once it is ready.
            job.grammar = self.loaded.grammars.prepare(request.sampling.grammar)
        job.prefetch = ops.prefetch(job)  # disk reads: on the reader thread too
        self.jobs[job.key] = job
        self.waiting.append(job)

    def cancel(self, request_id: str) -> None:
        """End the request wherever it is, every choice of it (nothing if it already ended)."""
        family = self.families.get(request_id)
        for job in family.jobs if family is not None else [self.jobs.get(request_id)]:
            if job is not None and job.stage is not Stage.DONE:
                self.endings.cancel(job)

    def fork(self, job: Job) -> list[Job]:
        """A prefilled request's choices 1..n-1 (gateway.engine.scheduler.choices), now in
        the jobs table; [] for one choice."""
        if job.request.sampling.n <= 1 or job.choices is not None:
            return []
        siblings = fork(job, self.loaded)
        for sibling in siblings:
            self.jobs[sibling.key] = sibling
        assert job.choices is not None
        self.families[job.request_id] = job.choices
        return siblings

    def admit(self) -> None:
        """Give free rows to the oldest waiting requests that are ready (all n rows of a
        request for n choices at once; a request that does not fit yet waits at the head)."""
        while self.waiting and self.occupancy.active < self.config.max_batch:
            job = self._next_ready(self.config.max_batch - self.occupancy.active)
            if job is None:
                return
            job.stage = Stage.PREFILL
            self.occupancy.admit(job.rows)
            try:
                self._start(job)
            except Exception as exc:
                log.exception("request %s failed to start", job.request_id)
                message = f"internal error starting the request: {exc}"
                self.endings.fail_internal(job, message)

    def _next_ready(self, room: int) -> Job | None:
        """The oldest waiting job whose grammar (if any) is compiled and disk read (if any)
        done, taken off the queue, if its rows fit in `room`. With nothing else to do, waits
        a little for one of them instead of spinning."""
        for attempt in range(2):
            for job in self.waiting:
                if job.ready():
                    if job.rows > room:
                        return None
                    self.waiting.remove(job)
                    return job
            if attempt or self.batch.rows or self.prefilling or self.encoding or self.group:
                return None
            # Idle: wait, then admit what got ready in this step rather than the next.
            wait([f for j in self.waiting for f in j.pending()], 0.05, FIRST_COMPLETED)
        return None

    def _start(self, job: Job) -> None:
        """Look the request up in the caches, then queue its image or prefill work."""
        grammars = self.loaded.grammars
        grammar = None
        if job.grammar is not None:
            grammar = grammars.start(job.grammar.result())  # raises a compile error
        thinking = job.request.sampling.thinking
        if needs_row(thinking, grammar is not None):
            assert thinking is not None
            grammar = ThinkingRow(thinking, grammar)  # type: ignore[assignment]
        job.sampler = make_sampler(job.request.sampling, grammar, grammars.masker)
        job.shaping = RowShaping.from_params(job.request.sampling, job.request.prompt_ids)
        self.loaded.cache_ops.admit(job)
        if self.trace is not None:
            self.trace.note("admitted", job.request_id)
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
            self.encoding.append(job)
        else:
            self.prefilling.append(job)

    def encode(self) -> None:
        """One vision-tower unit for the current group of images (formed from the oldest
        requests' pending images when none is running)."""
        ops = self.loaded.cache_ops
        if self.budget.join_only:
            return
        if self.group is None:
            if not self.encoding:
                return
            # Unit by unit only while rows decode (they must not stall); alone, the tower
            # runs as one graph. While rows decode the group holds the oldest request's
            # images only: grouping the next request's too would make the first image's first
            # token wait for the second's encode (issue 30); idle or in a wave (StepBudget), a
            # burst is encoded together (16 concurrent images: one tower call).
            alone = self.batch.rows and not self.budget.wave
            jobs = [self.encoding[0]] if alone else self.encoding
            self.group, failed = start_group(
                ops,
                jobs,
                max_images=None if self.loaded.group_images else 1,
                stepwise=lambda: bool(self.batch.rows),
            )
            for job, exc in failed:  # e.g. preprocessing an evicted image without pixels
                log.error("preparing an image of %s failed: %s", job.request_id, exc)
                self.endings.fail_internal(job, f"internal error preparing the image: {exc}")
            if self.group is None:
                return
        group = self.group
        started = time.perf_counter()
        # One free unit a step, not one per stage: after a prefill block (the older request's)
        # the tower gets only what the budget has left, so a step never runs a prefill block
        # and a tower unit beyond it (H200: 60-100 ms steps against a 15-25 ms decode, run 14).
        free = not self.budget.worked or self.budget.fixed
        try:
            done = step_group(ops, group, self.budget, free_first=free)
        except Exception as exc:
            self.group = None
            log.exception("encoding a group of %d images failed", len(group.images))
            for job in group.jobs:
                self.endings.fail_internal(job, f"internal error encoding the image: {exc}")
            return
        self.metrics.vision_encode_seconds.observe(time.perf_counter() - started)
        if not done:
            return
        self.group = None
        for job in group.jobs:
            if job.stage is Stage.ENCODE and not job.to_encode:
                self.encoding.remove(job)
                job.stage = Stage.PREFILL
                self.prefilling.append(job)

    def prefill(self) -> None:
        """Prompt tokens up to the step's budget (gateway.engine.scheduler.prefill_stage);
        the forwards' cost per row feeds the estimate."""
        if not self.prefilling or self.budget.join_only:
            return
        started = time.perf_counter()
        rows = self._prefill.run(self.prefilling, self.batch, self.budget)
        seconds = time.perf_counter() - started
        self.budget.spend(seconds)
        self.costs.add_prefill(rows, seconds)

    def decode(self) -> None:
        """One batched step of every row: emit each row's token, finish the rows that ended."""
        batch = self.batch
        if not batch.rows:
            return
        responses = batch.step(hold_new=self.budget.holds_joins)
        self._decoded = len(responses)
        if responses:
            self.metrics.decode_steps.inc()
            self.metrics.generation_tokens.inc(len(responses))
        stopped: list[Job] = []
        for job, r, values in responses:
            self.endings.emit(job, r.token, r.logprobs, values)
            if job.stage is Stage.DONE:  # failed while emitting
                continue
            if r.finish_reason is not None:
                batch.finished(job)
                self.endings.finish(job, r.finish_reason, r.prompt_cache, r.all_tokens)
            elif job.output.stopped:
                stopped.append(job)
        if stopped:  # by a stop string: the generator does not know, take the rows out
            caches = batch.remove(stopped)
            for job in stopped:
                kv, tokens = caches.get(job.uid, (None, None))
                self.endings.finish(job, FinishReason.STOP, kv, tokens)

    def store_finished(self) -> None:
        """Store the KV of the requests finished in this step (after their events left)."""
        self.endings.store_finished()

    def answer(self, arrived: Callable[[], bool]) -> None:
        """Answer prefill (gateway.engine.scheduler.answer_store) in this step's spare time,
        only while no user request waits for a row, its images or its prefill; `arrived`:
        has a message reached the engine's inbox since (then it stops)."""
        self._answer_rows = 0
        busy = self.waiting or self.encoding or self.prefilling or self.group is not None
        if self._answers is None or busy:
            return
        decoding = bool(self.batch.rows)
        self._answer_rows = self._answers.step(self.budget, self.costs, decoding, arrived)

    def release(self, job: Job) -> None:
        """Forget a job wherever it is and free its row (idempotent). The bookkeeping is
        undone before the batch is touched, so a failing batch cannot leave a half-released
        job (or a leaked row count) behind."""
        if self.jobs.pop(job.key, None) is None:
            return
        stage, job.stage = job.stage, Stage.DONE
        if job.prefetch is not None:  # its disk read's buffers: not needed any more
            job.prefetch.release()
            job.prefetch = None
        family = job.choices
        if family is not None and all(j.stage is Stage.DONE for j in family.jobs):
            self.families.pop(job.request_id, None)
        if stage is Stage.QUEUED:
            self.waiting.remove(job)
            self.occupancy.unqueue(job.rows)
            return
        self.occupancy.free_row(job.rows)
        for pending in (self.encoding, self.prefilling):
            if job in pending:
                pending.remove(job)
        job.cache = job.plan = None
        self.batch.release(job)

    def fail_active(self) -> None:
        """After an unexpected error in a step: fail every request holding a row (their state
        is unknown), with a fresh batch; queued requests are served as usual."""
        for job in [*self.encoding, *self.prefilling]:
            self.endings.fail_internal(job, "internal error in the engine step")
        self.group = None
        self.endings.drop_stores()
        self.fail_batch()

    def fail_batch(self) -> None:
        """The decode step raised: the batch's state is unknown. Replace it first, then fail
        its rows (releasing them no longer touches the broken batch)."""
        failed = self.batch.forget_rows()
        try:
            self._batch = self.loaded.new_batch(self.config)
        except Exception:
            log.exception("could not build a new batch")
        for job in failed:
            self.endings.fail_internal(job, "internal error in the decode step")

    def shut_down(self) -> None:
        """Fail every request still here (SHUTTING_DOWN), wait for the batch's last step and
        drop the batch (the engine thread parks rather than exits: nothing else would)."""
        for job in list(self.jobs.values()):
            self.endings.fail(job, ErrorKind.SHUTTING_DOWN, "the server is shutting down")
        try:
            mx.synchronize(self.batch.stream)  # the batch computes one token ahead
        except Exception:
            log.exception("the last batch step failed while shutting down")
        self._batch = None

    def begin_step(self) -> None:
        """Mark the start of a step (for `step_counts` and the decode-step estimate) and open
        its admission budget."""
        self._step_started = time.perf_counter()
        self._inserted = self.batch.inserted
        self._decoded = 0
        self._answer_rows = 0
        admitting = len(self.waiting) + len(self.encoding) + len(self.prefilling)
        ratio = self.config.admission_budget
        rows, joining = len(self.batch.rows), self.batch.joins_pending
        self.budget = StepBudget(self.costs, ratio, rows, admitting, joining)

    def end_step(self) -> None:
        """A step that decoded rows feeds the budget's estimates (`StepBudget.record`)."""
        if self._decoded:
            wall = time.perf_counter() - self._step_started
            self.budget.record(wall, joined=self.batch.last_joined > 0)

    def step_counts(self) -> dict[str, int]:
        """The step trace's counts after a step (gateway.engine.scheduler.step_trace)."""
        batch = self.batch
        return {
            "rows": len(batch.rows),
            "joined": max(batch.inserted - self._inserted, 0),
            "prefilling": len(self.prefilling),
            "encoding": len(self.encoding),
            "waiting": len(self.waiting),
            "tokens": self._decoded,
            "answer_rows": self._answer_rows,
        }
