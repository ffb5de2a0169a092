"""Encoded image bytes -> RGB pixels and their content hash (Pillow; blocking, CPU-bound).

Contract of `decode_rgb`: it returns a fully loaded RGB image with EXIF orientation applied,
taken from the first frame of animated images, or raises `APIError` (400 for undecodable input,
413 for a pixel count over the limit; `param` None). The pixel count is checked from the header
before any pixel data is decoded.

Conversion rules (one per source kind, so equal visible pixels hash equally):
- alpha (RGBA, LA, PA, premultiplied modes, palette or RGB/L with a transparent colour) is
  composited onto opaque white, i.e. what a browser shows on a white page. Plain conversion
  would instead expose the colours stored under transparent pixels, which are invisible and
  vary from encoder to encoder;
- 16-bit and 32-bit integer grayscale (I;16*, I) keep the top 8 of 16 bits (value >> 8, values
  clipped to 0..65535): Pillow's own conversion clips to 255 and turns such images white;
- CMYK, YCbCr, 1-bit and 8-bit grayscale use Pillow's conversion; float (F) clips to 0..255;
- ICC profiles are not applied.

Thread safety: pure functions of their inputs; call them from worker threads.
"""

from __future__ import annotations

import io
import logging
import struct
import time
import warnings

import numpy as np
from PIL import Image, ImageOps, UnidentifiedImageError

from caches.hashing import pixel_hash
from gateway.errors import APIError, invalid, too_large

log = logging.getLogger(__name__)

DECODE_CODE = "image_decode_failed"
# Formats with a mature decoder in Pillow. Excluded on purpose: EPS (runs Ghostscript), and
# exotic formats whose plugins see little hardening.
_WANTED_FORMATS = ("PNG", "JPEG", "MPO", "WEBP", "GIF", "BMP", "TIFF", "AVIF")
_ALPHA_MODES = frozenset({"RGBA", "LA", "PA", "RGBa", "La"})
_INT_GRAY_MODES = frozenset({"I", "I;16", "I;16L", "I;16B", "I;16N"})
# Errors Pillow's plugins raise on malformed input. Anything else is unexpected: still a 400
# for the client, but logged with a traceback so real bugs stay visible.
_EXPECTED_ERRORS = (OSError, SyntaxError, ValueError, EOFError, struct.error)


def supported_formats() -> tuple[str, ...]:
    """The wanted formats this Pillow build can open."""
    Image.init()
    return tuple(f for f in _WANTED_FORMATS if f in Image.OPEN)


def raise_pillow_pixel_limit(max_image_pixels: int) -> None:
    """Make sure Pillow's process-wide bomb limit never refuses an image our limit allows.

    Pillow warns above MAX_IMAGE_PIXELS and raises above twice that. Only ever raised, never
    lowered or disabled, because other code in the process may rely on it.
    """
    current = Image.MAX_IMAGE_PIXELS
    if current is not None and current < max_image_pixels:
        Image.MAX_IMAGE_PIXELS = max_image_pixels
    # Its warning (between the limit and twice it) comes before `decode_rgb` refuses such an
    # image with a 413 of its own: in the log it is only noise about a request already refused.
    warnings.filterwarnings("ignore", category=Image.DecompressionBombWarning)


def _pixel_limit_error(detail: str, max_pixels: int) -> APIError:
    return too_large(
        f"image {detail}, over the limit of {max_pixels} pixels per image "
        "(the limit is set by --max-image-pixels)"
    )


def to_rgb(image: Image.Image) -> Image.Image:
    """`image` as RGB by the module's conversion rules (may return `image` itself)."""
    mode = image.mode
    if mode in _ALPHA_MODES or "transparency" in image.info:
        rgba = image.convert("RGBA")
        white = Image.new("RGBA", rgba.size, (255, 255, 255, 255))
        white.alpha_composite(rgba)
        return white.convert("RGB")
    if mode == "RGB":
        return image
    if mode in _INT_GRAY_MODES:
        values = np.asarray(image).astype(np.int64)
        gray = (np.clip(values, 0, 65535) >> 8).astype(np.uint8)
        return Image.fromarray(gray).convert("RGB")
    if mode == "F":
        return image.convert("L").convert("RGB")
    return image.convert("RGB")


def decode_rgb(data: bytes, max_pixels: int) -> Image.Image:
    """Decode `data` into a loaded RGB image (see the module docstring for the contract)."""
    try:
        with Image.open(io.BytesIO(data), formats=supported_formats()) as source:
            width, height = source.size
            if width <= 0 or height <= 0:
                raise invalid(f"could not decode image: size {width}x{height}", code=DECODE_CODE)
            if width * height > max_pixels:
                raise _pixel_limit_error(
                    f"is {width}x{height} = {width * height} pixels", max_pixels
                )
            source.load()  # first frame only: an animated image starts at frame 0
            return to_rgb(_apply_exif_orientation(source))
    except APIError:
        raise
    except Image.DecompressionBombError as exc:
        raise _pixel_limit_error(f"is too large to decode safely ({exc})", max_pixels) from None
    except UnidentifiedImageError:
        raise invalid(_unidentified_message(data), code=DECODE_CODE) from None
    except _EXPECTED_ERRORS as exc:
        known = _known_format(data)
        damaged = f"the {known} data is truncated or corrupt ({exc})" if known else str(exc)
        raise invalid(f"could not decode image: {damaged}", code=DECODE_CODE) from None
    except Exception as exc:
        log.exception("unexpected error from Pillow while decoding an image")
        raise invalid(
            f"could not decode image: {type(exc).__name__}: {exc}", code=DECODE_CODE
        ) from None


# Leading bytes of the supported formats: a file that starts like one but does not open is
# damaged (truncated, corrupt), not of an unsupported format, and the message says so.
_SIGNATURES = {
    b"\x89PNG\r\n\x1a\n": "PNG",
    b"\xff\xd8\xff": "JPEG",
    b"GIF87a": "GIF",
    b"GIF89a": "GIF",
    b"BM": "BMP",
    b"II*\x00": "TIFF",
    b"MM\x00*": "TIFF",
}


def _known_format(data: bytes) -> str | None:
    """The supported format `data` starts like, if any (by its leading bytes)."""
    known = next((f for sig, f in _SIGNATURES.items() if data.startswith(sig)), None)
    if known is None and data[:4] == b"RIFF" and data[8:12] == b"WEBP":
        known = "WEBP"
    return known if known in supported_formats() else None


def _unidentified_message(data: bytes) -> str:
    """Why Pillow could not identify `data`: a damaged file of a known format, or a format
    we do not decode."""
    known = _known_format(data)
    if known is not None:
        return f"could not decode image: the {known} data is truncated or corrupt"
    return (
        "could not decode image: not a supported image format (supported: "
        f"{', '.join(supported_formats())})"
    )


def _apply_exif_orientation(image: Image.Image) -> Image.Image:
    try:
        return ImageOps.exif_transpose(image)
    except Exception as exc:
        # A malformed EXIF block should not make an otherwise fine photo unusable.
        log.debug("ignoring unreadable EXIF orientation: %r", exc)
        return image.copy()  # the caller closes `image`; the copy outlives it


def decode_and_hash(data: bytes, max_pixels: int) -> tuple[Image.Image, str, float, float]:
    """(RGB image, pixel hash, decode seconds, hash seconds). Blocking: run in a thread."""
    start = time.perf_counter()
    image = decode_rgb(data, max_pixels)
    decoded = time.perf_counter()
    width, height = image.size
    digest = pixel_hash("RGB", width, height, image.tobytes())
    return image, digest, decoded - start, time.perf_counter() - decoded
