"""Invariants of caches.disk.DiskStore (no MLX: tensors are bytes).

Pinned: an entry round-trips and survives a new store on the same folder (a restart); files
appear whole (nothing readable under a temporary name, none left after a write); a truncated,
corrupt or foreign file is a counted miss and is removed; the byte budget holds over the
whole folder, evicting by last use (a hit refreshes it, across restarts); namespaces never see
each other's entries; several processes writing and reading one folder at once leave only
intact files, read back only correct entries and end within the budget.
"""

from __future__ import annotations

import multiprocessing
import os
import time
from pathlib import Path

import pytest

from caches.disk import FORMAT_DIR, TMP_PREFIX, DiskStore
from caches.disk_format import RawTensor, decode

NS = "aaaa1111"


def _key(i: int) -> str:
    return f"{i:08d}deadbeef"


def _entry(i: int, size: int = 64) -> dict[str, RawTensor]:
    return {"x": RawTensor("U8", (size,), bytes([i % 256]) * size)}


def _store(root: Path, capacity: int = 10_000, namespace: str = NS, **kw: object) -> DiskStore:
    return DiskStore(root, namespace, capacity, **kw)  # type: ignore[arg-type]


def test_a_probe_counts_a_missing_file_as_a_miss(tmp_path: Path) -> None:
    """Invariant: `probe` (a stat before planning a read) answers like `contains`, and a
    missing file counts a miss as `get` would; a present one counts nothing (read later)."""
    store = _store(tmp_path)
    store.put("prefix", _key(1), _entry(1), {})
    assert store.probe("prefix", _key(1)) and not store.probe("prefix", _key(2))
    kinds = store.stats().kinds["prefix"]
    assert (kinds.hits, kinds.misses) == (0, 1)


def test_round_trip_and_restart(tmp_path: Path) -> None:
    """Invariant: what one store writes, a new store on the folder reads back (a restart),
    with its metadata; an absent key is a counted miss."""
    _store(tmp_path).put("vision", _key(1), _entry(1), {"num_tokens": "4"})
    store = _store(tmp_path)
    got = store.get("vision", _key(1))
    assert got is not None and bytes(got.tensors["x"].data) == bytes([1]) * 64
    assert got.metadata["num_tokens"] == "4" and got.metadata["namespace"] == NS
    assert store.get("vision", _key(2)) is None
    kinds = store.stats().kinds["vision"]
    assert (kinds.hits, kinds.misses) == (1, 1)
    assert store.stats().entries == 1


