"""Answer prefill: after an answer ends, its KV is computed again by prefill blocks and
stored, so the next turn of the conversation finds prompt + answer in the prefix cache.

Under the exact-reuse rule (docs/caching.md) only prefill-computed KV is stored: a finished
request's answer was computed by decode steps (one row at a time, in batches of varying size),
whose KV differs in the last bits from what a prefill of the same tokens gives, so it is never
stored. Without this module turn N+1 therefore recomputes turn N's whole answer.

Here, when a request finishes (its prompt's blocks just stored), an `AnswerStore` queues an
answer job. In spare time a worker thread renders what the next turn's prompt will hold after
this prompt (gateway.engine.tokens.answer_render: the answer as the chat template renders it,
and the end of its turn); then the engine thread runs, over those tokens, exactly the block
computation an uncached request for the next turn runs: a forward of `block` query rows at
absolute positions [k*block, (k+1)*block), from the stored prompt blocks on (a prefix hit on
the request's own prompt), and stores each whole block (memory tree and disk tier, under the
request's cache scope). A block the next prompt turns out not to hold is never hit, so a
wrong guess costs memory, never exactness. The next prompt's final partial block is left to
the next turn (it is not stored by anyone); for a family that feeds a prompt's last token as
a one-row step (`last_token_apart`) no stored block holds the rendered tail's last token.

When it runs (`step`, called once per engine step after the decode, by the scheduler, only
while no user request waits, encodes or prefills): idle (nothing decodes), block by block up
to CAP_BLOCKS a step, stopping as soon as a message reaches the engine's inbox (`arrived`);
while rows decode, only blocks whose estimated cost fits what is left of the step's time
budget (`StepBudget`; never the first unit for free as admission gets) *and* at most
DECODING_SHARE of a plain decode step, none in a wave or under the fixed rule. The budget is
for users waiting to be admitted; this work is for a turn that may never come, so it may
lengthen a running stream's step by a quarter at most. On the H200 at 7B shapes a 256-row
block costs about a decode step (13-18 ms against 15): there it runs in idle time only (with
the budget alone, 16- and 32-row steps that ran answer blocks took 24 and 34 ms against 15
and 13: docs/performance.md, run 14). An answer block's
estimate is its own running mean (it attends over a whole conversation, so it costs more
than an average prefill row); starting a job, which copies its prompt's stored blocks, is
estimated per prompt token and measured, so a never-measured start waits for idle time. A
job interrupted keeps its private KV and resumes; what it computed so far is stored at once,
so a next turn arriving early still uses it. Jobs are dropped (counted) when the queue is
full (oldest first), under device memory pressure, on a cache reset, when their blocks are
already stored, or on any error. Off with `--no-answer-prefill`, the prefix cache off, exact
reuse off (then the answer's decode KV is stored, as before), or for requests with
`use_caches` false.

Engine thread only, except `stats` (any thread: it reads ints) and the rendering (its worker).
"""

from __future__ import annotations

import json
import logging
import time
from collections import deque
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor, wait

from gateway.engine.cache_ops import CacheOps
from gateway.engine.scheduler.answer_job import AnswerJob, memory_pressure
from gateway.engine.scheduler.budget import CostModel, RunningMean, StepBudget
from gateway.engine.scheduler.job import Job
from gateway.engine.tokens.answer_render import AnswerTemplate

log = logging.getLogger(__name__)

MAX_PENDING = 32  # answer jobs queued at most; the oldest goes first
RENDER_WAIT_S = 0.002  # idle: how long a step waits for a render before yielding to the loop
CAP_BLOCKS = 8  # block forwards one step runs at most (idle: the inbox is checked between)
SPENT_S = 0.0002  # answer work below this in a step is not counted as admission work
MAX_VARS = 16  # answer templates kept, one per set of template variables
DECODING_SHARE = 0.25  # while rows decode: a unit's estimate at most this x a decode step


