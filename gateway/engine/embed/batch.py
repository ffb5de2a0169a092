"""One engine batch of embedding calls (engine thread): each input answered from the
embedding cache or computed, images' features from the vision cache or one tower pass each,
the computed inputs in right-padded forwards of at most `max_rows` rows, shortest first.

Identical inputs in a batch (within or across calls) are computed once. A call whose input
the model refuses fails alone (`EmbedRefused` naming the input); the others are answered.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import mlx.core as mx
import numpy as np

from caches.embeddings import EmbeddingCache, EmbeddingEntry, EmbeddingKey
from caches.vision import VisionCache, VisionEntry, VisionKey
from gateway.engine.embed.embedder import Embedder, ImageFeatures, Prepared, as_numpy, normalized
from gateway.engine.embed.metrics import EmbedMetrics
from gateway.engine.embed.request import Embed, EmbedRefused, EmbedResult

log = logging.getLogger(__name__)

Done = Callable[[EmbedResult | BaseException], None]


@dataclass
class Job:
    """A call waiting in the engine and where its answer goes."""

    call: Embed
    done: Done
    vectors: list[np.ndarray | None] = field(default_factory=list)
    tokens: list[int] = field(default_factory=list)
    cached: int = 0
    failed: BaseException | None = None


@dataclass
class _Row:
    """One distinct input to compute, and the (job, index) slots it answers."""

    key: EmbeddingKey
    prepared: Prepared
    dimensions: int | None
    slots: list[tuple[Job, int]]


class BatchRunner:
    """Runs batches of jobs for one embedder over its caches (engine thread only)."""

    def __init__(
        self,
        embedder: Embedder,
        embeddings: EmbeddingCache,
        vision: VisionCache,
        metrics: EmbedMetrics,
        max_rows: int,
    ) -> None:
        self.embedder = embedder
        self.embeddings = embeddings
        self.vision = vision
        self.metrics = metrics
        self.max_rows = max(1, max_rows)

    def run(self, jobs: Sequence[Job]) -> None:
        """Answer every job (its `done` called exactly once)."""
        rows: dict[EmbeddingKey, _Row] = {}
        for job in jobs:
            try:
                self._collect(job, rows)
            except Exception as exc:  # noqa: BLE001 - a fault preparing it fails this call alone
                job.failed = exc
        pending = [r for r in rows.values() if any(not job.failed for job, _ in r.slots)]
        try:
            self._compute(sorted(pending, key=lambda r: len(r.prepared.ids)))
        except Exception as exc:  # noqa: BLE001 - a model fault fails this batch's calls
            for job in jobs:
                job.failed = job.failed or exc
        for job in jobs:
            try:
                outcome: EmbedResult | BaseException = self._outcome(job)
            except Exception as exc:  # noqa: BLE001 - never leave a call unanswered
                outcome = exc
            try:
                job.done(outcome)
            except Exception:  # a caller's callback must not stop the engine thread
                log.exception("an embedding call's answer could not be delivered")

    def _collect(self, job: Job, rows: dict[EmbeddingKey, _Row]) -> None:
        """Look each input of `job` up; queue the misses as rows (one per distinct key)."""
        call, card = job.call, self.embedder.card
        n = len(call.items)
        job.vectors, job.tokens = [None] * n, [0] * n
        dims = call.dimensions
        if dims is not None and not 1 <= dims <= card.dimensions:
            job.failed = EmbedRefused(
                f"`dimensions` must be in 1..{card.dimensions} for this model", field="dimensions"
            )
            return
        if dims is not None and dims != card.dimensions and not card.matryoshka:
            job.failed = EmbedRefused(
                f"this model does not support shorter embeddings; `dimensions` must be "
                f"{card.dimensions} or left out",
                field="dimensions",
            )
            return
        dims = None if dims == card.dimensions else dims
        for index, item in enumerate(call.items):
            key = EmbeddingKey(self.embedder.fingerprint, item.content_key(), dims or 0, call.scope)
            hit = self.embeddings.lookup(key)
            if hit is not None:
                job.vectors[index], job.tokens[index] = hit.vector, hit.tokens
                job.cached += 1
                continue
            if key in rows:
                rows[key].slots.append((job, index))
                continue
            try:
                prepared = self.embedder.prepare(item)
            except EmbedRefused as refused:
                job.failed = EmbedRefused(str(refused), index, refused.field)
                return
            rows[key] = _Row(key, prepared, dims, [(job, index)])

    def _compute(self, rows: Sequence[_Row]) -> None:
        for chunk in _chunks(rows, self.max_rows):
            features = [f for r in chunk for f in self._features(r.prepared)]
            pooled = self.embedder.pooled([r.prepared for r in chunk], features)
            self.metrics.forwards.inc()
            self.metrics.rows.inc(len(chunk))
            # Rows asking the same dimensions are normalized together.
            for dims in {r.dimensions for r in chunk}:
                picked = [i for i, r in enumerate(chunk) if r.dimensions == dims]
                block = pooled[mx.array(picked)] if len(picked) < len(chunk) else pooled
                vectors = as_numpy(normalized(block, dims, self.embedder.card.normalize))
                for vector, i in zip(vectors, picked, strict=True):
                    self._answer(chunk[i], vector)

    def _answer(self, row: _Row, vector: np.ndarray) -> None:
        tokens = len(row.prepared.ids)
        self.embeddings.store(row.key, EmbeddingEntry(vector, tokens), vector.nbytes)
        for job, index in row.slots:
            job.vectors[index], job.tokens[index] = vector, tokens

    def _features(self, prepared: Prepared) -> list[ImageFeatures]:
        """The input's images' features: from the vision cache, else one tower pass each."""
        out = []
        embedder = self.embedder
        for image, grid in zip(prepared.images, prepared.grids, strict=True):
            key = VisionKey(
                embedder.fingerprint, embedder.processor_fingerprint, "embed", image.pixel_hash
            )
            entry = self.vision.lookup(key, embedder.image_tokens(grid))
            if entry is not None and isinstance(entry.features, ImageFeatures):
                out.append(entry.features)
                continue
            features = embedder.encode_image(image, grid)
            self.metrics.tower_passes.inc()
            self.vision.store(
                key, VisionEntry(features, int(features.features.shape[0]), grid, features.nbytes)
            )
            out.append(features)
        return out

    def _outcome(self, job: Job) -> EmbedResult | BaseException:
        """The job's answer: its result, or why it failed."""
        if job.failed is not None:
            return job.failed
        vectors = job.vectors
        if any(v is None for v in vectors):  # a shared row whose computing call failed
            return RuntimeError("the batch this request was in failed")
        self.metrics.inputs.inc(len(vectors))
        self.metrics.tokens.inc(sum(job.tokens))
        return EmbedResult(np.stack(vectors), tuple(job.tokens), job.cached)  # type: ignore[arg-type]


# Padded tokens one forward may hold (rows x the longest row): the attention masks and
# activations grow with it; a single longer input still runs alone.
MAX_FORWARD_TOKENS = 32768


def _chunks(rows: Sequence[_Row], max_rows: int) -> list[Sequence[_Row]]:
    """`rows` (shortest first) cut into forwards of at most `max_rows` rows and
    `MAX_FORWARD_TOKENS` padded tokens."""
    chunks: list[Sequence[_Row]] = []
    lo = 0
    while lo < len(rows):
        hi = lo + 1
        while (
            hi < len(rows)
            and hi - lo < max_rows
            and (hi - lo + 1) * len(rows[hi].prepared.ids) <= MAX_FORWARD_TOKENS
        ):
            hi += 1
        chunks.append(rows[lo:hi])
        lo = hi
    return chunks
