"""The prefill stage of an engine step: feed up to one budget of prompt tokens, oldest request
first; a request whose prompt is complete gets its first token from the prefill logits and
joins the decode batch (or ends there).

The feeding itself (chunks, exact-reuse blocks, shared final blocks) is the `Prefiller`'s
(gateway.engine.scheduler.prefill); this stage decides who is fed how much in a step, hands a
burst of short text prompts to the batch, and routes each first token. How much: while rows
decode, the rows that fit the step's time budget (`budget_rows`, from the measured cost per
row), in whole exact-reuse blocks; idle or in a wave, `prefill_budget`'s large budget. The
scheduler owns the queue of requests being prefilled and the decode batch and passes them
in; each request is failed alone when its part raises.

Engine thread only.
"""

from __future__ import annotations

import logging
from collections import deque
from collections.abc import Callable

import mlx.core as mx

from gateway.config import EngineConfig
from gateway.engine.request import FinishReason
from gateway.engine.scheduler.budget import StepBudget
from gateway.engine.scheduler.choices import first_tokens
from gateway.engine.scheduler.decode_batch import DecodeBatch
from gateway.engine.scheduler.endings import Endings
from gateway.engine.scheduler.job import Job, Stage
from gateway.engine.scheduler.prefill import MIN_FINAL_ROWS, FirstToken, Prefiller
from gateway.engine.scheduler.step_trace import StepTrace
from gateway.metrics import Metrics

log = logging.getLogger("gateway.engine.core")  # the engine's name (see endings.py)


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


def budget_rows(cap: int, unit: int, budget: StepBudget) -> int:
    """Query rows this step's prefill may feed: `cap` (`prefill_budget`) when nothing decodes,
    under the old fixed rule (ratio 0), or in a wave (`StepBudget.wave`: the old burst budget
    keeps a 16-image burst as fast as it was); else the rows whose estimated cost fits the
    time left in the step, in whole `unit`s (the exact-reuse block: the budget only decides
    how many blocks, never where one starts), at least one unit, at most `cap`."""
    if budget.fixed or budget.limit is None or budget.wave:
        return cap
    per_row = budget.costs.prefill_row.value
    left = budget.left() or 0.0
    if per_row is None or per_row <= 0:
        return min(unit, cap)  # the first forward measures it
    fit = int(left / per_row) // unit * unit
    return min(max(fit, unit), cap)


