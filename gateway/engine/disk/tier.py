"""The disk tier as the engine sees it: vision features and KV blocks to and from files of
caches/disk.py, written by a background thread (gateway/engine/disk/writer.py). This module
opens the tier and moves features; gateway/engine/disk/kv.py moves KV blocks.

What makes a file usable is fixed by its namespace (`namespace`): the model's fingerprint
(config.json and the weight files' names, sizes and mtimes), the processor's, the dtypes of
the features and the KV (with --kv-bits, its bits and group size: a block written at other
bits is never even looked for), the KV block size and whether the exact-reuse rule made the
blocks.
On top of that every entry is checked against the request on a hit (token count and grid of
an image; block index, key items and rope delta of a KV block; shapes and dtypes): a file
that disagrees is removed and the lookup is a miss.

Getting bytes off the engine thread: the arrays handed to `save_*` are already evaluated
(the caches store evaluated arrays) and never mutated afterwards, so the engine thread only
takes a `memoryview` of each (zero-copy: 0.35 us per array, measured on this CPU) and the
writer thread reads those views while the engine computes. Copying instead would cost the
engine thread the bytes: 32 ms for one Qwen2.5-VL-7B-shaped 256-token block (56 bf16 arrays
of (1, 4, 256, 128), 14 MiB) here. The view keeps its array alive until written. No MLX
function is called off the engine thread. On CUDA an array's view is not free: MLX moves the
device buffer to the host, array by array (a 1024 px image's 5 blocks, 280 arrays, took 28-42
ms of the engine thread on the H200), so there the arrays of one entry are joined into one
device array first and the writer gets byte slices of its one view (`raw_tensors`;
docs/investigations/disk_save.py measures both ways).

Getting bytes onto it: the files a request will need are read, verified and checked against
the request by the reader thread (gateway/engine/disk/reader.py) while the request waits; at
admission the engine thread only copies the checked tensors into new MLX arrays (`load_*`).

Engine thread only, except `has_vision` and `stats` (any thread).
"""

from __future__ import annotations

import dataclasses
import json
import logging
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import mlx.core as mx
import numpy as np

from caches.disk import DiskStore
from caches.disk_format import RawTensor
from caches.hashing import fingerprint
from caches.private_dir import FolderModes
from caches.vision import VisionEntry, VisionKey
from gateway.config import CacheConfig
from gateway.engine.disk.plan import ImageWant, ReadFeatures
from gateway.engine.disk.reader import DiskReader
from gateway.engine.disk.writer import DiskWriter
from gateway.engine.model.vision import EncodedImage

log = logging.getLogger(__name__)

TOUCH_EVERY_S = 60.0
_TO_FILE = {mx.bfloat16: "BF16", mx.float16: "F16", mx.float32: "F32", mx.uint32: "U32"}
_NUMPY = {"BF16": np.uint16, "F16": np.float16, "F32": np.float32, "U32": np.uint32}


# The version of the files *and of how their KV was computed*: a stored block must come from
# the same forward as the blocks computed after it, so a change to the prefill's kernels
# (2: text ranges with the one-kernel rope, `prompt_forward.text_offset`) starts a new
# namespace, as a new checkpoint does.
FORMAT = "disk-tier-2"


def namespace(model: Any, kv_dtype: str, block_tokens: int, exact: bool) -> str:
    """The fingerprint every file of this engine carries (see the module docstring)."""
    return fingerprint(
        FORMAT,
        getattr(getattr(model, "text_core", None), "fast_rope", None),
        model.fingerprint,
        model.processor_fingerprint,
        str(model.embed_dtype),
        str(model.vision_dtype),
        kv_dtype,
        block_tokens,
        exact,
    )


