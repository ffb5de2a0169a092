"""The families the end-to-end suite serves (tests/gateway/engine/families/test_families_e2e.py),
one `Family` row each: what differs between them in those checks, and the request parts
built from a row. Importable as `tests.gateway.engine.families.served`.
"""

from __future__ import annotations

import functools
import io
from collections.abc import Callable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

from PIL import Image
from support import ServerProcess, data_uri, noise_image
from video_clips import clip_bytes, noise_frames

FIXTURES = Path(__file__).resolve().parents[4] / "fixtures"
QUESTION = "What is in this picture?"  # what every check asks about the image


def _shapes() -> Image.Image:
    return Image.open(FIXTURES / "shapes.png").convert("RGB")


@dataclass(frozen=True)
class Family:
    """One family's row: what the end-to-end checks need to know about it.

    `arch`: the tiny checkpoint (`make-model --arch`), served as "test"; `family` and
    `media`: what /v1/models says; `image`: the image every question is about (None: a text
    model, asked in text only); `serve`: extra serve flags; `block`: exact-reuse block
    tokens (`--kv-block-tokens`, 32 by default); `refuses`: a media kind answered with 400;
    `vision_cache`: its state in /v1/cache/stats (the prefix cache is on for all);
    `template`: variables the reference renders its chat template with.
    """

    arch: str
    family: str
    media: tuple[str, ...]
    image: Callable[[], Image.Image] | None
    serve: tuple[str, ...]
    block: int
    refuses: str
    vision_cache: str = "on"
    # chat-template variables the reference must render with to see the gateway's prompt
    # (mlx-vlm renders thinking templates with thinking off; the gateway, their defaults)
    template: tuple[tuple[str, object], ...] = ()


FAMILIES = [
    # 96 x 64 -> 4 x 3 cells: 12 [IMG] + 2 [IMG_BREAK] + [IMG_END]; warm-up on (the one
    # family served with it here; first, so that its longer start overlaps the next one's).
    Family(
        "mistral3",
        "mistral3",
        ("image",),
        lambda: noise_image(7, 96, 64),
        ("--kv-block-tokens", "16"),
        16,
        "video",
    ),
    # 448 x 448 -> 64 soft tokens between the image markers: the 48-token window wraps.
    Family("gemma3", "gemma3", ("image",), _shapes, ("--no-warmup",), 32, "video"),
    # 448 x 448 -> 64 soft tokens read both ways; 4 of 10 layers share KV; an audio tower.
    Family("gemma4", "gemma4", ("audio", "image"), _shapes, ("--no-warmup",), 32, "video"),
    # Any image -> 256 soft tokens (mlx-vlm's MobileNetV5 at 256 px: tens of seconds a
    # CPU encode); 4 of 10 layers share KV; AltUp and per-layer inputs; an audio tower.
    Family("gemma3n", "gemma3n", ("audio", "image"), _shapes, ("--no-warmup",), 32, "video"),
    # 150 x 100 -> 3 x 2 tiles + the global image, row/column separators.
    Family(
        "smolvlm",
        "smolvlm",
        ("image",),
        lambda: noise_image(7, 150, 100),
        ("--no-warmup", "--kv-block-tokens", "8"),
        8,
        "video",
    ),
    # 448 x 448 -> 196 image tokens; hybrid: 3 recurrent layers per attention layer, prefix
    # reuse by state snapshots at 64-token block ends; its template opens a think block.
    Family(
        "qwen3_5",
        "qwen3_5",
        ("image",),
        _shapes,
        ("--no-warmup", "--kv-block-tokens", "64"),
        64,
        "video",
        template=(("enable_thinking", True),),
    ),
    # 448 x 448 -> 3 x 3 tiles + a thumbnail (160 image tokens, row/column markers); hybrid:
    # 3 short-convolution layers beside 1 attention layer, reuse by state snapshots.
    Family("lfm2_vl", "lfm2_vl", ("image",), _shapes, ("--no-warmup",), 32, "video"),
    # mlx-lm's own classes; Qwen 3's template (thinking) and no media at all.
    Family(
        "qwen3",
        "text",
        (),
        None,
        ("--no-warmup", "--kv-block-tokens", "8"),
        8,
        "image",
        vision_cache="off: a text model has no vision tower",
    ),
]


@functools.cache
def png(arch: str) -> bytes:
    """The PNG of the family's image (encoded once per family)."""
    image = next(f for f in FAMILIES if f.arch == arch).image
    assert image is not None
    out = io.BytesIO()
    image().save(out, format="PNG")
    return out.getvalue()


def content(fam: Family, question: str = QUESTION) -> list[dict] | str:
    """An OpenAI user content: the family's image (if any), then the question."""
    if fam.image is None:
        return question
    image = {"type": "image_url", "image_url": {"url": data_uri(png(fam.arch))}}
    return [image, {"type": "text", "text": question}]


def chat(fam: Family, question: str = QUESTION) -> list[dict]:
    return [{"role": "user", "content": content(fam, question)}]


def refused_part(kind: str) -> dict:
    if kind == "image":
        return {"type": "image_url", "image_url": {"url": data_uri(png("gemma3"))}}
    clip = clip_bytes(noise_frames(2, 64, 48, seed=3), 4, "mov")
    return {"type": "video_url", "video_url": {"url": data_uri(clip, "video/quicktime")}}


class OneAhead:
    """Starts the family servers one ahead: `take(fam)` returns `fam`'s server (started now,
    or already starting) and starts the next family of `order` on a worker thread, so its
    imports and model load overlap the current family's checks (which mostly wait on one
    engine) instead of adding to the suite's wall time. One server per family, as before.

    The caller owns a taken server (it stops it); `close()` stops any started but never
    taken. Called from the test thread only; the worker threads only construct servers.
    """

    def __init__(self, order: Sequence[Family]) -> None:
        self.order = list(order)
        self._pool = ThreadPoolExecutor(max_workers=2, thread_name_prefix="family-server")
        self._starting: dict[str, Future[ServerProcess]] = {}

    def _start(self, fam: Family) -> Future[ServerProcess]:
        if fam.arch not in self._starting:
            future = self._pool.submit(ServerProcess, *fam.serve, arch=fam.arch)
            self._starting[fam.arch] = future
        return self._starting[fam.arch]

    def take(self, fam: Family) -> ServerProcess:
        future = self._start(fam)
        later = self.order[self.order.index(fam) + 1 :] if fam in self.order else []
        if later:
            self._start(later[0])
        del self._starting[fam.arch]
        return future.result()

    def close(self) -> None:
        for future in self._starting.values():
            if future.exception() is None:
                future.result().stop()
        self._pool.shutdown()
