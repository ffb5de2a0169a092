"""What the engine does with its caches: lookups at admission, image encoding through the
vision cache, chunked image prefill, and storing KV snapshots. Engine thread only.

A failure inside a cache is a miss (or a skipped store) with a log line, never a failed
request: the caches are an optimisation, the request must still be answered.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Sequence
from typing import Any

import mlx.core as mx

from caches.prefix import ImageSpan, PrefixCache, PrefixEntry
from caches.vision import VisionCache, VisionEntry, VisionKey
from gateway.engine.job import Job
from gateway.engine.kv import RowKVCache
from gateway.engine.model import VisionLanguageModel
from gateway.engine.positions import rope_delta_at

log = logging.getLogger(__name__)


class CacheOps:
    """`exact_block` > 0 applies the exact-reuse rule (docs/caching.md): hits are whole blocks
    of that many tokens, and only KV that prefill computed is stored (a finished request's
    prompt, not its answer, whose KV decode steps computed in other shapes)."""

    def __init__(
        self,
        model: VisionLanguageModel,
        vision: VisionCache,
        prefix: PrefixCache,
        exact_block: int = 0,
    ) -> None:
        self.model = model
        self.vision = vision
        self.prefix = prefix
        self.exact_block = exact_block
        self._align = max(exact_block, 1)
        self._dtype = str(model.embed_dtype).replace("mlx.core.", "")

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
        evicted before admission, the engine preprocesses the image itself."""
        covered = self.prefix.peek(prompt_ids, images, self._align)
        return [
            span.end > covered and self.vision_key(span.content_hash) not in self.vision
            for span in images
        ]

    def vision_key(self, content_hash: str) -> VisionKey:
        return VisionKey(
            self.model.fingerprint, self.model.processor_fingerprint, self._dtype, content_hash
        )

    def admit(self, job: Job) -> None:
        """Prefix lookup, then vision lookups for the images the prefix does not cover.

        Sets job.cached_tokens, job.cache (a private fork of the hit), job.encoded,
        job.to_encode (images to run through the tower) and job.split.
        """
        request = job.request
        layouts = [i.layout for i in request.images]
        hit = None
        try:
            if request.use_caches:
                hit = self.prefix.lookup(request.prompt_ids, self.spans(job), self._align)
        except Exception:
            log.exception("prefix cache lookup failed; treating as a miss")
        if hit is not None:
            job.cached_tokens = hit.tokens
            # (an exact-rule hit may end inside an image: the delta of the images before it;
            # the prefill sets the prompt's own delta once it is complete)
            delta = sum(i.rope_shift for i in layouts if i.end <= hit.tokens)
            job.cache = fork(hit.entry.kv, hit.tokens, delta)
        job.encoded = [None] * len(request.images)
        pending = [i for i, img in enumerate(request.images) if img.layout.end > job.cached_tokens]
        job.split = max((request.images[i].layout.end for i in pending), default=0)
        job.fed = job.cached_tokens
        for i in pending:
            entry = None
            if request.use_caches:
                entry = self._vision_lookup(request.images[i].content_hash, layouts[i].num_tokens)
            if entry is not None:
                job.encoded[i] = entry.features
                job.vision_hits += 1
            else:
                job.to_encode.append(i)
                job.vision_misses += 1

    def _vision_lookup(self, content_hash: str, tokens: int) -> VisionEntry | None:
        try:
            return self.vision.lookup(self.vision_key(content_hash), tokens)
        except Exception:
            log.exception("vision cache lookup failed; treating as a miss")
            return None

    def store_image_part(self, job: Job) -> None:
        """Store a snapshot of the job's KV over the image-bearing part [0, split) (called once
        that part is prefilled), so a later question about the same images skips it."""
        split = job.split
        self._store(
            job,
            job.request.prompt_ids[:split],
            [c.snapshot(split) for c in job.cache or []],
            rope_delta_at([i.layout for i in job.request.images], split),
            self.spans(job, split),
        )

    def store_finished(self, job: Job, kv: list[Any], tokens: list[int], delta: int) -> None:
        """Store prompt + answer KV of a finished request (for the next turn); under the
        exact rule only the prompt's (`delta` is the rope delta at the prompt's end)."""
        if not kv or kv[0].offset != len(tokens):
            log.warning("not caching %s: KV length does not match its tokens", job.request_id)
            return
        if self.exact_block and len(tokens) > job.prompt_len:
            tokens = tokens[: job.prompt_len]
            kv = [c.snapshot(job.prompt_len) for c in kv]
        self._store(job, tokens, kv, delta, self.spans(job))

    def _store(
        self, job: Job, tokens: Any, kv: list[Any], delta: int, spans: list[ImageSpan]
    ) -> None:
        try:
            if self.prefix.capacity_bytes == 0 or not job.request.use_caches:
                return
            nbytes = sum(c.used_nbytes() for c in kv)
            if nbytes > self.prefix.capacity_bytes:
                return
            # Materialise the snapshot now: a lazy slice would keep its whole source buffer
            # (a batch's KV, every row) alive for as long as the entry lives, unaccounted.
            mx.eval([c.keys for c in kv], [c.values for c in kv])
            self.prefix.store(list(tokens), spans, PrefixEntry(kv, len(tokens), delta, nbytes))
        except Exception:
            log.exception("prefix cache store failed for %s; continuing", job.request_id)


def fork(kv: list[RowKVCache], tokens: int, rope_delta: int) -> list[RowKVCache]:
    """A private cache over the first `tokens` tokens of a stored snapshot. The stored arrays
    have no spare capacity, so the fork's first update reallocates instead of writing into
    them: the stored entry is never mutated."""
    out = []
    for layer in kv:
        keys = layer.keys[..., :tokens, :]
        values = layer.values[..., :tokens, :]
        out.append(RowKVCache.from_arrays(keys, values, rope_delta))
    mx.eval([c.keys for c in out])
    return out


def cache_stats(vision: VisionCache, prefix: PrefixCache) -> dict[str, dict[str, object]]:
    """Both caches' counters as JSON-able dicts: the one source for /v1/cache/stats and
    /metrics. Thread-safe."""
    out: dict[str, dict[str, object]] = {}
    p = prefix.stats()
    for name, stats in (("vision", vision.stats()), ("prefix", p)):
        d = dataclasses.asdict(stats)
        d["queries"] = stats.hits + stats.misses
        d["hit_rate"] = stats.hit_rate
        d["enabled"] = stats.capacity_bytes > 0
        out[name] = d
    out["prefix"]["token_hit_rate"] = p.tokens_hit / p.tokens_queried if p.tokens_queried else 0.0
    return out
