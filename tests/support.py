"""Shared test helpers (importable as `support`; pytest puts tests/ on sys.path).

Building the tiny models once per session and driving the engine without HTTP.
"""

from __future__ import annotations

import base64
import contextlib
import io
import os
import struct
import threading
import time
import zlib
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import numpy as np
from PIL import Image

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

from bench.server import LocalServer  # noqa: E402
from caches.hashing import pixel_hash  # noqa: E402
from gateway.media import DecodedImage  # noqa: E402

T = TypeVar("T")

MODEL_ROOT = Path(os.environ.get("VISION_GATEWAY_TEST_MODELS", "/tmp/vision-gateway-test-models"))
_build_lock = threading.Lock()


# Weight variants of the tiny models: float32 (the default), bfloat16, and 4-/8-bit
# quantized by mlx-vlm's converter (group size 32: several groups per row even at width 64).
WEIGHTS = ("float32", "bfloat16", "q4", "q8")


def tiny_model(arch: str = "qwen2_vl", weights: str = "float32") -> Path:
    """A tiny random-weight checkpoint of `arch` with `weights` (one of WEIGHTS), built once
    per machine (deterministic)."""
    from gateway.offline_model import BUILDER_VERSION, build_model

    suffix = "" if weights == "float32" else f"-{weights}"
    out = MODEL_ROOT / f"{arch}-tiny{suffix}-{BUILDER_VERSION}"
    quantize = {"q4": 4, "q8": 8}.get(weights)
    dtype = "bfloat16" if weights == "bfloat16" else None
    with _build_lock:
        if not (out / "vision_gateway_build.json").exists():
            build_model(out, arch, "tiny", 0, dtype=dtype, quantize=quantize, group_size=32)
    return out


def record_prefill_forwards(model: Any) -> list[tuple[int, int]]:
    """Replace `model.prefill` (an engine's family, for the rest of its life) by a spy that
    records each prompt forward as (the cache's offset before it, query rows incl. padding);
    returns the list it appends to."""
    forwards: list[tuple[int, int]] = []
    prefill = model.prefill

    def spy(plan, cache, lo, hi, rows=0):  # noqa: ANN001, ANN202
        forwards.append((cache[0].offset, max(rows, hi - lo)))
        return prefill(plan, cache, lo, hi, rows)

    model.prefill = spy
    return forwards


def assert_same_answers(a: Sequence[Run], b: Sequence[Run]) -> None:
    """Pairwise: the same token ids and the same logprobs (tolerance zero)."""
    assert len(a) == len(b)
    for index, (x, y) in enumerate(zip(a, b, strict=True)):
        assert x.token_ids == y.token_ids, index
        assert x.logprobs == y.logprobs, index


def block_shaped(forwards: Iterable[tuple[int, int]], block: int) -> bool:
    """Is every (start, rows) prompt forward one the exact-reuse rule allows: it starts at a
    block boundary and has `block` query rows, or the padded shape of a final partial block
    (`gateway.engine.scheduler.prefill.final_rows`)?"""
    from gateway.engine.scheduler.prefill import final_rows

    shapes = {final_rows(real, block) for real in range(1, block + 1)}
    return all(start % block == 0 and rows in shapes for start, rows in forwards)


def wait_until(
    predicate: Callable[[], T],
    timeout: float,
    interval: float = 0.05,
    message: str | Callable[[], object] = "the condition was not met",
) -> T:
    """Call `predicate` every `interval` seconds until it returns a truthy value, and return
    that value. After `timeout` seconds (wall clock) fail the test with AssertionError: the
    `message` (a callable is called then, e.g. to show a server's state at the time) and the
    predicate's last value. The predicate runs on the caller's thread, at least once and
    again once the deadline has passed, so the last check is never older than `interval`.
    """
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        left = deadline - time.monotonic()
        if left <= 0:
            said = message() if callable(message) else message
            raise AssertionError(f"{said} (within {timeout} s; last value: {value!r})")
        time.sleep(min(interval, left))


# A schema llguidance accepts but whose lazy lexer gives up once the string starts (too many
# regular expressions built for the nested bounded repetition): a 400 found while decoding.
LEXER_BOMB = {
    "type": "object",
    "properties": {"a": {"type": "string", "pattern": "^(a{1000}){1000}$"}},
    "required": ["a"],
    "additionalProperties": False,
}


def noise_image(seed: int, width: int = 56, height: int = 56) -> Image.Image:
    rng = np.random.default_rng(seed)
    return Image.fromarray((rng.random((height, width, 3)) * 255).astype("uint8"), "RGB")


