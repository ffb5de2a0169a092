"""The disk tier wired into the engine (tiny models, CPU).

Pinned: after an engine stops, a new engine on the same folder answers the same question from
disk (KV blocks; and image features when the KV cannot be reused) with token ids and logprobs
bit for bit equal to an engine without caches, on all three architectures (Qwen3-VL carries
deepstack features); damaged, truncated and foreign files are misses that are removed, and
the answer is still exact; another weight dtype of the same model reads none of the files;
the warm-up neither reads nor writes the disk; clearing the caches clears this model's disk
entries too (the next request is cold, exactly as uncached); joined views (how CUDA hands an
entry to the writer) carry each tensor's own bytes.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from support import EngineHarness, chat_body, noise_image

from caches.disk import FORMAT_DIR
from caches.disk_format import decode
from gateway.config import CacheConfig
from gateway.engine.request import AdmittedEvent

ARCHS = ["qwen2_vl", "qwen2_5_vl", "qwen3_vl"]
IMAGE = noise_image(21, 84, 56)


def _disk(folder: Path, **kwargs: object) -> CacheConfig:
    # No answer prefill: these tests count the files their requests write, and an answer's
    # blocks are written in the background after it (test_answer_store.py pins those).
    kwargs = {"answer_prefill": False, **kwargs}
    return CacheConfig(kv_block_tokens=8, cache_dir=folder, **kwargs)  # type: ignore[arg-type]


def _ask(h: EngineHarness, text: str = "What is in the picture?", first: bool = False):  # noqa: ANN202
    """One image question; `first` puts text before the image (no KV shared with the default)."""
    content = [{"type": "image_url", "image_url": {"url": "x"}}, {"type": "text", "text": text}]
    if first:
        content.insert(0, {"type": "text", "text": "Look:"})
    body = chat_body(text, max_tokens=6)
    body["messages"] = [{"role": "user", "content": content}]
    run = h.run(body, [IMAGE])
    admitted = next(e for e in run.events if isinstance(e, AdmittedEvent))
    return run, admitted


def _files(folder: Path, kind: str | None = None) -> list[Path]:
    pattern = f"*/{kind}/*/*.safetensors" if kind else "*/*/*/*.safetensors"
    return sorted((folder / FORMAT_DIR).glob(pattern))


@pytest.fixture(scope="module", params=ARCHS)
def arch(request: pytest.FixtureRequest) -> str:
    return request.param


@pytest.fixture(scope="module")
def reference(arch: str):  # noqa: ANN201
    """Answers of an engine without any cache."""
    off = CacheConfig(vision_enabled=False, prefix_enabled=False, kv_block_tokens=8)
    h = EngineHarness(arch, cache=off, warmup=False)
    try:
        yield {first: _ask(h, first=first)[0] for first in (False, True)}
    finally:
        h.close()


def _restart(arch: str, folder: Path, **cache: object) -> EngineHarness:
    return EngineHarness(arch, cache=_disk(folder, **cache), warmup=False)


def test_a_restarted_engine_answers_from_disk_exactly(arch: str, reference, tmp_path) -> None:  # noqa: ANN001
    """Invariant: KV blocks and features written by one engine are read by the next one on the
    same folder, and the answer equals the uncached one (token ids and logprobs, bit for bit)."""
    first = _restart(arch, tmp_path)
    run, admitted = _ask(first)
    first.close()
    assert admitted.disk_cached_tokens == 0 and admitted.vision_disk_hits == 0
    assert _files(tmp_path, "vision") and _files(tmp_path, "prefix")

    second = _restart(arch, tmp_path)
    try:
        again, admitted = _ask(second)
        assert admitted.disk_cached_tokens > 0
        assert admitted.cached_tokens == admitted.disk_cached_tokens  # memory was empty
        assert again.token_ids == reference[False].token_ids
        assert again.logprobs == reference[False].logprobs
        # Text before the image: no KV block is shared, the features come from disk.
        other, admitted = _ask(second, first=True)
        assert admitted.vision_disk_hits == 1 and admitted.vision_hits == 1
        assert other.token_ids == reference[True].token_ids
        assert other.logprobs == reference[True].logprobs
        disk = second.engine.cache_stats()["disk"]
        assert disk["vision"]["images_hit"] == 1 and disk["prefix"]["tokens_hit"] > 0
        assert disk["vision"]["corrupt"] == disk["prefix"]["corrupt"] == 0
        # A disk hit is promoted: the same question again is a memory hit, not a disk read.
        _, admitted = _ask(second)
        assert admitted.disk_cached_tokens == 0 and admitted.cached_tokens > 0
    finally:
        second.close()


def _block_file(folder: Path, index: int) -> Path:
    for path in _files(folder, "prefix"):
        if decode(path.read_bytes())[1]["block_index"] == str(index):
            return path
    raise AssertionError(f"no file for block {index}")


def _damage(path: Path, how: str, donor: Path) -> None:
    data = bytearray(path.read_bytes())
    if how == "truncated":
        path.write_bytes(bytes(data[: len(data) // 2]))
    elif how == "flipped":
        data[-3] ^= 0xFF  # one byte of the last tensor
        path.write_bytes(bytes(data))
    else:  # an intact file of another entry under this name
        path.write_bytes(donor.read_bytes())


@pytest.mark.parametrize("how", ["truncated", "flipped", "foreign"])
def test_damaged_files_are_misses_removed_and_the_answer_is_exact(how: str, tmp_path: Path) -> None:
    """Invariant: a truncated, bit-flipped or foreign file is a logged miss that is removed
    (and written again whole); the request is answered exactly as without caches."""
    arch = "qwen2_vl"
    first = _restart(arch, tmp_path)
    expected, _ = _ask(first)  # cold: the uncached answer
    first.close()
    [features] = _files(tmp_path, "vision")
    block0, block1 = _block_file(tmp_path, 0), _block_file(tmp_path, 1)
    _damage(block0, how, donor=block1)
    _damage(features, how, donor=block1)
    damaged = {p: p.read_bytes() for p in (block0, features)}
    second = _restart(arch, tmp_path)
    try:
        run, admitted = _ask(second)
        assert run.token_ids == expected.token_ids
        assert run.logprobs == expected.logprobs
        assert admitted.vision_disk_hits == 0 and admitted.disk_cached_tokens == 0
        disk = second.engine.cache_stats()["disk"]
        assert disk["vision"]["corrupt"] == 1 and disk["prefix"]["corrupt"] == 1
    finally:
        second.close()
    for path, bad in damaged.items():  # removed, then written again from the fresh compute
        assert path.read_bytes() != bad
        decode(path.read_bytes())  # intact


def test_another_dtype_reads_none_of_the_files(tmp_path: Path) -> None:
    """Invariant: files are namespaced by the model fingerprint and dtypes: the bfloat16
    weights of the same tiny model find nothing the float32 weights wrote."""
    first = _restart("qwen2_vl", tmp_path)
    _ask(first)
    first.close()
    other = EngineHarness("qwen2_vl", "bfloat16", cache=_disk(tmp_path), warmup=False)
    try:
        _, admitted = _ask(other)
        assert admitted.vision_disk_hits == 0 and admitted.disk_cached_tokens == 0
        disk = other.engine.cache_stats()["disk"]
        assert disk["vision"]["hits"] == disk["prefix"]["hits"] == 0
    finally:
        other.close()
    assert len(list((tmp_path / FORMAT_DIR).iterdir())) == 3  # two namespaces and the lock


def test_the_warm_up_neither_reads_nor_writes_the_disk(tmp_path: Path) -> None:
    """Invariant: until the warm-up's cache reset the tier is inactive (synthetic requests
    are not written, and a restart's warm-up still runs the tower); after it, it is used."""
    h = EngineHarness("qwen2_vl", cache=_disk(tmp_path), warmup=True)
    try:
        _ask(h)
        h.engine.loaded.cache_ops.disk.writer.flush()
        assert _files(tmp_path) == []
        h.engine.reset_caches()
        _ask(h, "Another question?")
        h.engine.loaded.cache_ops.disk.writer.flush()
        assert _files(tmp_path, "vision") and _files(tmp_path, "prefix")
    finally:
        h.close()


