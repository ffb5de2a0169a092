"""The rows decoding together: mlx-lm's BatchGenerator, the one sampler its rows share, and
which job holds which row.

A job joins once its prompt is in its KV cache and its first token is sampled (the engine's
own prefill: `join`), or hands its short text prompt over (`insert_prompt`: the generator
prefills such prompts together); each `step` then advances every row by one token. mlx-lm
computes one step ahead, so a step returns the tokens sampled in the previous call while the
next ones are already on the device.

Joining does not go through `BatchGenerator.insert`: that path runs a forward of its own for
the joining rows (their first token, as a one-token prompt) in the step they join, on top of
the batch's step, and merges each joiner's cache separately; on a GPU, where a forward costs
about the same at 1 row as at 32, a burst of arrivals paid one extra forward per step. Here
the rows joining in a step are merged once and added to mlx-lm's generation batch with their
first token as the next input, so it is fed together with every other row's token in the
batch's next forward. The generator then reports that first token once more (it was already
emitted from the prefill); `step` drops that report. A step may hold the rows that joined
during it until the next step (`step(hold_new=True)`): the join (the new row's KV merged into
every layer's buffers, a slower first decode) then does not land on top of the admission work
that produced the row (issue 30), and the next step's budget expects it (`joins_pending`).

Engine thread only. Not reusable after a step raised: the engine replaces the whole object
(`Scheduler.fail_batch`), so recovery never touches a broken generator.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import mlx.core as mx
from mlx_lm.generate import BatchGenerator, GenerationBatch, StopSequences, _merge_caches
from mlx_lm.models.cache import TokenBuffer

from gateway.config import EngineConfig
from gateway.engine.families.family import ModelFamily
from gateway.engine.scheduler.job import Job, Stage
from gateway.engine.tokens.grammar import GrammarRow
from gateway.engine.tokens.logprobs import LogprobValues
from gateway.engine.tokens.penalties import BatchShaper, RowShaping
from gateway.engine.tokens.sampling import GREEDY, BatchSampler, RowSampler, RowSampling


@dataclass(frozen=True)
class _Joiner:
    """A row joining at the next step: its job, uid and first token (already emitted)."""

    job: Job
    uid: int
    cache: list[Any]
    token: int
    logprobs: mx.array
    in_cache: list[int]


class DecodeBatch:
    """Decoding rows by uid; `rows` is read by the engine to know whether anything decodes."""

    def __init__(
        self, model: ModelFamily, config: EngineConfig, masker: Callable[..., Any]
    ) -> None:
        self.stop_ids = frozenset(model.eos_token_ids)
        self._stops = StopSequences([[t] for t in model.eos_token_ids])
        self._no_stops = StopSequences()
        self.generator = BatchGenerator(
            model.text_core,
            sampler=GREEDY,
            completion_batch_size=config.max_batch,
            prefill_batch_size=min(8, config.max_batch),
            prefill_step_size=config.prefill_chunk_tokens,
        )
        self.rows: dict[int, Job] = {}
        self._joining: list[_Joiner] = []  # added to the generation batch at the next step
        self._arrived: list[_Joiner] = []  # joined during this step (held or added at its end)
        self.last_joined = 0  # rows the last `step` added (a join step costs more: budget.py)
        self._echo: set[int] = set()  # rows whose next report is their first token again
        self.inserted = 0  # rows handed over so far (a counter, for the step trace)
        # mlx-lm's batch of decoding rows lives as long as the generator (semi-private).
        self._sampler = BatchSampler(
            self.generator._generation_batch,
            self._row_sampling,
            self._row_grammar,
            masker,
            self._row_logprobs,
        )
        # Penalties, biases, min_tokens: the generation batch calls the model through the
        # shaper, which leaves the logits untouched while no row is shaped.
        generation = self.generator._generation_batch
        generation.model = BatchShaper(
            model.text_core, generation, self._row_shaping, model.eos_token_ids
        )

    @property
    def stream(self) -> mx.Stream:
        """The stream all of the engine's MLX work runs on."""
        return self.generator.stream

    def join(self, job: Job, token: int, logprobs: mx.array, in_cache: list[int]) -> None:
        """The job's KV holds `in_cache` (its prompt) and its first token `token` (sampled
        with `logprobs`, already emitted) must be fed next: it decodes from the next step on,
        with at most `max_tokens - 1` more tokens. The caller ends the job instead when
        `token` is a stop token or `max_tokens` is 1 (ValueError here: the generator would
        end the row at the report of the token it was given)."""
        sampling = job.request.sampling
        if sampling.max_tokens <= 1 or (token in self.stop_ids and not sampling.ignore_eos):
            raise ValueError("a row must not join at its last token")
        uid = self.generator._uid_count  # the generator's own uid sequence (semi-private)
        self.generator._uid_count += 1
        self._arrived.append(_Joiner(job, uid, job.cache or [], token, logprobs, in_cache))
        self._echo.add(uid)
        job.cache = None
        self.inserted += 1
        job.uid = uid
        job.stage = Stage.DECODE
        self.rows[uid] = job

    @property
    def joins_pending(self) -> bool:
        """Rows held by the last step join at the next one."""
        return bool(self._joining)

    def _add_joiners(self) -> None:
        """Merge the rows joining now into one batch and append it to the generation batch,
        first tokens as the next inputs (module doc). Pinned to mlx-lm 0.32's
        GenerationBatch fields."""
        joining, self._joining = self._joining + self._arrived, []
        self._arrived = []
        if not joining:
            return
        stops = [
            self._no_stops if j.job.request.sampling.ignore_eos else self._stops for j in joining
        ]
        rows = GenerationBatch(
            self.generator.model,
            uids=[],
            inputs=mx.array([j.token for j in joining], dtype=mx.uint32),
            prompt_cache=_merge_caches([j.cache for j in joining]),
            tokens=[],
            samplers=[],
            fallback_sampler=self.generator.sampler,
            logits_processors=[],
            stop_sequences=[],
            max_tokens=[],
        )  # empty uids: the constructor runs no forward; the rows are filled in below
        rows.uids = [j.uid for j in joining]
        rows.tokens = [list(j.in_cache) for j in joining]
        rows.samplers = [j.job.sampler for j in joining]
        rows.logits_processors = [() for _ in joining]
        rows.stop_sequences = stops
        # The first token is counted by the generator like any other.
        rows.max_tokens = [j.job.request.sampling.max_tokens for j in joining]
        rows._next_logprobs = [j.logprobs for j in joining]
        rows._token_context = [TokenBuffer(t) for t in rows.tokens]
        rows._num_tokens = [0] * len(joining)
        rows._matchers = [ss.matcher() for ss in stops]
        self.generator._generation_batch.extend(rows)

    def insert(self, job: Job, tokens: list[int], budget: int, in_cache: list[int]) -> None:
        """Hand the job over: its KV holds `in_cache`, `tokens` are fed next and `budget` more
        tokens may be generated. The generator copies (merges) the job's cache."""
        [uid] = self.generator.insert(
            [tokens],
            max_tokens=[budget],
            caches=[job.cache],
            all_tokens=[in_cache],
            samplers=[job.sampler],
            stop_sequences=[self._no_stops if job.request.sampling.ignore_eos else self._stops],
        )
        job.cache = None
        self.inserted += 1
        job.uid = uid
        job.stage = Stage.DECODE
        self.rows[uid] = job

    def insert_prompt(self, job: Job) -> None:
        """Hand the job's remaining (text) prompt over; the generator prefills it together with
        the other prompts it admits in the same step."""
        prompt = list(job.request.prompt_ids)
        self.insert(job, prompt[job.fed :], job.request.sampling.max_tokens, prompt[: job.fed])

    def step(self, hold_new: bool = False) -> list[tuple[Job, Any, LogprobValues | None]]:
        """One decode step: (job, mlx-lm response, its log-probability values when the job
        asked for them and the batch's sampler computed them) per row that produced a token.
        Values are None where the sampler did not draw the token (the caller reads them from
        `response.logprobs` then). `hold_new`: rows that joined during this step join at the
        next one instead, when other rows decode (else holding would only delay them)."""
        arrived, self._arrived = self._arrived, []
        decoding = len(self.rows) > len(self._joining) + len(arrived)
        held = arrived if hold_new and decoding else []
        self._joining += [] if held else arrived
        self.last_joined = len(self._joining)
        self._add_joiners()
        self._joining = held
        # Rows that joined hold their own sampler: one batched draw from now on. (Rows the
        # generator prefilled itself join inside `next`, and are bound at the next step.)
        self._sampler.bind_all_rows()
        # This call reports the tokens the previous call sampled: their values were queued then.
        stash = self._sampler.stash
        _, responses = self.generator.next()
        out = []
        for response in responses:
            job = self.rows.get(response.uid)
            if job is None:
                continue
            if response.uid in self._echo:  # its first token, emitted at the prefill (never
                self._echo.discard(response.uid)  # a finishing one: `join`)
                continue
            sampling = job.request.sampling
            values = None
            if sampling.logprobs and stash is not None:
                values = stash.get(response.uid, response.token, sampling.top_logprobs)
            out.append((job, response, values))
        return out

    def remove(self, jobs: list[Job]) -> dict[int, tuple[Any, Any]]:
        """Take rows out mid-generation; returns uid -> (KV cache, all tokens)."""
        for job in jobs:
            self.rows.pop(job.uid, None)  # type: ignore[arg-type]
            self._echo.discard(job.uid)  # type: ignore[arg-type]
        self._add_joiners()  # rows still joining are in the generator before it looks
        return self.generator.remove([j.uid for j in jobs], return_prompt_caches=True)

    def release(self, job: Job) -> None:
        """Free the job's row if it holds one (idempotent)."""
        if job.uid is not None and self.rows.pop(job.uid, None) is not None:
            self._echo.discard(job.uid)
            pending = len(self._joining) + len(self._arrived)
            self._joining = [j for j in self._joining if j.uid != job.uid]
            self._arrived = [j for j in self._arrived if j.uid != job.uid]
            if len(self._joining) + len(self._arrived) == pending:  # in the generator
                self.generator.remove([job.uid])

    def forget_rows(self) -> list[Job]:
        """Every job holding a row, forgotten here (the generator is left as it is)."""
        jobs, self.rows = list(self.rows.values()), {}
        self._joining, self._arrived, self._echo = [], [], set()
        return jobs

    def finished(self, job: Job) -> None:
        """The generator ended this row itself (length or stop token)."""
        self.rows.pop(job.uid, None)  # type: ignore[arg-type]

    def _job_sampler(self, uid: int) -> RowSampler | None:
        job = self.rows.get(uid)
        sampler = job.sampler if job is not None else None
        return sampler if isinstance(sampler, RowSampler) else None

    def _row_sampling(self, uid: int) -> RowSampling | None:
        """A row's draw state (None: greedy), for the batch's one sampler."""
        sampler = self._job_sampler(uid)
        return sampler.row if sampler is not None else None

    def _row_logprobs(self, uid: int) -> int | None:
        """How many alternatives a row's request wants, None without logprobs."""
        job = self.rows.get(uid)
        if job is None or not job.request.sampling.logprobs:
            return None
        return job.request.sampling.top_logprobs

    def _row_shaping(self, uid: int) -> RowShaping | None:
        """A row's penalties, biases and min_tokens (None: unshaped), for the shaper."""
        job = self.rows.get(uid)
        return job.shaping if job is not None else None

    def _row_grammar(self, uid: int) -> GrammarRow | None:
        """A row's grammar state (None: free text), for the batch's one sampler."""
        sampler = self._job_sampler(uid)
        return sampler.grammar if sampler is not None else None
