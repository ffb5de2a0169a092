"""The disk tier's reader thread (gateway/engine/disk/reader.py) and the checks it applies
(gateway/engine/disk/plan.py), on real files of a DiskStore; no MLX.

Pinned: a plan's blocks are read in order up to the first missing, damaged or unfit one
(damaged and unfit files removed and counted, never an error); an image's features are read
only when the blocks read do not cover it; a released (cancelled) prefetch stops reading and
its bytes are no longer held; buffers held are bounded; a closed reader answers empty; a
quantized block (--kv-bits) is read as triples of packed integers, scales and biases.
"""

from __future__ import annotations

import json
import sys
import threading
from pathlib import Path

import pytest

from caches.disk import DiskStore
from caches.disk_format import RawTensor
from gateway.engine.disk.plan import (
    BlockWant,
    ImageWant,
    ReadPlan,
    check_block,
    check_features,
)
from gateway.engine.disk.reader import DiskReader, Prefetch

BLOCK, LAYERS = 4, 2


def _items(k: int) -> tuple[int | str, ...]:
    return tuple(range(10 * k, 10 * k + BLOCK))


def _want(k: int) -> BlockWant:
    return BlockWant(k, f"{k:08d}block", _items(k), rope_delta=-k)


def _put_block(store: DiskStore, k: int, **changes: str) -> None:
    tensor = RawTensor("F32", (1, 1, BLOCK, 2), bytes(range(32)))
    tensors = {f"{kv}.{i}": tensor for kv in "kv" for i in range(LAYERS)}
    meta = {
        "block_index": str(k),
        "block_tokens": str(BLOCK),
        "rope_delta": str(-k),
        "images": json.dumps([]),
        "token_key": json.dumps(list(_items(k))),
        **changes,
    }
    assert store.put("prefix", _want(k).key, tensors, meta)


def _image(end: int, key: str = "feedfacefeed") -> ImageWant:
    return ImageWant(key, end, "pix", 3, (1, 2, 6), "F32")


def _put_image(store: DiskStore, key: str = "feedfacefeed") -> None:
    meta = {"pixel_hash": "pix", "num_tokens": "3", "grid_thw": "[1, 2, 6]", "deepstack": "0"}
    store.put("vision", key, {"features": RawTensor("F32", (3, 2), bytes(24))}, meta)


def _plan(blocks: range, images: tuple[ImageWant, ...] = ()) -> ReadPlan:
    return ReadPlan(tuple(_want(k) for k in blocks), BLOCK, LAYERS, 0, images)


@pytest.fixture
def store(tmp_path: Path) -> DiskStore:
    return DiskStore(tmp_path, "ns", 10**8)


@pytest.fixture
def reader(store: DiskStore):  # noqa: ANN201
    r = DiskReader(store)
    yield r
    r.close()


def test_the_reader_needs_no_mlx() -> None:
    """Invariant: the reader and its checks import no MLX (no MLX call off the engine
    thread), so they are unit-testable without it."""
    import subprocess

    code = "import gateway.engine.disk.reader, sys; assert 'mlx' not in sys.modules"
    subprocess.run([sys.executable, "-c", code], check=True)


def test_blocks_are_read_in_order_up_to_the_first_missing(store, reader) -> None:  # noqa: ANN001
    """Invariant: a plan reads consecutive blocks and stops at the first missing one (block 3
    is on disk but past the gap: not read), every block checked and its bytes held."""
    for k in (0, 1, 3):
        _put_block(store, k)
    prefetch = reader.submit(_plan(range(0, 4)))
    found = prefetch.result()
    assert [b.index for b in found.blocks] == [0, 1]
    assert found.blocks[1].rope_delta == -1 and len(found.blocks[1].layers) == LAYERS
    assert found.blocks_from(1) == found.blocks[1:] and found.blocks_from(2) == []
    stats = reader.stats()
    assert stats["read_files"] == 2 and stats["read_held_bytes"] > 0
    assert store.stats().kinds["prefix"].misses == 1
    prefetch.release()
    prefetch.release()  # idempotent
    assert reader.stats()["read_held_bytes"] == 0 and reader.stats()["reads_cancelled"] == 0


@pytest.mark.parametrize("damage", ["truncated", "unfit"])
def test_a_damaged_or_unfit_block_is_removed_and_ends_the_read(store, reader, damage) -> None:  # noqa: ANN001
    """Invariant: a truncated file (checksum) or one that disagrees with the request (its
    token key) is removed, counted corrupt, and the read stops there: a miss, no error."""
    _put_block(store, 0)
    if damage == "unfit":
        _put_block(store, 1, token_key=json.dumps([9, 9, 9, 9]))
    else:
        _put_block(store, 1)
        path = store.path("prefix", _want(1).key)
        path.write_bytes(path.read_bytes()[:-5])
    _put_block(store, 2)
    found = reader.submit(_plan(range(0, 3))).result()
    assert [b.index for b in found.blocks] == [0]
    assert not store.contains("prefix", _want(1).key)
    assert store.stats().kinds["prefix"].corrupt == 1


