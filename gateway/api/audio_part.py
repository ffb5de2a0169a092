"""The audio content parts the OpenAI-style APIs share: `input_audio` (OpenAI's: base64
`data` and its `format`) and `audio_url` (vLLM's: an http(s) URL, a data URI or a path), both
turned into one `AudioPart` whose `param` names the field a refusal is about. Anthropic's
Messages API has no audio block.
"""

from __future__ import annotations

from typing import Any

from gateway.api import fields
from gateway.errors import invalid
from gateway.frontend.chat import AudioPart
from gateway.media.audio_decode import AUDIO_FORMATS


def input_audio(value: Any, at: str, key: str = "input_audio") -> AudioPart:
    """`{"data": base64, "format": "wav" | "mp3" | ...}` at `at.key` -> an AudioPart over a
    `data:audio/<format>;base64,` URI (the decoder probes the bytes; the format only names
    the media type). 400 naming the field for anything else."""
    if not isinstance(value, dict):
        raise invalid(f"`{at}.{key}` must be an object with `data` and `format`", f"{at}.{key}")
    data, fmt = value.get("data"), value.get("format")
    if not isinstance(data, str) or not data:
        raise invalid(f"`{at}.{key}.data` must be a non-empty base64 string", f"{at}.{key}.data")
    if data.lstrip()[:5].lower() == "data:":
        raise invalid(
            f"`{at}.{key}.data` is a data URI; send its base64 alone (the format goes in "
            "`format`), or the data URI as an `audio_url` part",
            f"{at}.{key}.data",
        )
    if fmt not in AUDIO_FORMATS:
        raise invalid(
            f"`{at}.{key}.format` must be one of {', '.join(AUDIO_FORMATS)}",
            f"{at}.{key}.format",
        )
    return AudioPart(f"data:audio/{fmt};base64,{data}", f"{at}.{key}.data")


def audio_url(part: dict[str, Any], at: str) -> AudioPart:
    """An `audio_url` part (`{"audio_url": {"url": ...}}` or the URL string itself)."""
    return AudioPart(fields.media_url(part, at, "audio_url", "audio"), f"{at}.audio_url.url")
