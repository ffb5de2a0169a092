"""Validation of single JSON fields, shared by the wire parsers.

Every function raises `APIError` 400 whose `param` names the field and whose message says
what to send instead. Pure functions.
"""

from __future__ import annotations

import math
from typing import Any

from gateway.errors import invalid


def text(value: str, where: str) -> str:
    """Text must be encodable as UTF-8 (JSON allows lone surrogates such as "\\ud800")."""
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        raise invalid(
            f"`{where}` contains an unpaired surrogate; send valid Unicode", where
        ) from None
    return value


def opt_int(body: dict[str, Any], name: str, lo: int, hi: int) -> int | None:
    value = body.get(name)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int):
        # A float stands for an integer only where it is exact (below 2**53): beyond that the
        # parser may already have rounded the client's integer (orjson turns integers outside
        # 64 bits into floats), and a rounded value must not slip into range.
        if isinstance(value, float) and value.is_integer() and abs(value) < 2**53:
            value = int(value)
        elif isinstance(value, float) and value.is_integer():  # a huge integer, rounded
            raise invalid(f"`{name}` must be an integer between {lo} and {hi}", name)
        else:
            raise invalid(f"`{name}` must be an integer", name)
    if not lo <= value <= hi:
        raise invalid(f"`{name}` must be between {lo} and {hi}, got {value}", name)
    return value


def opt_num(body: dict[str, Any], name: str, lo: float, hi: float, default: float) -> float:
    value = body.get(name)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise invalid(f"`{name}` must be a number", name)
    if not lo <= value <= hi:
        raise invalid(f"`{name}` must be between {lo} and {hi}, got {value}", name)
    return float(value)


def opt_bool(body: dict[str, Any], name: str, default: bool) -> bool:
    value = body.get(name)
    if value is None:
        return default
    if not isinstance(value, bool):
        raise invalid(f"`{name}` must be true or false", name)
    return value


MAX_CACHE_SALT_CHARS = 256


def cache_salt(body: dict[str, Any]) -> str:
    """vLLM's `cache_salt`: a non-empty string (at most 256 characters) that scopes cache
    reuse to requests sending the same salt; "" when absent."""
    value = body.get("cache_salt")
    if value is None:
        return ""
    if not isinstance(value, str) or not value or len(value) > MAX_CACHE_SALT_CHARS:
        raise invalid(
            f"`cache_salt` must be a non-empty string of at most {MAX_CACHE_SALT_CHARS} "
            "characters (requests share cached prompts only with the same salt)",
            "cache_salt",
        )
    return text(value, "cache_salt")


def stop_strings(raw: Any, name: str, limit: int, allow_single: bool) -> tuple[str, ...]:
    """A list of non-empty strings (or one string when `allow_single`), at most `limit`."""
    if raw is None:
        return ()
    stops = [raw] if allow_single and isinstance(raw, str) else raw
    if not isinstance(stops, list) or not all(isinstance(s, str) and s for s in stops):
        what = "a non-empty string or an array" if allow_single else "an array"
        raise invalid(f"`{name}` must be {what} of non-empty strings", name)
    if len(stops) > limit:
        raise invalid(f"`{name}` accepts at most {limit} strings", name)
    return tuple(text(s, name) for s in stops)
