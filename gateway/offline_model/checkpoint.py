"""Deterministic random weights, streamed into (sharded) safetensors files.

Every tensor is cut into fixed-size blocks and each block draws from its own numpy
Generator seeded by (model seed, tensor name, block index). The bytes therefore depend only
on those three things, not on the order tensors are written, on sharding or on how many
threads generate blocks; blocks are generated in a thread pool (numpy releases the GIL while
filling) and written in order, with a bounded number in flight, so memory stays at a few
blocks even for a 16 GB checkpoint.

The safetensors writer is our own (about 20 lines): the `safetensors` numpy API cannot
express bfloat16 and wants whole tensors in memory; here the header is computed from the
shapes up front and the data streamed after it.
"""

from __future__ import annotations

import hashlib
import json
import os
import struct
from collections import deque
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path

import numpy as np

from .params import ParamSpec

INIT_STD = 0.02
BLOCK_ELEMS = 1 << 22  # 16 MiB of float32 per block
SHARD_BYTES = 4 << 30  # like upstream checkpoints: a few GiB per shard
_ST_DTYPE = {"float32": "F32", "bfloat16": "BF16", "float16": "F16"}
_ITEMSIZE = {"float32": 4, "bfloat16": 2, "float16": 2}

Progress = Callable[[str], None]


def _name_key(name: str) -> int:
    return int.from_bytes(hashlib.sha256(name.encode()).digest()[:8], "little")


def _encode(x: np.ndarray, dtype: str) -> bytes:
    """float32 -> little-endian bytes of `dtype` (bfloat16 rounded to nearest even)."""
    if dtype == "float32":
        return x.astype("<f4", copy=False).tobytes()
    if dtype == "float16":
        return x.astype("<f2").tobytes()
    u = x.view(np.uint32)  # bfloat16 is the top half of a float32; no NaNs occur here
    u += np.uint32(0x7FFF) + ((u >> np.uint32(16)) & np.uint32(1))
    return (u >> np.uint32(16)).astype("<u2").tobytes()


def block_bytes(seed: int, name: str, block: int, specs: dict[str, ParamSpec], dtype: str) -> bytes:
    """Bytes of block `block` of tensor `name` (a pure function of its arguments)."""
    spec = specs[name]
    start = block * BLOCK_ELEMS
    n = min(BLOCK_ELEMS, spec.numel - start)
    if spec.init == "ones":
        x = np.ones(n, dtype=np.float32)
    elif spec.init == "zeros":
        x = np.zeros(n, dtype=np.float32)
    elif spec.init in ("inf", "-inf"):
        x = np.full(n, float(spec.init), dtype=np.float32)
    else:
        rng = np.random.default_rng([seed, _name_key(name), block])
        x = rng.standard_normal(n, dtype=np.float32)
        x *= np.float32(INIT_STD)
    return _encode(x, dtype)


def _n_blocks(spec: ParamSpec) -> int:
    return max(1, -(-spec.numel // BLOCK_ELEMS))


def plan_shards(
    specs: dict[str, ParamSpec], dtype: str, shard_bytes: int = SHARD_BYTES
) -> list[list[str]]:
    """Group tensor names (in the given order) into shards of at most ~`shard_bytes`."""
    shards: list[list[str]] = [[]]
    used = 0
    for name, spec in specs.items():
        size = spec.numel * _ITEMSIZE[dtype]
        if shards[-1] and used + size > shard_bytes:
            shards.append([])
            used = 0
        shards[-1].append(name)
        used += size
    return shards


def _header(names: list[str], specs: dict[str, ParamSpec], dtype: str) -> bytes:
    meta: dict[str, object] = {"__metadata__": {"format": "mlx"}}
    offset = 0
    for name in names:
        end = offset + specs[name].numel * _ITEMSIZE[dtype]
        meta[name] = {
            "dtype": _ST_DTYPE[dtype],
            "shape": list(specs[name].shape),
            "data_offsets": [offset, end],
        }
        offset = end
    raw = json.dumps(meta, separators=(",", ":")).encode()
    raw += b" " * (-len(raw) % 8)  # the data section starts 8-byte aligned
    return struct.pack("<Q", len(raw)) + raw


def write_weights(
    out_dir: Path,
    specs: dict[str, ParamSpec],
    seed: int,
    dtype: str,
    progress: Progress | None = None,
    shard_bytes: int = SHARD_BYTES,
    workers: int | None = None,
) -> list[str]:
    """Write all tensors of `specs`; return the weight file names.

    One shard -> `model.safetensors`; several -> `model-0000i-of-0000n.safetensors` plus
    `model.safetensors.index.json` (which mlx-vlm reads to find the shards).
    """
    if dtype not in _ST_DTYPE:
        raise ValueError(f"unsupported dtype {dtype!r}")
    say = progress or (lambda _msg: None)
    shards = plan_shards(specs, dtype, shard_bytes)
    n = len(shards)
    files = (
        ["model.safetensors"]
        if n == 1
        else [f"model-{i + 1:05d}-of-{n:05d}.safetensors" for i in range(n)]
    )
    total = sum(s.numel for s in specs.values()) * _ITEMSIZE[dtype]
    done = 0
    next_report = 0.1
    workers = workers or min(8, os.cpu_count() or 1)
    with ThreadPoolExecutor(max_workers=workers) as pool:
        for i, (fname, names) in enumerate(zip(files, shards)):
            say(f"writing weights {i + 1}/{n} ({fname}, {total / 2**30:.2f} GiB in all)")
            jobs: Iterator[tuple[str, int]] = (
                (name, b) for name in names for b in range(_n_blocks(specs[name]))
            )
            pending: deque[Future[bytes]] = deque()
            with open(out_dir / fname, "wb") as f:
                f.write(_header(names, specs, dtype))
                # Keep 2 blocks per worker in flight; write them back in submission order.
                job: tuple[str, int] | None
                for job in _take(jobs, 2 * workers):
                    pending.append(pool.submit(block_bytes, seed, *job, specs, dtype))
                while pending:
                    data = pending.popleft().result()
                    f.write(data)
                    done += len(data)
                    job = next(jobs, None)
                    if job is not None:
                        pending.append(pool.submit(block_bytes, seed, *job, specs, dtype))
                    if total > 1 << 28 and done / total >= next_report:
                        say(f"writing weights: {done / total:.0%} of {total / 2**30:.2f} GiB")
                        next_report += 0.1
    if n > 1:
        weight_map = {name: fname for fname, names in zip(files, shards) for name in names}
        index = {"metadata": {"total_size": total}, "weight_map": dict(sorted(weight_map.items()))}
        (out_dir / "model.safetensors.index.json").write_text(json.dumps(index, indent=2) + "\n")
    return files


def _take(it: Iterator[tuple[str, int]], k: int) -> list[tuple[str, int]]:
    out = []
    for _ in range(k):
        job = next(it, None)
        if job is None:
            break
        out.append(job)
    return out