class PrefillStage:
    """One step's prefill (`run`); see the module docstring."""

    def __init__(
        self,
        config: EngineConfig,
        metrics: Metrics,
        prefiller: Prefiller,
        endings: Endings,
        trace: StepTrace | None,
        fork: Callable[[Job], list[Job]],
    ) -> None:
        self._chunk = config.prefill_chunk_tokens
        self._fork = fork  # a prefilled request's other choices (n > 1), else []
        self._metrics = metrics
        self._prefiller = prefiller
        self._endings = endings
        self._trace = trace

    def run(self, prefilling: deque[Job], batch: DecodeBatch, step: StepBudget) -> int:
        """Feed up to this step's prefill budget (`budget_rows`) of prompt tokens of
        `prefilling`, oldest first; requests whose prompt completes leave the queue. Returns
        the query rows fed (padding rows included: what the forwards cost).

        A burst (several requests whose remaining prompt is short text) is handed to the
        batch instead, which prefills them together in one forward per group; one request
        alone is prefilled here, so its first token comes from its own prefill logits."""
        rows, waiting = len(batch.rows), len(prefilling)
        cap = prefill_budget(self._chunk, rows, waiting)
        unit = self._prefiller.block or MIN_FINAL_ROWS
        budget = start = budget_rows(cap, min(unit, cap), step)
        burst = [
            job
            for job in prefilling
            if job.fed == max(job.split, job.cached_tokens)  # images done, no text fed yet
            and job.prompt_len - job.fed <= budget
            # The generator's own prefill draws unshaped first tokens and does not fork.
            and job.shaping is None
            and job.rows == 1
        ]
        # exact: every prompt in blocks here; recurrent states: never in the generator's
        # left-padded prefill (its padding would run through the recurrence)
        if len(burst) > 1 and not (self._prefiller.exact or self._prefiller.model.state_snapshots):
            for job in burst:
                prefilling.remove(job)
                try:
                    batch.insert_prompt(job)
                except Exception as exc:
                    log.exception("inserting %s failed", job.request_id)
                    self._endings.fail_internal(job, f"internal error admitting it: {exc}")
        groups = self._prefiller.final_block_groups(prefilling)
        shared = {id(j): g for g in groups for j in g}
        for job in list(prefilling):
            if budget <= 0:
                break
            if job.stage is not Stage.PREFILL or job not in prefilling:
                continue  # fed with its group, or failed
            if id(job) in shared:
                budget = self._feed_group(shared[id(job)], budget, prefilling, batch)
                continue
            try:
                fed, first = self._prefiller.feed(job, budget)
                budget -= fed
                self._metrics.prefill_chunks.inc()
                if first is not None:
                    prefilling.remove(job)
                    self._first_token(job, first, batch)
            except Exception as exc:
                log.exception("prefill of %s failed", job.request_id)
                self._endings.fail_internal(job, f"internal error in the prefill: {exc}")
        return start - budget

    def _feed_group(
        self, group: list[Job], budget: int, prefilling: deque[Job], batch: DecodeBatch
    ) -> int:
        """Exact reuse: the final partial blocks of as many of `group` (from
        `final_block_groups`; members already fed are skipped) as the budget allows, at least
        one, in one forward; returns the budget left. A request alone takes the usual path."""
        pending = [job for job in group if job in prefilling]
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
                self._endings.fail_internal(job, f"internal error in the prefill: {exc}")
            return budget - rows * len(jobs)
        self._metrics.prefill_chunks.inc()
        for job, first in zip(jobs, firsts, strict=True):
            try:
                if isinstance(first, Exception):
                    raise first
                if first is not None:
                    prefilling.remove(job)
                    self._first_token(job, first, batch)
            except Exception as exc:  # this request alone
                log.exception("prefill of %s failed", job.request_id)
                self._endings.fail_internal(job, f"internal error in the prefill: {exc}")
        return budget - fed

    def _first_token(self, job: Job, first: FirstToken, batch: DecodeBatch) -> None:
        """Emit the token sampled at the end of the prefill; finish, or join the batch. A
        request for n > 1 choices forks here (gateway.engine.scheduler.choices): the others
        draw their first tokens from the same logits and join (or finish) alike."""
        try:
            self._first_tokens(job, first, batch)
        finally:
            self._prefiller.lap("first_token")

    def _first_tokens(self, job: Job, first: FirstToken, batch: DecodeBatch) -> None:
        siblings = self._fork(job)  # before job's KV moves into the batch
        if self._trace is not None:
            self._trace.note("first", job.request_id)
        self._route(job, first.token, first.logprobs, batch)
        if not siblings:
            return
        tokens = first_tokens(siblings, first.logprobs)
        for sibling, token in zip(siblings, tokens, strict=True):
            if sibling.stage is Stage.DONE:  # the request failed meanwhile
                continue
            try:
                self._route(sibling, token, first.logprobs, batch)
            except Exception as exc:  # fails every choice of the request (one ErrorEvent)
                log.exception("the first token of %s failed", sibling.key)
                self._endings.fail_internal(sibling, f"internal error in the prefill: {exc}")

    def _route(self, job: Job, token: int, logprobs: mx.array, batch: DecodeBatch) -> None:
        """Emit a job's first token; finish it there, or let it join the batch."""
        self._metrics.generation_tokens.inc()
        self._endings.emit(job, token, logprobs)
        if job.stage is Stage.DONE:  # failed while emitting
            return
        sampling = job.request.sampling
        eos = not sampling.ignore_eos and token in batch.stop_ids
        if eos or job.output.stopped or sampling.max_tokens <= 1:
            # Done at its first token: the KV holds exactly the prompt (copied without the
            # buffer's spare capacity, as every stored entry must be).
            kv = [c.snapshot() for c in job.cache or []]
            reason = FinishReason.STOP if eos or job.output.stopped else FinishReason.LENGTH
            self._endings.finish(job, reason, kv, list(job.request.prompt_ids))
        else:
            batch.join(job, token, logprobs, list(job.request.prompt_ids))
