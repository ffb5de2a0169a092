"""The engine: one thread that owns MLX, fed by a queue.

Every request, text or image, decodes in one shared mlx-lm BatchGenerator. Each loop iteration
is one scheduling step:

    admit    queued requests into free rows: prefix-cache lookup, vision-cache lookups
    encode   one vision-tower unit (a block) for a group of pending images (several requests'
             images go through the tower together)
    prefill  up to `prefill_chunk_tokens` prompt tokens of the requests being prefilled
             (4x when nothing decodes or a burst is a quarter of the batch), oldest
             first; a request whose prompt is complete gets its first token from the
             prefill logits and joins the batch (see gateway.engine.scheduler.prefill)
    decode   one batched step of every running row; emit tokens; finish rows

so a running stream waits at most one vision unit plus one prefill budget between two tokens.

Failure isolation: an exception while starting, encoding or prefilling one request fails that
request; an exception in the batched decode step fails the rows of that batch (the batch is
replaced first, so the recovery never touches the broken one); the loop itself never dies.

Thread contract: `submit`, `cancel`, `stop` and the read-only properties may be called from any
thread; everything else runs on the engine thread.

Around this module: `inbox.py` (what other threads send), `decode_batch.py` (the decoding rows
and their one sampler), `endings.py` (token emission and how jobs end, a mixin), `prefill.py`,
`encode_group.py` and `cache_ops.py` (the stages' work), `stages.py` (the stages below, a
mixin of `Engine`).
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections import deque
from collections.abc import Callable, Sequence

import mlx.core as mx

from caches.prefix import ImageSpan, PrefixCache
from caches.vision import VisionCache
from gateway.config import EngineConfig
from gateway.engine.cache_ops import CacheOps, cache_stats
from gateway.engine.model.vlm import VisionLanguageModel
from gateway.engine.request import (
    EngineBusy,
    EngineRequest,
    ErrorKind,
)
from gateway.engine.scheduler.decode_batch import DecodeBatch
from gateway.engine.scheduler.encode_group import EncodeGroup
from gateway.engine.scheduler.inbox import (
    Cancel,
    Message,
    ResetCaches,
    Stop,
    Submit,
    disable_cudnn_attention,
)
from gateway.engine.scheduler.job import Job, Sink
from gateway.engine.scheduler.prefill import Prefiller
from gateway.engine.scheduler.stages import Stages
from gateway.engine.scheduler.step_trace import StepTrace
from gateway.engine.tokens.grammar import Grammars
from gateway.engine.tokens.output import OutputState
from gateway.metrics import CacheCollector, Metrics

log = logging.getLogger(__name__)


def _no_mark(stage: str) -> None:
    """The step trace's stage mark when tracing is off."""