def test_features_are_read_only_where_the_blocks_do_not_cover_the_image(store, reader) -> None:  # noqa: ANN001
    """Invariant: an image whose tokens end within the blocks read needs no features (not
    read); one ending past them is read and checked; a missing one is a miss."""
    _put_block(store, 0)
    _put_image(store, "aaaaaaaaaaaa")
    _put_image(store, "bbbbbbbbbbbb")
    images = (_image(3, "aaaaaaaaaaaa"), _image(9, "bbbbbbbbbbbb"), _image(12, "cccccccccccc"))
    found = reader.submit(_plan(range(0, 2), images)).result()
    assert [b.index for b in found.blocks] == [0]  # covers tokens [0, 4)
    assert set(found.features) == {"bbbbbbbbbbbb"}
    assert found.features["bbbbbbbbbbbb"].features.shape == (3, 2)
    assert reader.stats()["read_files"] == 2


def test_a_released_prefetch_stops_reading_and_holds_nothing(store, monkeypatch) -> None:  # noqa: ANN001
    """Invariant: a prefetch released while its read runs (its request cancelled) reads no
    further file and holds no bytes; the reader serves the next plan."""
    for k in range(3):
        _put_block(store, k)
    entered, go = threading.Event(), threading.Event()
    real_get = store.get

    def slow_get(kind: str, key: str):  # noqa: ANN202
        entered.set()
        assert go.wait(10)
        return real_get(kind, key)

    monkeypatch.setattr(store, "get", slow_get)
    reader = DiskReader(store)
    try:
        prefetch = reader.submit(_plan(range(0, 3)))
        assert entered.wait(10)
        prefetch.release()  # while block 0 is being read
        go.set()
        assert prefetch.result().blocks == []
        assert reader.stats()["read_held_bytes"] == 0
        assert reader.stats()["reads_cancelled"] == 1
        assert reader.stats()["read_files"] == 1  # block 0 only
        assert [b.index for b in reader.submit(_plan(range(0, 3))).result().blocks] == [0, 1, 2]
    finally:
        go.set()
        reader.close()


class _Parking(threading.Condition):
    """A condition that says when a thread first waits on it."""

    def __init__(self) -> None:
        super().__init__()
        self.waiting = threading.Event()

    def wait(self, timeout: float | None = None) -> bool:
        self.waiting.set()
        return super().wait(timeout)


def test_held_bytes_are_bounded(store) -> None:  # noqa: ANN001
    """Invariant: buffers held stay under `max_held_bytes` plus one file: a plan ends once
    its own reach the cap, and the next waits while others' fill it (so waiting requests
    cannot pile up buffers) until they are released."""
    for k in range(2):
        _put_block(store, k)
    reader = DiskReader(store, max_held_bytes=1)  # any file passes it
    try:
        first = reader.submit(_plan(range(0, 2)))
        assert [b.index for b in first.result().blocks] == [0]  # one file: then at the cap
        # Once the reader thread waits on its condition it has taken the second plan and
        # chosen to wait (rather than read): only then does "not done" prove anything. (The
        # thread is idle in its queue now, so nobody holds the condition being replaced.)
        reader._cond = parking = _Parking()
        second = reader.submit(_plan(range(1, 2)))
        assert parking.waiting.wait(10), "the reader read on past the cap"
        assert not second.future.done()  # it waits for the first to be released
        first.release()
        assert [b.index for b in second.result().blocks] == [1]
    finally:
        reader.close()


def test_a_closed_reader_answers_empty(store) -> None:  # noqa: ANN001
    """Invariant: after close (the engine stopping) a plan is done at once, reading nothing,
    so no request waits on a stopped thread."""
    _put_block(store, 0)
    reader = DiskReader(store)
    reader.close()
    prefetch: Prefetch = reader.submit(_plan(range(0, 1)))
    assert prefetch.done() and prefetch.result().blocks == []


def test_an_unexpected_error_ends_the_read_and_the_reader_lives(store, monkeypatch) -> None:  # noqa: ANN001
    """Invariant: whatever a read raises ends that plan with what it found (logged); the
    thread reads the next plan."""
    _put_block(store, 0)
    reader = DiskReader(store)
    try:
        monkeypatch.setattr(store, "get", lambda kind, key: 1 / 0)
        assert reader.submit(_plan(range(0, 1))).result().blocks == []
        monkeypatch.undo()
        assert len(reader.submit(_plan(range(0, 1))).result().blocks) == 1
    finally:
        reader.close()


