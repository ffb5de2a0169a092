"""The engine: one thread that owns MLX, fed by a queue (`wire.py`: what other threads send).

Every request, text or image, decodes in one shared mlx-lm BatchGenerator. Each loop iteration
is one scheduling step (`Engine.step`): admit -> ship -> prefill -> ship -> encode -> decode ->
ship -> store -> answer. The stages and the jobs they move are the `Scheduler`'s
(gateway.engine.scheduler.scheduler); shipping hands the step's events to the transport
(`on_events`). While rows decode, a step's image work (tower units and prefill) is sized to
`--admission-budget` x the measured decode step (at least one unit of each), so a running
stream's gap between two tokens stays near that multiple (gateway.engine.scheduler.budget).

Failure isolation: an exception while starting, encoding or prefilling one request fails that
request; an exception in the batched decode step fails the rows of that batch (the batch is
replaced first, so the recovery never touches the broken one); the loop itself never dies.

Thread contract: the public methods and properties may be called from any thread, except
`step`; `step` and everything private run on the engine thread.

Around this module: `wire.py` (the typed messages other threads send), `scheduler/` (the
stages, the endings, the decode batch) and `cache_ops.py` (the caches' glue).
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any

import mlx.core as mx

from caches.entries import entries_report
from caches.prefix import ImageSpan
from gateway.config import EngineConfig
from gateway.engine.cache_ops import cache_stats, new_caches
from gateway.engine.device_memory import device_memory
from gateway.engine.families import ModelFamily, UnsupportedModel, load_model
from gateway.engine.model.cudnn import disable_cudnn_attention
from gateway.engine.model.kv_check import KVQuantUnsupported
from gateway.engine.pixels import PixelPreparer
from gateway.engine.request import EngineRequest
from gateway.engine.scheduler.job import Sink
from gateway.engine.scheduler.loaded import Loaded
from gateway.engine.scheduler.occupancy import Occupancy
from gateway.engine.scheduler.scheduler import Scheduler
from gateway.engine.scheduler.step_trace import StepTrace
from gateway.engine.wire import Cancel, Enqueue, Message, ResetCaches, Stop
from gateway.heap import freeze_startup_objects
from gateway.metrics import CacheCollector, Metrics

log = logging.getLogger(__name__)
# Load failures that are the model and flags' answer, not a fault: logged without a traceback.
_REFUSALS = (UnsupportedModel, KVQuantUnsupported)


def _no_mark(stage: str) -> None:
    """The step trace's stage mark when tracing is off."""


