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
import sys
import urllib.parse
from collections.abc import Sequence
from pathlib import Path

from gateway.errors import APIError, invalid, too_large
from gateway.media.url_policy import shorten

_ARTICLE = {"image": "an image", "video": "a video", "audio": "audio"}
_PLURAL = {"image": "images", "video": "videos", "audio": "audio"}
_UNIT = {"image": "image", "video": "video", "audio": "audio clip"}
_BASE64_BODY = re.compile(r"^[A-Za-z0-9+/]*={0,2}$")
# b64decode(validate=True) is a strict a2b_base64 from Python 3.11 on; 3.10 has no strict mode
# (it validates with a regex instead), so there every payload takes the checked path.
_STRICT_A2B = sys.version_info >= (3, 11)


def parse_data_uri(uri: str, max_bytes: int, kind: str = "image") -> bytes:
    """The bytes of a `data:<kind>/<type>;base64,<data>` URI (`kind`: "image" or "video").

    Tolerates ASCII whitespace inside the base64 and missing `=` padding; anything else that is
    not standard base64 is a 400. A decoded size over `max_bytes` is a 413 (checked before
    decoding, from the encoded length). Valid input costs one strict C base64 pass (no regex);
    only invalid input pays for the checks that name the problem.
    """
    header, comma, payload = uri.partition(",")
    if not comma:
        raise invalid(
            "invalid data URI: no ',' separates the header from the data; expected "
            f"data:{kind}/<type>;base64,<data>",
            code="invalid_data_uri",
        )
    parts = [p.strip().lower() for p in header[len("data:") :].split(";")]
    mime = parts[0]
    if not mime.startswith(f"{kind}/"):
        raise invalid(
            f"data URI has media type {shorten(mime or '(none)', 60)!r}, not {_ARTICLE[kind]}; "
            f"expected data:{kind}/<type>;base64,<data>",
            code="invalid_data_uri",
        )
    if "base64" not in parts[1:]:
        raise invalid(
            f"data URI is not base64-encoded; expected data:{kind}/<type>;base64,<data>",
            code="invalid_data_uri",
        )
    body = _strip_base64_space(payload)
    if len(body) // 4 * 3 > max_bytes + 3:
        raise too_large(
            f"data URI {kind} is about {len(body) // 4 * 3} bytes, over the limit of {max_bytes} "
            f"bytes per {kind} (the limit is set by --max-{kind}-bytes)"
        )
    data = _decode_fast(body)
    if data is None:
        data = _decode_checked(body)
    if len(data) > max_bytes:
        raise too_large(
            f"data URI {kind} is {len(data)} bytes, over the limit of {max_bytes} bytes per "
            f"{kind} (the limit is set by --max-{kind}-bytes)"
        )
    return data


def _strip_base64_space(payload: str) -> str:
    """`payload` without ASCII space, tab, CR and LF (what `re.sub(r"[ \\t\\r\\n]+", "")` gives).

    `ch in payload` is a memchr-speed scan, so the usual unwrapped payload costs four fast
    scans and no copy instead of a regex pass over megabytes.
    """
    for ch in " \t\r\n":
        if ch in payload:
            payload = payload.replace(ch, "")
    return payload


def _decode_fast(body: str) -> bytes | None:
    """Decode `body` if `_decode_checked` would accept it, else None (never raises).

    Equivalence with `_decode_checked`: a strict `a2b_base64` that succeeds has seen only the
    standard alphabet and '=' with nothing after the padding; the checks below add what the
    regex and length rule of `_decode_checked` demand beyond that (at most two '=', all at the
    end; data length not 1 more than a multiple of 4). Both then make the same
    `a2b_base64(body + pad, strict_mode=True)` call, so the bytes are identical. Anything else
    returns None and `_decode_checked` raises its usual error.
    """
    if not _STRICT_A2B:
        return None
    first_pad = body.find("=")
    data_len = len(body) if first_pad < 0 else first_pad
    if len(body) - data_len > 2 or data_len % 4 == 1:
        return None
    try:
        return binascii.a2b_base64(body + "=" * (-len(body) % 4), strict_mode=True)
    except (binascii.Error, ValueError):
        return None


