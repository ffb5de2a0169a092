"""Image references -> encoded bytes, for the sources that need no network: base64 data URIs
and local files.

Local paths (absolute paths and file:// URLs) are read only below the allowed roots. The path is
resolved with symlinks followed and must stay inside a root; whether a path outside the roots
exists is never revealed. Only regular files are read (no devices, FIFOs, directories).

Every failure is an `APIError` (4xx, `param` None: the caller fills it in). The functions are
blocking and thread-safe; the loader runs the file reads in worker threads.
"""

from __future__ import annotations

import base64
import binascii
import os
import re
import stat
import urllib.parse
from collections.abc import Sequence
from pathlib import Path

from gateway.errors import APIError, invalid, too_large
from gateway.url_policy import shorten

_BASE64_BODY = re.compile(r"^[A-Za-z0-9+/]*={0,2}$")
_BASE64_SPACE = re.compile(r"[ \t\r\n]+")


def parse_data_uri(uri: str, max_bytes: int) -> bytes:
    """The bytes of a `data:image/<type>;base64,<data>` URI.

    Tolerates ASCII whitespace inside the base64 and missing `=` padding; anything else that is
    not standard base64 is a 400. A decoded size over `max_bytes` is a 413 (checked before
    decoding, from the encoded length).
    """
    header, comma, payload = uri.partition(",")
    if not comma:
        raise invalid(
            "invalid data URI: no ',' separates the header from the data; expected "
            "data:image/<type>;base64,<data>",
            code="invalid_data_uri",
        )
    parts = [p.strip().lower() for p in header[len("data:") :].split(";")]
    mime = parts[0]
    if not mime.startswith("image/"):
        raise invalid(
            f"data URI has media type {shorten(mime or '(none)', 60)!r}, not an image; "
            "expected data:image/<type>;base64,<data>",
            code="invalid_data_uri",
        )
    if "base64" not in parts[1:]:
        raise invalid(
            "data URI is not base64-encoded; expected data:image/<type>;base64,<data>",
            code="invalid_data_uri",
        )
    body = _BASE64_SPACE.sub("", payload)
    if len(body) // 4 * 3 > max_bytes + 3:
        raise too_large(
            f"data URI image is about {len(body) // 4 * 3} bytes, over the limit of {max_bytes} "
            "bytes per image (the limit is set by --max-image-bytes)"
        )
    if not _BASE64_BODY.match(body):
        bad = next(
            (i for i, c in enumerate(body) if not (c.isascii() and (c.isalnum() or c in "+/="))),
            None,
        )
        where = f"unexpected character {body[bad]!r}" if bad is not None else "misplaced '='"
        raise invalid(
            f"invalid base64 in data URI: {where}; use the standard alphabet (A-Z a-z 0-9 + /)",
            code="invalid_data_uri",
        )
    if len(body.rstrip("=")) % 4 == 1:
        raise invalid("invalid base64 in data URI: truncated data", code="invalid_data_uri")
    try:
        data = base64.b64decode(body + "=" * (-len(body) % 4), validate=True)
    except (binascii.Error, ValueError) as exc:
        raise invalid(f"invalid base64 in data URI: {exc}", code="invalid_data_uri") from None
    if len(data) > max_bytes:
        raise too_large(
            f"data URI image is {len(data)} bytes, over the limit of {max_bytes} bytes per "
            "image (the limit is set by --max-image-bytes)"
        )
    return data


def file_url_path(url: str) -> str:
    """The local path of a `file:///abs/path` (or `file://localhost/...`) URL."""
    try:
        parts = urllib.parse.urlsplit(url)
    except ValueError as exc:  # e.g. an unbalanced '[' in the authority
        raise invalid(
            f"file URL {shorten(url, 80)!r} is not a valid URL: {exc}", code="invalid_image_url"
        ) from None
    if parts.netloc not in ("", "localhost"):
        raise invalid(
            f"file URL {shorten(url, 80)!r} names host {parts.netloc!r}; only local files "
            "(file:///path) are supported",
            code="unsupported_image_source",
        )
    if parts.query or parts.fragment:
        raise invalid(
            f"file URL {shorten(url, 80)!r} has a query or fragment; percent-encode '?' and '#'",
            code="invalid_image_url",
        )
    path = urllib.parse.unquote(parts.path)
    if not path.startswith("/"):
        raise invalid(
            f"file URL {shorten(url, 80)!r} is not absolute; use file:///absolute/path",
            code="invalid_image_url",
        )
    return path


def _inside(path: Path, roots: Sequence[Path]) -> bool:
    return any(path == root or path.is_relative_to(root) for root in roots)


def read_media_file(path: str, roots: Sequence[Path], max_bytes: int) -> bytes:
    """Read a regular file below one of `roots` (resolved directories). Blocking.

    Order matters: the containment check runs on the symlink-resolved path before existence
    is tested, so a refused path says the same whether or not it exists.
    """
    shown = shorten(path, 80)
    if not roots:
        raise invalid(
            f"local image paths are disabled (got {shown!r}); start the server with "
            "--allowed-media-dir DIR to serve images from DIR",
            code="image_path_forbidden",
        )
    outside = invalid(
        f"image path {shown!r} is outside the allowed media directories (--allowed-media-dir)",
        code="image_path_forbidden",
    )
    if "\x00" in path or not path.startswith("/"):
        raise invalid(
            f"image path {shown!r} is not a valid absolute path", code="invalid_image_url"
        )
    try:
        loose = Path(path).resolve(strict=False)
        if not _inside(loose, roots):
            raise outside
        real = Path(path).resolve(strict=True)
        if not _inside(real, roots):  # changed between the two resolutions
            raise outside
        info = os.stat(real)
    except FileNotFoundError:
        raise invalid(f"image path {shown!r} does not exist", code="image_path_invalid") from None
    except (OSError, RuntimeError) as exc:  # RuntimeError: symlink loop on some Pythons
        reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
        raise invalid(
            f"image path {shown!r} cannot be accessed: {reason}", code="image_path_invalid"
        ) from None
    _check_regular(info, shown, max_bytes)
    # O_NONBLOCK: if the file was swapped for a FIFO after the stat, opening must not hang.
    flags = os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_CLOEXEC", 0)
    try:
        fd = os.open(real, flags)
    except OSError as exc:
        raise invalid(
            f"image path {shown!r} cannot be read: {exc.strerror}", code="image_path_invalid"
        ) from None
    try:
        _check_regular(os.fstat(fd), shown, max_bytes)
        with os.fdopen(fd, "rb", closefd=False) as f:
            data = f.read(max_bytes + 1)
    except OSError as exc:
        raise invalid(
            f"image path {shown!r} cannot be read: {exc.strerror or exc}",
            code="image_path_invalid",
        ) from None
    finally:
        os.close(fd)
    if len(data) > max_bytes:
        raise _file_too_large(shown, max_bytes)
    return data


def _check_regular(info: os.stat_result, shown: str, max_bytes: int) -> None:
    if stat.S_ISDIR(info.st_mode):
        raise invalid(f"image path {shown!r} is a directory", code="image_path_invalid")
    if not stat.S_ISREG(info.st_mode):
        raise invalid(
            f"image path {shown!r} is not a regular file (device, FIFO or socket)",
            code="image_path_invalid",
        )
    if info.st_size > max_bytes:
        raise _file_too_large(shown, max_bytes)


def _file_too_large(shown: str, max_bytes: int) -> APIError:
    return too_large(
        f"image file {shown!r} is over the limit of {max_bytes} bytes per image "
        "(the limit is set by --max-image-bytes)"
    )
