"""Validation of single JSON fields, shared by the wire parsers.

Every function raises `APIError` 400 whose `param` names the field and whose message says
what to send instead. Pure functions.
"""

from __future__ import annotations

import math
import re
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


def model_name(body: dict[str, Any]) -> str:
    """The request's `model`: a non-empty string (which models exist is the pool's to say)."""
    model = body.get("model")
    if not isinstance(model, str) or not model:
        raise invalid("`model` is required and must be a string", "model")
    return model


def media_url(part: dict[str, Any], at: str, key: str, mime: str) -> str:
    """The URL of an OpenAI-style media part (`image_url`, `video_url`, `audio_url`): an
    object with `url`, or the URL string itself; `mime` ("image", ...) names the data URI."""
    value = part.get(key)
    url = value.get("url") if isinstance(value, dict) else value
    if not isinstance(url, str) or not url:
        raise invalid(
            f"`{at}.{key}.url` must be a non-empty string: an http(s) URL, a data:{mime}/... "
            "URI or a file path",
            f"{at}.{key}.url",
        )
    return url


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


_DURATION = re.compile(r"(-?\d+(?:\.\d+)?)(ms|s|m|h)?")
_UNIT_S = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, None: 1.0}


def keep_alive(body: dict[str, Any]) -> float | None:
    """Ollama's `keep_alive`: how long the model stays loaded once this request is done, in
    seconds (a number, or a duration such as "30s", "5m", "1h"); any negative value: until
    evicted (-1); 0: unload once idle. None when absent (the model's own keep-alive)."""
    value = body.get("keep_alive")
    if value is None:
        return None
    seconds: float | None = None
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        seconds = float(value)
    elif isinstance(value, str):
        match = _DURATION.fullmatch(value.strip())
        if match:
            seconds = float(match.group(1)) * _UNIT_S[match.group(2)]
    if seconds is None or seconds != seconds or seconds in (float("inf"), float("-inf")):
        raise invalid(
            '`keep_alive` must be seconds (a number, or a duration such as "5m"); '
            "-1: keep the model loaded, 0: unload it once this request is done",
            "keep_alive",
        )
    return -1.0 if seconds < 0 else seconds


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


MAX_LOGIT_BIAS = 300  # OpenAI's limit on `logit_bias` entries


def logit_bias(raw: Any) -> tuple[tuple[int, float], ...]:
    """OpenAI's `logit_bias`: an object from token ids (as strings) to a bias in [-100, 100],
    as sorted (id, bias) pairs. Whether each id is in the model's vocabulary is the prompt
    builder's check (it knows the tokenizer)."""
    if raw is None:
        return ()
    if not isinstance(raw, dict):
        raise invalid('`logit_bias` must be an object such as {"1234": -100}', "logit_bias")
    if len(raw) > MAX_LOGIT_BIAS:
        raise invalid(f"`logit_bias` accepts at most {MAX_LOGIT_BIAS} tokens", "logit_bias")
    out = {}
    for key, value in raw.items():
        where = f"logit_bias.{key}"
        if not isinstance(key, str) or not key.isdigit():
            raise invalid(f"`logit_bias` key {key!r} must be a token id (an integer)", where)
        out[int(key)] = opt_num({where: value}, where, -100.0, 100.0, default=0.0)
    return tuple(sorted(out.items()))


def shaping(body: dict[str, Any], max_tokens: int | None) -> dict[str, Any]:
    """The logit-shaping fields of a body, as `ChatRequest` keyword arguments: OpenAI's
    `presence_penalty`, `frequency_penalty` and `logit_bias`, and vLLM's
    `repetition_penalty` and `min_tokens` (gateway.engine.tokens.penalties says what each
    does)."""
    min_tokens = opt_int(body, "min_tokens", 0, 1_000_000) or 0
    if max_tokens is not None and min_tokens > max_tokens:
        raise invalid(
            f"`min_tokens` ({min_tokens}) must not exceed max_tokens ({max_tokens})", "min_tokens"
        )
    repetition = opt_num(body, "repetition_penalty", 0.0, 10.0, default=1.0)
    if repetition == 0.0:
        raise invalid("`repetition_penalty` must be greater than 0 (1: off)", "repetition_penalty")
    return {
        "presence_penalty": opt_num(body, "presence_penalty", -2.0, 2.0, default=0.0),
        "frequency_penalty": opt_num(body, "frequency_penalty", -2.0, 2.0, default=0.0),
        "repetition_penalty": repetition,
        "logit_bias": logit_bias(body.get("logit_bias")),
        "min_tokens": min_tokens,
    }


def printable(value: str, limit: int) -> str:
    """`value` cut to `limit` characters, printable ASCII only (others become "?"), so a
    client's field name or path can go into a header or a log line without breaking it
    into lines or forging one."""
    cut = value[:limit] + ("..." if len(value) > limit else "")
    return "".join(c if " " <= c <= "~" else "?" for c in cut)