def _decode_checked(body: str) -> bytes:
    """Validate and decode `body` (whitespace already removed); raises a 400 saying what is
    wrong. Slow (regex passes): only for input that `_decode_fast` refused."""
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
        return base64.b64decode(body + "=" * (-len(body) % 4), validate=True)
    except (binascii.Error, ValueError) as exc:
        raise invalid(f"invalid base64 in data URI: {exc}", code="invalid_data_uri") from None


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


def read_media_file(path: str, roots: Sequence[Path], max_bytes: int, kind: str = "image") -> bytes:
    """Read a regular file below one of `roots` (resolved directories) for a `kind` part
    ("image", "video" or "audio": the words of refusals; their codes are the same for all).
    Blocking.

    Order matters: the containment check runs on the symlink-resolved path before existence
    is tested, so a refused path says the same whether or not it exists.
    """
    shown = f"{kind} path {shorten(path, 80)!r}"
    if not roots:
        raise invalid(
            f"local {kind} paths are disabled (got {shorten(path, 80)!r}); start the server with "
            f"--allowed-media-dir DIR to serve {_PLURAL[kind]} from DIR",
            code="image_path_forbidden",
        )
    outside = invalid(
        f"{shown} is outside the allowed media directories (--allowed-media-dir)",
        code="image_path_forbidden",
    )
    if "\x00" in path or not path.startswith("/"):
        raise invalid(f"{shown} is not a valid absolute path", code="invalid_image_url")
    try:
        loose = Path(path).resolve(strict=False)
        if not _inside(loose, roots):
            raise outside
        real = Path(path).resolve(strict=True)
        if not _inside(real, roots):  # changed between the two resolutions
            raise outside
        info = os.stat(real)
    except FileNotFoundError:
        raise invalid(f"{shown} does not exist", code="image_path_invalid") from None
    except (OSError, RuntimeError) as exc:  # RuntimeError: symlink loop on some Pythons
        reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
        raise invalid(f"{shown} cannot be accessed: {reason}", code="image_path_invalid") from None
    _check_regular(info, shown, max_bytes, kind)
    # O_NONBLOCK: if the file was swapped for a FIFO after the stat, opening must not hang.
    flags = os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_CLOEXEC", 0)
    try:
        fd = os.open(real, flags)
    except OSError as exc:
        raise invalid(
            f"{shown} cannot be read: {exc.strerror}", code="image_path_invalid"
        ) from None
    try:
        _check_regular(os.fstat(fd), shown, max_bytes, kind)
        with os.fdopen(fd, "rb", closefd=False) as f:
            data = f.read(max_bytes + 1)
    except OSError as exc:
        raise invalid(
            f"{shown} cannot be read: {exc.strerror or exc}",
            code="image_path_invalid",
        ) from None
    finally:
        os.close(fd)
    if len(data) > max_bytes:
        raise _file_too_large(shown, max_bytes, kind)
    return data


def _check_regular(info: os.stat_result, shown: str, max_bytes: int, kind: str) -> None:
    if stat.S_ISDIR(info.st_mode):
        raise invalid(f"{shown} is a directory", code="image_path_invalid")
    if not stat.S_ISREG(info.st_mode):
        raise invalid(
            f"{shown} is not a regular file (device, FIFO or socket)",
            code="image_path_invalid",
        )
    if info.st_size > max_bytes:
        raise _file_too_large(shown, max_bytes, kind)


def _file_too_large(shown: str, max_bytes: int, kind: str) -> APIError:
    return too_large(
        f"{shown} is over the limit of {max_bytes} bytes per {_UNIT[kind]} "
        f"(the limit is set by --max-{kind}-bytes)"
    )
