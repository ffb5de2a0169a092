"""Content hashes for the caches.

A pixel hash identifies decoded pixels, not the file they came from: the same RGB pixels sent as
PNG, lossless WebP, BMP, a path or a URL hash alike, and one changed pixel changes the hash.
Hashes are xxh3-128 rendered as 32 hex characters and are never truncated.

Everything here is pure and thread-safe.
"""

from __future__ import annotations

import struct

import xxhash

HASH_HEX_CHARS = 32


def pixel_hash(mode: str, width: int, height: int, pixels: bytes | memoryview) -> str:
    """Hash decoded pixels together with their layout.

    `mode` (e.g. "RGB"), `width` and `height` are part of the hash, so two images whose raw
    buffers happen to coincide but whose shapes differ never collide by construction.
    """
    h = xxhash.xxh3_128()
    h.update(mode.encode("ascii"))
    h.update(struct.pack("<II", width, height))
    h.update(pixels)
    return h.hexdigest()


def bytes_hash(data: bytes | memoryview) -> str:
    """Hash encoded bytes (a file as received); used to memoise decoding, never as a cache key
    for features: two encodings of the same pixels have different byte hashes."""
    return xxhash.xxh3_128_hexdigest(data)


def fingerprint(*parts: object) -> str:
    """Stable hash of a tuple of plain values (str, int, float, bool, None, tuples of those).

    Used for model and processor fingerprints. `repr` of plain values is stable across runs.
    """
    return xxhash.xxh3_128_hexdigest(repr(parts).encode("utf-8"))
