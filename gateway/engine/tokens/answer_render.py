"""What the next turn's prompt will hold after this one: the tokens the chat template renders
for a finished answer (and the end of its turn), for the answer prefill
(gateway.engine.scheduler.answer_store).

A client continues a conversation by sending the history back, with the answer as an
assistant message whose content is the text it received. The front end renders that history
with the checkpoint's template (`ModelFamily.render`, text-only content as one string) and
tokenizes it whole. So the tokens that follow this request's prompt in the next turn are not
the generated ids: they are what the template renders for the answer text (Qwen's: the text,
then `<|im_end|>\\n<|im_start|>user\\n`; Qwen3's strips a `<think>` part first), tokenized.

`AnswerTemplate` finds them by rendering probe conversations with the real answer text:
`[user Q]` (the base: what a first turn's prompt looks like) and `[user Q, assistant
ANSWER, user F]` for two very different follow-ups F. The tokens both follow-ups share after
the base are the answer as rendered plus the part of the next turn that does not depend on
the next message: exactly what the next prompt holds. Where the generation prompt opens more
than the history renders (Gemma 4's empty thought channel), the next prompt drops those
tokens of this prompt's end first. Probes that differ from the base before its generation
prompt (a template that rewrites earlier history) give nothing: the answer is not
prefilled.

A wrong guess costs only memory: KV blocks are keyed by their tokens (and everything before
them), so a block the next prompt does not hold is never hit, and never changes an answer.

Thread-safe (the model's tokenizer lock guards rendering and tokenizing); meant for a worker
thread, so the engine thread never waits on the template or that lock.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any

log = logging.getLogger(__name__)

PROBE_QUESTION = "Describe it."
# Two follow-ups with nothing in common, so their common prefix ends where the next message's
# own tokens begin.
FOLLOW_UPS = ("Why?", "0 1 2")


def common_prefix(a: Sequence[int], b: Sequence[int]) -> int:
    """Length of the longest common prefix of two token lists."""
    n = min(len(a), len(b))
    for i in range(n):
        if a[i] != b[i]:
            return i
    return n


def common_suffix(a: Sequence[int], b: Sequence[int]) -> int:
    """Length of the longest common suffix of two token lists."""
    return common_prefix(list(reversed(a)), list(reversed(b)))


class AnswerTemplate:
    """The next-turn tokens of finished answers for one model (`model`: a ModelFamily, whose
    `render` and `tokenize` are thread-safe) and one set of template variables
    (`template_kwargs`: a prompt rendered with `enable_thinking` off ends otherwise).
    `generation_tail`: the tokens every chat prompt ends with (the turn end and the opened
    assistant turn); a prompt without them (a raw completion, an Anthropic prefill) is not a
    chat turn whose answer the template renders as probed. Both are computed once, lazily,
    on the first call (None: the template cannot be probed; then `tail` always gives None)."""

    def __init__(self, model: Any, template_kwargs: dict[str, Any] | None = None) -> None:
        self._model = model
        self._kwargs = template_kwargs  # the template's variables, as the prompts had them
        self._probed = False
        self._base: list[int] | None = None
        self.generation_tail: tuple[int, ...] | None = None

    def _messages(self, answer: str | None, follow: str) -> list[dict[str, Any]]:
        messages: list[dict[str, Any]] = [{"role": "user", "content": PROBE_QUESTION}]
        if answer is not None:
            messages += [
                {"role": "assistant", "content": answer},
                {"role": "user", "content": follow},
            ]
        return messages

    def _ids(self, messages: list[dict[str, Any]]) -> list[int]:
        return self._model.tokenize(self._model.render(messages, None, self._kwargs))

    def _probe(self) -> None:
        self._probed = True
        try:
            base = self._ids(self._messages(None, ""))
            other = self._ids([{"role": "user", "content": FOLLOW_UPS[1]}])
        except Exception:  # a template that refuses plain user turns: no answer prefill
            log.warning("the chat template could not be probed: no answer prefill")
            return
        shared = common_suffix(base, other)
        if shared == 0 or shared >= len(base):
            log.warning("the chat template's generation prompt was not found: no answer prefill")
            return
        self._base = base
        self.generation_tail = tuple(base[-shared:])

    def ends_turn(self, prompt_ids: Sequence[int]) -> bool:
        """Does `prompt_ids` end as a chat prompt does (the opened assistant turn)?"""
        if not self._probed:
            self._probe()
        tail = self.generation_tail
        return tail is not None and tuple(prompt_ids[-len(tail) :]) == tail

    def tail(self, answer: str) -> tuple[int, list[int]] | None:
        """What the next turn's prompt holds in place of this prompt's end, for an answer
        whose text (as the client received it) is `answer`: (how many of the prompt's last
        tokens it does not repeat, the tokens that follow instead). The first is 0 unless
        the template's generation prompt opens more than its history renders (Gemma 4's
        empty thought channel; at most the generation prompt). None when the template does
        not render the probes as a continuation of the first turn (module doc) or refuses
        them."""
        if not self._probed:
            self._probe()
        base, gen = self._base, self.generation_tail
        if base is None or gen is None:
            return None
        tails, keep = [], len(base)
        for follow in FOLLOW_UPS:
            try:
                ids = self._ids(self._messages(answer, follow))
            except Exception:  # e.g. a template that refuses the answer's content
                return None
            keep = min(keep, common_prefix(base, ids))
            tails.append(ids)
        if keep < len(base) - len(gen):  # history before the answer rendered otherwise
            return None
        tail = tails[0][keep : common_prefix(tails[0], tails[1])]
        return (len(base) - keep, tail) if tail else None