def test_clearing_the_caches_clears_the_disk_tier(tmp_path: Path) -> None:
    """Invariant: after `clear_caches` (`POST /v1/cache/clear`) a repeat question is cold in
    memory and on disk (no hit of either kind) and its tokens and logprobs equal the first
    answer's; a repeat before the clear was a hit."""
    h = _restart("qwen2_vl", tmp_path)
    try:
        first, _ = _ask(h)
        _, admitted = _ask(h)
        assert admitted.cached_tokens > 0  # the image's KV: the tower was not needed
        h.engine.loaded.cache_ops.disk.writer.flush()
        assert _files(tmp_path, "vision") and _files(tmp_path, "prefix")
        h.engine.clear_caches()
        assert _files(tmp_path) == []
        again, admitted = _ask(h)
        assert admitted.vision_hits == admitted.cached_tokens == 0
        assert admitted.vision_misses == 1  # the tower ran again
        assert admitted.vision_disk_hits == admitted.disk_cached_tokens == 0
        assert again.token_ids == first.token_ids and again.logprobs == first.logprobs
    finally:
        h.close()


@pytest.mark.parametrize("off", ["vision", "prefix"])
def test_a_cache_turned_off_has_no_disk_tier(off: str, tmp_path: Path) -> None:
    """Invariant: --no-vision-cache / --no-prefix-cache also keep that cache's entries off
    the disk (an A/B comparison stays one), while the other cache still uses it."""
    enabled = {"vision_enabled": off != "vision", "prefix_enabled": off != "prefix"}
    for _ in range(2):  # the second engine would read what the first wrote
        h = EngineHarness("qwen2_vl", cache=_disk(tmp_path, **enabled), warmup=False)
        try:
            _, admitted = _ask(h)
        finally:
            h.close()
    on = "prefix" if off == "vision" else "vision"
    assert _files(tmp_path, off) == [] and _files(tmp_path, on)
    if off == "vision":
        assert admitted.vision_disk_hits == 0 and admitted.disk_cached_tokens > 0
    else:
        assert admitted.vision_disk_hits == 1 and admitted.disk_cached_tokens == 0