def noise_png(seed: int, width: int = 56, height: int = 56) -> bytes:
    buf = io.BytesIO()
    noise_image(seed, width, height).save(buf, format="PNG")
    return buf.getvalue()


def data_uri(data: bytes, mime: str = "image/png") -> str:
    return f"data:{mime};base64,{base64.b64encode(data).decode()}"


def png_claiming(width: int, height: int) -> bytes:
    """A well-formed PNG whose header claims width x height but whose data is a few bytes
    (a decompression bomb as far as anything that trusts the header is concerned)."""

    def chunk(kind: bytes, data: bytes) -> bytes:
        crc = zlib.crc32(kind + data) & 0xFFFFFFFF
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", crc)

    ihdr = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    return (
        b"\x89PNG\r\n\x1a\n"
        + chunk(b"IHDR", ihdr)
        + chunk(b"IDAT", zlib.compress(b"\x00" * 16))
        + chunk(b"IEND", b"")
    )


def decoded(image: Image.Image) -> DecodedImage:
    rgb = image.convert("RGB")
    return DecodedImage(
        image=rgb,
        content_hash=pixel_hash("RGB", rgb.width, rgb.height, rgb.tobytes()),
        width=rgb.width,
        height=rgb.height,
        source="data",
        decode_seconds=0.0,
        hash_seconds=0.0,
    )


def _media(item: object) -> object:
    """A PIL image decoded as the media loader would; decoded media (audio) as given."""
    return decoded(item) if isinstance(item, Image.Image) else item


def chat_body(question: str, images: int = 0, max_tokens: int = 8, **extra: object) -> dict:
    """A greedy OpenAI chat body; image parts (URLs are placeholders) come before the text."""
    content: list[dict] = [{"type": "image_url", "image_url": {"url": "x"}}] * images
    content.append({"type": "text", "text": question})
    body = {
        "model": "test",
        "temperature": 0,
        "max_tokens": max_tokens,
        "logprobs": True,
        "messages": [{"role": "user", "content": content if images else question}],
    }
    body.update(extra)
    return body


@dataclass
class Run:
    """One request's events, filled by the engine thread."""

    events: list = field(default_factory=list)
    done: threading.Event = field(default_factory=threading.Event)
    progress: threading.Condition = field(default_factory=threading.Condition)

    def sink(self, event: object) -> None:
        from gateway.engine.request import ends_request

        with self.progress:
            self.events.append(event)
            self.progress.notify_all()
        if ends_request(event):  # type: ignore[arg-type]
            self.done.set()

    def choice(self, index: int) -> tuple[list[int], list[float]]:
        """Choice `index`'s token ids and logprobs (a request for n > 1 choices)."""
        from gateway.engine.request import TokenEvent

        events = [e for e in self.events if isinstance(e, TokenEvent) and e.index == index]
        return [t for e in events for t in e.token_ids], [
            lp.logprob for e in events for lp in e.logprobs
        ]

    def wait(self, timeout: float = 120.0) -> Run:
        assert self.done.wait(timeout), "request did not finish in time"
        return self

    def wait_tokens(self, n: int, timeout: float = 120.0) -> None:
        with self.progress:
            assert self.progress.wait_for(
                lambda: len(self.token_ids) >= n or self.done.is_set(), timeout
            )

    @property
    def token_ids(self) -> list[int]:
        from gateway.engine.request import TokenEvent

        return [t for e in self.events if isinstance(e, TokenEvent) for t in e.token_ids]

    @property
    def logprobs(self) -> list[float]:
        from gateway.engine.request import TokenEvent

        return [lp.logprob for e in self.events if isinstance(e, TokenEvent) for lp in e.logprobs]

    @property
    def text(self) -> str:
        from gateway.engine.request import FinishEvent, TokenEvent

        return "".join(e.text for e in self.events if isinstance(e, (TokenEvent, FinishEvent)))

    @property
    def finish(self):  # noqa: ANN201
        return self.events[-1]


