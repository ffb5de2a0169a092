"""The engine: one thread that owns MLX, fed by a queue.

Every request, text or image, decodes in one shared mlx-lm BatchGenerator. Each loop iteration
is one scheduling step:

    admit    queued requests into free rows: prefix-cache lookup, vision-cache lookups
    encode   at most one image through the vision tower (for the oldest admitted request)
    prefill  or one chunk of that request's image-bearing prompt part (inputs_embeds + mRoPE)
    decode   one batched step of every running row; emit tokens; finish rows

so a running stream waits at most one image encode or one prefill chunk between two tokens.

Thread contract: `submit`, `cancel`, `stop` and the read-only properties may be called from any
thread; everything else runs on the engine thread.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections import deque
from collections.abc import Callable, Sequence

import mlx.core as mx
from mlx_lm.generate import BatchGenerator, StopSequences

from caches.prefix import ImageSpan, PrefixCache
from caches.vision import VisionCache
from gateway.config import EngineConfig
from gateway.engine.cache_ops import CacheOps, cache_stats
from gateway.engine.job import Job, Sink
from gateway.engine.model import VisionLanguageModel
from gateway.engine.output import OutputState
from gateway.engine.positions import rope_delta_at
from gateway.engine.request import (
    AdmittedEvent,
    EngineRequest,
    ErrorEvent,
    FinishEvent,
    TokenEvent,
    Usage,
)
from gateway.engine.sampling import GREEDY, make_sampler
from gateway.errors import APIError
from gateway.metrics import Metrics

log = logging.getLogger(__name__)

_STOP = object()


class Engine:
    """Schedules requests onto the model. Construct, `start()`, `submit()`, `stop()`."""

    def __init__(
        self,
        config: EngineConfig,
        metrics: Metrics,
        loader: Callable[[], VisionLanguageModel] | None = None,
    ) -> None:
        self.config = config
        self.metrics = metrics
        self._loader = loader or (lambda: VisionLanguageModel(config.model))
        self.vision_cache = VisionCache(config.cache.vision_capacity_bytes)
        self.prefix_cache = PrefixCache(config.cache.kv_capacity_bytes)
        self.model: VisionLanguageModel | None = None
        self._inbox: queue.Queue[object] = queue.Queue()
        self._thread = threading.Thread(target=self._main, name="mlx-engine", daemon=True)
        self._ready = threading.Event()
        self._stopped = threading.Event()
        self._load_error: BaseException | None = None
        self._count_lock = threading.Lock()
        self._queued = 0  # submitted, not yet given a row (read from any thread)
        self._active = 0  # holding a row: encoding, prefilling or decoding
        # engine-thread state
        self._waiting: deque[Job] = deque()
        self._prefilling: deque[Job] = deque()
        self._rows: dict[int, Job] = {}
        self._jobs: dict[str, Job] = {}

    # ----- any thread -------------------------------------------------------------------------

    def start(self, timeout: float | None = None) -> None:
        """Start the thread and block until the model is loaded (re-raises a load failure)."""
        self._thread.start()
        if not self._ready.wait(timeout):
            raise TimeoutError("model did not load in time")
        if self._load_error is not None:
            raise RuntimeError(f"model failed to load: {self._load_error}") from self._load_error

    def submit(self, request: EngineRequest, sink: Sink) -> None:
        """Queue a request; events go to `sink` (called on the engine thread, must not block).

        Raises APIError 429 (with Retry-After) when the waiting queue is full.
        """
        with self._count_lock:
            # Rows plus queue is the capacity; counting them together also covers requests
            # submitted but not yet admitted (so a burst cannot overshoot the queue).
            capacity = self.config.max_waiting + self.config.max_batch
            if self._queued + self._active >= capacity:
                raise APIError(
                    429,
                    f"the server is at capacity ({self.config.max_batch} running, "
                    f"{self._queued} waiting); retry shortly",
                    "rate_limit_error",
                    code="server_busy",
                    headers={"Retry-After": "1"},
                )
            self._queued += 1
        self._inbox.put((request, sink))

    def cancel(self, request_id: str) -> None:
        """Drop a request wherever it is; its row is freed at the next step. Idempotent."""
        self._inbox.put(("cancel", request_id))

    def stop(self, timeout: float = 10.0) -> None:
        """Stop serving; requests still in flight get a 503 ErrorEvent. Returns once the
        engine has finished its last step (the thread then parks; see `_main`)."""
        if self._thread.is_alive() and not self._stopped.is_set():
            self._inbox.put(_STOP)
            self._stopped.wait(timeout)

    @property
    def running(self) -> int:
        return self._active

    @property
    def waiting(self) -> int:
        return self._queued

    def cache_stats(self) -> dict[str, dict[str, object]]:
        """Both caches' counters as plain JSON-able dicts (any thread)."""
        return cache_stats(self.vision_cache, self.prefix_cache)

    def needs_pixels(self, prompt_ids: Sequence[int], images: Sequence[ImageSpan]) -> list[bool]:
        """Per image: will the engine run the vision tower on it? (Any thread; advisory.)"""
        ops = getattr(self, "_cache_ops", None)
        return [True] * len(images) if ops is None else ops.needs_pixels(prompt_ids, images)

    def clear_caches(self) -> None:
        self.vision_cache.clear()
        self.prefix_cache.clear()

    @property
    def idle(self) -> bool:
        return self._active == 0 and self._queued == 0

    # ----- engine thread ----------------------------------------------------------------------

    def _main(self) -> None:
        try:
            if self.config.mlx_cache_limit_mb is not None:
                mx.set_cache_limit(int(self.config.mlx_cache_limit_mb * 1024 * 1024))
            self.model = self._loader()
            self._cache_ops = CacheOps(self.model, self.vision_cache, self.prefix_cache)
            self._batch = self._new_batch()
        except BaseException as exc:  # noqa: BLE001 - reported to start()
            log.exception("model load failed")
            self._load_error = exc
            self._ready.set()
            return
        self._ready.set()
        log.info("engine ready: %s (%s)", self.config.model, self.model.arch)
        while self._drain_inbox(block=not (self._waiting or self._active)):
            started = time.perf_counter()
            try:
                self._step()
            except Exception:
                log.exception("batch step failed; failing the requests in the batch")
                self._fail_batch()
            self.metrics.step_seconds.observe(time.perf_counter() - started)
        for job in list(self._jobs.values()):
            self._fail(job, 503, "the server is shutting down")
        mx.synchronize(self._batch.stream)  # the batch computes one token ahead
        self._batch = None
        self._stopped.set()
        # Park instead of returning. mlx 0.32's thread-local destructors (random state,
        # compile cache) take the GIL when a thread exits; if that races interpreter
        # shutdown the process aborts ("terminate called without an active exception",
        # ml-explore/mlx#3126, fixed after 0.32). A parked daemon thread never runs them.
        threading.Event().wait()

    def _new_batch(self) -> BatchGenerator:
        assert self.model is not None
        self._stops = StopSequences([[t] for t in self.model.eos_token_ids])
        return BatchGenerator(
            self.model.text_core,
            sampler=GREEDY,
            completion_batch_size=self.config.max_batch,
            prefill_batch_size=min(8, self.config.max_batch),
            prefill_step_size=self.config.prefill_chunk_tokens,
        )

    def _drain_inbox(self, block: bool) -> bool:
        """Apply queued submits/cancels. Returns False on stop."""
        try:
            item = self._inbox.get(timeout=0.5) if block else self._inbox.get_nowait()
        except queue.Empty:
            return True
        while True:
            if item is _STOP:
                return False
            if isinstance(item, tuple) and item[0] == "cancel":
                self._cancel(item[1])
            else:
                request, sink = item  # type: ignore[misc]
                self._enqueue(request, sink)
            try:
                item = self._inbox.get_nowait()
            except queue.Empty:
                return True

    def _enqueue(self, request: EngineRequest, sink: Sink) -> None:
        assert self.model is not None
        output = OutputState(request.sampling, self.model.decode, self.model.token_text)
        job = Job(request=request, sink=sink, output=output)
        self._jobs[request.request_id] = job
        self._waiting.append(job)

    def _step(self) -> None:
        # All MLX work of this thread runs on the batch's stream: one stream, one ordering,
        # and no extra per-thread stream whose worker MLX would abort on at process exit.
        with mx.stream(self._batch.stream):
            self._admit()
            self._encode_or_prefill()
            self._decode()
        self.metrics.running.set(self._active)
        self.metrics.waiting.set(self._queued)
        self.metrics.mlx_active_bytes.set(mx.get_active_memory())
        self.metrics.mlx_cache_bytes.set(mx.get_cache_memory())
        self.metrics.mlx_peak_bytes.set(mx.get_peak_memory())

    def _admit(self) -> None:
        while self._waiting and self._active < self.config.max_batch:
            job = self._waiting.popleft()
            job.stage = "admitted"
            with self._count_lock:
                self._queued -= 1
                self._active += 1
            try:
                self._start(job)
            except Exception as exc:
                log.exception("request %s failed to start", job.request_id)
                self._fail(job, 500, f"internal error while starting the request: {exc}")

    def _start(self, job: Job) -> None:
        """Look the request up in the caches, then queue its image work or insert it."""
        job.sampler = make_sampler(job.request.sampling)
        self._cache_ops.admit(job)
        job.sink(
            AdmittedEvent(job.prompt_len, job.cached_tokens, job.vision_hits, job.vision_misses)
        )
        if job.to_encode or job.split > job.cached_tokens:
            job.stage = "encode"
            self._prefilling.append(job)
        else:
            self._insert(job, start=job.cached_tokens)

    def _encode_or_prefill(self) -> None:
        """One unit of image work for the oldest admitted image request."""
        if not self._prefilling:
            return
        job = self._prefilling[0]
        try:
            if job.to_encode:
                started = time.perf_counter()
                self._cache_ops.encode_step(job)
                self.metrics.vision_encode_seconds.observe(time.perf_counter() - started)
                return
            job.stage = "prefill"
            if self._cache_ops.prefill_chunk(job, self.config.prefill_chunk_tokens):
                self._prefilling.popleft()
                self._insert(job, start=job.split)
            self.metrics.prefill_chunks.inc()
        except Exception as exc:
            log.exception("image work for %s failed", job.request_id)
            self._fail(job, 500, f"internal error while processing the image: {exc}")

    def _insert(self, job: Job, start: int) -> None:
        """Hand the prompt's tokens [start:] (with the KV for [:start]) to the batch."""
        prompt = list(job.request.prompt_ids)
        budget = job.request.sampling.max_tokens
        [uid] = self._batch.insert(
            [prompt[start:]],
            max_tokens=[budget],
            caches=[job.cache],
            all_tokens=[prompt[:start]],
            samplers=[job.sampler],
            stop_sequences=[self._stops],
        )
        job.cache = None  # the batch merged (copied) it
        job.plan = None
        job.uid = uid
        job.stage = "batch"
        self._rows[uid] = job

    def _decode(self) -> None:
        if not self._rows:
            return
        _, responses = self._batch.next()
        if responses:
            self.metrics.decode_steps.inc()
            self.metrics.generation_tokens.inc(len(responses))
        stopped: list[Job] = []
        for r in responses:
            job = self._rows.get(r.uid)
            if job is None:
                continue
            self._emit(job, r.token, r.logprobs)
            if r.finish_reason is not None:
                self._finish(job, r.finish_reason, r.prompt_cache, r.all_tokens)
            elif job.output.stopped:
                stopped.append(job)
        if stopped:
            caches = self._batch.remove([j.uid for j in stopped], return_prompt_caches=True)
            for job in stopped:
                kv, tokens = caches.get(job.uid, (None, None))
                self._finish(job, "stop", kv, tokens)

    def _emit(self, job: Job, token: int, logprobs: object) -> None:
        if job.first_token_time is None:
            job.first_token_time = time.perf_counter()
            self.metrics.ttft.observe(job.elapsed())
        text = job.output.push(token)
        lps = ()
        if job.request.sampling.logprobs:
            lps = (job.output.logprob(token, logprobs),)  # type: ignore[arg-type]
        job.sink(TokenEvent(text, (token,), lps))

    def _finish(self, job: Job, reason: str, kv: object, all_tokens: object) -> None:
        self._release(job)
        tail = job.output.finish()
        reason = "stop" if job.output.stopped else reason
        usage = Usage(
            job.prompt_len,
            job.output.completion_tokens,
            job.cached_tokens,
            job.vision_hits,
            job.vision_misses,
        )
        job.sink(FinishEvent(reason, usage, tail))
        self.metrics.requests.labels("ok").inc()
        self.metrics.prompt_tokens.inc(job.prompt_len)
        self.metrics.latency.observe(job.elapsed())
        if kv is not None and all_tokens is not None:
            delta = rope_delta_at([i.layout for i in job.request.images], job.prompt_len)
            self._cache_ops.store_finished(job, kv, list(all_tokens), delta)  # type: ignore[arg-type]

    def _fail(self, job: Job, status: int, message: str) -> None:
        self._release(job)
        job.sink(ErrorEvent(status, message, "server_error"))
        self.metrics.requests.labels("error").inc()

    def _cancel(self, request_id: str) -> None:
        job = self._jobs.get(request_id)
        if job is None:
            return
        self._release(job)
        job.sink(FinishEvent("cancelled", Usage(job.prompt_len, 0, job.cached_tokens)))
        self.metrics.requests.labels("cancelled").inc()

    def _release(self, job: Job) -> None:
        """Forget a job wherever it is and free its row (idempotent)."""
        if self._jobs.pop(job.request_id, None) is None:
            return
        if job.stage == "queued":
            self._waiting.remove(job)
            with self._count_lock:
                self._queued -= 1
            return
        if job in self._prefilling:
            self._prefilling.remove(job)
        if job.uid is not None and self._rows.pop(job.uid, None) is not None:
            self._batch.remove([job.uid])
        job.cache = job.plan = job.encoding = None
        job.stage = "done"
        with self._count_lock:
            self._active -= 1

    def _fail_batch(self) -> None:
        for job in list(self._rows.values()):
            self._fail(job, 500, "internal error in the decode step; the request was dropped")
        self._rows.clear()
        self._batch = self._new_batch()