def open_disk_tier(
    config: CacheConfig, model: Any, block_tokens: int, exact: bool, active: bool
) -> DiskTier | None:
    """The tier for `config.cache_dir`, or None when it is off or cannot be opened (logged:
    the server then serves from memory alone)."""
    if config.cache_dir is None or config.disk_capacity_bytes <= 0:
        return None
    kv_dtype = str(model.embed_dtype)  # the KV is computed from the embeddings' dtype
    quant = getattr(model, "kv_quant", None)  # --kv-bits: other bits, another folder
    if quant is not None:
        kv_dtype += f"/{quant.label}"
    space = namespace(model, kv_dtype, block_tokens, exact)
    try:
        modes = FolderModes.group_shared() if config.cache_dir_group else FolderModes.private()
        store = DiskStore(Path(config.cache_dir), space, config.disk_capacity_bytes, modes=modes)
    except (OSError, ValueError) as exc:
        log.error(
            "disk cache at %s is unusable (%s): serving from memory only", config.cache_dir, exc
        )
        return None
    log.info(
        "disk cache: %s (namespace %s, %.1f GiB budget for the whole --cache-dir)",
        store.base / space,
        space,
        config.disk_capacity_bytes / 2**30,
    )
    return DiskTier(store, active)


class DiskTier:
    """Reads and writes entries of one namespace. `active` False: every call is a no-op miss
    until `activate()` (the start-up warm-up must neither read nor write synthetic entries)."""

    def __init__(self, store: DiskStore, active: bool = True) -> None:
        self.store = store
        self.writer = DiskWriter(store)
        self.reader = DiskReader(store)
        self.active = active
        # Counted by this module (vision) and gateway.engine.disk.kv (KV blocks); load
        # seconds are the engine thread's (the reader counts its own).
        self.vision_hits = self.prefix_hits = self.prefix_tokens = 0
        self.load_seconds = {"vision": 0.0, "prefix": 0.0}
        self._touched: dict[str, float] = {}  # file key -> when last touched (monotonic s)

    def touch(self, kind: str, key: str) -> None:
        """Mark an entry's file used now (a memory hit on it): queued, at most once a minute
        per entry, so a hot entry served from memory does not age out of the disk."""
        now = time.monotonic()
        if now - self._touched.get(key, -TOUCH_EVERY_S) < TOUCH_EVERY_S:
            return
        if len(self._touched) > 100_000:  # bounded: forgetting only costs a repeated touch
            self._touched.clear()
        self._touched[key] = now
        self.writer.touch(kind, key)

    def activate(self) -> None:
        self.active = True

    def clear(self, timeout: float = 5.0) -> int:
        """Remove this model's entries from the disk; returns the files removed. Any thread.
        What is queued is written first (up to `timeout` s, short: under load the queue keeps
        filling, and the HTTP call waiting on this must not time out), so entries queued
        before the clear do not reappear after it, unless the wait ran out."""
        self.writer.flush(timeout)
        self._touched.clear()
        return self.store.clear()

    def close(self, timeout: float = 30.0) -> None:
        """Write what is queued (up to `timeout` s; the rest is lost, never half-written) and
        stop the reader (not waited for long: it only reads)."""
        self.reader.close(timeout=1.0)
        self.writer.close(timeout)

    # ----- vision features ----------------------------------------------------------------

    @staticmethod
    def vision_file_key(key: VisionKey) -> str:
        return fingerprint(
            key.model_fingerprint, key.processor_fingerprint, key.dtype, key.pixel_hash
        )

    def has_vision(self, key: VisionKey) -> bool:
        """Is the image's file there now? (Any thread; advisory.)"""
        return self.active and self.store.contains("vision", self.vision_file_key(key))

    def save_vision(self, key: VisionKey, entry: VisionEntry) -> None:
        """Queue the features of a freshly encoded image for writing."""
        if not self.active:
            return
        encoded: EncodedImage = entry.features
        tensors = {"features": raw_tensor(encoded.features)}
        for i, layer in enumerate(encoded.deepstack or ()):
            tensors[f"deepstack.{i}"] = raw_tensor(layer)
        meta = {
            "pixel_hash": key.pixel_hash,
            "num_tokens": str(entry.num_tokens),
            "grid_thw": json.dumps(list(entry.grid_thw)),
            "deepstack": str(len(encoded.deepstack or ())),
        }
        self.writer.submit("vision", self.vision_file_key(key), tensors, meta)

    def image_want(
        self, key: VisionKey, end: int, num_tokens: int, grid_thw: Sequence[int], dtype: mx.Dtype
    ) -> ImageWant:
        """What the reader must find in the image's file (`end`: where its tokens end)."""
        name = _TO_FILE.get(dtype, str(dtype))
        grid = tuple(grid_thw)
        return ImageWant(self.vision_file_key(key), end, key.pixel_hash, num_tokens, grid, name)

    def load_vision(self, read: ReadFeatures, dtype: mx.Dtype) -> VisionEntry:
        """The image's features from their checked file (read by the reader thread): one copy
        into new MLX arrays, the engine thread's whole part of a disk hit."""
        started = time.perf_counter()
        rows = read.num_tokens
        features = to_array(read.features, dtype, rows=rows)
        stack = tuple(to_array(layer, dtype, rows=rows) for layer in read.deepstack)
        mx.eval(features, list(stack))
        encoded = EncodedImage(features, stack or None)
        self.vision_hits += 1
        self.load_seconds["vision"] += time.perf_counter() - started
        return VisionEntry(encoded, rows, read.grid_thw, encoded.nbytes)  # type: ignore[arg-type]

    def stats(self) -> dict[str, Any]:
        """JSON-able counters (any thread)."""
        s = self.store.stats()
        kinds = {name: dataclasses.asdict(k) for name, k in s.kinds.items()}
        reads = self.reader.stats()
        read_seconds = reads.pop("read_seconds")
        for kind in ("vision", "prefix"):
            kinds[kind].update(
                load_seconds=self.load_seconds[kind],
                read_seconds=read_seconds[kind],  # type: ignore[index]
            )
        kinds["vision"].update(images_hit=self.vision_hits)
        kinds["prefix"].update(lookups_hit=self.prefix_hits, tokens_hit=self.prefix_tokens)
        return {
            "enabled": True,
            "active": self.active,
            "path": str(self.store.base / self.store.namespace),  # this model's files
            # The budget, bytes, entries and evictions are the whole folder's: every model
            # sharing --cache-dir draws on one budget (a clear empties `path` only).
            "folder": str(self.store.base),
            "capacity_bytes": s.capacity_bytes,
            "bytes": s.bytes,
            "entries": s.entries,
            "evictions": s.evictions,
            **self.writer.stats(),
            **reads,
            **kinds,
        }


