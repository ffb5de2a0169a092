"""`bench text-prefix`: TTFT with a long shared system prompt, cold vs warm.

Every request carries a system prompt of about `prefix_tokens` tokens (512 by default, as in
the paper, which reports 5.8x) and a short user question. Cold: a system prompt the server has
never seen (it differs from its first word on). Warm: the same system prompt as the cold
request just before, with a different question, so only the question is new. The word count
that gives `prefix_tokens` is calibrated from the server's own `usage.prompt_tokens` (two
untimed requests), so every backend sees the same text.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from bench.plots import line_plot
from bench.report import ColdWarm, Log, fmt
from bench.sse import ChatClient
from bench.workload import salt, system_prompt

QUESTIONS = ("Summarise the context in one sentence.", "Which boats came in first?")
WORDS_PER_TOKEN_GUESS = 0.75  # when the server reports no usage


@dataclass(frozen=True)
class TextPrefixSettings:
    prefix_tokens: int = 512  # shared system prompt length (target; measured is reported)
    reps: int = 5  # cold/warm pairs (median)
    max_tokens: int = 16


@dataclass
class PrefixResult(ColdWarm):
    words: int = 0

    def summary(self) -> dict[str, Any]:
        return {"system_prompt_words": self.words, **super().summary()}


def _messages(system: str, question: str) -> list[dict[str, Any]]:
    return [{"role": "system", "content": system}, {"role": "user", "content": question}]


async def calibrate(client: ChatClient, target_tokens: int, log: Log) -> int:
    """Words of filler that make the system message (with its header and chat-template
    wrapping) about `target_tokens` tokens on this server's tokenizer: a line through two
    untimed requests' prompt token counts, less a request without a system message."""
    counts = []
    for n in (None, 64, 256):
        system = [] if n is None else _messages(system_prompt(n, salt("cal", n)), "")[:1]
        reply = await client.chat([*system, {"role": "user", "content": QUESTIONS[0]}], 1)
        if reply.error or not reply.prompt_tokens:
            log(f"calibration: no prompt token count ({reply.error or 'no usage'}); guessing")
            return int(target_tokens * WORDS_PER_TOKEN_GUESS)
        counts.append(reply.prompt_tokens)
    bare, p64, p256 = counts
    per_word = (p256 - p64) / (256 - 64)
    fixed = p64 - 64 * per_word - bare  # header and template tokens of the system message
    words = max(1, round((target_tokens - fixed) / per_word))
    log(f"calibration: {per_word:.2f} tokens/word -> {words} words for {target_tokens} tokens")
    return words


async def run(client: ChatClient, settings: TextPrefixSettings, log: Log) -> dict[str, Any]:
    words = await calibrate(client, settings.prefix_tokens, log)
    system = system_prompt(words, salt("warmup", 0))  # untimed pair: this length's shapes
    for question in QUESTIONS:
        await client.chat(_messages(system, question), 2)
    result = PrefixResult(words=words)
    for rep in range(settings.reps):
        system = system_prompt(words, salt("prefix", rep))
        cold = await client.chat(_messages(system, QUESTIONS[0]), settings.max_tokens)
        warm = await client.chat(_messages(system, QUESTIONS[1]), settings.max_tokens)
        result.cold.append(cold)
        result.warm.append(warm)
        log(
            f"rep {rep + 1}/{settings.reps}: cold {fmt(cold.ttft_ms)} ms "
            f"({cold.prompt_tokens} prompt tokens), warm {fmt(warm.ttft_ms)} ms "
            f"(cached {warm.cached_tokens})"
            + (f" ERROR {cold.error or warm.error}" if cold.error or warm.error else "")
        )
    return result.summary()


HEADER = (
    "| prompt tokens (system + question) | TTFT cold (ms, median / p95) | "
    "TTFT warm (ms, median / p95) | cold / warm | warm cached tokens | "
    "decode tok/s (per request) | generated tokens |\n|---|---|---|---|---|---|---|"
)


def markdown(summary: dict[str, Any]) -> str:
    s = summary
    return "\n".join(
        [
            HEADER,
            f"| {fmt(s['prompt_tokens'], 0)} | {fmt(s['cold_ttft_ms'])} / "
            f"{fmt(s['cold_ttft_p95_ms'])} | {fmt(s['warm_ttft_ms'])} / "
            f"{fmt(s['warm_ttft_p95_ms'])} | {fmt(s['cold_over_warm'], 1, 'x')} | "
            f"{fmt(s['warm_cached_tokens'], 0)} | {fmt(s['decode_tok_s'])} | "
            f"{fmt(s['generated_tokens'], 0)} |",
        ]
    )


def plot(series: dict[str, dict[str, Any]], path: str) -> bool:
    """Per-rep cold and warm TTFT, one pair of lines per backend (label -> summary)."""
    lines = {}
    for label, s in series.items():
        prefix = f"{label}: " if len(series) > 1 else ""
        for kind in ("cold", "warm"):
            samples = [float("nan") if v is None else v for v in s[f"{kind}_samples_ms"]]
            lines[f"{prefix}{kind}"] = (list(range(1, len(samples) + 1)), samples)
    tokens = next(iter(series.values()), {}).get("prompt_tokens")
    reps = max((len(xs) for xs, _ in lines.values()), default=0)
    return line_plot(
        lines,
        path,
        xlabel="repetition",
        ylabel="time to first token (ms)",
        title=f"Shared system prompt ({fmt(tokens, 0)} prompt tokens): cold vs warm",
        log_y=True,
        marker="o",
        xticks=list(range(1, reps + 1)),
    )
