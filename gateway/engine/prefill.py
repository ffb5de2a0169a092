"""Feeding a request's uncached prompt tokens into its own KV cache, in chunks, and sampling
its first token from the last chunk's logits. Engine thread only.

Every request, text or image, is prefilled here rather than inside mlx-lm's BatchGenerator:
- the image-bearing part [cached_tokens, split) needs `inputs_embeds` and 3-axis mRoPE
  positions, which BatchGenerator cannot feed;
- the text part [split, prompt_len) goes through the same `TextCore` the batch decodes with;
- the first token comes straight from the prefill's last logits. Handing the whole prompt to
  BatchGenerator would cost one more forward pass before the first token (it prefills all
  but the last prompt token, then steps the last one), about one decode step of TTFT.

A job then joins the batch with its first token as the "prompt", which BatchGenerator steps
like any decode row.
"""

from __future__ import annotations

from dataclasses import dataclass

import mlx.core as mx

from gateway.engine.cache_ops import CacheOps
from gateway.engine.job import Job
from gateway.engine.model import VisionLanguageModel
from gateway.engine.positions import rope_delta_at


@dataclass(frozen=True)
class FirstToken:
    """The token sampled from the prompt's last position and its (vocab,) log-probabilities."""

    token: int
    logprobs: mx.array


class Prefiller:
    """Chunked prefill for one job at a time (`feed`), owned by the engine thread."""

    def __init__(self, model: VisionLanguageModel, cache_ops: CacheOps) -> None:
        self.model = model
        self.cache_ops = cache_ops

    def feed(self, job: Job, budget: int) -> tuple[int, FirstToken | None]:
        """Feed at most `budget` (> 0) of the job's remaining prompt tokens.

        Returns (tokens fed, the first token once the whole prompt is in the cache, else
        None). The image part and the text part are never mixed in one call, so a call may
        feed fewer tokens than the budget allows.
        """
        if job.cache is None:
            job.cache = self.model.new_cache()
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
            self.cache_ops.store_image_part(job)
        return hi - lo

    def _feed_text(self, job: Job, budget: int) -> tuple[int, FirstToken | None]:
        prompt = job.request.prompt_ids
        lo, hi = job.fed, min(job.fed + budget, len(prompt))
        logits = self.model.text_core(mx.array([prompt[lo:hi]], dtype=mx.int32), job.cache)
        job.fed = hi
        if hi < len(prompt):
            mx.eval([c.state for c in job.cache or []])
            return hi - lo, None
        last = logits[:, -1, :]
        logprobs = last - mx.logsumexp(last, axis=-1, keepdims=True)
        token = job.sampler(logprobs)
        mx.eval(token, logprobs, [c.state for c in job.cache or []])
        return hi - lo, FirstToken(int(token.item()), logprobs[0])
