"""The disk tier after a restart, for every non-Qwen family (the Qwen-VL ones:
tests/gateway/engine/disk/test_tier.py): one engine writes a prompt's KV blocks and image
features to `--cache-dir`, a new engine on the same folder reads them.

Pinned at tolerance zero, per family: the restarted engine's answer to the same question
takes KV blocks from disk and equals the answer of an engine without caches (token ids and
logprobs), and so does the writer's own; for the vision-language families, a question with
text before the image shares no block from the image on with the stored prompt (the system
prompt's at most) and takes the image's features from disk, with the uncached answer too.
Gemma 3's and Gemma 4's sliding layers keep every position (`WindowKVCache`), so their blocks
go to disk like a global layer's; Qwen3.5's recurrent layers and LFM2-VL's convolution layers
write the state snapshot at each block's end in its place, and the reader restores the deepest
one.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pytest
from PIL import Image
from support import EngineHarness, Run, chat_body

from gateway.config import CacheConfig
from gateway.engine.request import AdmittedEvent
from tests.gateway.engine.families.common import (
    NO_CACHES,
    Request,
    assert_same_answers,
    engine_request,
)

FIXTURES = Path(__file__).resolve().parents[4] / "fixtures"
QUESTION = "What is in this picture?"
# Fixed, so a template that would write today's date (Mistral 3's) gives the same ids
# to all three engines, and long enough for whole 32-token blocks in a text-only prompt.
SYSTEM = "You describe pictures briefly and carefully, in plain words. " * 3


def _shapes() -> Image.Image:
    return Image.open(FIXTURES / "shapes.png").convert("RGB")


@dataclass(frozen=True)
class DiskCase:
    """One family's checkpoint and the image its question is about (None: a text model)."""

    arch: str
    image: Callable[[], Image.Image] | None


CASES = [
    DiskCase("gemma3", _shapes),  # 64 soft tokens; the 48-token window wraps inside them
    DiskCase("gemma4", _shapes),  # 64 soft tokens read both ways; KV-sharing layers
    DiskCase("smolvlm", lambda: _shapes().resize((640, 360))),  # 2 x 3 tiles + global
    DiskCase("mistral3", lambda: _shapes().resize((640, 360))),  # 8 x 5 cells, breaks, end
    DiskCase("qwen3", None),  # the text family (llama runs the same TextModel code)
    DiskCase("qwen3_5", _shapes),  # hybrid: recurrent-state snapshots go to disk with KV
    DiskCase("lfm2_vl", _shapes),  # hybrid: convolution-state snapshots; 3 x 3 tiles + thumb
]


def _request(case: DiskCase, text_first: bool = False) -> Request:
    """The question (about the case's image, if any) after the system message, with
    "Look:" before the image when `text_first`."""
    images = [case.image()] if case.image else []
    body = chat_body(QUESTION, images=len(images), max_tokens=6)
    body["messages"] = [{"role": "system", "content": SYSTEM}, *body["messages"]]
    if text_first:
        body["messages"][-1]["content"].insert(0, {"type": "text", "text": "Look:"})
    return body, images


def _ask(h: EngineHarness, case: DiskCase, text_first: bool = False) -> tuple[Run, AdmittedEvent]:
    """The run of `_request(case, text_first)` and its admission (where its KV and
    features came from)."""
    run = h.run(*_request(case, text_first))
    return run, next(e for e in run.events if isinstance(e, AdmittedEvent))


def _engine(case: DiskCase, cache: CacheConfig) -> EngineHarness:
    return EngineHarness(case.arch, cache=cache, warmup=False)


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.arch)
def test_a_restarted_engine_answers_from_the_disk_tier_exactly(
    case: DiskCase, tmp_path: Path
) -> None:
    """Invariant: blocks and features written by one engine serve the next one on the same
    folder with the uncached answer (ids and logprobs)."""
    variants = (False, True) if case.image else (False,)
    cold = _engine(case, NO_CACHES)
    try:
        want = {first: _ask(cold, case, first)[0] for first in variants}
    finally:
        cold.close()
    writer = _engine(case, CacheConfig(cache_dir=tmp_path))
    try:
        written, admitted = _ask(writer, case)
        assert admitted.disk_cached_tokens == 0 and admitted.cached_tokens == 0
    finally:
        writer.close()  # drains the writer thread: every file is on disk after this
    assert_same_answers([written], [want[False]])
    reader = _engine(case, CacheConfig(cache_dir=tmp_path))
    try:
        image_start = 0  # (a text model: nothing read from disk before the question below)
        if case.image:
            run, admitted = _ask(reader, case, text_first=True)
            image_start = engine_request(reader, *_request(case, True)).images[0].layout.start
            assert admitted.vision_disk_hits == 1
            assert admitted.cached_tokens <= image_start  # the system prompt's blocks at most
            assert_same_answers([run], [want[True]])
        run, admitted = _ask(reader, case)
        assert admitted.disk_cached_tokens > 0
        # from memory: at most the system prompt's blocks the question above read from disk
        assert admitted.cached_tokens - admitted.disk_cached_tokens <= image_start
        assert_same_answers([run], [want[False]])
    finally:
        reader.close()
