"""Invariants of caches.hashing: pixel hashes identify decoded pixels and their layout, are
full-length (never truncated) and deterministic."""

from __future__ import annotations

import re

from caches.hashing import HASH_HEX_CHARS, bytes_hash, fingerprint, pixel_hash

PIXELS = bytes(range(256)) * 3  # 768 bytes: a 16x16 RGB image


def test_same_pixels_mode_size_give_same_hash() -> None:
    """Invariant: identical (mode, width, height, pixels) -> identical hash, whatever the
    buffer type (bytes, bytearray copy, memoryview)."""
    a = pixel_hash("RGB", 16, 16, PIXELS)
    assert a == pixel_hash("RGB", 16, 16, bytes(bytearray(PIXELS)))
    assert a == pixel_hash("RGB", 16, 16, memoryview(PIXELS))


def test_one_changed_byte_changes_hash() -> None:
    """Invariant: one changed pixel byte anywhere -> a different hash."""
    base = pixel_hash("RGB", 16, 16, PIXELS)
    for i in (0, 383, len(PIXELS) - 1):
        changed = bytearray(PIXELS)
        changed[i] ^= 1
        assert pixel_hash("RGB", 16, 16, bytes(changed)) != base


def test_same_bytes_different_shape_or_mode_differ() -> None:
    """Invariant: the layout is part of the hash; equal raw buffers with different width,
    height or mode never collide."""
    hashes = {
        pixel_hash("RGB", 16, 16, PIXELS),
        pixel_hash("RGB", 8, 32, PIXELS),
        pixel_hash("RGB", 32, 8, PIXELS),
        pixel_hash("L", 16, 48, PIXELS),
        pixel_hash("RGBA", 16, 12, PIXELS),
    }
    assert len(hashes) == 5


def test_hashes_are_32_hex_chars() -> None:
    """Invariant: hashes are xxh3-128 as 32 lowercase hex chars, never truncated."""
    assert HASH_HEX_CHARS == 32
    for h in (pixel_hash("RGB", 1, 1, b"\0\0\0"), bytes_hash(b"abc"), fingerprint("m", 1)):
        assert re.fullmatch(r"[0-9a-f]{32}", h), h


def test_bytes_hash_deterministic_and_sensitive() -> None:
    """Invariant: bytes_hash is a pure function of the bytes."""
    assert bytes_hash(b"png-bytes") == bytes_hash(memoryview(b"png-bytes"))
    assert bytes_hash(b"png-bytes") != bytes_hash(b"png-bytez")


def test_fingerprint_stable_and_order_sensitive() -> None:
    """Invariant: fingerprints depend on every part and their order, and are stable."""
    a = fingerprint("qwen", 28, 14, (256, 1280), None, True)
    assert a == fingerprint("qwen", 28, 14, (256, 1280), None, True)
    assert a != fingerprint("qwen", 14, 28, (256, 1280), None, True)
    assert a != fingerprint("qwen", 28, 14, (256, 1281), None, True)
    assert fingerprint(1) != fingerprint("1")
