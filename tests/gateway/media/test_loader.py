"""Invariants of gateway.media (loader, sources, image_decode): one content hash per set of pixels
whatever the encoding or source; every pixel kind decodes to the right RGB; limits are checked
before decoding; local paths never leave the allowed roots; the memo skips decoding; and for
any input at all, `MediaLoader.load` raises nothing but a 4xx APIError.

Network rule: the only HTTP traffic goes to a server started here on 127.0.0.1; fetches in the
property tests go to an in-memory mock transport, and names resolve with a fake resolver.
"""

from __future__ import annotations

import asyncio
import base64
import io
import os
import re
import threading
import time
import urllib.parse
from collections.abc import Coroutine, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, TypeVar

import httpx
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from PIL import Image, ImageFile
from support import data_uri, png_claiming

from caches.hashing import pixel_hash
from gateway.config import MediaConfig
from gateway.errors import APIError
from gateway.media import DecodedImage, MediaLoader
from gateway.media import loader as media
from gateway.media import sources as media_sources
from gateway.media.sources import parse_data_uri

T = TypeVar("T")


def sample_image(width: int = 7, height: int = 5) -> Image.Image:
    """Distinct pixels everywhere, so a transposition or channel swap changes the hash."""
    image = Image.new("RGB", (width, height))
    image.putdata(
        [
            (x * 30 % 256, y * 40 % 256, (x + y) * 10 % 256)
            for y in range(height)
            for x in range(width)
        ]
    )
    return image


def encode(image: Image.Image, fmt: str, **params: object) -> bytes:
    buf = io.BytesIO()
    image.save(buf, fmt, **params)
    return buf.getvalue()


def run(coro: Coroutine[Any, Any, T]) -> T:
    return asyncio.run(coro)


def load(loader: MediaLoader, url: str, param: str = "p") -> DecodedImage:
    return run(loader.load(url, param))


def load_error(loader: MediaLoader, url: str, param: str = "p") -> APIError:
    with pytest.raises(APIError) as info:
        load(loader, url, param)
    assert info.value.param == param
    return info.value


def pixels(decoded: DecodedImage) -> list[tuple[int, int, int]]:
    """Row-major RGB tuples."""
    image = decoded.image
    return [image.getpixel((x, y)) for y in range(image.height) for x in range(image.width)]


@pytest.fixture
def root(tmp_path: Path) -> Path:
    media = tmp_path / "media"
    media.mkdir()
    return media


@pytest.fixture
def serve_bytes() -> Iterator[dict[str, bytes]]:
    """A loopback HTTP server; yields its routes (path -> body) plus its base URL under ''."""
    routes: dict[str, bytes] = {}

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802 (http.server's naming)
            body = routes.get(self.path)
            if body is None:
                self.send_error(404)
                return
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: object) -> None:
            pass

    httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    httpd.daemon_threads = True
    threading.Thread(target=httpd.serve_forever, args=(0.02,), daemon=True).start()
    routes[""] = f"http://127.0.0.1:{httpd.server_address[1]}".encode()
    yield routes
    httpd.shutdown()
    httpd.server_close()


# --- one hash per set of pixels --------------------------------------------------------------


def test_same_pixels_give_one_hash_across_formats_and_sources(
    root: Path, serve_bytes: dict[str, bytes]
) -> None:
    image = sample_image()
    expected = pixel_hash("RGB", 7, 5, image.tobytes())
    encodings = {
        "png": encode(image, "PNG"),
        "webp": encode(image, "WEBP", lossless=True),
        "bmp": encode(image, "BMP"),
        "tiff": encode(image, "TIFF"),
        "rgba-png": encode(image.convert("RGBA"), "PNG"),  # opaque alpha changes nothing
    }
    (root / "cat.png").write_bytes(encodings["png"])
    (root / "my cat.webp").write_bytes(encodings["webp"])
    serve_bytes["/cat.bmp"] = encodings["bmp"]
    base = serve_bytes[""].decode()
    refs = [data_uri(data) for data in encodings.values()] + [
        str(root / "cat.png"),
        "file://" + urllib.parse.quote(str(root / "my cat.webp")),
        base + "/cat.bmp",
    ]
    loader = MediaLoader(MediaConfig(allowed_media_dirs=(root,), allow_private_urls=True))
    results = [load(loader, ref) for ref in refs]
    assert {r.content_hash for r in results} == {expected}
    assert {(r.width, r.height, r.image.mode) for r in results} == {(7, 5, "RGB")}
    assert [r.source for r in results[-3:]] == ["path", "path", "url"]