def test_memory_hits_keep_their_files_young(tmp_path: Path) -> None:
    """Invariant: last use on disk includes hits the memory tier served (throttled, in the
    background), so an entry that stays hot in memory does not age out of the disk."""
    h = EngineHarness("qwen2_vl", cache=_disk(tmp_path), warmup=False)
    try:
        _ask(h)
        disk = h.engine.loaded.cache_ops.disk
        disk.writer.flush()
        blocks = set(_files(tmp_path, "prefix"))  # the question's blocks
        _ask(h, first=True)
        disk.writer.flush()
        files = _files(tmp_path)
        for path in files:
            os.utime(path, (1000, 1000))
        disk._touched.clear()  # (the throttle: one touch a minute per file)
        _, admitted = _ask(h)  # memory hits: KV blocks (the image's features: not needed)
        assert admitted.cached_tokens > 0 and admitted.disk_cached_tokens == 0
        _, admitted = _ask(h, "Other text?", first=True)  # a memory vision hit
        assert admitted.vision_hits == 1 and admitted.vision_disk_hits == 0
        disk.writer.flush()
    finally:
        h.close()
    young = {p for p in files if p.stat().st_mtime > 1000}
    assert set(_files(tmp_path, "vision")) <= young
    assert len(blocks) == 2 and blocks <= young


def test_an_unusable_folder_means_memory_only(tmp_path: Path, caplog) -> None:  # noqa: ANN001
    """Invariant: a --cache-dir that cannot be a folder (here: a file) is logged and the
    server runs on memory alone; the namespace separates block sizes and the exact rule."""
    from types import SimpleNamespace

    import mlx.core as mx

    from gateway.engine.disk.tier import namespace, open_disk_tier

    model = SimpleNamespace(
        fingerprint="m", processor_fingerprint="p", embed_dtype=mx.bfloat16,
        vision_dtype=mx.bfloat16,
    )  # fmt: skip
    blocker = tmp_path / "a-file"
    blocker.write_text("not a folder")
    assert open_disk_tier(_disk(blocker), model, 8, True, active=True) is None
    assert "unusable" in caplog.text
    tier = open_disk_tier(_disk(tmp_path / "ok"), model, 8, True, active=True)
    assert tier is not None
    tier.close()
    spaces = {namespace(model, "bfloat16", b, e) for b in (8, 16) for e in (True, False)}
    assert len(spaces) == 4


def test_the_budget_holds_with_a_real_engine(tmp_path: Path) -> None:
    """Invariant: with a budget of a few entries, distinct images streaming through keep the
    folder within it (least recently used files evicted and counted), and recent images'
    files are kept."""
    budget_gb = 40_000 / 2**30  # ~40 kB: about three images' features and blocks
    h = EngineHarness("qwen2_vl", cache=_disk(tmp_path, disk_cache_gb=budget_gb), warmup=False)
    try:
        for seed in range(6):
            body = chat_body("What is it?", images=1, max_tokens=2)
            h.run(body, [noise_image(100 + seed, 84, 56)])
            h.engine.loaded.cache_ops.disk.writer.flush()
            total = sum(p.stat().st_size for p in _files(tmp_path))
            assert total <= 40_000, f"after image {seed}: {total} bytes"
        stats = h.engine.cache_stats()["disk"]
    finally:
        h.close()
    assert stats["evictions"] > 0 and stats["bytes"] <= 40_000
    assert stats["vision"]["corrupt"] == stats["vision"]["write_errors"] == 0
    assert 1 <= len(_files(tmp_path, "vision")) < 6


@pytest.mark.parametrize("dtype", ["bfloat16", "float32"])
def test_joined_views_write_the_same_bytes_as_one_view_per_array(dtype: str) -> None:
    """The CUDA way of exposing an entry's arrays (joined on the device, byte slices of one
    view: `raw_tensors(join=True)`) gives each tensor the dtype, shape and bytes of its own
    array's view, so the files are those of the per-array way."""
    import mlx.core as mx

    from gateway.engine.disk.tier import raw_tensor, raw_tensors

    arrays = [mx.random.normal((1, 2, 8, 4)).astype(getattr(mx, dtype)) for _ in range(6)]
    mx.eval(arrays)
    named = [(f"{'kv'[i % 2]}.{i // 2}", a) for i, a in enumerate(arrays)]
    joined = raw_tensors(named, join=True)
    assert list(joined) == [name for name, _ in named]
    for name, array in named:
        alone = raw_tensor(array)
        assert (joined[name].dtype, joined[name].shape) == (alone.dtype, alone.shape)
        assert bytes(memoryview(joined[name].data)) == bytes(memoryview(alone.data).cast("B"))
