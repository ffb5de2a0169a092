"""Disk hits read off the engine thread (gateway/engine/disk/reader.py wired in cache_ops and
the admission stage; tiny model, CPU).

Pinned: a disk hit's files are read by the reader thread while other rows keep decoding (a
read that never finishes does not stall them), and the answer equals the uncached one; a
request cancelled while its files are read ends at once and its buffers are dropped; a file
damaged while the request waits is a miss, removed, and the answer is still exact; when the
memory cache gets the entry meanwhile, memory serves it.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
from support import EngineHarness, chat_body, noise_image

from gateway.config import CacheConfig
from gateway.engine.request import AdmittedEvent

IMAGE = noise_image(22, 84, 56)


def _engine(folder: Path) -> EngineHarness:
    return EngineHarness("qwen2_vl", cache=CacheConfig(kv_block_tokens=8, cache_dir=folder),
                         warmup=False)  # fmt: skip


def _question() -> dict:
    return chat_body("What is in the picture?", images=1, max_tokens=6)


def _admitted(run) -> AdmittedEvent:  # noqa: ANN001
    return next(e for e in run.events if isinstance(e, AdmittedEvent))


@pytest.fixture
def written(tmp_path: Path):  # noqa: ANN201
    """A folder holding the question's files, and its cold (uncached) answer."""
    h = _engine(tmp_path)
    try:
        cold = h.run(_question(), [IMAGE])
    finally:
        h.close()
    return tmp_path, cold


class Gate:
    """Holds every disk-tier file read (DiskStore.get) until opened; records its threads."""

    def __init__(self, store, monkeypatch: pytest.MonkeyPatch) -> None:  # noqa: ANN001
        self.entered, self.opened = threading.Event(), threading.Event()
        self.threads: list[str] = []
        self.first: tuple[str, str] | None = None
        real = store.get

        def get(kind: str, key: str):  # noqa: ANN202
            self.threads.append(threading.current_thread().name)
            self.first = self.first or (kind, key)
            self.entered.set()
            assert self.opened.wait(30), "the gate was never opened"
            return real(kind, key)

        monkeypatch.setattr(store, "get", get)


def _noop_plan():  # noqa: ANN201
    """An empty plan: done once the reader has finished what was queued before it."""
    from gateway.engine.disk.plan import ReadPlan

    return ReadPlan((), 8, 1, 0, ())


@pytest.fixture
def second(written) -> Iterator[EngineHarness]:  # noqa: ANN001
    h = _engine(written[0])
    try:
        yield h
    finally:
        h.close()


def test_other_rows_decode_while_a_disk_hit_is_read(written, second, monkeypatch) -> None:  # noqa: ANN001
    """Invariant: the file read of a disk hit runs on the reader thread, not the engine
    thread: while it is held, a decoding stream keeps getting tokens and the request waits;
    once read, the answer (from disk) equals the uncached one."""
    _, cold = written
    stream = second.submit(chat_body("count", max_tokens=1000, ignore_eos=True))
    stream.wait_tokens(1)  # (its own read done: it shares the system prompt's blocks)
    gate = Gate(second.engine.loaded.cache_ops.disk.store, monkeypatch)
    try:
        run = second.submit(_question(), [IMAGE])
        assert gate.entered.wait(30)
        before = len(stream.token_ids)
        stream.wait_tokens(before + 5, timeout=10)
        assert len(stream.token_ids) >= before + 5, "decoding stalled during the file read"
        assert not run.done.is_set()
    finally:
        gate.opened.set()
    run.wait()
    second.engine.cancel("req-1")
    assert run.token_ids == cold.token_ids and run.logprobs == cold.logprobs
    assert _admitted(run).disk_cached_tokens > 0
    assert gate.threads and set(gate.threads) == {"disk-cache-reader"}
    disk = second.engine.cache_stats()["disk"]
    assert disk["prefix"]["read_seconds"] > 0 and disk["prefix"]["load_seconds"] > 0