class Engine(Stages):
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
        metrics.add_collector(CacheCollector(self.cache_stats))
        # Called where a step's events should leave now (sinks may buffer until then).
        self.on_events: Callable[[], None] | None = None
        self._to_store: list[tuple[Job, object, list[int]]] = []
        self.model: VisionLanguageModel | None = None
        self._inbox: queue.Queue[Message] = queue.Queue()
        self._thread = threading.Thread(target=self._main, name="mlx-engine", daemon=True)
        self._ready = threading.Event()
        self._stopped = threading.Event()
        self._load_error: BaseException | None = None
        self._count_lock = threading.Lock()
        self._queued = 0  # submitted, not yet given a row (read from any thread)
        self._active = 0  # holding a row: encoding, prefilling or decoding
        # engine-thread state
        self._waiting: deque[Job] = deque()
        self._encoding: deque[Job] = deque()  # requests with images still to encode
        self._group: EncodeGroup | None = None  # images going through the tower now
        self._prefilling: deque[Job] = deque()
        self._jobs: dict[str, Job] = {}
        self._step_hook: Callable[[], None] | None = None  # tests inject faults here
        self._grammars: Grammars | None = None  # structured output; built with the model
        self.on_gpu = False  # the model computes on a GPU (set once loaded; any thread reads)
        self._trace = StepTrace(config.step_trace) if config.step_trace is not None else None
        self._decoded = 0  # tokens emitted by this step's decode (for the trace)

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

        Raises EngineBusy when every row and queue slot is taken.
        """
        with self._count_lock:
            # Rows plus queue is the capacity; counting them together also covers requests
            # submitted but not yet admitted (so a burst cannot overshoot the queue).
            capacity = self.config.max_waiting + self.config.max_batch
            if self._queued + self._active >= capacity:
                raise EngineBusy(min(self._active, self.config.max_batch), self._queued)
            self._queued += 1
        self._inbox.put(Submit(request, sink))

    def cancel(self, request_id: str) -> None:
        """Drop a request wherever it is; its row is freed at the next step. Idempotent."""
        self._inbox.put(Cancel(request_id))

    def stop(self, timeout: float = 10.0) -> None:
        """Stop serving; requests still in flight get an ErrorEvent (SHUTTING_DOWN). Returns
        once the engine has finished its last step (the thread then parks; see `_main`)."""
        if self._thread.is_alive() and not self._stopped.is_set():
            self._inbox.put(Stop())
            self._stopped.wait(timeout)

    @property
    def running(self) -> int:
        return self._active

    @property
    def waiting(self) -> int:
        return self._queued

    def cache_stats(self) -> dict[str, dict[str, object]]:
        """The caches' counters as plain JSON-able dicts (any thread): vision, prefix and,
        once the model is loaded, compiled grammars."""
        stats = cache_stats(self.vision_cache, self.prefix_cache)
        if self._grammars is not None:
            stats["grammar"] = self._grammars.stats()
            stats["disk"] = self._cache_ops.disk_stats()
        return stats

    def needs_pixels(self, prompt_ids: Sequence[int], images: Sequence[ImageSpan]) -> list[bool]:
        """Per image: will the engine run the vision tower on it? (Any thread; advisory.)"""
        ops = getattr(self, "_cache_ops", None)
        return [True] * len(images) if ops is None else ops.needs_pixels(prompt_ids, images)

    def clear_caches(self) -> None:
        """Empty the vision and prefix caches and this model's disk tier (a cleared server
        answers the next request cold, as `/v1/cache/clear` promises). Any thread."""
        self.vision_cache.clear()
        self.prefix_cache.clear()
        disk = getattr(getattr(self, "_cache_ops", None), "disk", None)
        if disk is not None:
            disk.clear()
        if self._grammars is not None:
            self._grammars.cache.clear()

    def reset_caches(self) -> None:
        """Replace both caches by empty ones with zeroed counters (after the start-up warm-up,
        so stats count only real traffic). Applied on the engine thread, in inbox order."""
        self._inbox.put(ResetCaches())

    @property
    def idle(self) -> bool:
        return self._active == 0 and self._queued == 0

    @property
    def alive(self) -> bool:
        """The engine thread is serving (loaded, not stopped)."""
        return self._ready.is_set() and self._load_error is None and not self._stopped.is_set()

    # ----- engine thread: the loop ------------------------------------------------------------

    def _main(self) -> None:
        try:
            if not self.config.cudnn_attention:
                disable_cudnn_attention()
            if self.config.mlx_cache_limit_mb is not None:
                mx.set_cache_limit(int(self.config.mlx_cache_limit_mb * 1024 * 1024))
            self.model = self._loader()
            self.on_gpu = mx.default_device().type == mx.DeviceType.gpu
            block = self.config.cache.exact_block_tokens(self.on_gpu)  # 0: exact reuse off
            self._cache_ops = CacheOps(self.model, self.vision_cache, self.prefix_cache, block)
            # The disk tier stays off through the warm-up (activated by its reset_caches).
            self._cache_ops.open_disk(self.config.cache, active=not self.config.warmup)
            self._prefiller = Prefiller(self.model, self._cache_ops, block)
            self._grammars = Grammars(
                self.model.tokenizer,
                self.model.vocab_size,
                self.model.eos_token_ids,
                self.config.cache.grammar_capacity_bytes,
            )
            self._batch = self._new_batch()
        except BaseException as exc:  # noqa: BLE001 - reported to start()
            log.exception("model load failed")
            self._load_error = exc
            self._ready.set()
            return
        self._ready.set()
        log.info("engine ready: %s (%s)", self.config.model, self.model.arch)
        try:
            while self._drain_inbox(block=not (self._waiting or self._active)):
                started = time.perf_counter()
                try:
                    self._step()
                except Exception:  # a bug outside the per-request guards: never stop serving
                    log.exception("engine step failed; failing the requests it held")
                    self._fail_active()
                self.metrics.step_seconds.observe(time.perf_counter() - started)
        finally:
            self._shut_down()
        # Park instead of returning. mlx 0.32's thread-local destructors (random state,
        # compile cache) take the GIL when a thread exits; if that races interpreter
        # shutdown the process aborts ("terminate called without an active exception",
        # ml-explore/mlx#3126, fixed after 0.32). A parked daemon thread never runs them.
        threading.Event().wait()

    def _shut_down(self) -> None:
        for job in list(self._jobs.values()):
            self._fail(job, ErrorKind.SHUTTING_DOWN, "the server is shutting down")
        try:
            mx.synchronize(self._batch.stream)  # the batch computes one token ahead
        except Exception:
            log.exception("the last batch step failed while shutting down")
        self._batch = None
        if self._trace is not None:
            self._trace.flush()
        self._cache_ops.close()  # entries answered so far reach the disk tier
        self._ship()  # the shutdown errors above
        self._stopped.set()

    def _new_caches(self) -> None:
        self.vision_cache = VisionCache(self.config.cache.vision_capacity_bytes)
        self.prefix_cache = PrefixCache(self.config.cache.kv_capacity_bytes)
        self._cache_ops.vision, self._cache_ops.prefix = self.vision_cache, self.prefix_cache
        self._cache_ops.activate_disk()
        if self._grammars is not None:
            self._grammars.reset()

    def _new_batch(self) -> DecodeBatch:
        assert self.model is not None and self._grammars is not None
        return DecodeBatch(self.model, self.config, self._grammars.masker)

    def _drain_inbox(self, block: bool) -> bool:
        """Apply queued submits/cancels. Returns False on stop."""
        try:
            message = self._inbox.get(timeout=0.5) if block else self._inbox.get_nowait()
        except queue.Empty:
            return True
        while True:
            if isinstance(message, Stop):
                return False
            if isinstance(message, Cancel):
                self._cancel(message.request_id)
            elif isinstance(message, ResetCaches):
                self._new_caches()
                self.metrics.reset_request_timings()  # the warm-up's timings are not the users'
            else:
                self._enqueue(message.request, message.sink)
            try:
                message = self._inbox.get_nowait()
            except queue.Empty:
                return True

    def _enqueue(self, request: EngineRequest, sink: Sink) -> None:
        assert self.model is not None
        output = OutputState(request.sampling, self.model.new_detokenizer, self.model.token_text)
        job = Job(request=request, sink=sink, output=output)
        if request.sampling.grammar is not None and self._grammars is not None:
            # Compiled on a worker thread while the request waits; admitted once it is ready.
            job.grammar = self._grammars.prepare(request.sampling.grammar)
        job.prefetch = self._cache_ops.prefetch(job)  # disk reads: on the reader thread too
        self._jobs[request.request_id] = job
        self._waiting.append(job)

    def _step(self) -> None:
        # All MLX work of this thread runs on the batch's stream: one stream, one ordering,
        # and no extra per-thread stream whose worker MLX would abort on at process exit.
        trace = self._trace
        mark = trace.stage if trace is not None else _no_mark
        if trace is not None:
            trace.begin()
        inserted = self._batch.inserted
        self._decoded = 0
        with mx.stream(self._batch.stream):
            self._admit()
            mark("admit")
            self._ship()  # admissions first: clients get their headers while we prefill
            mark("ship")
            self._encode()
            mark("encode")
            self._prefill()
            mark("prefill")
            self._ship()  # first tokens before the decode step
            mark("ship")
            try:
                if self._step_hook is not None:
                    self._step_hook()
                self._decode()
            except Exception:
                log.exception("decode step failed; failing the requests in the batch")
                self._fail_batch()
            mark("decode")
            self._ship()
            self._store_finished()  # KV copies of finished requests, after their events
            mark("ship")
        if trace is not None:
            trace.end(
                rows=len(self._batch.rows),
                joined=max(self._batch.inserted - inserted, 0),
                prefilling=len(self._prefilling),
                encoding=len(self._encoding),
                waiting=len(self._waiting),
                tokens=self._decoded,
            )
        self.metrics.running.set(self._active)
        self.metrics.waiting.set(self._queued)
        self.metrics.mlx_active_bytes.set(mx.get_active_memory())
        self.metrics.mlx_cache_bytes.set(mx.get_cache_memory())
        self.metrics.mlx_peak_bytes.set(mx.get_peak_memory())

    def _ship(self) -> None:
        if self.on_events is not None:
            self.on_events()

    def metrics_text(self) -> bytes:
        """The engine's metrics in Prometheus text format (any thread)."""
        return self.metrics.render()