def test_the_checks_refuse_what_does_not_fit() -> None:
    """Invariant: a block must agree on index, size, key items, rope delta, layers and
    shapes; features on pixel hash, token count, grid, tensors, dtype and rows."""
    tensor = RawTensor("F32", (1, 1, BLOCK, 2), bytes(32))
    tensors = {f"{kv}.{i}": tensor for kv in "kv" for i in range(LAYERS)}
    meta = {"block_index": "1", "block_tokens": str(BLOCK), "rope_delta": "-1",
            "images": "[]", "token_key": json.dumps(list(_items(1)))}  # fmt: skip
    assert check_block(_want(1), BLOCK, LAYERS, meta, tensors).nbytes == 4 * 32
    bad = [
        {**meta, "block_index": "2"},
        {**meta, "rope_delta": "0"},
        {**meta, "token_key": "[1]"},
        {**meta, "images": "{}"},
    ]
    for wrong in bad:
        with pytest.raises(ValueError):
            check_block(_want(1), BLOCK, LAYERS, wrong, tensors)
    with pytest.raises(ValueError):
        check_block(_want(1), BLOCK, LAYERS + 1, meta, tensors)
    fmeta = {"pixel_hash": "pix", "num_tokens": "3", "grid_thw": "[1, 2, 6]", "deepstack": "0"}
    features = {"features": RawTensor("F32", (3, 2), bytes(24))}
    assert check_features(_image(3), fmeta, features).deepstack == ()
    for wrong_meta, wrong_tensors in [
        ({**fmeta, "num_tokens": "4"}, features),
        ({**fmeta, "deepstack": "1"}, features),
        (fmeta, {"features": RawTensor("BF16", (3, 2), bytes(12))}),
        (fmeta, {"features": RawTensor("F32", (2, 3), bytes(24))}),
    ]:
        with pytest.raises(ValueError):
            check_features(_image(3), wrong_meta, wrong_tensors)


def test_a_state_layer_holds_a_snapshot_not_kv_rows() -> None:
    """Invariant: for the layers the model says keep recurrent states (`state_layers`) a
    block file holds one row's snapshot (any trailing shape), counted as snapshot bytes; the
    same tensors at a KV layer, or a snapshot of two rows, do not fit."""
    kv_tensor = RawTensor("F32", (1, 1, BLOCK, 2), bytes(32))
    snapshot = RawTensor("F32", (1, 3, 5), bytes(60))
    tensors = {"k.0": snapshot, "v.0": snapshot, "k.1": kv_tensor, "v.1": kv_tensor}
    meta = {"block_index": "1", "block_tokens": str(BLOCK), "rope_delta": "-1",
            "images": "[]", "token_key": json.dumps(list(_items(1)))}  # fmt: skip
    read = check_block(_want(1), BLOCK, LAYERS, meta, tensors, state_layers=(0,))
    assert (read.nbytes, read.snapshot_nbytes) == (2 * 60 + 2 * 32, 2 * 60)
    with pytest.raises(ValueError):
        check_block(_want(1), BLOCK, LAYERS, meta, tensors)  # layer 0 read as KV
    two_rows = {**tensors, "k.0": RawTensor("F32", (2, 3, 5), bytes(120))}
    with pytest.raises(ValueError):
        check_block(_want(1), BLOCK, LAYERS, meta, two_rows, state_layers=(0,))


def test_a_quantized_block_holds_three_arrays_per_tensor() -> None:
    """Invariant (--kv-bits): a quantized plan's block has `k.L.q`, `k.L.scales`,
    `k.L.biases` (and `v.L.*`) per layer, read back as triples and counted whole; a plain
    block does not fit a quantized plan, nor a quantized one a plain plan."""
    packed = RawTensor("U32", (1, 1, BLOCK, 2), bytes(32))
    scale = RawTensor("F32", (1, 1, BLOCK, 1), bytes(16))
    parts = {"q": packed, "scales": scale, "biases": scale}
    tensors = {f"{kv}.{i}.{p}": t for kv in "kv" for i in range(LAYERS) for p, t in parts.items()}
    meta = {"block_index": "1", "block_tokens": str(BLOCK), "rope_delta": "-1",
            "images": "[]", "token_key": json.dumps(list(_items(1)))}  # fmt: skip
    read = check_block(_want(1), BLOCK, LAYERS, meta, tensors, quantized=True)
    assert read.nbytes == 2 * LAYERS * (32 + 16 + 16)
    assert all(k == (packed, scale, scale) for k, _ in read.layers)
    with pytest.raises(ValueError):
        check_block(_want(1), BLOCK, LAYERS, meta, tensors)  # read as a plain block
    plain = {f"{kv}.{i}": packed for kv in "kv" for i in range(LAYERS)}
    with pytest.raises(ValueError):
        check_block(_want(1), BLOCK, LAYERS, meta, plain, quantized=True)
    short = {**tensors, "k.1.scales": RawTensor("F32", (1, 1, BLOCK - 1, 1), bytes(12))}
    with pytest.raises(ValueError):
        check_block(_want(1), BLOCK, LAYERS, meta, short, quantized=True)