def test_a_request_cancelled_while_its_files_are_read(written, second, monkeypatch) -> None:  # noqa: ANN001
    """Invariant: cancelling a request whose files are being read ends it at once (no wait
    for the disk), its read stops and its buffers are dropped; the next request is served
    from disk, exactly."""
    _, cold = written
    gate = Gate(second.engine.loaded.cache_ops.disk.store, monkeypatch)
    run = second.submit(_question(), [IMAGE])
    try:
        assert gate.entered.wait(30)
        second.engine.cancel("req-1")
        run.wait(10)
        assert run.finish.finish_reason == "cancelled"
    finally:
        gate.opened.set()
    reader = second.engine.loaded.cache_ops.disk.reader
    assert reader.submit(_noop_plan()).result() is not None  # the reader is past it
    stats = reader.stats()
    assert stats["reads_cancelled"] == 1 and stats["read_held_bytes"] == 0
    assert stats["read_files"] == 1  # the file being read when it was cancelled, dropped
    again = second.run(_question(), [IMAGE])
    assert again.token_ids == cold.token_ids and again.logprobs == cold.logprobs
    assert _admitted(again).disk_cached_tokens > 0
    assert reader.stats()["read_held_bytes"] == 0  # released once admitted
    assert second.engine.running == 0


def test_a_file_damaged_while_the_request_waits(written, second, monkeypatch) -> None:  # noqa: ANN001
    """Invariant: a KV block file damaged between the request's arrival and its read is a
    miss, removed and counted (the features are read instead); the answer is exact."""
    from caches.disk_format import decode

    folder, cold = written
    store = second.engine.loaded.cache_ops.disk.store
    gate = Gate(store, monkeypatch)
    run = second.submit(_question(), [IMAGE])
    try:
        assert gate.entered.wait(30)
        kind, key = gate.first  # type: ignore[misc]
        assert kind == "prefix"
        path = store.path(kind, key)
        data = bytearray(path.read_bytes())
        data[-3] ^= 0xFF
        path.write_bytes(bytes(data))
    finally:
        gate.opened.set()
    run.wait()
    assert run.token_ids == cold.token_ids and run.logprobs == cold.logprobs
    admitted = _admitted(run)
    assert admitted.disk_cached_tokens == 0 and admitted.vision_disk_hits == 1
    assert second.engine.cache_stats()["disk"]["prefix"]["corrupt"] == 1
    second.engine.loaded.cache_ops.disk.writer.flush()
    decode(path.read_bytes())  # written again, whole


def test_memory_serves_what_it_got_while_a_read_waited(written, second) -> None:  # noqa: ANN001
    """Invariant: two requests for the same blocks arriving together both read them; the
    one admitted second finds them in memory (promoted by the first) and uses memory; both
    answers are exact and nothing stays held."""
    _, cold = written
    reader = second.engine.loaded.cache_ops.disk.reader
    with second.arriving_together():  # (its holder request is admitted and read first)
        base = reader.stats()["read_files"]
        runs = [second.submit(_question(), [IMAGE]) for _ in range(2)]
    for run in runs:
        run.wait()
        assert run.token_ids == cold.token_ids and run.logprobs == cold.logprobs
    admitted = [_admitted(run) for run in runs]
    assert sorted(a.disk_cached_tokens > 0 for a in admitted) == [False, True]
    assert admitted[0].cached_tokens == admitted[1].cached_tokens > 0
    stats = reader.stats()
    assert stats["read_held_bytes"] == 0
    blocks = max(a.disk_cached_tokens for a in admitted) // 8
    assert stats["read_files"] - base == 2 * blocks  # both plans read every block


def test_only_requests_with_files_to_read_wait_for_the_reader(second, monkeypatch) -> None:  # noqa: ANN001
    """Invariant: a read is planned only where memory misses and a file is there (a stat):
    a memory hit and a new image are admitted without a round trip through the reader."""
    reader = second.engine.loaded.cache_ops.disk.reader
    plans = []
    real = reader.submit
    monkeypatch.setattr(reader, "submit", lambda plan: plans.append(plan) or real(plan))
    second.run(_question(), [IMAGE])  # from disk
    assert len(plans) == 1 and plans[0].blocks
    second.run(_question(), [IMAGE])  # from memory
    second.run(_question(), [noise_image(23, 84, 56)])  # new: no files
    assert len(plans) == 1
    misses = second.engine.cache_stats()["disk"]["vision"]["misses"]
    assert misses == 1  # the new image's stat counted as a lookup
