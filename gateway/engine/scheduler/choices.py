"""n > 1 choices: one prefill, n decode rows.

A request with `SamplingParams.n` > 1 is one job until its prompt is prefilled: it waits,
is admitted (taking n rows at once: `Job.rows`), looks up the caches and prefills like any
other. When its first token is sampled, `fork` makes n - 1 more jobs, each with a copy of
the prompt's KV (`snapshot`: the batch merge copies it once more anyway), its own output
state, grammar matcher and shaping state, and its own sampler: with a seed, choice i draws
with `seed + i` (the tokens a request seeded `seed + i` gets, alone or batched); without,
each choice its own random seed. `first_tokens` samples their first tokens from the same
prefill log-probabilities, in one evaluation. From then on each choice is a row of the decode
batch like any other; its events carry its `index`, and the last choice to end sends the
final FinishEvent (gateway.engine.scheduler.endings). Cancelling the request cancels every
choice; an error in one fails them all (one ErrorEvent).

Engine thread only.
"""

from __future__ import annotations

import time

import mlx.core as mx

from gateway.engine.scheduler.job import Choices, Job, Stage
from gateway.engine.scheduler.loaded import Loaded
from gateway.engine.tokens.output import OutputState
from gateway.engine.tokens.penalties import RowShaping
from gateway.engine.tokens.sampling import make_sampler


def fork(job: Job, loaded: Loaded) -> list[Job]:
    """Choices 1..n-1 of `job` (choice 0, its prompt prefilled into `job.cache`), ready to
    take their first token; all n jobs share one `Choices`. The caller registers them."""
    request = job.request
    params = request.sampling
    model, grammars = loaded.model, loaded.grammars
    compiled = job.grammar.result() if job.grammar is not None else None
    now = time.perf_counter()
    siblings = []
    for index in range(1, params.n):
        sibling = Job(
            request=request,
            sink=job.sink,
            output=OutputState(params, model.new_detokenizer, model.token_text, model.token_bytes),
            stage=Stage.PREFILL,
            cached_tokens=job.cached_tokens,
            vision_hits=job.vision_hits,
            vision_misses=job.vision_misses,
            vision_disk_hits=job.vision_disk_hits,
            disk_cached_tokens=job.disk_cached_tokens,
            split=job.split,
            fed=job.fed,
            first_token_time=now,  # the request's time to first token is choice 0's
            index=index,
        )
        grammar = grammars.start(compiled) if compiled is not None else None
        sibling.sampler = make_sampler(params, grammar, grammars.masker, index)
        sibling.shaping = RowShaping.from_params(params, request.prompt_ids)
        sibling.cache = [layer.snapshot() for layer in job.cache or []]
        siblings.append(sibling)
    family = Choices([job, *siblings], open=params.n)
    for member in family.jobs:
        member.choices = family
    job.rows = 1  # it held the rows of all n choices until now
    return siblings


def first_tokens(siblings: list[Job], logprobs: mx.array) -> list[int]:
    """Each forked choice's first token, drawn by its own sampler from the prefill's (vocab,)
    log-probabilities (shaped as the first token's always are), in one evaluation."""
    drawn = [job.sampler(logprobs[None]) for job in siblings]
    mx.eval(drawn)
    return [int(token.reshape(-1)[0].item()) for token in drawn]
