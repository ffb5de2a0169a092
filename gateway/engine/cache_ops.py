"""What the engine does with its caches: lookups at admission (a prefix hit's KV blocks
assembled into the request's own cache), vision-cache lookups, and storing a prompt's KV as
blocks of the radix tree (caches/prefix.py). Engine thread only.

A failure inside a cache is a miss (or a skipped store) with a log line, never a failed
request: the caches are an optimisation, the request must still be answered.

Scopes (caches/scope.py): a request's images arrive with scoped content hashes (the prompt
builder's doing), so vision keys and image tags are scoped already; its `cache_scope` tag is
passed with every prompt given to the prefix cache (`_scope`), so its text is too.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Sequence
from typing import Any

import mlx.core as mx

from caches.prefix import ImageSpan, PrefixCache, PrefixHit
from caches.radix import Block
from caches.scope import scope_of_hash
from caches.vision import VisionCache, VisionEntry, VisionKey
from gateway.config import CPU_KV_BLOCK_TOKENS, GPU_KV_BLOCK_TOKENS, CacheConfig
from gateway.engine.disk.kv import (
    BlockLayers,
    block_wants,
    extend_hit,
    queue_blocks,
    touch_blocks,
)
from gateway.engine.disk.plan import ReadPlan
from gateway.engine.disk.reader import Prefetch, Prefetched
from gateway.engine.disk.tier import DiskTier, open_disk_tier
from gateway.engine.families.family import ModelFamily
from gateway.engine.model.kv import assemble, block_nbytes
from gateway.engine.model.snapshots import layer_block, snapshot_nbytes, state_layers, storable
from gateway.engine.scheduler.job import Job

log = logging.getLogger(__name__)


class CacheOps:
    """`exact_block` > 0 applies the exact-reuse rule (docs/caching.md): hits are whole blocks
    of that many tokens, and only KV that prefill computed is stored (a finished request's
    prompt, not its answer, whose KV decode steps computed in other shapes).

    The prefix cache stores blocks of `exact_block` tokens (with the rule off: the device's
    default block, hits then any whole-block prefix that does not end inside an image).

    `disk` (optional) is the tier under both caches: read ahead for a request while it waits
    (`prefetch`: what the memory caches lack when it arrives), used at admission where memory
    still misses (a hit is promoted to memory), written in the background when an entry is
    first computed.

    The model family's `cache_policy` can turn either cache off for this model (a layer type
    that cannot be restored exactly): lookups then miss, nothing is stored, in memory or on
    disk, and the reason shows in /v1/cache/stats (`Loaded.cache_stats`)."""

    def __init__(
        self,
        model: ModelFamily,
        vision: VisionCache,
        prefix: PrefixCache,
        exact_block: int = 0,
        disk: DiskTier | None = None,
    ) -> None:
        self.model = model
        self.vision = vision
        self.disk = disk
        self.exact_block = exact_block
        on_gpu = mx.default_device().type == mx.DeviceType.gpu
        self.block = exact_block or (GPU_KV_BLOCK_TOKENS if on_gpu else CPU_KV_BLOCK_TOKENS)
        self.prefix = prefix
        self._align = max(exact_block, 1)
        self._dtype = str(model.embed_dtype).replace("mlx.core.", "")
        layers = model.new_cache()
        self._layers, self._states = len(layers), state_layers(layers)
        # (state snapshots exist only at the exact-reuse rule's block ends: off without it)
        on = model.cache_policy.prefix_off is None
        self._prefix_on = on and (exact_block > 0 or not model.state_snapshots)
        self._vision_on = model.cache_policy.vision_off is None

    @property
    def prefix(self) -> PrefixCache:
        return self._prefix

    @prefix.setter
    def prefix(self, cache: PrefixCache) -> None:
        """Use `cache` (also a fresh one after a reset), keyed by this engine's blocks."""
        cache.configure(self.block)
        self._prefix = cache

    @staticmethod
    def _scope(job: Job) -> str:
        """The request's cache scope: one more component of every prefix-cache key."""
        return job.request.cache_scope

    def spans(self, job: Job, upto: int | None = None) -> list[ImageSpan]:
        """Image spans of the request's prompt (those wholly before `upto`, if given)."""
        return [
            ImageSpan(i.layout.start, i.layout.end, i.content_hash)
            for i in job.request.images
            if upto is None or i.layout.end <= upto
        ]

    def needs_pixels(self, prompt_ids: Sequence[int], images: Sequence[ImageSpan]) -> list[bool]:
        """Per image: is it neither covered by a prefix-cache hit nor in the vision cache, so
        the tower must run on it? Thread-safe (the caches lock); advisory: if an entry is
        evicted before admission, the engine preprocesses the image itself. (The scope is
        that of the images' scoped hashes: every image of a request carries it.)"""
        scope = scope_of_hash(images[0].content_hash) if images else ""
        covered = self.prefix.peek(prompt_ids, images, self._align, scope) if self._prefix_on else 0
        return [
            span.end > covered and not self._vision_held(self.vision_key(span.content_hash))
            for span in images
        ]

    def _vision_held(self, key: VisionKey) -> bool:
        if not self._vision_on:
            return False
        if key in self.vision:
            return True
        return self._disk_for(self.vision) and self.disk.has_vision(key)  # type: ignore[union-attr]

    def _disk_for(self, cache: VisionCache | PrefixCache) -> bool:
        """Is there an active disk tier under `cache`? A cache turned off has none (so
        --no-vision-cache / --no-prefix-cache still mean what they say), nor one the model
        family turned off."""
        on = self._prefix_on if isinstance(cache, PrefixCache) else self._vision_on
        return on and self.disk is not None and self.disk.active and cache.capacity_bytes > 0

    def vision_key(self, content_hash: str) -> VisionKey:
        return VisionKey(
            self.model.fingerprint, self.model.processor_fingerprint, self._dtype, content_hash
        )

    def prefetch(self, job: Job) -> Prefetch | None:
        """Start reading from the disk tier what the request will need and the memory caches
        lack now (None: nothing to read). Called when the request arrives; `admit` waits
        until it is done. Never raises (a failure is logged: the request reads nothing)."""
        request = job.request
        if not request.use_caches or self.disk is None or not self.disk.active:
            return None
        try:
            plan = self._read_plan(job)
        except Exception:
            log.exception("planning the disk cache read of %s failed", job.request_id)
            return None
        return self.disk.reader.submit(plan) if plan else None

    def _read_plan(self, job: Job) -> ReadPlan:
        """What memory lacks and the disk may hold. Files that are not there are left out
        (a stat each), so a request that will not hit the disk (a new prompt) does not wait
        for the reader at all."""
        request, disk = job.request, self.disk
        assert disk is not None
        layouts = [i.layout for i in request.images]
        spans = self.spans(job)
        blocks: tuple = ()
        if self._disk_for(self.prefix):
            blocks = block_wants(
                self.prefix,
                request.prompt_ids,
                spans,
                lambda cut: delta_before(layouts, cut),
                self._scope(job),
            )
            if blocks and not disk.store.probe("prefix", blocks[0].key):
                blocks = ()
        covered = 0
        if self._prefix_on:
            covered = self.prefix.peek(request.prompt_ids, spans, self._align, self._scope(job))
        images = []
        for image in request.images if self._disk_for(self.vision) else ():
            key = self.vision_key(image.content_hash)
            # (covered by the memory hit, or in the vision cache: memory serves it)
            if image.layout.end > covered and key not in self.vision:
                num, end = image.layout.num_tokens, image.layout.end
                want = disk.image_want(key, end, num, image.grid_thw, self.model.embed_dtype)
                if disk.store.probe("vision", want.key):
                    images.append(want)
        quantized = self.model.kv_quant is not None
        return ReadPlan(
            blocks, self.block, self._layers, covered, tuple(images), self._states, quantized
        )

    def admit(self, job: Job) -> None:
        """Prefix lookup, then vision lookups for the images the prefix does not cover; where
        memory misses, what the request's prefetch read from disk (then released).

        Sets job.cached_tokens, job.cache (the hit's blocks assembled into a private cache),
        job.encoded, job.to_encode (images to run through the tower) and job.split.
        """
        found = Prefetched()
        if job.prefetch is not None:
            found = job.prefetch.result()  # done: the request was admitted once it was
        try:
            self._admit(job, found)
        finally:
            if job.prefetch is not None:
                job.prefetch.release()
                job.prefetch = None

    def _admit(self, job: Job, found: Prefetched) -> None:
        request = job.request
        layouts = [i.layout for i in request.images]
        hit = None
        try:
            if request.use_caches and self._prefix_on:
                hit = self.prefix.lookup(
                    request.prompt_ids, self.spans(job), self._align, self._scope(job)
                )
            if request.use_caches and self._disk_for(self.prefix):
                touch_blocks(self.disk, hit)  # type: ignore[arg-type]
                hit = self._disk_extend(job, hit, found)
        except Exception:
            log.exception("prefix cache lookup failed; treating as a miss")
        if hit is not None:
            job.cached_tokens = hit.tokens
            # (an exact-rule hit may end inside an image: the delta of the images before it;
            # the prefill sets the prompt's own delta once it is complete)
            # room for the rest of the prompt (and the exact rule's padded last block)
            room = len(request.prompt_ids) - hit.tokens + self.exact_block
            delta = delta_before(layouts, hit.tokens)
            job.cache = assemble(hit, delta, room, self.model.new_cache(delta))
        job.encoded = [None] * len(request.images)
        pending = [i for i, img in enumerate(request.images) if img.layout.end > job.cached_tokens]
        job.split = max((request.images[i].layout.end for i in pending), default=0)
        job.fed = job.cached_tokens
        for i in pending:
            entry = None
            if request.use_caches and self._vision_on:
                entry = self._vision_lookup(request.images[i], layouts[i].num_tokens)
            if entry is None and request.use_caches:
                entry = self._vision_from_disk(request.images[i], found)
                job.vision_disk_hits += entry is not None
            if entry is not None:
                job.encoded[i] = entry.features
                job.vision_hits += 1
            else:
                job.to_encode.append(i)
                job.vision_misses += 1

    def _vision_lookup(self, image: Any, tokens: int) -> VisionEntry | None:  # an ImageInput
        try:
            key = self.vision_key(image.content_hash)
            entry = self.vision.lookup(key, tokens, image.media)
            if entry is not None and self._disk_for(self.vision):
                self.disk.touch("vision", self.disk.vision_file_key(key))  # type: ignore[union-attr]
            return entry
        except Exception:
            log.exception("vision cache lookup failed; treating as a miss")
            return None

    def _vision_from_disk(self, image: Any, found: Prefetched) -> VisionEntry | None:
        """The image's features as the prefetch read them, promoted to the memory cache, or
        None (not read: not on disk, or the memory cache held them when the read was planned)."""
        if not self._disk_for(self.vision):
            return None
        key = self.vision_key(image.content_hash)
        read = found.features.get(self.disk.vision_file_key(key))  # type: ignore[union-attr]
        if read is None:
            return None
        try:
            entry = self.disk.load_vision(read, self.model.embed_dtype)  # type: ignore[union-attr]
        except Exception:
            log.exception("disk cache vision load failed; treating as a miss")
            return None
        self.vision.store(key, entry)
        return entry

    def store_vision(self, key: VisionKey, entry: VisionEntry) -> None:
        """A freshly encoded image: into the memory cache, and queued for the disk tier."""
        if not self._vision_on:
            return
        self.vision.store(key, entry)
        if self._disk_for(self.vision):
            try:
                self.disk.save_vision(key, entry)
            except Exception:
                log.exception("queueing vision features for the disk cache failed")

    def _disk_extend(self, job: Job, hit: PrefixHit | None, found: Prefetched) -> PrefixHit | None:
        """A memory lookup extended with whole blocks the prefetch read (see disk_kv)."""
        request = job.request
        extended, gained = extend_hit(
            self.disk,  # type: ignore[arg-type]
            self.prefix,
            request.prompt_ids,
            self.spans(job),
            self._align,
            hit,
            found,
            self._scope(job),
        )
        job.disk_cached_tokens = gained
        return extended

    def store_image_part(self, job: Job) -> None:
        """Store the job's KV blocks prefilled so far (called once the image-bearing part
        [0, split) is in its cache), so a later question about the same images skips it."""
        kv = job.cache or []
        upto = min(job.fed, kv[0].offset) if kv else 0
        self._store(job, job.request.prompt_ids, kv, upto)

    def store_finished(self, job: Job, kv: list[Any], tokens: list[int], delta: int) -> None:
        """Store the KV blocks of a finished request's prompt + answer (for the next turn);
        under the exact rule only the prompt's. (`delta`, the rope delta at the prompt's end,
        is recomputed per block.)"""
        if not kv or kv[0].offset != len(tokens):
            log.warning("not caching %s: KV length does not match its tokens", job.request_id)
            return
        length = job.prompt_len if self.exact_block else len(tokens)
        self._store(job, tokens, kv, length)

    def _store(self, job: Job, tokens: Any, kv: list[Any], length: int) -> None:
        """Store whole blocks of tokens[:length]; only blocks the tree lacks are copied."""
        try:
            off = self.prefix.capacity_bytes == 0 or not self._prefix_on
            if off or not job.request.use_caches or not kv:
                return
            layouts = [i.layout for i in job.request.images]
            if self.model.last_token_apart and self.exact_block:  # a one-row step's KV
                length = min(length, job.prompt_len - 1)
            block, new = self.prefix.block_tokens, []
            length = storable(kv, block, length)  # hybrid: blocks with state snapshots only
            made: list[tuple[int, Block]] = []

            def make(k: int) -> Block:
                lo, hi = k * block, (k + 1) * block
                arrays = BlockLayers(layer_block(c, lo, hi) for c in kv)  # (snapshots.py)
                new.append(arrays)
                nbytes = block_nbytes(arrays)  # quantized KV: its packed bytes
                delta, states = delta_before(layouts, hi), snapshot_nbytes(arrays, kv)
                made.append((k, Block(arrays, nbytes, delta, snapshot_nbytes=states)))
                return made[-1][1]

            spans = self.spans(job)
            self.prefix.store(list(tokens), spans, make, length, self._scope(job))
            mx.eval(new)
        except Exception:
            log.exception("prefix cache store failed for %s; continuing", job.request_id)
            return
        if made and self._disk_for(self.prefix):
            queue_blocks(self.disk, list(tokens), spans, block, made, self._scope(job))  # type: ignore[arg-type]

    def open_disk(self, config: CacheConfig, active: bool) -> None:
        """Open the disk tier `config` asks for (none if off or unusable), for this engine's
        model and blocks. `active` False: unused until `activate_disk`."""
        self.disk = open_disk_tier(config, self.model, self.block, bool(self.exact_block), active)

    def activate_disk(self) -> None:
        """Start reading and writing the disk tier (after the start-up warm-up)."""
        if self.disk is not None:
            self.disk.activate()

    def close(self) -> None:
        """Write what the disk tier has queued (bounded), then stop its writer."""
        if self.disk is not None:
            self.disk.close(timeout=8.0)  # within Engine.stop's 10 s

    def disk_stats(self) -> dict[str, object]:
        """The disk tier's counters ({"enabled": False} when there is none). Thread-safe."""
        return {"enabled": False} if self.disk is None else self.disk.stats()


