"""`bench multi-turn`: follow-up turns with and without answer prefill (issue 27, target 4).

Per configuration (a fresh server each: `--answer-prefill`, the default, and
`--no-answer-prefill`), two measurements through the real `openai` client:

- conversations: `--conversations` distinct images, `--turns` greedy turns each, the history
  (with the answers as received) resent every turn after `--think-ms` of think time; per turn
  the TTFT and cached / prompt tokens. Turn 1 is cold; turns 2.. are warm;
- streams: `--streams` text streams of staggered lengths (stream i: (i+1)/streams of
  `--stream-tokens`) decode while one more such conversation runs its turns, so its answers
  and the shorter streams' own long answers end (and their answer prefills run) while rows
  decode; reported: the streams' decode step before the conversation (per stream its mean
  gap, the median) and their median / p99 / max inter-token gap from the conversation's
  start to the last stream's end, and the answer-prefill blocks run meanwhile
  (/v1/cache/stats `answers`).

The answers of both configurations must be identical (token strings and logprobs): answer
prefill changes what is cached, never an answer.
"""

from __future__ import annotations

import statistics
import threading
import time
from typing import Any

from bench.stall import window_gaps
from bench.timing import StreamTiming, image_message, timed_stream
from bench.workload import image_uri

CONFIGS = {"answer prefill": [], "prompt only": ["--no-answer-prefill"]}
HEADER = (
    "| config | cold TTFT (ms) | warm TTFT median (ms) | warm cached / prompt | "
    "decode step before (ms) | median gap (ms) | p99 gap (ms) | max gap (ms) | "
    "answer blocks during |\n|---|---|---|---|---|---|---|---|---|"
)


def _answers(server: Any) -> dict[str, Any]:
    import httpx

    url = f"{server.base_url}/v1/cache/stats"
    return httpx.get(url, headers=getattr(server, "headers", dict)()).json().get("answers", {})


def conversation(
    client: Any, model: str, image: str, turns: int, max_tokens: int, think_s: float
) -> list[StreamTiming]:
    """One greedy conversation about `image` (module doc)."""
    messages: list[dict[str, Any]] = [image_message(image, "What is in this picture?")]
    out = []
    for turn in range(turns):
        t = timed_stream(client, model, messages, max_tokens)
        out.append(t)
        messages += [
            {"role": "assistant", "content": t.text},
            {"role": "user", "content": f"What else do you see? (part {turn + 2})"},
        ]
        time.sleep(think_s)
    return out


def run_config(server: Any, model: str, name: str, args: Any, log: Any) -> dict[str, Any]:
    client = server.client()
    timed_stream(client, model, [image_message(image_uri(args.image_size, 4242), "warm")], 2)
    think = args.think_ms / 1000
    convs = []
    for k in range(args.conversations):
        log(f"  {name}: conversation {k + 1}/{args.conversations}")
        image = image_uri(args.image_size, 100 + k)
        convs.append(conversation(client, model, image, args.turns, args.max_tokens, think))
    log(f"  {name}: {args.streams} streams while a conversation runs")
    progress: list[StreamTiming] = []

    def stream(i: int) -> None:
        t = StreamTiming(start=time.perf_counter())
        progress.append(t)
        messages = [{"role": "user", "content": f"Tell me a long story, number {i}."}]
        # ignore_eos: a random-weight model may end a stream before the conversation does;
        # staggered lengths: each stream's own (long) answer prefill runs while the longer
        # ones still decode
        extra = {"extra_body": {"ignore_eos": True}}
        tokens = args.stream_tokens * (i + 1) // args.streams
        timed_stream(client, model, messages, tokens, t, **extra)

    threads = [threading.Thread(target=stream, args=(i,)) for i in range(args.streams)]
    for t in threads:
        t.start()
    while len(progress) < args.streams or any(len(p.token_times) < 8 for p in progress):
        time.sleep(0.01)
    blocks = _answers(server).get("blocks", 0)
    start = time.perf_counter()
    image = image_uri(args.image_size, 999)
    during = conversation(client, model, image, args.turns, args.max_tokens, think)
    for t in threads:
        t.join(600)
    end = max(p.token_times[-1] for p in progress)
    time.sleep(0.5)  # the last stream's own answer prefill
    blocks = _answers(server).get("blocks", 0) - blocks
    steps, gaps, _ = window_gaps([p.token_times for p in progress], (start, end))
    return {
        "conversations": convs,
        "during": during,
        "step_ms": 1000 * statistics.median(steps or [float("nan")]),
        "median_gap_ms": 1000 * statistics.median(gaps or [float("nan")]),
        "max_gap_ms": 1000 * max(gaps or [float("nan")]),
        "p99_gap_ms": 1000 * _quantile(gaps, 0.99),
        "answer_blocks_during": blocks,
    }


def _quantile(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(int(q * len(ordered)), len(ordered) - 1)]


def row(name: str, r: dict[str, Any]) -> str:
    cold = [c[0].ttft_s * 1000 for c in r["conversations"]]
    warm = [t for c in r["conversations"] for t in c[1:]]
    cached = sum(t.cached_tokens for t in warm)
    prompt = sum(t.prompt_tokens or 0 for t in warm)
    return (
        f"| {name} | {statistics.median(cold):.1f} | "
        f"{statistics.median(t.ttft_s * 1000 for t in warm):.1f} | "
        f"{cached} / {prompt} ({cached / max(prompt, 1):.1%}) | {r['step_ms']:.1f} | "
        f"{r['median_gap_ms']:.1f} | {r['p99_gap_ms']:.1f} | {r['max_gap_ms']:.1f} | "
        f"{r['answer_blocks_during']} |"
    )


def answers_differ(a: dict[str, Any], b: dict[str, Any]) -> int:
    """Turns whose answers (token strings, logprobs) differ between two configurations."""
    turns = lambda r: [t for c in [*r["conversations"], r["during"]] for t in c]  # noqa: E731
    return sum(
        (x.token_ids, x.logprobs) != (y.token_ids, y.logprobs)
        for x, y in zip(turns(a), turns(b), strict=True)
    )


def per_turn(r: dict[str, Any]) -> list[dict[str, Any]]:
    """JSON rows: per conversation and turn, TTFT (ms), cached and prompt tokens."""
    return [
        {"turn": i + 1, "ttft_ms": t.ttft_s * 1000, "cached": t.cached_tokens,
         "prompt": t.prompt_tokens}
        for c in r["conversations"]
        for i, t in enumerate(c)
    ]  # fmt: skip