class EngineHarness:
    """An Engine plus a PromptBuilder, driven directly (no HTTP). `path`: serve that
    checkpoint instead of the tiny `arch` one."""

    def __init__(
        self,
        arch: str = "qwen2_vl",
        weights: str = "float32",
        path: Path | None = None,
        **engine_kwargs: object,
    ) -> None:
        from gateway.config import CacheConfig, EngineConfig
        from gateway.engine.core import Engine
        from gateway.frontend.prompt import PromptBuilder
        from gateway.metrics import Metrics

        caches = engine_kwargs.pop("cache", CacheConfig())
        loader = engine_kwargs.pop("loader", None)  # a model-family loader to use instead
        config = EngineConfig(
            model=str(path or tiny_model(arch, weights)),
            served_model_name="test",
            cache=caches,
            **engine_kwargs,
        )
        self.metrics = Metrics()
        self.engine = Engine(config, self.metrics, loader=loader)  # type: ignore[arg-type]
        self.engine.start(timeout=300)
        self.prompts = PromptBuilder(self.engine.model, 8192, 16)
        self._ids = 0

    def submit(self, body: dict, images: list[Image.Image] | tuple = ()) -> Run:
        from gateway.api.openai.parse import parse_chat_request

        return self.submit_chat(parse_chat_request(body), images)

    def submit_chat(self, chat: object, images: list[Image.Image] | tuple = ()) -> Run:
        """Submit a parsed `ChatRequest` (from any wire format)."""
        self._ids += 1
        request = self.prompts.build(
            chat, [_media(i) for i in images], f"req-{self._ids}", time.perf_counter()
        )
        run = Run()
        self.engine.submit(request, run.sink)
        return run

    def run(self, body: dict, images: list[Image.Image] | tuple = ()) -> Run:
        return self.submit(body, images).wait()

    @contextlib.contextmanager
    def arriving_together(self) -> Iterator[None]:
        """Requests submitted inside the block reach the engine in the same step: a running
        request holds the engine inside a step until the block ends (and the pixel preparer
        has forwarded every request submitted in it)."""
        holder = self.submit(chat_body("hold the engine", max_tokens=64))
        holder.wait_tokens(1)
        entered, release = threading.Event(), threading.Event()

        def pause() -> None:
            entered.set()
            release.wait(30)

        self.engine.step_hook = pause
        try:
            assert entered.wait(30), "the engine never paused"
            yield
            self.engine._pixels.drain(30)
        finally:
            self.engine.step_hook = None
            release.set()

    def close(self) -> None:
        self.engine.stop()


def _image_turn(text: str, images: int = 1) -> dict:
    parts = [{"type": "image_url", "image_url": {"url": "x"}}] * images
    return {"role": "user", "content": [*parts, {"type": "text", "text": text}]}


def conversation(
    h: EngineHarness, image: Image.Image, turns: int = 5, fresh: bool = True
) -> list[Run]:
    """`turns` greedy turns about one image, each resending the history, then (`fresh`) a
    new question about the same image (so len(result) == turns + fresh)."""
    messages = [_image_turn("What is in this picture?")]
    runs = []
    for turn in range(turns):
        body = {
            "model": "t",
            "temperature": 0,
            "max_tokens": 8,
            "logprobs": True,
            "messages": messages,
        }
        run = h.run(body, [image])
        runs.append(run)
        messages = [
            *messages,
            {"role": "assistant", "content": run.text},
            {"role": "user", "content": f"Tell me more, part {turn + 2}."},
        ]
    if fresh:
        runs.append(h.run(chat_body("A different question about it", images=1), [image]))
    return runs


class ServerProcess(LocalServer):
    """The gateway on a tiny test model (served as "test"), in a subprocess on 127.0.0.1."""

    def __init__(self, *args: str, arch: str = "qwen2_vl") -> None:
        model = ["--model", str(tiny_model(arch)), "--served-model-name", "test"]
        super().__init__([*model, *args])


class ImageServer:
    """A threaded HTTP server on 127.0.0.1 serving files from a folder, counting hits."""

    def __init__(self, root: Path) -> None:
        import functools
        import http.server

        hits = self.hits = {}

        class Handler(http.server.SimpleHTTPRequestHandler):
            def do_GET(self) -> None:  # noqa: N802
                hits[self.path] = hits.get(self.path, 0) + 1
                super().do_GET()

            def log_message(self, *args: object) -> None:
                pass

        handler = functools.partial(Handler, directory=str(root))
        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def thinking_model(arch: str = "qwen3") -> Path:
    """The tiny `arch` checkpoint with Qwen3's Thinking template (the generation prompt opens
    `<think>\\n`, as Qwen3-*-Thinking-2507 do; `make-model --thinking`): a copy of its files
    whose weights are a link, built once per session root."""
    import shutil

    from gateway.offline_model.qwen3 import use_thinking_template

    source = tiny_model(arch)
    out = source.parent / f"{source.name}-thinking"
    if not (out / "config.json").exists():
        scratch = source.parent / f"{out.name}.{os.getpid()}"
        scratch.mkdir(parents=True, exist_ok=True)
        for item in source.iterdir():
            if item.suffix == ".safetensors":
                (scratch / item.name).symlink_to(item)
            elif item.is_file():
                shutil.copy(item, scratch / item.name)
        use_thinking_template(scratch)
        try:
            scratch.rename(out)
        except OSError:  # another process made it first
            shutil.rmtree(scratch, ignore_errors=True)
    return out