def test_one_changed_pixel_changes_the_hash() -> None:
    image = sample_image()
    changed = image.copy()
    changed.putpixel((3, 2), (1, 2, 3))
    loader = MediaLoader(MediaConfig())
    a = load(loader, data_uri(encode(image, "PNG")))
    b = load(loader, data_uri(encode(changed, "PNG")))
    assert a.content_hash != b.content_hash


# --- pixel kinds -> RGB ----------------------------------------------------------------------


def test_exif_orientation_is_applied() -> None:
    image = Image.new("RGB", (8, 4), (255, 0, 0))
    image.paste((0, 0, 255), (4, 0, 8, 4))  # left half red, right half blue
    exif = Image.Exif()
    exif[0x0112] = 6  # "rotate 90 degrees clockwise to display"
    decoded = load(MediaLoader(MediaConfig()), data_uri(encode(image, "JPEG", exif=exif)))
    assert (decoded.width, decoded.height) == (4, 8)
    top, bottom = decoded.image.getpixel((2, 1)), decoded.image.getpixel((2, 6))
    assert top[0] > 200 and top[2] < 60  # the left (red) half is now on top
    assert bottom[2] > 200 and bottom[0] < 60


def test_cmyk_decodes_to_rgb() -> None:
    image = Image.new("CMYK", (3, 2), (0, 0, 0, 0))
    image.putpixel((1, 0), (0, 255, 255, 0))
    for fmt in ("TIFF", "JPEG"):
        decoded = load(MediaLoader(MediaConfig()), data_uri(encode(image, fmt)))
        assert (decoded.width, decoded.height, decoded.image.mode) == (3, 2, "RGB")
        red, white = decoded.image.getpixel((1, 0)), decoded.image.getpixel((0, 1))
        assert red[0] > 230 and red[1] < 30 and red[2] < 30, fmt
        assert min(white) > 230, fmt


def test_16_bit_grayscale_keeps_its_range() -> None:
    image = Image.new("I;16", (3, 1))
    for x, value in enumerate((65535, 32768, 256)):
        image.putpixel((x, 0), value)
    decoded = load(MediaLoader(MediaConfig()), data_uri(encode(image, "PNG")))
    assert pixels(decoded) == [(255, 255, 255), (128, 128, 128), (1, 1, 1)]


def test_palette_with_transparency_is_composited_onto_white() -> None:
    image = Image.new("P", (2, 1))
    image.putpalette([255, 0, 0, 0, 255, 0])
    image.putpixel((1, 0), 1)
    decoded = load(MediaLoader(MediaConfig()), data_uri(encode(image, "PNG", transparency=0)))
    assert pixels(decoded) == [(255, 255, 255), (0, 255, 0)]


def test_alpha_is_composited_onto_white() -> None:
    image = Image.new("RGBA", (3, 1))
    image.putdata([(10, 20, 30, 0), (255, 0, 0, 255), (0, 0, 0, 128)])
    decoded = load(MediaLoader(MediaConfig()), data_uri(encode(image, "PNG")))
    clear, red, half = pixels(decoded)
    assert clear == (255, 255, 255) and red == (255, 0, 0)
    assert all(abs(c - 127) <= 1 for c in half)

    la = Image.new("LA", (2, 1))
    la.putdata([(0, 0), (100, 255)])
    assert pixels(load(MediaLoader(MediaConfig()), data_uri(encode(la, "PNG")))) == [
        (255, 255, 255),
        (100, 100, 100),
    ]