def raw_tensor(array: mx.array) -> RawTensor:
    """A zero-copy view of an evaluated, contiguous array (see the module docstring)."""
    return RawTensor(_TO_FILE[array.dtype], tuple(array.shape), memoryview(array))


def raw_tensors(
    named: Sequence[tuple[str, mx.array]], join: bool | None = None
) -> dict[str, RawTensor]:
    """Views of evaluated, contiguous arrays by name, for one entry. `join` (None: on CUDA,
    module doc): arrays of one dtype are joined into one evaluated device array (a copy on
    the device) and each tensor is a byte slice of its single view; else each array's own."""
    if join is None:
        join = mx.default_device().type == mx.DeviceType.gpu and not mx.metal.is_available()
    if not join or len({a.dtype for _, a in named}) != 1:
        return {name: raw_tensor(array) for name, array in named}
    joined = mx.concatenate([array.reshape(-1) for _, array in named])
    mx.eval(joined)
    view, at, out = memoryview(joined).cast("B"), 0, {}
    for name, array in named:
        end = at + array.nbytes
        out[name] = RawTensor(_TO_FILE[array.dtype], tuple(array.shape), view[at:end])
        at = end
    return out


def to_array(tensor: RawTensor, dtype: mx.Dtype | None, rows: int | None = None) -> mx.array:
    """A new MLX array from a file's tensor; ValueError unless it has `dtype` (None: any) and
    `rows`."""
    if dtype is not None and tensor.dtype != _TO_FILE.get(dtype):
        raise ValueError(f"dtype {tensor.dtype}, expected {dtype}")
    if rows is not None and (len(tensor.shape) != 2 or tensor.shape[0] != rows):
        raise ValueError(f"shape {tensor.shape}, expected {rows} rows")
    flat = np.frombuffer(tensor.data, dtype=_NUMPY[tensor.dtype])  # type: ignore[call-overload]
    array = mx.array(flat)
    if tensor.dtype == "BF16":
        array = array.view(mx.bfloat16)
    return array.reshape(tensor.shape)