class AnswerStore:
    """The queue of answer jobs of one engine (module doc). `block`: the exact-reuse block
    (0: exact reuse off, nothing is queued); `enabled`: `--answer-prefill`."""

    def __init__(
        self,
        cache_ops: CacheOps,
        block: int,
        enabled: bool = True,
        pressure: Callable[[], bool] = memory_pressure,
    ) -> None:
        self._ops = cache_ops
        self._model = cache_ops.model
        self.block = block
        self.enabled = enabled and block > 0 and self._model.cache_policy.prefix_off is None
        self._pressure = pressure
        # One template per set of template variables (worker thread only), at most MAX_VARS.
        self._templates: dict[str, AnswerTemplate] = {}
        self._queue: deque[AnswerJob] = deque()
        self._pool: ThreadPoolExecutor | None = None
        # Seconds per prompt token of starting a job (the hit's copy): while rows decode a
        # job starts only when that fits the step's budget (never measured: only when idle).
        self._copy_per_token = RunningMean()
        self._block_cost = RunningMean()  # seconds per answer block forward
        self._cancels = self._seen_cancels = 0  # `cancel` calls (any thread) / handled
        self.counts = dict.fromkeys(
            ("offered", "skipped", "dropped", "covered", "failed", "done", "blocks", "steps"), 0
        )

    @property
    def pending(self) -> bool:
        """Are answer jobs queued (the engine loop must keep stepping)?"""
        return bool(self._queue)

    def stats(self) -> dict[str, object]:
        """Counters for /v1/cache/stats (any thread): jobs offered, skipped (not a chat turn,
        or a template that does not render the answer as a continuation), dropped (queue
        full, memory pressure, reset), covered (already stored), failed, done; block forwards
        run (`blocks`, tokens = blocks x block_tokens) and steps that ran any."""
        return {"enabled": self.enabled, "pending": len(self._queue), **self.counts}

    def offer(self, job: Job, tokens: list[int]) -> None:
        """A request finished with `tokens` (prompt + answer) and its prompt's blocks were just
        stored: queue its answer job (the next-turn tokens render on the worker thread)."""
        request = job.request
        answer = tokens[job.prompt_len :]
        if not (self.enabled and request.use_caches and answer and self._ops.prefix.capacity_bytes):
            return
        if len(self._queue) >= MAX_PENDING:
            self._queue.popleft()
            self.counts["dropped"] += 1
        # The text the client received (stop strings cut), which it sends back next turn;
        # rendered only in spare time (`_run`): a next request sent the moment this answer
        # ends (an agent loop) does not share the CPU with the template.
        # Features only of images the answer's first blocks may hold (ending in the prompt's
        # last two blocks): the job starts from the stored prompt blocks; were those evicted
        # meanwhile, it is skipped rather than holding every image of every queued answer.
        keep = (job.prompt_len // self.block - 1) * self.block
        encoded = [
            f if image.layout.end > keep else None
            for f, image in zip(job.encoded, request.images, strict=False)
        ]
        self._queue.append(AnswerJob(request, encoded, job.output.text))
        self.counts["offered"] += 1  # after the append: offered and pending read consistently

    def _render(self, head: AnswerJob) -> Future[tuple[int, list[int]] | None]:
        """Start rendering the job's next-turn tokens on the worker thread."""
        if self._pool is None:
            self._pool = ThreadPoolExecutor(1, thread_name_prefix="answer-render")
        request = head.request
        return self._pool.submit(
            self._next_tokens, request.prompt_ids, head.text, request.template_vars
        )

    def _next_tokens(
        self, prompt: tuple[int, ...], text: str, template_vars: str = ""
    ) -> tuple[int, list[int]] | None:
        """(worker thread) The next turn's tokens in place of `prompt`'s end
        (`AnswerTemplate.tail`, with the prompt's template variables), or None."""
        template = self._templates.get(template_vars)
        if template is None:
            if len(self._templates) >= MAX_VARS:  # clients varying them freely: start over
                self._templates.clear()
            kwargs = json.loads(template_vars) if template_vars else None
            template = self._templates[template_vars] = AnswerTemplate(self._model, kwargs)
        if not template.ends_turn(prompt):
            return None
        return template.tail(text)

    def cancel(self) -> None:
        """Any thread (`/v1/cache/clear`, before the caches are emptied): drop every queued
        job; the engine thread sees it before its next store, so no answer block computed
        from the old caches lands after the clear."""
        self._cancels += 1

    def _cancelled(self) -> bool:
        """Has `cancel` been called since the engine thread last looked? (Engine thread.)"""
        return self._seen_cancels != self._cancels

    def clear(self, reset: bool = False) -> None:
        """Drop every queued job; `reset`: a cache reset (their hits came from the old
        caches), whose fresh caches count from zero, as these counters then do."""
        self.counts["dropped"] += len(self._queue)
        self._queue.clear()
        if reset:
            self.counts = dict.fromkeys(self.counts, 0)

    def step(
        self, budget: StepBudget, costs: CostModel, decoding: bool, arrived: Callable[[], bool]
    ) -> int:
        """Run answer work in this step's spare time (module doc); returns the query rows
        fed. Its time is spent from `budget`; the block forwards' feed `costs`' prefill
        estimate (the same forwards a prompt's prefill runs)."""
        if self._cancelled():
            self._seen_cancels = self._cancels
            self.clear()
        if not self._queue:
            return 0
        if decoding and (budget.fixed or budget.wave or budget.limit is None):
            return 0
        t0 = time.perf_counter()
        share = DECODING_SHARE * (costs.decode_step.value or 0.0)

        def allow(estimate: float | None) -> bool:
            """May work estimated at `estimate` seconds (None: unknown) start now?"""
            if arrived():
                return False
            if not decoding:
                return True
            left = (budget.left() or 0.0) - (time.perf_counter() - t0)
            return estimate is not None and estimate <= min(left, share)

        per_row = costs.prefill_row.value
        rows, forwards = self._run(allow, per_row, decoding, arrived)
        spent = time.perf_counter() - t0
        if rows or spent > SPENT_S:  # (a step that only looked stays a plain decode step)
            budget.spend(spent)
        if rows:
            costs.add_prefill(rows, forwards)
            self.counts["steps"] += 1
        return rows

    def _run(
        self,
        allow: Callable[[float | None], bool],
        per_row: float | None,
        decoding: bool,
        arrived: Callable[[], bool],
    ) -> tuple[int, float]:
        """Blocks of the oldest jobs while `allow`ed, at most CAP_BLOCKS; returns the rows
        fed and the seconds their forwards took."""
        rows, seconds = 0, 0.0
        # An answer block's own measured cost (it attends over a whole conversation, so it
        # costs more than the average prefill row says); before one is measured, the latter.
        block_cost = self._block_cost.value
        if block_cost is None and per_row is not None:
            block_cost = per_row * self.block
        while self._queue and rows < CAP_BLOCKS * self.block:
            if self._cancelled():  # a clear meanwhile: the next step drops the queue
                break
            head = self._queue[0]
            if head.job is None:
                if head.render is None:
                    if not allow(0.0):
                        break
                    head.render = self._render(head)
                if not head.render.done():
                    if decoding or arrived() or not wait([head.render], RENDER_WAIT_S).done:
                        break
                    continue  # rendered: look for a clear again before starting
                # Starting copies the prompt's stored blocks into the job's own KV.
                copy = self._copy_per_token.value
                if not allow(None if copy is None else copy * len(head.request.prompt_ids)):
                    break
                if not self._start(head):
                    self._queue.popleft()
                    continue
            if self._pressure():
                self.clear()
                break
            if not allow(block_cost):
                break
            started = time.perf_counter()
            try:
                head.feed_block(self._model, self.block)
                self.counts["blocks"] += 1
            except Exception:
                log.exception("answer prefill of %s failed", head.request.request_id)
                self.counts["failed"] += 1
                self._queue.popleft()
                continue
            took = time.perf_counter() - started
            self._block_cost.add(took)
            block_cost = self._block_cost.value
            seconds += took
            rows += self.block
            if head.done:
                self.counts["done" if self._store(head) else "dropped"] += 1
                self._queue.popleft()
        if self._queue and self._queue[0].job is not None:
            self._store(self._queue[0])  # interrupted: what it has is usable at once
        return rows, seconds

    def _start(self, head: AnswerJob) -> bool:
        """Set up the job's private KV from the stored blocks of its own prompt (False: skip
        it, counted)."""
        try:
            assert head.render is not None
            rendered = head.render.result()
            prompt = head.request.prompt_ids
            if rendered is None or rendered[0] >= len(prompt):
                self.counts["skipped"] += 1
                return False
            drop, tail = rendered
            started = time.perf_counter()
            why_not = head.setup(self._ops, self.block, (*prompt[: len(prompt) - drop], *tail))
            if why_not is not None:
                self.counts[why_not] += 1
                return False
            self._copy_per_token.add((time.perf_counter() - started) / len(prompt))
            return True
        except Exception:
            log.exception("starting the answer prefill of %s failed", head.request.request_id)
            self.counts["failed"] += 1
            return False

    def _store(self, head: AnswerJob) -> bool:
        """Hand the job's new blocks to the cache, unless a clear cancelled it meanwhile
        (False)."""
        if self._cancelled():
            return False
        head.store(self._ops)
        return True
