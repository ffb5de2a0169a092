"""`bench agent-loop`: an agent's screenshot loop, per-turn TTFT with the caches on and off.

The workload the caches exist for: a model looks at a screenshot, calls a tool, gets a new
screenshot back as the tool's result, and so on; every turn resends the whole conversation
(all earlier screenshots and calls) plus one new screenshot. Each turn is one streamed Chat
Completions request with `tools` and `tool_choice: "required"` (a forced call: the answer is
always a call, so the loop never stalls on free text), greedy, so the configurations see the
same conversation. Per turn: TTFT (request sent -> first generated token's chunk), prompt
tokens, cached tokens and how many images the vision tower ran on (`x-cache`).

With the caches on, turn N should cost about one new screenshot plus the new tokens whatever
N is; with them off it grows with the whole conversation. The calls of both configurations
must be identical (the caches are exact); a difference fails the bench.
"""

from __future__ import annotations

import base64
import io
import time
from dataclasses import dataclass
from typing import Any

from bench.plots import line_plot
from bench.workload import RUN_NONCE

CONFIGS: dict[str, list[str]] = {
    "caches on": [],
    "caches off": ["--no-vision-cache", "--no-prefix-cache"],
}
TASK = "Open the settings page and turn on dark mode. Use one tool call per step."
TOOLS: list[dict[str, Any]] = [
    {
        "type": "function",
        "function": {
            "name": "click",
            "description": "Click at a point of the screen.",
            "parameters": {
                "type": "object",
                "properties": {
                    "x": {"type": "integer", "minimum": 0, "maximum": 4095},
                    "y": {"type": "integer", "minimum": 0, "maximum": 4095},
                },
                "required": ["x", "y"],
                "additionalProperties": False,
            },
        },
    },
    {
        "type": "function",
        "function": {
            "name": "type_text",
            "description": "Type text at the focused field.",
            "parameters": {
                "type": "object",
                "properties": {"text": {"type": "string", "maxLength": 24}},
                "required": ["text"],
                "additionalProperties": False,
            },
        },
    },
]


@dataclass(frozen=True)
class TurnResult:
    """One turn of one configuration. `call` is (name, arguments JSON)."""

    turn: int
    ttft_ms: float
    prompt_tokens: int
    cached_tokens: int
    images_encoded: int
    call: tuple[str, str]


