"""Invariants of caches.disk_format: files are standard safetensors (the `safetensors` package
reads them), round-trip tensors and metadata exactly, and every damage (truncation, a flipped
data byte, a bad header, trailing bytes) is refused with CorruptFile, never read as data."""

from __future__ import annotations

import struct

import numpy as np
import pytest

from caches.disk_format import CHECKSUM_KEY, CorruptFile, RawTensor, decode, encode, layout


def _tensors() -> dict[str, RawTensor]:
    a = np.arange(12, dtype=np.float32).reshape(3, 4)
    b = np.arange(6, dtype=np.uint16).reshape(1, 2, 3)  # stands for bfloat16 bits
    return {"a": RawTensor("F32", (3, 4), a), "b": RawTensor("BF16", (1, 2, 3), b)}


def test_round_trip_is_exact() -> None:
    """Invariant: decode(encode(t, m)) gives the same bytes, shapes, dtypes and metadata."""
    tensors = _tensors()
    blob = encode(tensors, {"rope_delta": "-7", "token_key": "[1, 2]"})
    back, meta = decode(blob)
    assert meta["rope_delta"] == "-7" and meta["token_key"] == "[1, 2]"
    for name, t in tensors.items():
        assert back[name].dtype == t.dtype and back[name].shape == t.shape
        assert bytes(back[name].data) == np.asarray(t.data).tobytes()


def test_packed_integers_round_trip() -> None:
    """Invariant: U32 tensors (quantized KV's packed integers, --kv-bits) keep their bits and
    their byte count (4 per item)."""
    packed = np.array([[0, 1, 2**32 - 1, 2**31]], dtype=np.uint32)
    back, _ = decode(encode({"k.0.q": RawTensor("U32", (1, 4), packed)}, {}))
    assert back["k.0.q"].nbytes == 16
    assert np.array_equal(np.frombuffer(back["k.0.q"].data, np.uint32), packed.ravel())


def test_other_tools_read_the_file() -> None:
    """Invariant: the file is plain safetensors: the reference reader gets the same arrays
    and our metadata."""
    safetensors = pytest.importorskip("safetensors.numpy")
    blob = encode({"a": _tensors()["a"]}, {"k": "v"})
    arrays = safetensors.load(blob)
    assert np.array_equal(arrays["a"], np.arange(12, dtype=np.float32).reshape(3, 4))
    (size,) = struct.unpack("<Q", blob[:8])
    assert (8 + size) % 8 == 0  # data aligned


@pytest.mark.parametrize(
    "damage",
    [
        lambda b: b[: len(b) - 1],  # truncated data
        lambda b: b[:20],  # truncated header
        lambda b: b[:4],  # shorter than the length prefix
        lambda b: b + b"\0",  # trailing bytes
        lambda b: b[:-2] + bytes([b[-2] ^ 1]) + b[-1:],  # one flipped data bit
        lambda b: struct.pack("<Q", 2**40) + b[8:],  # absurd header length
        lambda b: b[:8] + b"[" + b[9:],  # header not JSON
        lambda b: b.replace(b"F32", b"F99"),  # unknown dtype
        lambda b: b.replace(CHECKSUM_KEY.encode(), b"vg_checksuX"),  # no checksum
        lambda b: b"",
    ],
)
def test_damage_is_refused(damage) -> None:  # noqa: ANN001
    """Invariant: any damaged file raises CorruptFile (and nothing else)."""
    blob = encode(_tensors(), {"x": "y"})
    with pytest.raises(CorruptFile):
        decode(damage(blob))


def _with_header(header: bytes) -> bytes:
    return struct.pack("<Q", len(header)) + header


@pytest.mark.parametrize(
    "header",
    [
        b"[" * 100_000 + b"]" * 100_000,  # nesting deeper than the JSON parser's recursion
        b'{"__metadata__": {"x": "y"}, "a": [1]}',  # a tensor entry that is not an object
        b'{"__metadata__": {"x": "y"}, "a": {"dtype": "F32", "shape": [-1], '
        b'"data_offsets": [0, 0]}}',  # negative dimension
        b'{"__metadata__": {"x": "y"}, "a": {"dtype": "F32", "shape": [1], '
        b'"data_offsets": [4, 0]}}',  # offsets backwards
    ],
)
def test_hostile_headers_are_refused(header: bytes) -> None:
    """Invariant: a hostile header is CorruptFile too (no RecursionError, no TypeError, and
    no reliance on asserts, which `python -O` removes)."""
    with pytest.raises(CorruptFile):
        decode(_with_header(header))


def test_shape_and_bytes_must_agree() -> None:
    """Invariant: a tensor whose bytes do not fill its shape is refused at write time."""
    with pytest.raises(ValueError):
        layout({"a": RawTensor("F32", (5,), np.zeros(4, dtype=np.float32))}, {})
    with pytest.raises(ValueError):
        RawTensor("Q4", (1,), b"\0")


def test_checksum_of_large_tensors_is_chunked_consistently() -> None:
    """Invariant: a tensor larger than the hashing chunk round-trips (the writer hashes it
    piecewise, the reader at once: the same digest)."""
    from caches.disk_format import CHUNK_BYTES

    big = np.arange(CHUNK_BYTES // 2 + 3, dtype=np.float32)  # ~2 MiB + 12 bytes
    back, _ = decode(encode({"big": RawTensor("F32", big.shape, big)}, {}))
    assert bytes(back["big"].data) == big.tobytes()