def test_writes_are_atomic(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Invariant: a write that fails half-way leaves no file under the entry's name and no
    temporary file; a successful one leaves only the entry."""
    store = _store(tmp_path)
    real_replace = os.replace

    def crash(*args: object) -> None:
        raise OSError("disk full")

    monkeypatch.setattr(os, "replace", crash)
    assert not store.put("prefix", _key(1), _entry(1), {})
    assert not store.contains("prefix", _key(1)) and store.stats().kinds["prefix"].write_errors
    monkeypatch.setattr(os, "replace", real_replace)
    assert store.put("prefix", _key(1), _entry(1), {})
    names = [p.name for p in (tmp_path / FORMAT_DIR).rglob("*") if p.is_file()]
    assert sorted(names) == [".lock", _key(1) + ".safetensors"]


@pytest.mark.parametrize(
    "how", ["truncated", "garbage", "empty", "other-key", "other-kind", "other-namespace"]
)
def test_damaged_or_foreign_files_are_removed_misses(tmp_path: Path, how: str) -> None:
    """Invariant: a damaged file, or an intact one naming another key, kind or namespace
    (model), is a miss that is counted and removed, never returned."""
    store = _store(tmp_path)
    store.put("vision", _key(1), _entry(1), {})
    store.put("vision", _key(2), _entry(2), {})
    store.put("prefix", _key(3), _entry(3), {})
    other = _store(tmp_path, namespace="othermodel")
    other.put("vision", _key(1), _entry(1), {})
    path = store.path("vision", _key(1))
    blob = path.read_bytes()
    path.write_bytes(
        {
            "truncated": blob[:-10],
            "garbage": os.urandom(len(blob)),
            "empty": b"",
            "other-key": store.path("vision", _key(2)).read_bytes(),
            "other-kind": store.path("prefix", _key(3)).read_bytes(),
            "other-namespace": other.path("vision", _key(1)).read_bytes(),
        }[how]
    )
    assert store.get("vision", _key(1)) is None
    assert not path.exists()
    assert store.stats().kinds["vision"].corrupt == 1
    assert store.get("vision", _key(2)) is not None  # the others are untouched


def test_namespaces_are_apart(tmp_path: Path) -> None:
    """Invariant: another namespace (another model or dtype) never reads an entry."""
    _store(tmp_path, namespace="model1").put("vision", _key(1), _entry(1), {})
    other = _store(tmp_path, namespace="model2")
    assert other.get("vision", _key(1)) is None and not other.contains("vision", _key(1))


def test_budget_holds_and_evicts_least_recently_used(tmp_path: Path) -> None:
    """Invariant: the folder's file bytes stay within the budget after every write; the
    least recently *used* files go first, and a hit counts as a use, also for a store opened
    later (last use is the file's mtime)."""
    size = len(_encoded(0))
    store = _store(tmp_path, capacity=3 * size, rescan_s=3600)
    for i in range(3):
        store.put("vision", _key(i), _entry(i), {})
        os.utime(store.path("vision", _key(i)), (1000 + i, 1000 + i))  # distinct ages
    restarted = _store(tmp_path, capacity=3 * size, rescan_s=3600)
    assert restarted.get("vision", _key(0)) is not None  # 0 is now the most recent
    restarted.put("vision", _key(3), _entry(3), {})
    assert _folder_bytes(tmp_path) <= 3 * size
    present = [i for i in range(4) if restarted.contains("vision", _key(i))]
    assert present == [0, 2, 3]  # 1 was the least recently used
    assert restarted.stats().evictions == 1 and restarted.stats().bytes == _folder_bytes(tmp_path)
    assert not restarted.put("vision", _key(9), _entry(9, size=10 * size), {})  # over budget


def test_stale_temporary_files_are_swept(tmp_path: Path) -> None:
    """Invariant: a temporary file of a writer that died long ago is removed at the next
    scan; a young one (a live writer's) is left alone and never read as an entry."""
    store = _store(tmp_path)
    folder = store.path("vision", _key(1)).parent
    folder.mkdir(parents=True)
    old, young = folder / f"{TMP_PREFIX}1-old.safetensors", folder / f"{TMP_PREFIX}2-y.safetensors"
    for p in (old, young):
        p.write_bytes(b"partial")
    os.utime(old, (time.time() - 7200, time.time() - 7200))
    store.enforce_budget(force=True)
    assert not old.exists() and young.exists()
    assert store.stats().entries == 0


def _encoded(i: int) -> bytes:
    from caches.disk_format import encode

    meta = {"namespace": NS, "kind": "vision", "key": _key(i)}
    return encode(_entry(i), meta)


def _folder_bytes(root: Path) -> int:
    return sum(p.stat().st_size for p in (root / FORMAT_DIR).rglob("*.safetensors"))


def _worker(root: str, worker: int, capacity: int, errors: multiprocessing.Queue) -> None:
    """Write entries 0..59 (content fixed by the key) and read random others back."""
    import random

    store = DiskStore(Path(root), NS, capacity, rescan_s=0.0)
    rng = random.Random(worker)
    for _ in range(60):
        i = rng.randrange(40)
        store.put("prefix", _key(i), _entry(i, size=200 + i), {"i": str(i)})
        j = rng.randrange(40)
        got = store.get("prefix", _key(j))
        if got is not None and bytes(got.tensors["x"].data) != bytes([j]) * (200 + j):
            errors.put(f"worker {worker} read a wrong entry {j}")
    if any(c.corrupt for c in store.stats().kinds.values()):
        errors.put(f"worker {worker} found a damaged file")


def test_processes_sharing_a_folder_never_corrupt_it(tmp_path: Path) -> None:
    """Invariant: four processes writing, reading and evicting in one folder at once: every
    read is the right entry or a miss, no file is ever damaged, and the folder ends within
    its budget with only intact files."""
    capacity = 15 * 700
    ctx = multiprocessing.get_context("spawn")
    errors: multiprocessing.Queue = ctx.Queue()
    args = [(str(tmp_path), w, capacity, errors) for w in range(4)]
    procs = [ctx.Process(target=_worker, args=a) for a in args]
    for p in procs:
        p.start()
    for p in procs:
        p.join(120)
        assert p.exitcode == 0
    found = []
    while not errors.empty():
        found.append(errors.get())
    assert found == []
    assert _folder_bytes(tmp_path) <= capacity
    files = list((tmp_path / FORMAT_DIR).rglob("*.safetensors"))
    assert files and not [p for p in files if p.name.startswith(TMP_PREFIX)]
    for path in files:
        _, meta = decode(path.read_bytes())
        assert path.name == meta["key"] + ".safetensors"


def test_clear_removes_this_namespace_only(tmp_path: Path) -> None:
    """Invariant: `clear` removes every entry of the store's namespace (later lookups miss,
    stats count none of them) and leaves another namespace's entries in the folder."""
    store, other = _store(tmp_path), _store(tmp_path, namespace="other22")
    for i in range(3):
        store.put("vision", _key(i), _entry(i), {})
    store.put("prefix", _key(9), _entry(9), {})
    other.put("vision", _key(1), _entry(1), {})
    assert store.clear() == 4
    assert not any(store.contains(k, _key(i)) for k in ("vision", "prefix") for i in (0, 1, 9))
    assert store.get("vision", _key(0)) is None
    assert store.stats().entries == 1  # the other namespace's file, still in the folder
    assert other.get("vision", _key(1)) is not None
