"""Feeding a request's uncached prompt tokens into its own KV cache, in chunks, and sampling
its first token from the last chunk's logits. Engine thread only.

Every request, text or image, is prefilled here rather than inside mlx-lm's BatchGenerator:
- the image-bearing part [cached_tokens, split) needs `inputs_embeds` and the family's
  positions (e.g. 3-axis mRoPE), which BatchGenerator cannot feed;
- the text part [split, prompt_len) goes through the same `TextCore` the batch decodes with;
- the first token comes straight from the prefill's last logits. Handing the whole prompt to
  BatchGenerator would cost one more forward pass before the first token (it prefills all
  but the last prompt token, then steps the last one), about one decode step of TTFT.

A job then joins the batch with its first token as the "prompt", which BatchGenerator steps
like any decode row.

With the exact-reuse rule on (`block` > 0, docs/caching.md) every forward covers exactly one
block [k*block, (k+1)*block) of absolute prompt positions with `block` query rows (the last
block padded), image and text alike through the embeddings path, and the first token comes
from the last real row alone. The cached path starts at a block boundary (cache_ops aligns
hits), so each reused or recomputed position is produced by the same forward, in the same
shape, from the same inputs, as in the uncached path.

The final block of a prompt, when partial, is never stored (hits are whole blocks), so its
shape only has to be the same for the same prompt: it is padded to `final_rows` (the next
power of two from 32, at most `block`) rather than to a whole block, which spares a short
prompt on a GPU a 256-row forward. And requests whose next forward is such a final partial
block at the same absolute position (a burst of new short prompts, or of repeat questions)
share one forward (`feed_final_blocks`): each row gets the inputs it would get alone, so on
backends whose kernels do not depend on the batch size (CPU: measured, and pinned by tests at
tolerance zero) the answers are those of each request alone; elsewhere they may differ in the
last bits the way rows decoded in a batch do, but no stored KV ever comes from such a forward.

The image-bearing part's blocks are stored as they are computed, one per block forward (a
hit may end inside an image under this rule; the rest of the image comes from its
features), not all at the end of the part: that step did the part's last block, its first
token and every block's store, the longest step a running stream waited through.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import mlx.core as mx

from gateway.engine.cache_ops import CacheOps
from gateway.engine.families.family import ModelFamily
from gateway.engine.model.prompt_forward import GroupPart, PrefillPlan, text_offset
from gateway.engine.model.snapshots import drop_marks
from gateway.engine.scheduler.job import Job
from gateway.engine.tokens.penalties import shape_first
from gateway.processors.positions import rope_delta_at

MIN_FINAL_ROWS = 32  # the most a final partial block's smallest forward is padded to


def _no_lap(stage: str) -> None:
    """The step trace's stage closer when nothing traces."""