def screenshot_uri(size: int, turn: int, nonce: int = RUN_NONCE) -> str:
    """A `size`x`size` PNG data URI that looks like a desktop window (title bar, sidebar,
    text lines, a button) and differs with `turn` and `nonce` (stamped into the first pixels,
    so no two runs or turns share pixels)."""
    from PIL import Image, ImageDraw

    image = Image.new("RGB", (size, size), (246, 246, 248))
    draw = ImageDraw.Draw(image)
    u = max(1, size // 64)
    draw.rectangle((0, 0, size, 3 * u), fill=(52, 58, 70))
    draw.rectangle((0, 3 * u, 12 * u, size), fill=(225, 228, 235))
    for row in range(3 + turn % 5, 40, 3):
        width = (17 * row + 29 * turn) % (40 * u) + 8 * u
        draw.rectangle((15 * u, row * u * 1.5, 15 * u + width, row * u * 1.5 + u), fill=(90,) * 3)
    x, y = (turn * 7 % 40 + 15) * u, (turn * 11 % 40 + 10) * u
    draw.rounded_rectangle((x, y, x + 10 * u, y + 3 * u), radius=u, fill=(40, 110, 220))
    stamp = (turn & (2**48 - 1)).to_bytes(6, "big") + nonce.to_bytes(6, "big")
    for i in range(0, len(stamp), 3):
        image.putpixel((i // 3, size - 1), tuple(stamp[i : i + 3]))
    buf = io.BytesIO()
    image.save(buf, format="PNG")
    return "data:image/png;base64," + base64.b64encode(buf.getvalue()).decode()


def _image(uri: str) -> dict[str, Any]:
    return {"type": "image_url", "image_url": {"url": uri}}


def agent_turn(
    client: Any, model: str, messages: list[dict[str, Any]], max_tokens: int
) -> tuple[float, Any, str, tuple[str, str, str]]:
    """One streamed turn with a forced call: (TTFT s, usage, x-cache header, (call id,
    name, arguments))."""
    start = time.perf_counter()
    raw = client.chat.completions.with_raw_response.create(
        model=model, messages=messages, tools=TOOLS, tool_choice="required",
        parallel_tool_calls=False, temperature=0, max_tokens=max_tokens, stream=True,
        stream_options={"include_usage": True},
    )  # fmt: skip
    first, usage = float("nan"), None
    call_id, name, arguments = "", "", ""
    for chunk in raw.parse():
        usage = chunk.usage or usage
        if not chunk.choices:
            continue
        delta = chunk.choices[0].delta
        if first != first and (delta.tool_calls or delta.content):  # nan: not yet
            first = time.perf_counter() - start
        for piece in delta.tool_calls or []:
            call_id = piece.id or call_id
            name = (piece.function and piece.function.name) or name
            arguments += (piece.function and piece.function.arguments) or ""
    if not name:
        raise RuntimeError(f"turn ended without a tool call (max_tokens {max_tokens} too small?)")
    return first, usage, raw.headers.get("x-cache", ""), (call_id, name, arguments)


def _count(header: str, key: str) -> int:
    for item in header.split(";"):
        name, _, value = item.strip().partition("=")
        if name == key:
            return int(value)
    return -1  # a server without the header


def run_loop(
    server: Any, model: str, turns: int, image_size: int, max_tokens: int, log: Any = print
) -> list[TurnResult]:
    """`turns` turns of one agent conversation against `server` (a fresh one per
    configuration: nothing cached from another run)."""
    client = server.client()
    # Untimed: one-time compilation and allocator growth are not the caches' business.
    text = {"type": "text", "text": TASK}
    warm = [{"role": "user", "content": [_image(screenshot_uri(image_size, 10_000)), text]}]
    agent_turn(client, model, warm, max_tokens)
    messages: list[dict[str, Any]] = [
        {"role": "system", "content": "You operate a desktop computer through tools."},
        {"role": "user", "content": [_image(screenshot_uri(image_size, 0)), text]},
    ]  # fmt: skip
    out = []
    for turn in range(1, turns + 1):
        ttft, usage, cache, (call_id, name, arguments) = agent_turn(
            client, model, messages, max_tokens
        )
        details = getattr(usage, "prompt_tokens_details", None)
        result = TurnResult(
            turn,
            1000 * ttft,
            int(getattr(usage, "prompt_tokens", 0) or 0),
            int(getattr(details, "cached_tokens", 0) or 0),
            _count(cache, "vision-misses"),
            (name, arguments),
        )
        out.append(result)
        log(f"  turn {turn}: TTFT {result.ttft_ms:.0f} ms, {result.prompt_tokens} tokens "
            f"({result.cached_tokens} cached), {name}({arguments})")  # fmt: skip
        call = {"id": call_id, "type": "function",
                "function": {"name": name, "arguments": arguments}}  # fmt: skip
        messages += [
            {"role": "assistant", "content": None, "tool_calls": [call]},
            {"role": "tool", "tool_call_id": call_id, "content": [
                {"type": "text", "text": f"done ({name}); the screen now:"},
                _image(screenshot_uri(image_size, turn))]},
        ]  # fmt: skip
    return out


def markdown(results: dict[str, list[TurnResult]]) -> str:
    """Per turn: TTFT with the caches on and off, the prompt and what was reused."""
    on, off = results.get("caches on", []), results.get("caches off", [])
    lines = [
        "| turn | images in prompt | prompt tokens | TTFT caches on (ms) | cached tokens | "
        "images encoded | TTFT caches off (ms) | off / on |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for i in range(max(len(on), len(off))):
        a = on[i] if i < len(on) else None
        b = off[i] if i < len(off) else None
        ref = a or b
        assert ref is not None
        ratio = f"{b.ttft_ms / a.ttft_ms:.1f}x" if a and b and a.ttft_ms > 0 else "n/a"
        lines.append(
            f"| {ref.turn} | {ref.turn} | {ref.prompt_tokens} | "
            f"{f'{a.ttft_ms:.0f}' if a else 'n/a'} | {a.cached_tokens if a else 'n/a'} | "
            f"{a.images_encoded if a else 'n/a'} | {f'{b.ttft_ms:.0f}' if b else 'n/a'} | "
            f"{ratio} |"
        )
    return "\n".join(lines)


def differing_calls(results: dict[str, list[TurnResult]]) -> list[int]:
    """Turns whose call differs between the configurations (the caches must be exact)."""
    runs = list(results.values())
    if len(runs) < 2:
        return []
    return [r.turn for r, s in zip(runs[0], runs[1], strict=False) if r.call != s.call]


def plot(results: dict[str, list[TurnResult]], path: str) -> bool:
    lines = {
        name: ([r.turn for r in rows], [r.ttft_ms for r in rows]) for name, rows in results.items()
    }
    return line_plot(
        lines, path, xlabel="turn (one new screenshot each)", ylabel="TTFT (ms)",
        title="agent loop: TTFT per turn", marker="o",
        xticks=[r.turn for r in next(iter(results.values()), [])],
    )  # fmt: skip
