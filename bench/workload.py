"""What the table benches send: images that no server has seen, and prompts of known length.

A server measured with `--base-url` keeps its caches between bench runs, so "cold" must mean
pixels and prompts it has never seen: every image and cold prompt carries this process's
`RUN_NONCE` (random per run) besides its seed.
"""

from __future__ import annotations

import base64
import io
import secrets
from typing import Any

RUN_NONCE = secrets.randbits(48)

# Ordinary English words: a few tokens each in any BPE vocabulary, no special tokens.
_WORDS = (
    "the keeper walked along the harbour wall at dawn and counted every boat that came in "
    "from the grey sea while gulls circled over the market stalls where fishermen sold their "
    "catch to cooks from the inns on the hill above the old stone lighthouse"
).split()


def image_uri(size: int, seed: int, nonce: int = RUN_NONCE) -> str:
    """A `size`x`size` PNG data URI: a drawing that varies with `seed`, with (seed, nonce)
    written into the first pixels so two calls with different arguments never share pixels."""
    from PIL import Image, ImageDraw

    image = Image.new("RGB", (size, size), (240 - seed % 50, 235, 225 + seed % 30))
    draw = ImageDraw.Draw(image)
    for i in range(6):
        x = (seed * 37 + i * 71) % (size - size // 4)
        y = (seed * 53 + i * 97) % (size - size // 4)
        color = ((seed * 11 + i * 40) % 256, (i * 90) % 256, (seed * 7 + i * 60) % 256)
        draw.ellipse((x, y, x + size // 4, y + size // 4), fill=color)
    stamp = (seed & (2**48 - 1)).to_bytes(6, "big") + nonce.to_bytes(6, "big")
    for i in range(0, len(stamp), 3):  # 4 pixels, 3 bytes each
        image.putpixel((i // 3, 0), tuple(stamp[i : i + 3]))
    buf = io.BytesIO()
    image.save(buf, format="PNG")
    return "data:image/png;base64," + base64.b64encode(buf.getvalue()).decode()


def image_turn(uri: str, question: str) -> dict[str, Any]:
    return {
        "role": "user",
        "content": [
            {"type": "image_url", "image_url": {"url": uri}},
            {"type": "text", "text": question},
        ],
    }


def words(n: int, salt: str = "") -> str:
    """`n` words of plain prose; `salt` (first word) makes prompts differ from their start,
    so no prefix of one is a prefix of another."""
    body = " ".join(_WORDS[i % len(_WORDS)] for i in range(n))
    return f"{salt} {body}" if salt else body


def system_prompt(n_words: int, salt: str) -> str:
    return words(n_words, salt=f"[{salt}] You are a careful assistant. Context:")


def story(salt: str) -> str:
    """A long-answer text prompt that differs from the first token on with `salt`."""
    return (
        f"{salt}: write a long, detailed story about a lighthouse keeper who finds a message in "
        "a bottle. Describe the island, the weather, the keeper's routine and the letter."
    )


def salt(kind: str, index: int) -> str:
    return f"{kind}-{RUN_NONCE:x}-{index}"
