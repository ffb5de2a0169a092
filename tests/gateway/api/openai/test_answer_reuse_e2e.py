"""End to end through the real `openai` SDK: follow-up turns reuse the previous answer.

Pinned: in a 5-turn conversation about one image (the history resent each turn, the answer
as the SDK returned it), every warm turn's `usage.prompt_tokens_details.cached_tokens` is at
least 90% of its prompt, more than the previous prompt alone could give, and every answer
(token strings and logprobs) equals that of a server with no caches; /v1/cache/stats shows
the answer prefills (`answers`); `--no-answer-prefill` turns them off and leaves warm turns
with the previous prompt's blocks only.
"""

from __future__ import annotations

from collections.abc import Iterator

import httpx
import pytest
from support import ServerProcess, data_uri, noise_png, wait_until

BLOCK = 32  # the CPU's exact-reuse block
SYSTEM = "You are a careful assistant who describes pictures in detail."


@pytest.fixture(scope="module")
def servers() -> Iterator[dict[str, ServerProcess]]:
    procs = {
        "on": ServerProcess(),
        "off": ServerProcess("--no-answer-prefill"),
        "none": ServerProcess("--no-prefix-cache", "--no-vision-cache"),
    }
    yield procs
    for proc in procs.values():
        assert proc.stop(), proc.log()


def _answers(proc: ServerProcess) -> dict:
    return httpx.get(f"{proc.base_url}/v1/cache/stats").json()["answers"]


def _settled(proc: ServerProcess, offered: int) -> dict:
    """Wait for `offered` answers queued and none pending (a user's think time)."""
    return wait_until(
        lambda: (a := _answers(proc))["offered"] >= offered and a["pending"] == 0 and a, 60
    )


def _conversation(
    proc: ServerProcess, image: str, answers: list[str] | None = None, settle: bool = False
) -> list:
    """Five turns; each resends the history with the previous answers (`answers`: use these
    instead of this server's own, so two servers see the same prompts); `settle`: wait for
    each answer prefill before the next turn."""
    client = proc.client()
    messages: list[dict] = [
        {"role": "system", "content": SYSTEM},
        {
            "role": "user",
            "content": [
                {"type": "image_url", "image_url": {"url": image}},
                {"type": "text", "text": "What is in this picture?"},
            ],
        },
    ]
    out = []
    for turn in range(5):
        r = client.chat.completions.create(
            model="test", messages=messages, temperature=0, max_tokens=64, logprobs=True
        )
        out.append(r)
        if settle:
            _settled(proc, turn + 1)
        text = answers[turn] if answers is not None else r.choices[0].message.content
        messages += [
            {"role": "assistant", "content": text},
            {"role": "user", "content": f"And what else? (part {turn + 2})"},
        ]
    return out


def _lps(r) -> list[tuple[str, float]]:  # noqa: ANN001
    return [(t.token, t.logprob) for t in r.choices[0].logprobs.content]


def test_warm_turns_reuse_the_answer_exactly(servers: dict[str, ServerProcess]) -> None:
    image = data_uri(noise_png(27, 560, 560))
    on = _conversation(servers["on"], image, settle=True)
    texts = [r.choices[0].message.content for r in on]
    none = _conversation(servers["none"], image, texts)
    off = _conversation(servers["off"], image, texts)
    for turn, (a, b) in enumerate(zip(on, none, strict=True)):
        assert _lps(a) == _lps(b), f"turn {turn + 1}"  # tolerance exactly zero
    for turn in range(1, 5):
        usage, before = on[turn].usage, on[turn - 1].usage
        cached = usage.prompt_tokens_details.cached_tokens
        assert cached >= 0.9 * usage.prompt_tokens, f"turn {turn + 1}: {cached}/{usage}"
        assert cached > before.prompt_tokens // BLOCK * BLOCK  # past the previous prompt
        # without answer prefill: the previous prompt's whole blocks only
        plain = off[turn].usage.prompt_tokens_details.cached_tokens
        assert plain <= before.prompt_tokens // BLOCK * BLOCK < cached
    stats = _answers(servers["on"])
    assert stats["enabled"] and stats["done"] >= 4 and stats["blocks"] > 0
    assert _answers(servers["off"])["enabled"] is False
