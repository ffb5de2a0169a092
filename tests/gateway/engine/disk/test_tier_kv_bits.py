"""The disk tier under quantized KV (`--kv-bits`).

Pinned: a conversation answered by one engine at 8 or 4 bits is answered again, after a
restart on the same folder, from the quantized blocks on disk, every turn bit for bit equal
to an engine without caches at the same bits; the files hold the packed integers (U32),
scales and biases of every layer; files written at other bits (or unquantized) are never
read: another namespace, a miss, and the answer is still the uncached one at the reader's
bits.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from kv_support import wide_heads
from support import EngineHarness, conversation, noise_image

from caches.disk import FORMAT_DIR
from caches.disk_format import decode
from gateway.config import CacheConfig
from gateway.engine.request import AdmittedEvent

IMAGE = noise_image(31, 112, 84)


def _engine(bits: int, folder: Path | None = None) -> EngineHarness:
    """Blocks of 8 (several per prompt); no answer prefill (the files are the prompts')."""
    cache = CacheConfig(
        kv_bits=bits, kv_group_size=32, kv_block_tokens=8, answer_prefill=False,
        cache_dir=folder,
        **({} if folder else {"vision_enabled": False, "prefix_enabled": False}),
    )  # fmt: skip
    return EngineHarness(path=wide_heads("qwen2_vl"), cache=cache, warmup=False)


def _talk(h: EngineHarness) -> list:
    try:
        return conversation(h, IMAGE, turns=3, fresh=False)
    finally:
        h.close()


def _disk_tokens(run) -> int:  # noqa: ANN001
    return next(e for e in run.events if isinstance(e, AdmittedEvent)).disk_cached_tokens


@pytest.mark.parametrize("bits", [8, 4])
def test_a_restarted_engine_answers_every_turn_from_disk_exactly(bits: int, tmp_path: Path) -> None:
    """Invariant: after a restart, each turn of the conversation is served from the quantized
    blocks on disk and equals the uncached engine's turn at the same bits, bit for bit."""
    reference = _talk(_engine(bits))
    _talk(_engine(bits, tmp_path))
    again = _talk(_engine(bits, tmp_path))
    for turn, (a, b) in enumerate(zip(again, reference, strict=True)):
        assert (a.token_ids, a.logprobs) == (b.token_ids, b.logprobs), f"turn {turn + 1}"
        assert _disk_tokens(a) > 0, f"turn {turn + 1}"
    [space] = [p for p in (tmp_path / FORMAT_DIR).iterdir() if p.is_dir()]
    tensors, meta = decode(next((space / "prefix").glob("*/*.safetensors")).read_bytes())
    assert {tensors[f"k.0.{p}"].dtype for p in ("q", "scales", "biases")} == {"U32", "F32"}
    assert tensors["k.0.q"].shape[2] == int(meta["block_tokens"]) == 8
    assert "k.0" not in tensors


def test_files_written_at_other_bits_are_never_read(tmp_path: Path) -> None:
    """Invariant: an engine at 4 bits, and one unquantized, find none of the files an 8-bit
    engine wrote (a namespace per format) and answer as uncached at their own bits."""
    _talk(_engine(8, tmp_path))
    for bits in (4, 0):
        runs = _talk(_engine(bits, tmp_path))
        reference = _talk(_engine(bits))
        assert all(_disk_tokens(r) == 0 for r in runs)
        for a, b in zip(runs, reference, strict=True):
            assert (a.token_ids, a.logprobs) == (b.token_ids, b.logprobs)
    spaces = [p for p in (tmp_path / FORMAT_DIR).iterdir() if p.is_dir()]
    assert len(spaces) == 3
