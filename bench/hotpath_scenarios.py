"""The hotpath bench's scenarios: each sends real streaming requests and appends `Row`s.

Order matters and is fixed by `Scenarios.run_all`: the very first requests after the server
starts come first (cold-start costs are part of what is measured), then the first concurrent
wave, and only then the steady-state figures. A scenario that raises becomes an ERROR row; the
bench goes on.
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable
from typing import Any

import httpx

from bench.hotpath_client import (
    ImageFiles,
    Stream,
    aggregate_tok_s,
    first_error,
    image_turn,
    median,
    plain_stream,
    steady_tok_s,
    stream,
    together,
)
from bench.hotpath_report import Row, brief, failed, ratio
from bench.raw_measure import median_wave

Log = Callable[[str], None]
STORY = (
    "Write a long, detailed story about a lighthouse keeper who finds a message in a bottle. "
    "Describe the island, the weather over several days, the keeper's daily routine, the "
    "letter's strange handwriting, the people he writes to, the ships that pass, and how the "
    "mystery is finally solved. Use many sentences and do not stop early."
)
QUESTIONS = (
    "Describe this picture.",
    "How many shapes are there?",
    "Which colour is the largest shape?",
    "Is any shape touching the border?",
    "What would you call this picture?",
    "Which shape is closest to the centre?",
)


def _user(text: str) -> dict[str, Any]:
    return {"role": "user", "content": text}


class Scenarios:
    """Runs every scenario against one server. `settings` is a `HotpathSettings`, `raw` the
    raw ceiling's JSON (empty if it failed: rows then have no raw value)."""

    def __init__(
        self,
        client: Any,
        files: ImageFiles,
        settings: Any,
        raw: dict[str, Any],
        log: Log,
        deadline: float = float("inf"),
        on_step: Callable[[Scenarios], None] = lambda _: None,
    ) -> None:
        self.client = client
        self.files = files  # in a dir the server allows (--allowed-media-dir)
        self.s = settings
        self.raw = raw
        self.log = log
        self.deadline = deadline  # perf_counter s: scenarios not started by then are skipped
        self.on_step = on_step  # after each scenario (partial results survive a kill)
        self.rows: list[Row] = []
        self.details: dict[str, Any] = {}
        self.ignore_eos = True  # until the server refuses the field
        self.http: httpx.AsyncClient | None = None  # the plain client, during `decode`
        self._seed = 0

    def new_seed(self) -> int:
        """A seed never used before: new pixels, so vision- and prefix-cache misses."""
        self._seed += 1
        return self._seed

    async def run_all(self) -> list[Row]:
        steps: list[tuple[str, Callable[[], Awaitable[None]]]] = [
            ("first requests after start", self.first_requests),
            ("first concurrent wave vs second", self.waves),
            (f"first image of a new size ({self.s.new_size})", self.new_size),
            ("warm conversation by path", lambda: self.conversation("path")),
            ("warm conversation by data URI", lambda: self.conversation("uri")),
            # The same as the first, after the other: does the order matter?
            ("warm conversation by path, again", lambda: self.conversation("path", "path_again")),
            ("decode through HTTP", self.decode),
            (f"{self.s.image_batch} concurrent image requests", self.image_batch),
        ]
        if self.s.only:
            steps = [(n, step) for n, step in steps if n.startswith(self.s.only)]
        for name, step in steps:
            key, started, before = name.replace(" ", "_"), time.perf_counter(), len(self.rows)
            if started > self.deadline:
                self.rows.append(failed(key, name, "-", "SKIPPED: over the time budget"))
                continue
            self.log(f"scenario: {name}")
            try:
                await step()
            except Exception as exc:  # noqa: BLE001 - recorded, the bench goes on
                self.rows.append(failed(key, name, "-", exc))
            for row in self.rows[before:]:
                self.log(f"  {brief(row)}")
            self.log(f"scenario: {name} done in {time.perf_counter() - started:.1f} s")
            self.on_step(self)
        return self.rows

    # ----- requests -------------------------------------------------------------------------

    async def image(self, size: int, max_tokens: int = 1, **kw: Any) -> Stream:
        """One request about a new size x size image sent by path."""
        path = self.files.path(size, self.new_seed())
        return await stream(self.client, [image_turn(path, QUESTIONS[0])], max_tokens, **kw)

    async def text(self, i: int) -> Stream:
        """A short text prompt (distinct per i), first token only."""
        return await stream(self.client, [_user(f"Say hello to user {i}.")], 1, logprobs=True)

    async def plain_text_ms(
        self, reps: int, untimed_first: bool = True, salt: str = ""
    ) -> list[float]:
        """TTFT of short text prompts read by a plain httpx client (no SDK parsing), after one
        untimed request on the same connection unless `untimed_first` is False: the server's
        share of the SDK's figure."""
        base = str(self.client.base_url).rstrip("/")
        times: list[float] = []
        skip = 1 if untimed_first else 0
        async with httpx.AsyncClient(base_url=base, timeout=120) as http:
            for i in range(reps + skip):
                body = {
                    "model": "bench",
                    "messages": [_user(f"Say hi to plain user {salt}{i}.")],
                    "max_tokens": 1,
                    "temperature": 0,
                    "stream": True,
                }
                start, first = time.perf_counter(), None
                async with http.stream("POST", "/chat/completions", json=body) as response:
                    async for line in response.aiter_lines():
                        if first is None and line.startswith("data:") and '"role"' not in line:
                            first = time.perf_counter() - start
                if i >= skip and first is not None:
                    times.append(1000 * first)
        return times

    async def decode_wave(
        self, n: int, tokens: int, temperature: float = 0.0, salt: str = "d", plain: bool = False
    ) -> list[Stream]:
        """`n` concurrent story requests of `tokens` tokens each (EOS ignored if the server
        takes `ignore_eos`; if it refuses the field, the wave is resent without it). Prompts
        differ by one character per `salt` and row: same shapes, different prefix-cache keys."""

        def one(i: int) -> Awaitable[Stream]:
            prompt = _user(f"Story {salt}{i:03d}. {STORY}")
            if plain:
                kw = {"temperature": temperature, "ignore_eos": True} if self.ignore_eos else {}
                return plain_stream(self.http, [prompt], tokens, **kw)
            kw = {"temperature": temperature, "ignore_eos": self.ignore_eos}
            return stream(self.client, [prompt], tokens, **kw)

        streams = await together(n, one)
        error = first_error(streams) or ""
        if self.ignore_eos and "ignore_eos" in error:
            self.log(f"server refused ignore_eos ({error}); resending without it")
            self.ignore_eos = False
            streams = await together(n, one)
        return streams

    def _early(self, streams: list[Stream], tokens: int) -> str:
        short = sum(1 for s in streams if s.completion_tokens < tokens)
        if not short:
            return ""
        why = "ignore_eos refused" if not self.ignore_eos else "ignore_eos not honoured?"
        return f"{short}/{len(streams)} streams stopped early ({why})"

    # ----- scenarios ------------------------------------------------------------------------

    async def first_requests(self) -> None:
        """The very first text and image requests after start, then later ones of each kind."""
        s, raw = self.s, self.raw
        # The client's own first-call costs (connection, SDK imports) are not the server's.
        await self.client.models.list()
        # The very first request by the plain client: the openai SDK's own first streamed call
        # costs the client ~27 ms (lazy imports and model building; measured on CPU against a
        # fresh server, whose first request is not slower when read by plain HTTP).
        first_plain = await self.plain_text_ms(1, untimed_first=False, salt="first ")
        first_text = await self.text(0)
        first_image = await self.image(s.image_size, logprobs=True)
        later_text = [await self.text(i + 1) for i in range(s.reps)]
        later_image = [await self.image(s.image_size, logprobs=True) for _ in range(s.reps)]
        text_ms = median([x.ttft_ms for x in later_text])
        plain_ms = median(await self.plain_text_ms(s.reps))
        image_ms = median([x.ttft_ms for x in later_image])
        sizes = raw.get("settings", {})
        lm_only = f"raw: LM prefill of {sizes.get('prefix_tokens')} tokens only"
        prompt = f"prompt {first_text.prompt_tokens} tokens (raw {sizes.get('text_tokens')})"
        raw_text, raw_image = raw.get("text_first_token_ms"), raw.get("prefill_ms")
        image = f"image {s.image_size} by path"
        self.rows += [
            Row("text_first_request_ms", "text TTFT, very first request after start, plain "
                "HTTP client", "ms", median(first_plain), raw_text, note=prompt),
            Row("text_first_request_sdk_ms", "text TTFT, first request by the openai SDK", "ms",
                first_text.ttft_ms, raw_text, note=first_text.error or "the SDK's first call"),
            Row("text_first_token_ms", "text TTFT, short prompt, max_tokens 1 (median)", "ms",
                text_ms, raw_text, note=first_error(later_text) or prompt),
            Row("text_first_token_plain_ms", "text TTFT, same, plain HTTP client (median)",
                "ms", plain_ms, raw_text, note="no SDK parsing: the server's share"),
            Row("text_first_vs_later", "text: first request / later (plain client)", "x",
                ratio(median(first_plain), plain_ms), target="<= 2"),
            Row("image_first_request_ms", f"{image}, first after start", "ms",
                first_image.ttft_ms, raw_image, note=first_image.error or lm_only),
            Row("image_cold_ms", f"{image}, new image, cold (median)", "ms",
                image_ms, raw_image, note=first_error(later_image) or lm_only),
            Row("image_first_vs_later", "image: first request / later cold", "x",
                ratio(first_image.ttft_ms, image_ms), target="<= 2"),
        ]  # fmt: skip
        self.details["first_requests"] = {
            "first_text": _summary(first_text),
            "first_image": _summary(first_image),
            "later_text": [_summary(x) for x in later_text],
            "later_image": [_summary(x) for x in later_image],
        }

    async def waves(self) -> None:
        """The first wave of concurrent text requests after start vs a second of the same
        shapes (other prompts, so no prefix-cache hits flatter it)."""
        walls = []
        for salt in ("a", "b"):
            started = time.perf_counter()
            streams = await self.decode_wave(self.s.wave, self.s.wave_tokens, salt=salt)
            walls.append(time.perf_counter() - started)
            if error := first_error(streams):
                raise RuntimeError(error)
        note = f"walls {1000 * walls[0]:.0f} / {1000 * walls[1]:.0f} ms"
        self.rows.append(
            Row("wave_first_vs_second", f"{self.s.wave} concurrent text: 1st wave / 2nd (wall)",
                "x", ratio(walls[0], walls[1]), target="<= 1.2", note=note)
        )  # fmt: skip

    async def new_size(self) -> None:
        """The first image of a size never seen vs later new images of that size."""
        size = self.s.new_size
        first = await self.image(size, logprobs=True)
        later = [await self.image(size, logprobs=True) for _ in range(self.s.reps)]
        later_ms = median([x.ttft_ms for x in later])
        note = first.error or first_error(later) or f"first {first.ttft_ms or 0:.0f} ms"
        self.rows.append(
            Row("new_size_first_vs_later", f"image {size}: first of new size / later cold",
                "x", ratio(first.ttft_ms, later_ms), target="<= 1.5", note=note)
        )  # fmt: skip
        self.details["new_size"] = [_summary(x) for x in [first, *later]]

    async def conversation(self, by: str, key: str = "") -> None:
        """Turns 2..T of a conversation about one image (each turn appends a new question):
        warm TTFT, the prefix cache holding everything before the new question."""
        size, seed = self.s.image_size, self.new_seed()
        url = self.files.path(size, seed) if by == "path" else self.files.uri(size, seed)
        messages = [image_turn(url, QUESTIONS[0])]
        turns: list[Stream] = []
        for turn in range(self.s.turns):
            if turn:
                messages.append(_user(QUESTIONS[turn % len(QUESTIONS)]))
            kw = {"logprobs": True, "ignore_eos": self.ignore_eos}
            reply = await stream(self.client, messages, self.s.answer_tokens, **kw)
            if reply.error:
                raise RuntimeError(f"turn {turn + 1}: {reply.error}")
            messages.append({"role": "assistant", "content": reply.text or "OK."})
            turns.append(reply)
        warm = turns[1:]
        cached = [f"{x.cached_tokens}/{x.prompt_tokens}" for x in warm]
        role_ms = median([x.role_ms for x in warm])
        note = f"role chunk {role_ms or 0:.1f} ms; cached/prompt {', '.join(cached)}"
        self.rows.append(
            Row(f"warm_ttft_{key or by}_ms",
                f"warm TTFT, turns 2-{self.s.turns}, image by {by}{' (again)' if key else ''}",
                "ms", median([x.ttft_ms for x in warm]), self.raw.get("warm_ttft_ms"), note=note)
        )  # fmt: skip
        self.details[f"conversation_{key or by}"] = [_summary(x) for x in turns]

    async def decode(self) -> None:
        """Greedy decode at each stream count, sampled at `sampled_streams`, and greedy again
        read by a plain HTTP client at the most streams (is the SDK client the limit?)."""
        runs = [(n, 0.0, False) for n in self.s.streams] + [(self.s.sampled_streams, 0.7, False)]
        runs.append((max(self.s.streams), 0.0, True))
        base = str(self.client.base_url).rstrip("/")
        async with httpx.AsyncClient(base_url=base, timeout=300) as self.http:
            for n, temperature, plain in runs:
                await self._decode_run(n, temperature, plain)

    async def _decode_run(self, n: int, temperature: float, plain: bool) -> None:
        tokens = self.s.decode_tokens
        await self.decode_wave(n, min(16, tokens), temperature)  # warm-up: these shapes
        waves = [
            await self.decode_wave(n, tokens, temperature, plain=plain)
            for _ in range(self.s.decode_reps)
        ]
        streams = median_wave(waves, key=lambda w: aggregate_tok_s(w) or 0.0)
        raw_agg = self.raw.get(f"decode_tok_s_b{n}")
        note = next((first_error(w) for w in waves if first_error(w)), None)
        note = note or self._early(streams, tokens)
        tag = f"_t{temperature:g}" if temperature else ("_plain" if plain else "")
        label = f"decode, {n} stream{'s' if n > 1 else ''}"
        label += f", temperature {temperature:g}" if temperature else ""
        label += ", plain HTTP client" if plain else ""
        agg = aggregate_tok_s(streams)
        agg_note = note or ("raw: greedy" if temperature else "")
        self.rows.append(
            Row(f"decode_agg_tok_s_{n}{tag}", f"{label}: aggregate", "tok/s", agg, raw_agg,
                note=agg_note)
        )  # fmt: skip
        self.rows.append(
            Row(f"decode_steady_tok_s_{n}{tag}", f"{label}: steady window", "tok/s",
                steady_tok_s(streams), raw_agg,
                note=note or "all streams decoding, first 10 tokens each skipped (as raw)")
        )  # fmt: skip
        if not temperature:
            per_raw = raw_agg / n if raw_agg else None
            self.rows.append(
                Row(f"decode_stream_tok_s_{n}{tag}", f"{label}: per stream (median)", "tok/s",
                    median([x.tok_s for x in streams]), per_raw, note=note)
            )  # fmt: skip

    async def image_batch(self) -> None:
        """Concurrent requests with distinct images: aggregate tok/s vs one such request."""
        n, size, tokens = self.s.image_batch, self.s.batch_image_size, self.s.decode_tokens
        single = await self.image(size, tokens, ignore_eos=self.ignore_eos)
        many = await together(n, lambda _: self.image(size, tokens, ignore_eos=self.ignore_eos))
        alone, agg = aggregate_tok_s([single]), aggregate_tok_s(many)
        early = self._early([single, *many], tokens)
        note = first_error([single, *many]) or f"{agg or 0:.1f} vs {alone or 0:.1f} tok/s"
        note += f"; {early}" if early else ""
        self.rows.append(
            Row("image_batch_gain", f"{n} concurrent {size}px images: aggregate / one alone",
                "x", ratio(agg, alone), target=f">= {max(1.0, n / 4):g}", note=note)
        )  # fmt: skip


def _summary(s: Stream) -> dict[str, Any]:
    """What the JSON keeps of one stream (ms relative to its start)."""
    return {
        "ttft_ms": s.ttft_ms,
        "role_ms": s.role_ms,
        "tok_s": s.tok_s,
        "prompt_tokens": s.prompt_tokens,
        "cached_tokens": s.cached_tokens,
        "completion_tokens": s.completion_tokens,
        "server_timing_ms": s.server_timing,
        "error": s.error,
    }