def delta_before(layouts: Sequence[Any], cut: int) -> int:
    """Rope delta of the images wholly before token `cut` (which may fall inside an image)."""
    return sum(i.rope_shift for i in layouts if i.end <= cut)


def new_caches(config: CacheConfig) -> tuple[VisionCache, PrefixCache]:
    """Empty vision and prefix caches with `config`'s budgets and per-tenant share."""
    share = config.tenant_cache_share
    return (
        VisionCache(config.vision_capacity_bytes, share),
        PrefixCache(config.kv_capacity_bytes, tenant_share=share),
    )


def cache_stats(vision: VisionCache, prefix: PrefixCache) -> dict[str, dict[str, object]]:
    """Both caches' counters as JSON-able dicts: the one source for /v1/cache/stats and
    /metrics, with `tenants`: per tenant, each cache's lookups, hits, entries and bytes.
    Thread-safe."""
    out: dict[str, dict[str, object]] = {}
    p = prefix.stats()
    for name, stats in (("vision", vision.stats()), ("prefix", p)):
        d = dataclasses.asdict(stats)
        d["queries"] = stats.hits + stats.misses
        d["hit_rate"] = stats.hit_rate
        d["enabled"] = stats.capacity_bytes > 0
        out[name] = d
    out["vision"]["media"] = vision.media_stats()
    out["prefix"]["token_hit_rate"] = p.tokens_hit / p.tokens_queried if p.tokens_queried else 0.0
    tenants: dict[str, dict[str, object]] = {}
    for name, per in (("vision", vision.tenant_stats()), ("prefix", prefix.tenant_stats())):
        for tenant, row in per.items():
            tenants.setdefault(tenant, {})[name] = row
    out["tenants"] = tenants
    return out