def final_rows(real: int, block: int) -> int:
    """Query rows of a block forward holding `real` (1..block) prompt tokens: a whole block
    is `block` rows; a final partial block the next power of two from a quarter block, at
    most MIN_FINAL_ROWS (so 32 for a GPU's 256-token block, 8 for the CPU's 32), at most
    `block` (module doc). Padding costs rows on a CPU, where a forward's time grows with
    them: a warm turn's final block of a dozen tokens padded to 32 rows was most of that
    turn for Mistral 3's 560-token prompts."""
    if real >= block:
        return block
    rows = min(MIN_FINAL_ROWS, max(block // 4, 1))
    while rows < real:
        rows *= 2
    return min(rows, block)


@dataclass(frozen=True)
class FirstToken:
    """The token sampled from the prompt's last position and its (vocab,) log-probabilities."""

    token: int
    logprobs: mx.array


class Prefiller:
    """Chunked prefill for one job at a time (`feed`), owned by the engine thread.
    `block` > 0: the exact-reuse rule with blocks of that many tokens (module doc)."""

    def __init__(self, model: ModelFamily, cache_ops: CacheOps, block: int = 0) -> None:
        self.model = model
        self.cache_ops = cache_ops
        self.block = block
        # The step trace's `stage` when tracing (set by the scheduler): the time since its
        # last mark goes to the named stage, so a step's prefill splits into the forwards
        # ("prefill"), storing the image part's blocks ("store") and the first token
        # ("first_token").
        self.lap: Callable[[str], None] = _no_lap

    @property
    def exact(self) -> bool:
        """True when every prompt must be prefilled here in blocks (never by the batch)."""
        return self.block > 0

    def feed(self, job: Job, budget: int) -> tuple[int, FirstToken | None]:
        """Feed at most `budget` (> 0) of the job's remaining prompt tokens.

        Returns (tokens fed, the first token once the whole prompt is in the cache, else
        None). The image part and the text part are never mixed in one call, so a call may
        feed fewer tokens than the budget allows.
        """
        if job.cache is None:
            job.cache = self.model.new_cache()
        if self.exact:
            return self._feed_blocks(job, budget)
        if job.fed < job.split:
            return self._feed_images(job, budget), None
        return self._feed_text(job, budget)

    def _feed_images(self, job: Job, budget: int) -> int:
        layouts = [i.layout for i in job.request.images]
        if job.plan is None:
            job.plan = self.model.prefill_plan(
                job.request.prompt_ids, layouts, list(job.encoded), job.cached_tokens, job.split
            )
        lo = job.fed - job.cached_tokens
        hi = min(lo + budget, job.plan.length)
        self.model.prefill(job.plan, job.cache, lo, hi)  # type: ignore[arg-type]
        job.fed = job.cached_tokens + hi
        if job.fed == job.split:
            delta = rope_delta_at(layouts, job.split)
            for layer in job.cache or []:
                layer.rope_delta = delta
            job.plan = None
            self._store(job)
        return hi - lo

    def _feed_text(self, job: Job, budget: int) -> tuple[int, FirstToken | None]:
        prompt = job.request.prompt_ids
        lo, hi = job.fed, min(job.fed + budget, len(prompt))
        logits = self.model.text_core(mx.array([prompt[lo:hi]], dtype=mx.int32), job.cache)
        job.fed = hi
        if hi < len(prompt):
            mx.eval([c.state for c in job.cache or []])
            return hi - lo, None
        last = shape_first(logits[:, -1, :], job.shaping, self.model.eos_token_ids)
        logprobs = last - mx.logsumexp(last, axis=-1, keepdims=True)
        token = job.sampler(logprobs)
        mx.eval(token, logprobs, [c.state for c in job.cache or []])
        return hi - lo, FirstToken(int(token.item()), logprobs[0])

    def _feed_blocks(self, job: Job, budget: int) -> tuple[int, FirstToken | None]:
        """Feed whole blocks until `budget` rows are spent (at least one block)."""
        prompt = job.request.prompt_ids
        n, block = len(prompt), self.block
        self._plan(job)
        base, rows = job.cached_tokens, 0
        while True:
            lo = job.fed
            hi = min(lo + block, n)
            shape = self.final_rows(hi - lo)
            hidden = self.model.prefill(job.plan, job.cache, lo - base, hi - base, rows=shape)
            job.fed, rows = hi, rows + shape
            if lo < job.split:  # block by block: a final step storing all of an image's
                self._store(job)  # blocks at once was the longest (H200 1024 px: 11-20 ms)
            if hi == n:
                job.plan = None
                return rows, self._first_token(job, hidden[:, hi - 1 - lo : hi - lo, :])
            if rows >= budget:
                return rows, None

    def final_rows(self, real: int) -> int:
        """Query rows of a block forward holding `real` (1..block) prompt tokens
        (`final_rows` below)."""
        return final_rows(real, self.block)

    def final_block_groups(self, jobs: Sequence[Job]) -> list[list[Job]]:
        """Jobs (in the given order) whose next forward is their final, partial block, grouped
        by (absolute position, query rows, text or image block), groups of two or more only,
        ordered by their first job. Such jobs may share one forward (`feed_final_blocks`)."""
        if not self.exact:
            return []
        groups: dict[tuple[int, int], list[Job]] = {}
        for job in jobs:
            left = job.prompt_len - job.fed
            if not 0 < left < self.block or job.fed % self.block:
                continue
            try:
                if job.cache is None:
                    job.cache = self.model.new_cache()
                plan = self._plan(job)
            except Exception:  # left to `feed`, whose caller fails this request alone
                continue
            if plan.deepstack is not None:  # Qwen3-VL image rows: fed alone (prefill_group)
                continue
            # Text blocks and image blocks take different rope kernels: never in one forward,
            # so a request's path does not depend on what it is grouped with.
            base = job.cached_tokens
            text = text_offset(plan, job.fed - base, job.prompt_len - base) is not None
            groups.setdefault((job.fed, self.final_rows(left), text), []).append(job)
        return [g for g in groups.values() if len(g) > 1]

    def feed_final_blocks(self, jobs: Sequence[Job]) -> list[FirstToken | Exception]:
        """Feed each job's final partial block in one forward (jobs from one group of
        `final_block_groups`); returns each job's first token, or the exception that ended
        that job alone after the shared forward (its sampler, say). An exception raised here
        comes from the shared forward and concerns every job."""
        rows = self.final_rows(jobs[0].prompt_len - jobs[0].fed)
        parts = []
        for job in jobs:
            lo, base = job.fed, job.cached_tokens
            parts.append(GroupPart(self._plan(job), job.cache, lo - base, job.prompt_len - base))
        hidden = self.model.prefill_group(parts, rows)
        firsts: list[FirstToken | Exception] = []
        for i, job in enumerate(jobs):
            lo, hi = job.fed, job.prompt_len
            job.fed, job.plan = hi, None
            try:
                if lo < job.split <= hi:
                    self._store(job)
                last = hidden[i : i + 1, hi - 1 - lo : hi - lo, :]
                firsts.append(self._first_token(job, last))
            except Exception as exc:  # noqa: BLE001 - reported per job by the caller
                firsts.append(exc)
        return firsts

    def _store(self, job: Job) -> None:
        """Store the image part's blocks (`CacheOps.store_image_part`), timed apart."""
        self.lap("prefill")
        self.cache_ops.store_image_part(job)
        self.lap("store")

    def _plan(self, job: Job) -> PrefillPlan:
        """The job's inputs from where its prefill started (its cached tokens) to its end."""
        if job.plan is None:
            assert job.fed % self.block == 0, "an exact prefill must start at a block boundary"
            layouts = [i.layout for i in job.request.images]
            job.plan = self.model.prefill_plan(
                job.request.prompt_ids, layouts, list(job.encoded), job.fed, job.prompt_len
            )
        return job.plan

    def _first_token(self, job: Job, last_hidden: mx.array) -> FirstToken:
        """Sample from the prompt's last row (1, 1, hidden) and give the cache the prompt's
        rope delta, which the batch's decode positions read."""
        self.lap("prefill")
        delta = rope_delta_at([i.layout for i in job.request.images], job.prompt_len)
        for layer in job.cache or []:
            layer.rope_delta = delta
        if self.model.state_snapshots:  # store the prompt's blocks now: a decoding row keeps
            self.cache_ops.store_image_part(job)  # no snapshot marks (engine/model/snapshots)
            drop_marks(job.cache or [])
        last = self.model.logits(last_hidden)[:, -1, :]
        last = shape_first(last, job.shaping, self.model.eos_token_ids)
        logprobs = last - mx.logsumexp(last, axis=-1, keepdims=True)
        token = job.sampler(logprobs)
        mx.eval(token, logprobs)
        self.lap("first_token")
        return FirstToken(int(token.item()), logprobs[0])
