"""`bench repeat-audio`: time to first token for repeat questions about one audio clip, per
delivery format (an `input_audio` WAV, an `input_audio` FLAC of the same kind of sound).

For each cache configuration (none, both) a fresh server is started; then, per format, a
5-turn conversation about one clip is streamed through the `openai` client (turn 1 is cold:
a clip the server has not heard; turns 2..5 carry the history and re-send the clip). Every
answer is compared with the no-cache configuration's: cached output must be identical
(greedy tokens and logprobs). The clips are deterministic tones (tests/audio_clips.py's
recipe, restated here so the bench needs nothing from the tests), one per format and
configuration run, so every turn 1 is really cold. Default model: the tiny Gemma 4 (it has an
audio tower), built offline on first use.
"""

from __future__ import annotations

import argparse
import base64
import io
import statistics
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from bench.cli_tables import add_target_options
from bench.repeat_image import compare_answers
from bench.timing import timed_stream

CONFIGS: dict[str, list[str]] = {"none": ["--no-vision-cache", "--no-prefix-cache"], "both": []}
FORMATS = ("wav", "flac")
QUESTIONS = [
    "What is said in this recording?",
    "Who is speaking?",
    "What is the mood of the speaker?",
    "Is there any background noise?",
    "Summarize it in one sentence.",
]


@dataclass
class FormatResult:
    """One format's conversation in one configuration: TTFT and cached tokens per turn, and
    the answers (for the cached == uncached check)."""

    ttft_ms: list[float] = field(default_factory=list)
    cached_tokens: list[int] = field(default_factory=list)
    prompt_tokens: list[int] = field(default_factory=list)
    answers: list[list[tuple[list[str], list[float]]]] = field(default_factory=list)

    @property
    def warm_median(self) -> float:
        return statistics.median(self.ttft_ms[1:])


def tone(seconds: float, rate: int, pitch: float) -> np.ndarray:
    """A rising tone with a harmonic, mono float32 (a stand-in for speech: same cost)."""
    t = np.arange(int(seconds * rate)) / rate
    wave = np.sin(2 * np.pi * pitch * t * (1 + t / 10)) + 0.3 * np.sin(2 * np.pi * 3 * pitch * t)
    return (0.4 * wave).astype(np.float32)


def encoded(samples: np.ndarray, rate: int, container: str) -> bytes:
    """16-bit PCM `samples` in a WAV file, or FLAC-compressed."""
    import av

    codec = {"wav": "pcm_s16le", "flac": "flac"}[container]
    buffer = io.BytesIO()
    with av.open(buffer, "w", format=container) as out:
        stream = out.add_stream(codec, rate=rate)
        stream.layout = "mono"
        frame = av.AudioFrame.from_ndarray(
            np.round(samples * 32767).astype(np.int16)[None], format="s16", layout="mono"
        )
        frame.sample_rate = rate
        for packet in [*stream.encode(frame), *stream.encode(None)]:
            out.mux(packet)
    return buffer.getvalue()


def audio_message(data: bytes, fmt: str, question: str) -> dict[str, Any]:
    part = {
        "type": "input_audio",
        "input_audio": {"data": base64.b64encode(data).decode(), "format": fmt},
    }
    return {"role": "user", "content": [{"type": "text", "text": question}, part]}


def run_format(client: Any, model: str, data: bytes, fmt: str, max_tokens: int) -> FormatResult:
    """One 5-turn conversation about the clip `data` (in `fmt`)."""
    result = FormatResult()
    messages: list[dict[str, Any]] = []
    answers = []
    for turn, question in enumerate(QUESTIONS, start=1):
        messages.append(
            audio_message(data, fmt, question)
            if turn == 1
            else {"role": "user", "content": question}
        )
        timing = timed_stream(client, model, messages, max_tokens)
        messages.append({"role": "assistant", "content": timing.text})
        answers.append((timing.token_ids, timing.logprobs))
        result.ttft_ms.append(1000 * timing.ttft_s)
        result.cached_tokens.append(timing.cached_tokens)
        result.prompt_tokens.append(timing.prompt_tokens or 0)
    result.answers.append(answers)
    return result


def markdown(results: dict[str, dict[str, FormatResult]], differ: dict[str, int]) -> str:
    lines = [
        "| caches | format | TTFT turn 1 (cold, ms) | TTFT turns 2-5 (warm, median ms) | "
        "cold / warm | cached tokens turn 2 / prompt | answers differing from no-cache |",
        "|---|---|---|---|---|---|---|",
    ]
    for name, formats in results.items():
        for fmt, r in formats.items():
            cold, warm = r.ttft_ms[0], r.warm_median
            check = differ.get(f"{name}/{fmt}", "n/a")
            lines.append(
                f"| {name} | {fmt} | {cold:.1f} | {warm:.1f} | {cold / warm:.1f}x | "
                f"{r.cached_tokens[1]} / {r.prompt_tokens[1]} | {check} |"
            )
    return "\n".join(lines)


def add_parser(kinds: argparse._SubParsersAction, common: Any) -> None:
    p = kinds.add_parser("repeat-audio", help="TTFT of repeat questions about one audio clip")
    common(p)
    add_target_options(p)
    p.add_argument("--seconds", type=float, default=20.0, help="clip length (Gemma 4: <= 30)")
    p.add_argument("--rate", type=int, default=44100, help="the clips' own sample rate")
    p.add_argument("--max-tokens", type=int, default=8)
    p.add_argument("--configs", default="none,both", help="comma-separated: none, both")
    p.add_argument("--markdown", type=Path, help="write the markdown table")
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> None:
    from bench import report
    from bench.target import open_target

    if not args.model and not args.base_url:
        from gateway.offline_model import ensure_model

        args.model = str(ensure_model("gemma4"))
    log = report.progress("repeat-audio: ")
    names = ["as served"] if args.base_url else [n.strip() for n in args.configs.split(",")]
    results: dict[str, dict[str, FormatResult]] = {}
    meta: dict[str, Any] = {}
    for name in names:
        log(f"config '{name}': starting")
        with open_target(args, CONFIGS.get(name, [])) as (target, backend, facts):
            meta = meta or report.metadata("repeat-audio", args, backend, facts)
            client = target.client()
            # Untimed: one-time compilation and allocator growth are not cold-cache cost.
            warm = encoded(tone(args.seconds, args.rate, 200.0), args.rate, "wav")
            run_format(client, backend.model, warm, "wav", 2)
            results[name] = {}
            for k, fmt in enumerate(FORMATS):
                clip = encoded(tone(args.seconds, args.rate, 300.0 + 50 * k), args.rate, fmt)
                r = run_format(client, backend.model, clip, fmt, args.max_tokens)
                results[name][fmt] = r
                log(f"  [{name}] {fmt}: TTFT cold {r.ttft_ms[0]:.1f} ms, warm {r.warm_median:.1f}")
    differ: dict[str, int] = {}
    if "none" in results:
        for name, formats in results.items():
            for fmt, r in formats.items():
                differ[f"{name}/{fmt}"] = compare_answers(results["none"][fmt], r, tol=0.0)[0]  # type: ignore[arg-type]
    table = markdown(results, differ)
    payload = {
        **meta,
        "seconds": args.seconds,
        "rate": args.rate,
        "results": {
            n: {f: {"ttft_ms": r.ttft_ms, "cached_tokens": r.cached_tokens} for f, r in fs.items()}
            for n, fs in results.items()
        },
        "differing_answers": differ,
    }
    report.write_outputs(payload, table, args, lambda path: False)
    if any(differ.values()):
        raise SystemExit("cached answers differ from uncached answers")
