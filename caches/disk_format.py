"""The disk tier's file format: safetensors (8-byte little-endian header length, a JSON header,
the tensors' bytes), readable by any safetensors tool, with our metadata in `__metadata__`.

Tensors are raw bytes here (`RawTensor`): no MLX or numpy, so bfloat16 needs no numpy dtype
and the unit tests need no MLX. Every file also carries, in its metadata, an xxh3-128
checksum of its data section: `read` refuses a file whose structure or checksum is wrong
(truncated, bit-flipped, not ours) with `CorruptFile`, so a damaged file can never be read
back as a different tensor. Pure functions; thread-safe.
"""

from __future__ import annotations

import json
import math
import struct
from collections.abc import Mapping
from dataclasses import dataclass

import xxhash

# (U32: the packed integers of quantized KV, --kv-bits)
ITEM_BYTES = {
    "BF16": 2, "F16": 2, "F32": 4, "F64": 8, "I32": 4, "I64": 8, "U8": 1, "U16": 2, "U32": 4,
}  # fmt: skip
CHECKSUM_KEY = "vg_checksum"
MAX_HEADER_BYTES = 16 * 2**20  # a header this large is not one we wrote
CHUNK_BYTES = 2**20


class CorruptFile(ValueError):
    """The bytes are not a complete, intact file of this format."""


@dataclass(frozen=True)
class RawTensor:
    """One tensor: safetensors dtype name (a key of ITEM_BYTES), shape, and its C-order bytes
    (any buffer: bytes, memoryview, a numpy or MLX array exporting the buffer protocol)."""

    dtype: str
    shape: tuple[int, ...]
    data: object

    def __post_init__(self) -> None:
        if self.dtype not in ITEM_BYTES:
            raise ValueError(f"unsupported dtype {self.dtype!r}")

    @property
    def nbytes(self) -> int:
        return math.prod(self.shape) * ITEM_BYTES[self.dtype]


def layout(
    tensors: Mapping[str, RawTensor], metadata: Mapping[str, str]
) -> tuple[bytes, list[memoryview]]:
    """The file's head (length prefix and JSON header, with `metadata` plus the data checksum)
    and its data section as byte views, tensors in the mapping's order. Raises ValueError if
    a tensor's bytes do not match its shape. The file is the head, then the views."""
    checksum = xxhash.xxh3_128()
    header: dict[str, object] = {}
    views = []
    offset = 0
    for name, tensor in tensors.items():
        data = _byte_view(tensor.data)
        if len(data) != tensor.nbytes:
            raise ValueError(f"{name}: {len(data)} bytes for shape {tensor.shape} {tensor.dtype}")
        for start in range(0, len(data), CHUNK_BYTES):
            # xxhash holds the GIL for a whole call: in 1 MiB pieces (~0.2 ms each) a writer
            # thread hashing a 9 MB image's features never keeps the engine thread waiting.
            checksum.update(data[start : start + CHUNK_BYTES])
        views.append(data)
        header[name] = {
            "dtype": tensor.dtype,
            "shape": list(tensor.shape),
            "data_offsets": [offset, offset + tensor.nbytes],
        }
        offset += tensor.nbytes
    meta = {str(k): str(v) for k, v in metadata.items()}
    meta[CHECKSUM_KEY] = checksum.hexdigest()
    header["__metadata__"] = meta
    raw = json.dumps(header, separators=(",", ":")).encode()
    raw += b" " * (-len(raw) % 8)  # the data section starts 8-byte aligned
    return struct.pack("<Q", len(raw)) + raw, views


def _byte_view(data: object) -> memoryview:
    view = memoryview(data)  # type: ignore[arg-type]
    try:
        return view.cast("B")
    except (TypeError, ValueError):
        # An exotic format (MLX exports bfloat16 as "bfloat16") cannot be cast; tobytes()
        # copies it out (on the writer thread, where this runs).
        return memoryview(view.tobytes())


def encode(tensors: Mapping[str, RawTensor], metadata: Mapping[str, str]) -> bytes:
    """A whole file in memory (tests and small entries; the store streams instead)."""
    head, views = layout(tensors, metadata)
    return head + b"".join(views)


def decode(blob: bytes | memoryview) -> tuple[dict[str, RawTensor], dict[str, str]]:
    """Parse and verify a whole file: tensors (views into `blob`) and metadata.

    Raises CorruptFile unless the header is well-formed JSON of known dtypes, every tensor's
    extent matches its shape and lies inside a data section that ends exactly at the end of
    the file, and the data's checksum matches the one in the metadata."""
    view = memoryview(blob)
    if len(view) < 8:
        raise CorruptFile(f"{len(view)} bytes: shorter than the length prefix")
    (size,) = struct.unpack("<Q", view[:8])
    if size > MAX_HEADER_BYTES or 8 + size > len(view):
        raise CorruptFile(f"header length {size} does not fit a {len(view)}-byte file")
    try:
        header = json.loads(bytes(view[8 : 8 + size]))
    except (UnicodeDecodeError, json.JSONDecodeError, RecursionError) as exc:
        raise CorruptFile(f"header is not JSON: {type(exc).__name__}") from None
    if not isinstance(header, dict):
        raise CorruptFile("header is not a JSON object")
    meta = header.pop("__metadata__", None)
    if not isinstance(meta, dict) or not all(isinstance(v, str) for v in meta.values()):
        raise CorruptFile("no string metadata")
    data = view[8 + size :]
    tensors: dict[str, RawTensor] = {}
    end = 0
    for name, spec in header.items():
        tensors[name] = _tensor(name, spec, data)
        end = max(end, spec["data_offsets"][1])
    if end != len(data):
        raise CorruptFile(f"data section is {len(data)} bytes, tensors cover {end}")
    if _checksum(data) != meta.get(CHECKSUM_KEY):
        raise CorruptFile("data checksum mismatch")
    return tensors, meta


def _checksum(data: memoryview) -> str:
    # In 1 MiB pieces, as `layout` hashes: the disk tier's reader thread verifies files while
    # the engine thread computes, and one call over a 14 MiB KV block would hold the GIL ~3 ms.
    checksum = xxhash.xxh3_128()
    for start in range(0, len(data), CHUNK_BYTES):
        checksum.update(data[start : start + CHUNK_BYTES])
    return checksum.hexdigest()


def _tensor(name: str, spec: object, data: memoryview) -> RawTensor:
    # Explicit checks, not asserts: `python -O` must not let a bad entry through.
    try:
        if not isinstance(spec, dict):
            raise TypeError("not an object")
        dtype, shape, (lo, hi) = spec["dtype"], tuple(spec["shape"]), spec["data_offsets"]
        if dtype not in ITEM_BYTES or not all(isinstance(d, int) and d >= 0 for d in shape):
            raise ValueError("dtype or shape")
        if not (isinstance(lo, int) and isinstance(hi, int) and 0 <= lo <= hi <= len(data)):
            raise ValueError("data offsets")
    except (KeyError, TypeError, ValueError):
        raise CorruptFile(f"tensor {name!r}: bad header entry {str(spec)[:200]}") from None
    if hi - lo != math.prod(shape) * ITEM_BYTES[dtype]:
        raise CorruptFile(f"tensor {name!r}: {hi - lo} bytes for shape {shape} {dtype}")
    return RawTensor(dtype, shape, data[lo:hi])
