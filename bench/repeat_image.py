"""`bench repeat-image`: time to first token for repeat questions about one image.

For each cache configuration (both caches, vision only, prefix only, none) a fresh server is
started; then, for several distinct images, a 5-turn conversation about the image is streamed
through the `openai` client (turn 1 is cold; turns 2..5 carry the history and the same image).
Every answer is compared with the answer of the no-cache configuration: cached output must be
identical (greedy token strings and logprobs). Against a `--base-url` server there is one
configuration (the server's own) and no reference; columns the server cannot fill read n/a.
"""

from __future__ import annotations

import math
import statistics
import time
from dataclasses import dataclass, field
from typing import Any

from bench.plots import line_plot
from bench.report import fmt
from bench.timing import image_message, timed_stream
from bench.workload import image_uri

CONFIGS: dict[str, list[str]] = {
    "none": ["--no-vision-cache", "--no-prefix-cache"],
    "vision only": ["--no-prefix-cache"],
    "prefix only": ["--no-vision-cache"],
    "both": [],
}
QUESTIONS = [
    "What is in this picture?",
    "What colours do you see?",
    "How many shapes are there?",
    "Which shape is the largest?",
    "Describe the background.",
]


@dataclass
class ConfigResult:
    name: str
    ttft_ms: dict[int, list[float]] = field(default_factory=dict)  # turn -> samples
    cached_tokens: dict[int, list[int]] = field(default_factory=dict)
    prompt_tokens: dict[int, list[int]] = field(default_factory=dict)
    answers: list[list[tuple[list[str], list[float]]]] = field(default_factory=list)
    server_ms: dict[int, list[float]] = field(default_factory=dict)  # turn -> server-side
    generated_tokens: dict[int, list[int]] = field(default_factory=dict)
    decode_tok_s: dict[int, list[float]] = field(default_factory=dict)  # after the first token

    def median_ttft(self, turn: int) -> float:
        return statistics.median(self.ttft_ms[turn])

    def warm_median(self) -> float:
        return statistics.median([t for turn in range(2, 6) for t in self.ttft_ms[turn]])


def run_config(
    server: Any,
    model: str,
    name: str,
    images: int,
    image_size: int,
    max_tokens: int,
    log: Any,
    think_s: float = 0.0,
) -> ConfigResult:
    """`images` 5-turn conversations, each turn sent `think_s` after the last one's answer
    ended (0: at once)."""
    client = server.client()
    result = ConfigResult(name)
    # Untimed requests at the measured size (and a follow-up turn) so one-time kernel
    # compilation and allocator growth are not counted as cold-cache cost.
    warm = [image_message(image_uri(image_size, 9999), "Warm-up question?")]
    first = timed_stream(client, model, warm, 4)
    warm += [{"role": "assistant", "content": first.text}, {"role": "user", "content": "More?"}]
    timed_stream(client, model, warm, 4)
    for index in range(images):
        uri = image_uri(image_size, index)
        messages: list[dict[str, Any]] = []
        answers = []
        for turn, question in enumerate(QUESTIONS, start=1):
            if turn == 1:
                messages.append(image_message(uri, question))
            else:
                messages.append({"role": "user", "content": question})
                time.sleep(think_s)
            timing = timed_stream(client, model, messages, max_tokens)
            messages.append({"role": "assistant", "content": timing.text})
            answers.append((timing.token_ids, timing.logprobs))
            result.ttft_ms.setdefault(turn, []).append(1000 * timing.ttft_s)
            result.cached_tokens.setdefault(turn, []).append(timing.cached_tokens)
            prompt = timing.prompt_tokens
            result.prompt_tokens.setdefault(turn, []).append(math.nan if prompt is None else prompt)
            # time the server spent before admitting the request (read + media + prompt); a
            # server without the Server-Timing header: n/a
            server = sum(timing.server_timing.values()) if timing.server_timing else math.nan
            result.server_ms.setdefault(turn, []).append(server)
            times = timing.token_times
            result.generated_tokens.setdefault(turn, []).append(len(times))
            speed = (len(times) - 1) / (times[-1] - times[0]) if len(times) > 1 else math.nan
            result.decode_tok_s.setdefault(turn, []).append(speed)
        result.answers.append(answers)
        log(
            f"  [{name}] image {index + 1}/{images}: TTFT turn1 "
            f"{result.ttft_ms[1][-1]:.1f} ms, turns 2-5 "
            + ", ".join(f"{result.ttft_ms[t][-1]:.1f}" for t in range(2, 6))
            + " ms"
        )
    return result


def compare_answers(
    reference: ConfigResult, other: ConfigResult, tol: float = 1e-4
) -> tuple[int, float]:
    """(answers that differ from the reference in token strings or logprobs, largest
    first-token logprob difference). The second number tells numerical drift (e.g. bf16
    kernels of other shapes) from a real difference."""
    mismatches, drift = 0, 0.0
    for ref_conv, conv in zip(reference.answers, other.answers, strict=True):
        for (ref_ids, ref_lps), (ids, lps) in zip(ref_conv, conv, strict=True):
            same = ref_ids == ids and all(abs(a - b) <= tol for a, b in zip(ref_lps, lps))
            mismatches += not same
            if ref_lps and lps:
                drift = max(drift, abs(ref_lps[0] - lps[0]))
    return mismatches, drift


def markdown(results: dict[str, ConfigResult], mismatches: dict[str, tuple[int, float]]) -> str:
    lines = [
        "| caches | TTFT turn 1 (cold, ms) | TTFT turns 2-5 (warm, median ms) | "
        "cold / warm | server pre-admission ms (cold / warm) | cached tokens turn 2 / prompt | "
        "decode tok/s (median) | generated tokens | "
        "answers differing from no-cache | max first-token logprob diff |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for name, r in results.items():
        cold, warm = r.median_ttft(1), r.warm_median()
        cached = statistics.median(r.cached_tokens[2])
        prompt = _median(r.prompt_tokens[2])
        server_cold = _median(r.server_ms[1])
        server_warm = _median([t for turn in range(2, 6) for t in r.server_ms[turn]])
        decode = _median([t for turns in r.decode_tok_s.values() for t in turns])
        generated = _median([t for turns in r.generated_tokens.values() for t in turns])
        if name in mismatches:
            differ, drift = mismatches[name]
            check = f"{differ} | {drift:.1e}"
        else:
            check = "n/a | n/a"
        lines.append(
            f"| {name} | {cold:.1f} | {warm:.1f} | {cold / warm:.1f}x | "
            f"{fmt(server_cold)} / {fmt(server_warm)} | "
            f"{cached:.0f} / {fmt(prompt, 0)} | {fmt(decode)} | {fmt(generated, 0)} | {check} |"
        )
    return "\n".join(lines)


def _median(values: list[float]) -> float:
    present = [v for v in values if not math.isnan(v)]
    return statistics.median(present) if present else math.nan


def plot(results: dict[str, ConfigResult], path: str) -> bool:
    """TTFT per turn, one line per configuration. False when matplotlib is missing."""
    turns = list(range(1, 6))
    lines = {name: (turns, [r.median_ttft(t) for t in turns]) for name, r in results.items()}
    return line_plot(
        lines,
        path,
        xlabel="turn (1 = cold)",
        ylabel="median time to first token (ms)",
        title="Repeat questions about one image",
        log_y=True,
        marker="o",
        xticks=turns,
    )