def test_colours_hidden_under_full_transparency_do_not_change_the_hash() -> None:
    a, b = Image.new("RGBA", (2, 2), (0, 0, 0, 0)), Image.new("RGBA", (2, 2), (9, 99, 199, 0))
    loader = MediaLoader(MediaConfig())
    assert (
        load(loader, data_uri(encode(a, "PNG"))).content_hash
        == load(loader, data_uri(encode(b, "PNG"))).content_hash
    )


def test_grayscale_becomes_rgb() -> None:
    decoded = load(MediaLoader(MediaConfig()), data_uri(encode(Image.new("L", (2, 3), 77), "PNG")))
    assert decoded.image.mode == "RGB" and set(pixels(decoded)) == {(77, 77, 77)}


def test_animated_gif_uses_the_first_frame() -> None:
    frames = [Image.new("RGB", (5, 4), (255, 0, 0)), Image.new("RGB", (5, 4), (0, 0, 255))]
    buf = io.BytesIO()
    frames[0].save(buf, "GIF", save_all=True, append_images=frames[1:], duration=50, loop=0)
    decoded = load(MediaLoader(MediaConfig()), data_uri(buf.getvalue(), "image/gif"))
    assert (decoded.width, decoded.height, decoded.image.mode) == (5, 4, "RGB")
    assert set(pixels(decoded)) == {(255, 0, 0)}


# --- limits checked before decoding ----------------------------------------------------------


@pytest.mark.parametrize("side", [9_000, 100_000])  # under and over Pillow's own bomb limit
def test_pixel_bomb_is_refused_from_the_header(side: int) -> None:
    start = time.monotonic()
    err = load_error(MediaLoader(MediaConfig()), data_uri(png_claiming(side, side)))
    assert (err.status, err.code) == (413, "too_large")
    assert "--max-image-pixels" in err.message
    assert time.monotonic() - start < 1  # 10^10 pixels were certainly not decoded


