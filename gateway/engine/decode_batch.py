"""The rows decoding together: mlx-lm's BatchGenerator, the one sampler its rows share, and
which job holds which row.

A job joins once its prompt is in its KV cache (the engine's own prefill) or hands its short
text prompt over (`insert_prompt`: the generator prefills such prompts together); each `step`
then advances every row by one token. mlx-lm computes one step ahead, so a step returns the
tokens sampled in the previous call while the next ones are already on the device.

Engine thread only. Not reusable after a step raised: the engine replaces the whole object
(`Engine._fail_batch`), so recovery never touches a broken generator.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import mlx.core as mx
from mlx_lm.generate import BatchGenerator, StopSequences

from gateway.config import EngineConfig
from gateway.engine.grammar import GrammarRow
from gateway.engine.job import Job, Stage
from gateway.engine.model import VisionLanguageModel
from gateway.engine.sampling import GREEDY, BatchSampler, RowSampler, RowSampling


class DecodeBatch:
    """Decoding rows by uid; `rows` is read by the engine to know whether anything decodes."""

    def __init__(
        self, model: VisionLanguageModel, config: EngineConfig, masker: Callable[..., Any]
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
        self.inserted = 0  # rows handed over so far (a counter, for the step trace)
        # mlx-lm's batch of decoding rows lives as long as the generator (semi-private).
        self._sampler = BatchSampler(
            self.generator._generation_batch, self._row_sampling, self._row_grammar, masker
        )

    @property
    def stream(self) -> mx.Stream:
        """The stream all of the engine's MLX work runs on."""
        return self.generator.stream

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

    def step(self) -> list[tuple[Job, Any]]:
        """One decode step: (job, mlx-lm response) per row that produced a token."""
        _, responses = self.generator.next()
        # Rows that joined in this step hold their own sampler: one batched draw from now on.
        self._sampler.bind_all_rows()
        out = []
        for response in responses:
            job = self.rows.get(response.uid)
            if job is not None:
                out.append((job, response))
        return out

    def remove(self, jobs: list[Job]) -> dict[int, tuple[Any, Any]]:
        """Take rows out mid-generation; returns uid -> (KV cache, all tokens)."""
        for job in jobs:
            self.rows.pop(job.uid, None)  # type: ignore[arg-type]
        return self.generator.remove([j.uid for j in jobs], return_prompt_caches=True)

    def release(self, job: Job) -> None:
        """Free the job's row if it holds one (idempotent)."""
        if job.uid is not None and self.rows.pop(job.uid, None) is not None:
            self.generator.remove([job.uid])

    def forget_rows(self) -> list[Job]:
        """Every job holding a row, forgotten here (the generator is left as it is)."""
        jobs, self.rows = list(self.rows.values()), {}
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

    def _row_grammar(self, uid: int) -> GrammarRow | None:
        """A row's grammar state (None: free text), for the batch's one sampler."""
        sampler = self._job_sampler(uid)
        return sampler.grammar if sampler is not None else None