class Engine:
    """Schedules requests onto the model. Construct, `start()`, `submit()`, `stop()`."""

    def __init__(
        self,
        config: EngineConfig,
        metrics: Metrics,
        loader: Callable[[], ModelFamily] | None = None,
    ) -> None:
        self.config = config
        self.metrics = metrics
        self._loader = loader or (lambda: load_model(config.model))
        # Replaced (not cleared) by `reset_caches`; any thread reads them.
        self.vision_cache, self.prefix_cache = new_caches(config.cache)
        metrics.add_collector(CacheCollector(self.cache_stats))
        # Called where a step's events should leave now (sinks may buffer until then).
        self.on_events: Callable[[], None] | None = None
        # Tests inject faults here: called on the engine thread in every step, inside the
        # decode step's guard (an exception fails the batch's rows, as a decode failure does).
        self.step_hook: Callable[[], None] | None = None
        self._inbox: queue.Queue[Message] = queue.Queue()
        self._thread = threading.Thread(target=self._main, name="mlx-engine", daemon=True)
        self._ready = threading.Event()
        self._stopped = threading.Event()
        self._load_error: BaseException | None = None
        self._occupancy = Occupancy(config.max_waiting, config.max_batch)
        self._trace = StepTrace(config.step_trace) if config.step_trace is not None else None
        self._admission_stream: mx.Stream | None = None  # `--admission-stream` (engine thread)
        # Set once, by the engine thread, when the model has loaded; None before (and for
        # good if the load failed). The one piece of post-load state.
        self._scheduler: Scheduler | None = None
        # The one owner of pixel preprocessing: the images the tower will run on, prepared
        # off the engine thread before their request enters the inbox.
        self._pixels = PixelPreparer(
            self.needs_pixels,
            self._preprocess,
            lambda request, sink: self._inbox.put(Enqueue(request, sink)),
            lambda request_id: self._inbox.put(Cancel(request_id)),
        )

    # ----- any thread -------------------------------------------------------------------------

    def start(self, timeout: float | None = None) -> None:
        """Start the thread and block until the model is loaded (re-raises a load failure)."""
        self._thread.start()
        if not self._ready.wait(timeout):
            raise TimeoutError("model did not load in time")
        if self._load_error is not None:
            raise RuntimeError(f"model failed to load: {self._load_error}") from self._load_error

    def submit(self, request: EngineRequest, sink: Sink) -> None:
        """Queue a request; events go to `sink` (called on an engine thread, must not block).
        Its images' pixels are prepared here (`gateway.engine.pixels`), only for those the
        tower will run on; the request's `pixel_values` may be None.

        Raises EngineBusy when every row and queue slot is taken.
        """
        if request.sampling.n > self.config.max_batch:  # the HTTP edge refuses these (400)
            raise ValueError(f"n={request.sampling.n} exceeds max_batch={self.config.max_batch}")
        self._occupancy.reserve(request.sampling.n)
        self._pixels.submit(request, sink)

    def cancel(self, request_id: str) -> None:
        """Drop a request wherever it is; its row is freed at the next step. Idempotent."""
        self._pixels.cancel(request_id)

    def stop(self, timeout: float = 10.0) -> None:
        """Stop serving; requests still in flight get an ErrorEvent (SHUTTING_DOWN). Returns
        once the engine has finished its last step (the thread then parks; see `_main`)."""
        self._pixels.close()  # what was submitted reaches the inbox before Stop
        if self._thread.is_alive() and not self._stopped.is_set():
            self._inbox.put(Stop())
            self._stopped.wait(timeout)

    @property
    def running(self) -> int:
        return self._occupancy.active

    @property
    def waiting(self) -> int:
        return self._occupancy.queued

    @property
    def idle(self) -> bool:
        return self._occupancy.idle

    @property
    def alive(self) -> bool:
        """The engine thread is serving (loaded, not stopped)."""
        return self._ready.is_set() and self._load_error is None and not self._stopped.is_set()

    @property
    def loaded(self) -> Loaded | None:
        """The model and what serves it, once loaded (None before, or if the load failed)."""
        scheduler = self._scheduler
        return None if scheduler is None else scheduler.loaded

    @property
    def model(self) -> ModelFamily | None:
        """The loaded model (None before it is loaded)."""
        loaded = self.loaded
        return None if loaded is None else loaded.model

    @property
    def on_gpu(self) -> bool:
        """The model computes on a GPU (False until it is loaded)."""
        loaded = self.loaded
        return loaded is not None and loaded.on_gpu

    @property
    def device_memory(self) -> int | None:  # bytes for the model (None until loaded)
        return None if self.loaded is None else device_memory(self.loaded.on_gpu)

    @property
    def scheduler(self) -> Scheduler | None:
        """The jobs and stages, once loaded: engine-thread state, for tests to observe and
        patch (never to call into from another thread)."""
        return self._scheduler

    def cache_stats(self) -> dict[str, dict[str, object]]:
        """The caches' counters as plain JSON-able dicts (any thread): vision, prefix and,
        once the model is loaded, compiled grammars and the disk tier."""
        stats = cache_stats(self.vision_cache, self.prefix_cache)
        loaded = self.loaded
        if loaded is None:
            return stats
        stats["prefix"].update(loaded.kv_format())  # the KV's dtype and bits
        return {**stats, **loaded.cache_stats()}

    def needs_pixels(self, prompt_ids: Sequence[int], images: Sequence[ImageSpan]) -> list[bool]:
        """Per image: will the engine run the vision tower on it? (Any thread; advisory.)"""
        loaded = self.loaded
        if loaded is None:
            return [True] * len(images)
        return loaded.cache_ops.needs_pixels(prompt_ids, images)

    def _preprocess(self, image: Any) -> Any:
        """An image's (or a video block's) pixel values, by the loaded model's processor
        (any thread; RuntimeError before the model has loaded)."""
        model = self.model
        if model is None:
            raise RuntimeError("the model is not loaded")
        return model.preprocess(image)[0]

    def cache_entries(
        self, limit: int = 10, kind: str | None = None, tenant: str | None = None
    ) -> dict[str, Any]:
        """`caches.entries.entries_report` over this engine's caches (any thread: they are
        thread-safe to read)."""
        return entries_report(self.vision_cache, self.prefix_cache, limit, kind, tenant)

    def clear_caches(self) -> None:
        """Empty the vision and prefix caches and this model's disk tier (a cleared server
        answers the next request cold, as `/v1/cache/clear` promises). Any thread."""
        loaded = self.loaded
        if loaded is not None and loaded.answers is not None:
            loaded.answers.cancel()  # first: no answer block computed before lands after
        self.vision_cache.clear()
        self.prefix_cache.clear()
        if loaded is not None:
            loaded.clear_caches()

    def reset_caches(self) -> None:
        """Replace both caches by empty ones with zeroed counters (after the start-up warm-up,
        so stats count only real traffic). Applied on the engine thread, in inbox order."""
        self._inbox.put(ResetCaches())

    def metrics_text(self) -> bytes:
        """The engine's metrics in Prometheus text format (any thread)."""
        return self.metrics.render()

    # ----- engine thread: the loop ------------------------------------------------------------

    def _main(self) -> None:
        try:
            if not self.config.cudnn_attention:
                disable_cudnn_attention()
            if self.config.mlx_cache_limit_mb is not None:
                mx.set_cache_limit(int(self.config.mlx_cache_limit_mb * 1024 * 1024))
            loaded = Loaded.load(self.config, self._loader, self.vision_cache, self.prefix_cache)
            scheduler = Scheduler(self.config, self.metrics, loaded, self._occupancy, self._trace)
        except BaseException as exc:  # noqa: BLE001 - reported to start()
            if isinstance(exc, _REFUSALS):  # a sentence for the user, not a crash
                log.error("model refused: %s", exc)
            else:
                log.exception("model load failed")
            self._load_error = exc
            self._ready.set()
            return
        self._scheduler = scheduler
        if self.config.admission_stream:
            self._admission_stream = mx.new_stream(mx.default_device())
        freeze_startup_objects("engine, loaded")
        self._ready.set()
        log.info("engine ready: %s (%s)", self.config.model, loaded.model.arch)
        try:
            while self._drain_inbox(block=scheduler.idle):
                started = time.perf_counter()
                try:
                    self.step()
                except Exception:  # a bug outside the per-request guards: never stop serving
                    log.exception("engine step failed; failing the requests it held")
                    scheduler.fail_active()
                    self._ship()
                self.metrics.step_seconds.observe(time.perf_counter() - started)
        finally:
            self._shut_down()
        # Park instead of returning. mlx 0.32's thread-local destructors (random state,
        # compile cache) take the GIL when a thread exits; if that races interpreter
        # shutdown the process aborts ("terminate called without an active exception",
        # ml-explore/mlx#3126, fixed after 0.32). A parked daemon thread never runs them.
        threading.Event().wait()

    @property
    def _serving(self) -> Scheduler:
        """The scheduler, on the engine thread after the load (where it is never None)."""
        assert self._scheduler is not None, "the engine thread serves only once loaded"
        return self._scheduler

    def _shut_down(self) -> None:
        scheduler = self._serving
        scheduler.shut_down()  # fails what is left (SHUTTING_DOWN), drops the batch
        if self._trace is not None:
            self._trace.flush()
        scheduler.loaded.cache_ops.close()  # entries answered so far reach the disk tier
        self._ship()  # the shutdown errors above
        self._stopped.set()

    def _new_caches(self) -> None:
        self.vision_cache, self.prefix_cache = new_caches(self.config.cache)
        self._serving.loaded.use_caches(self.vision_cache, self.prefix_cache)

    def _drain_inbox(self, block: bool) -> bool:
        """Apply the inbox's queued messages (gateway.engine.wire.Message). Returns False on
        Stop."""
        try:
            message = self._inbox.get(timeout=0.5) if block else self._inbox.get_nowait()
        except queue.Empty:
            return True
        while True:
            match message:
                case Stop():
                    return False
                case Cancel(request_id):
                    self._serving.cancel(request_id)
                case ResetCaches():
                    self._new_caches()
                    self.metrics.reset_request_timings()  # the warm-up's are not the users'
                    freeze_startup_objects("engine, warmed up")  # (the only reset: start-up)
                case Enqueue(request, sink):
                    self._serving.enqueue(request, sink)
            try:
                message = self._inbox.get_nowait()
            except queue.Empty:
                return True

    def step(self) -> None:
        """One scheduling step (engine thread only: the loop calls it). Events leave after
        admission (clients get their headers while we prefill), after the prefill (first
        tokens before the tower and the decode step) and after the decode, then finished KV
        is stored."""
        s = self._serving
        trace = self._trace
        mark = trace.stage if trace is not None else _no_mark
        if trace is not None:
            trace.begin()
        s.begin_step()
        if self._admission_stream is not None:
            self._step_overlapped(s, mark)
        else:
            self._step_serial(s, mark)
        s.end_step()
        if trace is not None:
            trace.end(**s.step_counts())
        self.metrics.running.set(self._occupancy.active)
        self.metrics.waiting.set(self._occupancy.queued)
        self.metrics.mlx_active_bytes.set(mx.get_active_memory())
        self.metrics.mlx_cache_bytes.set(mx.get_cache_memory())
        self.metrics.mlx_peak_bytes.set(mx.get_peak_memory())

    def _step_serial(self, s: Scheduler, mark: Callable[[str], None]) -> None:
        """admit, prefill, encode, decode, store, answer: one stream, one after the other."""
        # All MLX work of this thread runs on the batch's stream: one stream, one ordering,
        # and no extra per-thread stream whose worker MLX would abort on at process exit.
        with mx.stream(s.batch.stream):
            self._admit(s, mark)
            self._image_work(s, mark)
            self._decode(s)
            mark("decode")
            self._ship()
            self._after_answers(s, mark)

    def _step_overlapped(self, s: Scheduler, mark: Callable[[str], None]) -> None:
        """`--admission-stream`: the decode first (mlx-lm queues the batch's next token on its
        stream and reads the previous one), its tokens shipped, then the image work on the
        admission stream, which the device runs beside that queued token: a running stream
        waits for the longer of the two, not their sum. Results are those of the serial step
        (the same kernels on the same inputs; MLX orders the arrays one stream hands the
        other). Rows prefilled here join at the next step's decode."""
        with mx.stream(s.batch.stream):
            self._admit(s, mark)
            self._decode(s)
            mark("decode")
            self._ship()
            mark("ship")
        with mx.stream(self._admission_stream):
            self._image_work(s, mark)
            self._after_answers(s, mark)

    def _admit(self, s: Scheduler, mark: Callable[[str], None]) -> None:
        s.admit()
        mark("admit")
        self._ship()
        mark("ship")

    def _image_work(self, s: Scheduler, mark: Callable[[str], None]) -> None:
        # Prefill before encode: the requests prefilling finished their encode earlier, so
        # they are older than the group in the tower and take the step's budget first (an
        # image's prefill does not crawl at one block per step behind the next image's
        # encode). A request whose encode ends here is prefilled from the next step on.
        s.prefill()
        mark("prefill")
        self._ship()
        mark("ship")
        s.encode()
        mark("encode")

    def _after_answers(self, s: Scheduler, mark: Callable[[str], None]) -> None:
        """Store the KV of the requests that finished (their events left), answer prefill."""
        s.store_finished()
        mark("ship")
        s.answer(self._arrived)
        mark("answer")

    def _decode(self, s: Scheduler) -> None:
        try:
            if self.step_hook is not None:
                self.step_hook()
            s.decode()
        except Exception:
            log.exception("decode step failed; failing the requests in the batch")
            s.fail_batch()

    def _arrived(self) -> bool:
        """Has a message (a new request, say) reached the inbox? (Answer prefill yields.)"""
        return not self._inbox.empty()

    def _ship(self) -> None:
        if self.on_events is not None:
            self.on_events()