def test_pixel_limit_is_checked_before_any_pixel_is_decoded(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    data = data_uri(encode(sample_image(64, 64), "PNG"))

    def no_decoding(self: ImageFile.ImageFile) -> None:
        raise AssertionError("pixels were decoded")

    monkeypatch.setattr(ImageFile.ImageFile, "load", no_decoding)
    err = load_error(MediaLoader(MediaConfig(max_image_pixels=1000)), data)
    assert err.status == 413 and "64x64 = 4096 pixels" in err.message


def test_undecodable_bytes_are_a_400_with_the_reason() -> None:
    good = encode(sample_image(), "PNG")
    for payload in (b"not an image at all", good[: len(good) // 2], b""):
        err = load_error(MediaLoader(MediaConfig()), data_uri(payload))
        assert (err.status, err.code) == (400, "image_decode_failed")
        assert err.message.startswith("could not decode image")


def test_a_damaged_file_of_a_known_format_is_not_called_unsupported() -> None:
    """Invariant: bytes that start like a supported format but do not open are reported as
    truncated or corrupt data of that format; bytes of no known format name the formats we
    decode."""
    loader = MediaLoader(MediaConfig())
    for payload, name in ((b"GIF89a", "GIF"), (b"\x89PNG\r\n\x1a\n\x00", "PNG"),
                          (b"RIFF\x10\x00\x00\x00WEBPVP8 ", "WEBP")):  # fmt: skip
        err = load_error(loader, data_uri(payload))
        assert (err.status, err.code) == (400, "image_decode_failed")
        assert f"the {name} data is truncated or corrupt" in err.message, err.message
    err = load_error(loader, data_uri(b"not an image at all"))
    assert "not a supported image format (supported: PNG" in err.message


# --- data URIs -------------------------------------------------------------------------------


def test_data_uri_tolerates_whitespace_and_missing_padding() -> None:
    data = encode(sample_image(), "PNG")
    b64 = base64.b64encode(data).decode()
    assert b64.endswith("=")  # so stripping it really drops padding
    wrapped = "\n".join(b64[i : i + 60] for i in range(0, len(b64), 60))
    loader = MediaLoader(MediaConfig())
    hashes = {
        load(loader, f"data:image/png;base64,{text}").content_hash
        for text in (b64, wrapped, b64.rstrip("="), " " + b64 + "\r\n")
    }
    assert len(hashes) == 1


@pytest.mark.parametrize(
    "uri, fragment",
    [
        ("data:image/png;base64,iVBO$$$$", "invalid base64"),
        ("data:image/png;base64,iVBORw0KG", "invalid base64"),
        ("data:image/png;base64,iVB=ORw0", "invalid base64"),
        ("data:text/plain;base64,aGVsbG8=", "not an image"),
        ("data:;base64,aGVsbG8=", "not an image"),
        ("data:image/png,%89PNG", "not base64"),
        ("data:image/png;base64", "no ','"),
    ],
)
def test_malformed_data_uris_are_400s(uri: str, fragment: str) -> None:
    err = load_error(MediaLoader(MediaConfig()), uri)
    assert (err.status, err.code) == (400, "invalid_data_uri") and fragment in err.message


def test_data_uri_over_the_byte_cap_is_413() -> None:
    data = encode(sample_image(), "PNG")
    err = load_error(MediaLoader(MediaConfig(max_image_bytes=len(data) - 1)), data_uri(data))
    assert err.status == 413 and "--max-image-bytes" in err.message


def parse_outcome(payload: str, max_bytes: int) -> tuple[object, ...]:
    try:
        return ("ok", parse_data_uri("data:image/png;base64," + payload, max_bytes))
    except APIError as err:
        return ("error", err.status, err.code, err.message)


def _base64_mutant(data: bytes, op: int, position: int, char: str) -> str:
    text = base64.b64encode(data).decode()
    cut = position % (len(text) + 1)
    return [
        text,
        text.rstrip("="),
        text + "=" * (op % 3 + 1),
        text[:cut] + char + text[cut:],
        text[:cut],
        "\n".join(text[i : i + 4] for i in range(0, len(text), 4)),
    ][op % 6]


BASE64_TEXT = st.one_of(
    st.text(alphabet="QUJDRWFiYz0189+/=  \t\r\n\x0b\x0c-_.\xe9\u2028", max_size=24),
    st.builds(
        _base64_mutant,
        st.binary(max_size=20),
        st.integers(0, 5),
        st.integers(0, 40),
        st.sampled_from(list("=A/+ \n\t-_\x0b\xe9")),
    ),
)


@settings(max_examples=600, deadline=None)
@given(payload=BASE64_TEXT, max_bytes=st.integers(0, 24))
def test_fast_data_uri_parse_equals_the_checked_parse(payload: str, max_bytes: int) -> None:
    """The fast path (strict C base64, no regex) changes nothing observable: same bytes, or the
    same 400/413 with the same message, as the regex-validated path alone."""
    fast = parse_outcome(payload, max_bytes)
    with pytest.MonkeyPatch.context() as patch:  # the parse as it was: regexes, checked decode
        patch.setattr(media_sources, "_decode_fast", lambda body: None)
        patch.setattr(
            media_sources, "_strip_base64_space", lambda text: re.sub(r"[ \t\r\n]+", "", text)
        )
        assert parse_outcome(payload, max_bytes) == fast


@pytest.mark.skipif(not media_sources._STRICT_A2B, reason="Python 3.10: checked path only")
def test_valid_base64_never_takes_the_slow_checked_path(monkeypatch: pytest.MonkeyPatch) -> None:
    def checked(body: str) -> bytes:
        raise AssertionError("valid base64 went through the regex checks")

    monkeypatch.setattr(media_sources, "_decode_checked", checked)
    data = encode(sample_image(), "PNG")
    text = base64.b64encode(data).decode()
    wrapped = "\r\n".join(text[i : i + 76] for i in range(0, len(text), 76))
    for payload in (text, text.rstrip("="), wrapped):
        assert parse_data_uri("data:image/png;base64," + payload, 1 << 20) == data


# --- local paths -----------------------------------------------------------------------------


def test_paths_are_disabled_without_an_allowed_dir(tmp_path: Path) -> None:
    (tmp_path / "a.png").write_bytes(encode(sample_image(), "PNG"))
    for ref in (str(tmp_path / "a.png"), f"file://{tmp_path}/a.png"):
        err = load_error(MediaLoader(MediaConfig()), ref)
        assert (err.status, err.code) == (400, "image_path_forbidden")
        assert "--allowed-media-dir DIR" in err.message


def test_traversal_and_symlink_escapes_are_refused_alike(root: Path) -> None:
    secret = root.parent / "secret.png"
    secret.write_bytes(encode(sample_image(), "PNG"))
    (root / "escape.png").symlink_to(secret)
    (root / "inner.png").write_bytes(encode(sample_image(), "PNG"))
    (root / "alias.png").symlink_to(root / "inner.png")  # a link that stays inside is fine
    loader = MediaLoader(MediaConfig(allowed_media_dirs=(root,)))
    refused = [
        f"{root}/../secret.png",
        f"{root}/../missing.png",  # same answer whether or not the file exists
        str(root / "escape.png"),
        f"file://{root}/%2e%2e/secret.png",
        "/etc/passwd",
    ]
    for ref in refused:
        err = load_error(loader, ref)
        assert (err.status, err.code) == (400, "image_path_forbidden"), ref
        assert "outside the allowed media directories" in err.message
    assert load(loader, str(root / "alias.png")).width == 7


def test_non_regular_files_are_refused(root: Path) -> None:
    (root / "sub").mkdir()
    os.mkfifo(root / "pipe.png")
    loader = MediaLoader(MediaConfig(allowed_media_dirs=(root,)))
    err = load_error(loader, str(root / "sub"))
    assert err.code == "image_path_invalid" and "directory" in err.message
    start = time.monotonic()
    err = load_error(loader, str(root / "pipe.png"))  # opening a FIFO must not block
    assert err.code == "image_path_invalid" and "not a regular file" in err.message
    assert time.monotonic() - start < 1
    devices = MediaLoader(MediaConfig(allowed_media_dirs=(Path("/dev"),)))
    for device in ("/dev/zero", "/dev/null"):
        assert "not a regular file" in load_error(devices, device).message


def test_missing_oversized_and_relative_paths(root: Path) -> None:
    data = encode(sample_image(), "PNG")
    (root / "a.png").write_bytes(data)
    loader = MediaLoader(MediaConfig(allowed_media_dirs=(root,), max_image_bytes=len(data) - 1))
    assert "does not exist" in load_error(loader, str(root / "nope.png")).message
    err = load_error(loader, str(root / "a.png"))
    assert err.status == 413 and "--max-image-bytes" in err.message
    err = load_error(loader, "media/a.png")
    assert (err.status, err.code) == (400, "unsupported_image_source")
    assert "data:image/" in err.message and "--allowed-media-dir" in err.message
    assert "only local files" in load_error(loader, f"file://example.com{root}/a.png").message


# --- memo ------------------------------------------------------------------------------------


def test_memo_hit_skips_decoding() -> None:
    uri = data_uri(encode(sample_image(), "PNG"))
    loader = MediaLoader(MediaConfig())
    first, second = load(loader, uri), load(loader, uri)
    stats = loader.stats()
    assert (stats["decodes"], stats["memo_hits"]) == (1, 1)
    assert second.decode_seconds == 0.0 and first.decode_seconds > 0
    assert second.content_hash == first.content_hash and second.image is first.image

    no_memo = MediaLoader(MediaConfig(decode_memo_mb=0))
    load(no_memo, uri), load(no_memo, uri)
    assert no_memo.stats()["decodes"] == 2


def test_repeated_data_uri_text_skips_base64_and_decoding(monkeypatch: pytest.MonkeyPatch) -> None:
    uri = data_uri(encode(sample_image(), "PNG"))
    loader = MediaLoader(MediaConfig())
    first = load(loader, uri)

    def forbidden(*args: object) -> None:
        raise AssertionError("a repeat of the same data URI text was parsed or decoded")

    monkeypatch.setattr(media, "parse_data_uri", forbidden)
    monkeypatch.setattr(media, "decode_and_hash", forbidden)
    second = load(loader, uri)
    assert second.image is first.image and second.content_hash == first.content_hash
    assert (second.source, second.decode_seconds) == ("data", 0.0)
    stats = loader.stats()
    assert (stats["decodes"], stats["memo_hits"], stats["data_uri_memo_hits"]) == (1, 1, 1)


def test_same_bytes_in_other_data_uri_text_share_one_decode() -> None:
    data = encode(sample_image(), "PNG")
    text = base64.b64encode(data).decode()
    uris = [
        data_uri(data),
        data_uri(data, "image/jpeg"),  # the label is not the format: still the same image
        "data:image/png;base64," + "\n".join(text[i : i + 60] for i in range(0, len(text), 60)),
    ]
    loader = MediaLoader(MediaConfig())
    results = [load(loader, uri) for uri in uris + uris]
    assert len({r.content_hash for r in results}) == 1
    stats = loader.stats()
    assert (stats["decodes"], stats["data_uri_memo_hits"], stats["memo_entries"]) == (1, 3, 1)


def test_failing_data_uris_fail_the_same_way_every_time() -> None:
    good = encode(sample_image(), "PNG")
    loader = MediaLoader(MediaConfig(max_image_bytes=len(good) - 1))
    for uri in (
        data_uri(good),  # 413: over the byte cap
        data_uri(b"not an image"),  # 400: undecodable
        "data:image/png;base64,iVB=ORw0",  # 400: invalid base64
    ):
        errors = {(e.status, e.code, e.message) for e in (load_error(loader, uri) for _ in "abc")}
        assert len(errors) == 1, errors
    assert loader.stats()["data_uri_memo_hits"] == 0


def test_data_uri_index_falls_through_once_the_image_is_evicted() -> None:
    uris = [data_uri(encode(sample_image(400, 300 + i), "PNG")) for i in range(3)]
    loader = MediaLoader(MediaConfig(decode_memo_mb=1))  # room for two 400x300 images
    first = [load(loader, uri) for uri in uris]
    again = load(loader, uris[0])  # evicted by the third: decoded again, same pixels
    assert again.content_hash == first[0].content_hash and again.decode_seconds > 0
    assert loader.stats()["decodes"] == 4


def test_concurrent_loads_of_the_same_bytes_decode_once() -> None:
    uri = data_uri(encode(sample_image(300, 200), "PNG"))
    loader = MediaLoader(MediaConfig())

    async def go() -> set[str]:
        results = await asyncio.gather(*(loader.load(uri) for _ in range(6)))
        return {r.content_hash for r in results}

    assert len(run(go())) == 1
    assert loader.stats()["decodes"] == 1


# --- load_all --------------------------------------------------------------------------------


def test_load_all_keeps_order() -> None:
    colours = [(255, 0, 0), (0, 255, 0), (0, 0, 255), (255, 0, 0)]
    refs = [
        (data_uri(encode(Image.new("RGB", (2, 2), c), "PNG")), f"m[{i}]")
        for i, c in enumerate(colours)
    ]
    results = run(MediaLoader(MediaConfig()).load_all(refs))
    assert [r.image.getpixel((0, 0)) for r in results] == colours


def test_load_all_enforces_image_count_and_request_pixels() -> None:
    uri = data_uri(encode(sample_image(10, 10), "PNG"))
    loader = MediaLoader(MediaConfig(max_images_per_request=2))
    with pytest.raises(APIError) as info:
        run(loader.load_all([(uri, "a"), (uri, "b"), (uri, "c")]))
    assert info.value.status == 400 and "--max-images-per-request" in info.value.message

    loader = MediaLoader(MediaConfig(max_image_pixels=100, max_request_pixels=150))
    with pytest.raises(APIError) as info:
        run(loader.load_all([(uri, "a"), (uri, "b")]))
    assert info.value.status == 413 and "--max-request-pixels" in info.value.message


def test_load_all_reports_the_failing_images_param() -> None:
    good = data_uri(encode(sample_image(), "PNG"))
    with pytest.raises(APIError) as info:
        run(MediaLoader(MediaConfig()).load_all([(good, "m[0]"), ("data:text/plain,x", "m[1]")]))
    assert info.value.param == "m[1]"


# --- any input: only 4xx APIErrors -----------------------------------------------------------


def offline_loader(root: Path) -> MediaLoader:
    """A loader whose URL fetches never leave the process (mock transport, fake resolver)."""

    async def resolver(host: str, port: int) -> list[str]:
        raise OSError("no DNS in property tests")

    def transport(_backend: object) -> httpx.AsyncBaseTransport:
        return httpx.MockTransport(lambda request: httpx.Response(200, content=b"\x89PNG junk"))

    config = MediaConfig(allowed_media_dirs=(root,), max_image_pixels=1_000_000)
    return MediaLoader(config, resolver=resolver, transport_factory=transport)


SEEDS = [encode(sample_image(), f) for f in ("PNG", "GIF", "JPEG", "BMP", "TIFF", "WEBP")]
references = st.one_of(
    st.text(max_size=200),
    st.builds(
        lambda p, s: p + s,
        st.sampled_from(
            ["data:", "http://", "https://", "file://", "/", "data:image/png;base64,", "ftp:"]
        ),
        st.text(max_size=100),
    ),
)


@pytest.fixture(scope="module")
def loop_and_loader(
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[tuple[asyncio.AbstractEventLoop, MediaLoader]]:
    """One event loop and loader for all examples of a property test (module-scoped, so
    hypothesis does not rerun a function-scoped fixture per example); its allowed folder is
    empty."""
    loop = asyncio.new_event_loop()
    yield loop, offline_loader(tmp_path_factory.mktemp("empty-root"))
    loop.close()


def assert_only_4xx(
    loop_and_loader: tuple[asyncio.AbstractEventLoop, MediaLoader], ref: object
) -> None:
    loop, loader = loop_and_loader
    unexpected_before = loader.stats()["unexpected_errors"]
    try:
        loop.run_until_complete(loader.load(ref, "p"))  # type: ignore[arg-type]
    except APIError as err:
        assert 400 <= err.status < 500 and err.param == "p"
    # The guard in load() turns bugs into 400s; here they must not happen at all.
    assert loader.stats()["unexpected_errors"] == unexpected_before


@settings(max_examples=300, deadline=None)
@given(ref=references)
def test_any_string_yields_an_image_or_a_4xx(
    loop_and_loader: tuple[asyncio.AbstractEventLoop, MediaLoader], ref: str
) -> None:
    assert_only_4xx(loop_and_loader, ref)


@pytest.mark.filterwarnings("ignore::UserWarning")  # Pillow warns about the corrupt EXIF we feed
@settings(max_examples=300, deadline=None)
@given(
    payload=st.one_of(
        st.binary(max_size=300),
        st.builds(
            lambda seed, flips: _mutate(SEEDS[seed], flips),
            st.integers(0, len(SEEDS) - 1),
            st.lists(st.tuples(st.integers(0, 10**6), st.integers(0, 255)), max_size=8),
        ),
    ),
    mime=st.sampled_from(["image/png", "image/jpeg", "image/gif", "image/webp"]),
)
def test_any_data_uri_payload_yields_an_image_or_a_4xx(
    loop_and_loader: tuple[asyncio.AbstractEventLoop, MediaLoader], payload: bytes, mime: str
) -> None:
    assert_only_4xx(loop_and_loader, data_uri(payload, mime))


def _mutate(data: bytes, flips: list[tuple[int, int]]) -> bytes:
    out = bytearray(data)
    for position, value in flips:
        out[position % len(out)] = value
    if flips and flips[0][1] % 3 == 0:
        del out[flips[0][0] % len(out) :]  # also truncate sometimes
    return bytes(out)


def test_non_string_input_is_a_400() -> None:
    err = load_error(MediaLoader(MediaConfig()), 42)  # type: ignore[arg-type]
    assert err.status == 400


def test_audio_clips_count_against_the_media_limit() -> None:
    """Invariant: images, videos and audio clips together are held to
    --max-images-per-request before any is fetched or decoded (400 too_many_images)."""
    loader = MediaLoader(MediaConfig(max_images_per_request=3))
    loader.check_media_count(1, 0, 2)  # at the limit
    with pytest.raises(APIError) as refused:
        loader.check_media_count(1, 0, 3)
    assert refused.value.status == 400 and refused.value.code == "too_many_images"
    assert "3 audio clips" in refused.value.message
