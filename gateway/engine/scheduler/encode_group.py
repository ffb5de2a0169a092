"""Images of several requests through the vision tower together. Engine thread only.

One tower call per image would leave a GPU mostly idle on small images and make a burst of
image requests wait in line (16 requests with distinct 448 px images: the last one started
after 15 whole encodes). Qwen-VL towers take several images in one call (the images stay
separate through their attention segments), so an idle engine encodes the oldest requests'
pending images as one group, up to a patch budget, as one graph. While rows decode, the
scheduler forms a group from the oldest request's images only (no head-of-line blocking: a
request's first token never waits for a younger request's encode, issue 30) and `step_group`
runs as many tower units per engine step as the step's time budget allows
(gateway.engine.scheduler.budget).

An image's features do not depend on the group it is encoded in: its own attention segment,
and row-wise ops elsewhere (pinned bitwise on CPU: tests/gateway/engine/model/test_vision_units.py).
The same pixels twice (in one prompt, or in two requests waiting together) are encoded once.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Generator, Iterable
from dataclasses import dataclass

from caches.vision import VisionEntry
from gateway.engine.cache_ops import CacheOps
from gateway.engine.model.vision import EncodedImage, Unit
from gateway.engine.request import ImageInput
from gateway.engine.scheduler.budget import StepBudget
from gateway.engine.scheduler.job import Job, Stage

log = logging.getLogger(__name__)

# Patches one group may hold: 16 images of 448x448, or 3 of 1024x1024, in one tower call.
MAX_GROUP_PATCHES = 16384


@dataclass
class EncodeGroup:
    """Distinct images (by content hash) in tower order, and the (job, image index) pairs
    waiting for each. Jobs cancelled meanwhile are skipped when the group completes."""

    images: list[ImageInput]
    members: list[tuple[Job, int]]
    steps: Generator[Unit, None, list[EncodedImage]]
    pending: Unit | None = None  # the unit the next `next(steps)` evaluates (None: not built)
    built: bool = False  # the first `next(steps)` has run

    @property
    def jobs(self) -> list[Job]:
        return list({id(job): job for job, _ in self.members}.values())

    @property
    def build(self) -> Unit:
        """The first `next(steps)`, which builds the tower's graph (pixels to the device, the
        window and position indices, which wait for the work already queued): a unit of its
        own, so the budget sizes it like any other (H200, 1024 px: run untimed after a
        prefill block it made 63-83 ms steps against a 20 ms decode)."""
        patches = sum(t * h * w for t, h, w in (i.grid_thw for i in self.images))
        return Unit("build", patches, ())


def start_group(
    ops: CacheOps,
    jobs: Iterable[Job],
    max_patches: int | None = None,
    stepwise: Callable[[], bool] = lambda: True,
    max_images: int | None = None,
) -> tuple[EncodeGroup | None, list[tuple[Job, Exception]]]:
    """The next group: every pending image of the given jobs (oldest first) that fits the
    patch budget and `max_images` (None: no limit; 1 where a group would change the bits,
    gateway.engine.scheduler.group_check); at least one image (None if no job has an image
    pending). Also returns the jobs whose images could not be prepared (preprocessing
    failed), to be failed alone."""
    max_patches = MAX_GROUP_PATCHES if max_patches is None else max_patches
    distinct: dict[str, ImageInput] = {}
    pixels: dict[str, object] = {}
    members: list[tuple[Job, int]] = []
    failed: dict[int, tuple[Job, Exception]] = {}
    patches = 0
    for job in jobs:
        for i in job.to_encode:
            image = job.request.images[i]
            if image.content_hash not in distinct:
                size = image.grid_thw[0] * image.grid_thw[1] * image.grid_thw[2]
                full = max_images is not None and len(distinct) >= max_images
                if distinct and (full or patches + size > max_patches):
                    return _group(ops, distinct, pixels, members, failed, stepwise)
                try:
                    pixels[image.content_hash] = _pixels(ops, image)
                except Exception as exc:  # noqa: BLE001 - fails this job only
                    failed[id(job)] = (job, exc)
                    continue
                distinct[image.content_hash] = image
                patches += size
            members.append((job, i))
    return _group(ops, distinct, pixels, members, failed, stepwise)


def _pixels(ops: CacheOps, image: ImageInput) -> object:
    if image.pixel_values is not None:
        return image.pixel_values
    if image.image is None:
        raise RuntimeError("the image's pixels are gone (evicted from every cache)")
    return ops.model.preprocess(image.image)[0]


def _group(
    ops: CacheOps,
    distinct: dict[str, ImageInput],
    pixels: dict[str, object],
    members: list[tuple[Job, int]],
    failed: dict[int, tuple[Job, Exception]],
    stepwise: Callable[[], bool],
) -> tuple[EncodeGroup | None, list[tuple[Job, Exception]]]:
    members = [(job, i) for job, i in members if id(job) not in failed]
    used = {job.request.images[i].content_hash for job, i in members}
    images = [image for h, image in distinct.items() if h in used]
    if not images:
        return None, list(failed.values())
    inputs = [(pixels[i.content_hash], i.grid_thw) for i in images]
    steps = ops.model.encode_steps_many(inputs, stepwise)  # type: ignore[arg-type]
    group = EncodeGroup(images, members, steps)
    return group, list(failed.values())


def step_group(
    ops: CacheOps, group: EncodeGroup, budget: StepBudget, free_first: bool = True
) -> bool:
    """Run as many tower units as `budget` allows (the first one whatever its estimate when
    `free_first`; the graph's build, `EncodeGroup.build`, is a group's first unit), measuring
    each into its cost model. When the tower is done, hand each job its features, store them
    in the vision cache and return True."""
    costs = budget.costs
    ran = 0
    while True:
        unit = group.pending if group.built else group.build
        if unit is not None and not budget.allows(costs.unit(unit), first=ran == 0 and free_first):
            return False
        started = time.perf_counter()
        try:
            group.pending = next(group.steps)
        except StopIteration as done:
            encoded: list[EncodedImage] = done.value
            break
        finally:
            seconds = time.perf_counter() - started
            budget.spend(seconds)
            group.built = True
            if unit is not None:
                ran += 1
                if budget.limit is not None:  # else it ran the rest as one graph
                    costs.add_unit(unit, seconds)
    by_hash = {}
    for image, features in zip(group.images, encoded, strict=True):
        if features.features.shape[0] != image.layout.num_tokens:
            raise RuntimeError(
                f"vision tower gave {features.features.shape[0]} features for "
                f"{image.layout.num_tokens} placeholders"
            )
        by_hash[image.content_hash] = features
    cache_them = any(job.request.use_caches for job, _ in group.members)
    for image in group.images if cache_them else ():
        features = by_hash[image.content_hash]
        entry = VisionEntry(features, image.layout.num_tokens, image.grid_thw, features.nbytes)
        try:
            ops.store_vision(ops.vision_key(image.content_hash), entry)
        except Exception:
            log.exception("vision cache store failed; continuing without caching")
    for job, i in group.members:
        if job.stage is Stage.DONE:
            continue  # cancelled or failed while its images were encoding
        job.encoded[i] = by_hash[job.request.images[i].content_hash]
        job.to_encode.remove(i)
    return True
