"""Gemma 4's audio tower through the engine (families/gemma4.py) on the tiny offline
checkpoint, which has one (`make-model --arch gemma4`: a 2-layer Conformer, the real feature
extractor settings; one soft token per 40 ms).

Pinned at tolerance zero (token ids and logprobs): the engine's greedy answer to an audio +
text question equals mlx-vlm's own `stream_generate` on the same samples (tests/reference.py)
for clips of two lengths, an image with a clip, two clips, in float32 and bf16; batched ==
alone; cached == uncached over a multi-turn
conversation about one clip (prefix blocks over the audio run, audio-feature cache hits);
the same samples delivered as WAV and as FLAC are one content hash, so one cache entry; a
model without an audio tower refuses an audio part naming it.
"""

from __future__ import annotations

import base64
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import pytest
from audio_clips import chirp, encode
from support import EngineHarness, Run, tiny_model

from gateway.engine.families.gemma4 import Gemma4
from gateway.frontend.prompt import UnsupportedImage
from gateway.media.audio_decode import DecodedAudio, decode_audio
from gateway.processors.audio import AudioGrid
from tests.gateway.engine.families.common import (
    assert_cached_equals_uncached,
    conversation,
    engine_request,
)

FIXTURES = Path(__file__).resolve().parents[4] / "fixtures"
QUESTION = "What is said in this clip?"
RATE = 16000


@pytest.fixture(scope="module")
def clips() -> list[DecodedAudio]:
    """A 1.3 s clip recorded at 16 kHz and a 2.07 s one at 44.1 kHz (resampled), as WAV."""
    return [
        decode_audio(encode(chirp(1.3, RATE, 440.0), RATE, "wav"), RATE, 60.0, "data"),
        decode_audio(encode(chirp(2.07, 44100, 300.0), 44100, "wav"), RATE, 60.0, "data"),
    ]


def audio_body(question: str, max_tokens: int = 10) -> dict:
    """A greedy OpenAI chat body: the question, then one `input_audio` part (its data is a
    placeholder: the engine harness hands the decoded clip in)."""
    part = {"type": "input_audio", "input_audio": {"data": "UklGRg==", "format": "wav"}}
    content = [{"type": "text", "text": question}, part]
    return {
        "model": "test",
        "temperature": 0,
        "max_tokens": max_tokens,
        "logprobs": True,
        "messages": [{"role": "user", "content": content}],
    }


def _body(question: str, kinds: Sequence[str], max_tokens: int = 10) -> dict:
    """A greedy chat body: an image part for each "image" in `kinds` first, the question,
    then an `input_audio` part for each "audio" (mlx-vlm's template helper puts audio after
    the text and images before it)."""
    body = audio_body(question, max_tokens)
    image = {"type": "image_url", "image_url": {"url": "x"}}
    audio = body["messages"][0]["content"][1]
    content = [image] * kinds.count("image") + [body["messages"][0]["content"][0]]
    body["messages"][0]["content"] = content + [audio] * kinds.count("audio")
    return body


@pytest.mark.parametrize("weights", ["float32", "bfloat16"])
def test_greedy_answer_equals_mlx_vlm_generate(weights: str, clips: list[DecodedAudio]) -> None:
    """Invariant: engine == mlx-vlm's generate (prompt ids, answer ids, logprobs) on the
    same samples: a 33-token and a 52-token clip (audio runs crossing 32-token blocks, the
    48-token window wrapped), an image and a clip in one prompt (mlx-vlm then prefills in
    chunks, causally: no image overlay), two clips longest first."""
    from PIL import Image
    from reference import reference_generate

    path = tiny_model("gemma4", weights)
    image = Image.open(FIXTURES / "shapes.png").convert("RGB")
    cases = [
        ([clips[0]], ["audio"]),
        ([clips[1]], ["audio"]),
        ([image, clips[0]], ["image", "audio"]),
        ([clips[1], clips[0]], ["audio", "audio"]),
    ]
    h = EngineHarness(path=path, max_batch=2)
    try:
        assert isinstance(h.engine.model, Gemma4)
        assert "audio" in h.engine.model.media
        for media, kinds in cases:
            body = _body(QUESTION, kinds)
            content = [{"type": "image"}] * kinds.count("image")
            messages = [{"role": "user", "content": [*content, {"type": "text", "text": QUESTION}]}]
            request = engine_request(h, body, media)
            for item, layout in zip(media, request.images, strict=True):
                if isinstance(item, DecodedAudio):
                    tokens = layout.layout.num_tokens - 2  # less `<|audio>`, `<audio|>`
                    assert layout.grid_thw == AudioGrid.of(tokens)
                    assert tokens == int(np.ceil(len(item.samples) / RATE * 1000 / 40))
            images = [m for m in media if not isinstance(m, DecodedAudio)]
            audio = [m.samples for m in media if isinstance(m, DecodedAudio)]
            ref = reference_generate(path, messages, images, max_tokens=10, audio=audio)
            assert list(request.prompt_ids) == list(ref.prompt_ids)
            run = h.run(body, media)
            assert run.token_ids == list(ref.token_ids), kinds
            assert run.logprobs == list(ref.logprobs), kinds  # tolerance zero
    finally:
        h.close()


def test_batched_equals_alone(clips: list[DecodedAudio]) -> None:
    """Invariant: audio rows decoded together with text and image rows (other prompt
    lengths, ring phases, left padding) answer as each does alone."""
    from PIL import Image

    from tests.gateway.engine.families.common import assert_batched_equals_alone

    image = Image.open(FIXTURES / "shapes.png").convert("RGB")
    h = EngineHarness(path=tiny_model("gemma4"), max_batch=8)
    try:
        requests = [
            (_body(QUESTION, ["audio"], 12), [clips[0]]),
            (_body("Hi", [], 12), []),
            (_body("And this?", ["image", "audio"], 12), [image, clips[1]]),
            (_body("Short?", ["audio"], 12), [clips[1]]),
        ]
        assert_batched_equals_alone(h, requests, clear_caches=True)
    finally:
        h.close()


def test_cached_equals_uncached(clips: list[DecodedAudio]) -> None:
    """Invariant: follow-up turns that resend the clip (prefix blocks over the audio run) and
    a new question about it (an audio-feature cache hit) change no token id and no logprob."""
    clip = clips[1]

    def talk(h: EngineHarness) -> list[Run]:
        first = (audio_body(QUESTION), [clip])
        then = [(audio_body("Who speaks, and in which language?"), [clip])]
        return conversation(h, first, 3, lambda t: f"And what about second {t}?", then)

    def check(cached: EngineHarness, runs: list[Run]) -> None:
        span = engine_request(cached, audio_body(QUESTION), [clip]).images[0].layout
        assert all(r.finish.usage.cached_tokens >= span.end - 32 for r in runs[1:3])
        # Another question before the clip: the clip's blocks differ, its features do not.
        assert runs[3].finish.usage.vision_hits == 1

    assert_cached_equals_uncached(tiny_model("gemma4"), talk, check, max_batch=2)


def test_wav_and_flac_of_the_same_samples_share_one_entry(clips: list[DecodedAudio]) -> None:
    """Invariant: the cache key is the decoded samples' hash, so a FLAC delivery of the WAV
    clip's samples hits every cache the WAV one filled (and answers the same); one changed
    sample is another key."""
    samples = chirp(1.3, 44100, 440.0)
    wav, flac = encode(samples, 44100, "wav"), encode(samples, 44100, "flac")
    assert wav != flac
    as_wav = decode_audio(wav, RATE, 60.0, "data")
    as_flac = decode_audio(flac, RATE, 60.0, "path")
    assert as_wav.content_hash == as_flac.content_hash
    changed = samples.copy()
    changed[1000] += 1 / 32767
    other = decode_audio(encode(changed, 44100, "flac"), RATE, 60.0, "data")
    assert other.content_hash != as_wav.content_hash
    h = EngineHarness(path=tiny_model("gemma4"), max_batch=2)
    try:
        first = h.run(audio_body(QUESTION), [as_wav])
        again = h.run(audio_body("Another question?"), [as_flac])
        assert again.finish.usage.vision_hits == 1 and again.finish.usage.vision_misses == 0
        same = h.run(audio_body(QUESTION), [as_flac])
        assert same.token_ids == first.token_ids and same.logprobs == first.logprobs
        assert same.finish.usage.cached_tokens > 0
        miss = h.run(audio_body("Another question?"), [other])
        assert miss.finish.usage.vision_misses == 1
    finally:
        h.close()


def test_model_without_audio_tower_refuses_audio(clips: list[DecodedAudio]) -> None:
    """Invariant: an audio part sent to a model without an audio tower is a refusal naming
    the part (never silently dropped)."""
    h = EngineHarness(path=tiny_model("qwen2_vl"), max_batch=1)
    try:
        with pytest.raises(UnsupportedImage) as refused:
            engine_request(h, audio_body(QUESTION), [clips[0]])
        assert refused.value.kind == "audio" and refused.value.index == 0
        assert "content[1].input_audio.data" in str(refused.value)
    finally:
        h.close()


def test_input_audio_part_parses_to_a_data_uri() -> None:
    """Invariant: an OpenAI `input_audio` part becomes an audio part over a data URI of its
    format, named by its field; a bad format is a 400 naming `format`."""
    from gateway.api.openai.parse import parse_chat_request
    from gateway.errors import APIError

    data = base64.b64encode(b"RIFF....").decode()
    body = audio_body(QUESTION)
    body["messages"][0]["content"][1]["input_audio"]["data"] = data
    [part] = parse_chat_request(body).audio
    assert part.url == f"data:audio/wav;base64,{data}"
    assert part.param == "messages[0].content[1].input_audio.data"
    body["messages"][0]["content"][1]["input_audio"]["format"] = "midi"
    with pytest.raises(APIError) as bad:
        parse_chat_request(body)
    assert bad.value.param == "messages[0].content[1].input_audio.format"


def test_stepwise_audio_tower_yields_units_and_the_whole_towers_features(
    clips: list[DecodedAudio],
) -> None:
    """Invariant: the audio tower runs one unit per step (its convolutional front end, then
    each Conformer block), announced to the step budget, and gives, bit for bit, the features
    of the whole tower run at once."""
    import mlx.core as mx

    from gateway.engine.families.registry import load_model
    from gateway.processors.audio import AudioClip

    family = load_model(str(tiny_model("gemma4")))
    features, grid = family.preprocess(AudioClip(clips[1].samples, clips[1].rate))
    steps = family.encode_steps(features, grid)
    units = []
    while True:
        try:
            units.append(next(steps))
        except StopIteration as done:
            stepwise = done.value
            break
    assert [u.kind for u in units] == ["embed", "block", "block"], units
    whole = family.encode_image(features, grid)
    assert mx.array_equal(stepwise.features, whole.features).item()
    assert stepwise.features.shape[0] == grid.tokens + 2  # with `<|audio>`, `<audio|>`


def test_models_card_says_audio_before_and_after_load() -> None:
    """Invariant: /v1/models' preview of a Gemma 4 checkpoint (config.json alone) lists audio
    when the config has an audio tower and not when it has none; the loaded family agrees."""
    import json
    import shutil
    import tempfile
    from pathlib import Path

    from gateway.pool.build import preview

    path = tiny_model("gemma4")
    card, _ = preview(str(path))
    assert card["media"] == ["audio", "image"] and card["capabilities"]["audio"]
    assert sorted(Gemma4(str(path), lazy=True).media) == card["media"]
    with tempfile.TemporaryDirectory() as tmp:
        copy = Path(tmp) / "no-audio"
        shutil.copytree(path, copy)
        config = json.loads((copy / "config.json").read_text())
        config["audio_config"] = None
        (copy / "config.json").write_text(json.dumps(config))
        card, _ = preview(str(copy))
        assert card["media"] == ["image"] and not card["capabilities"]["audio"]


def test_cache_stats_count_lookups_by_media(clips: list[DecodedAudio]) -> None:
    """Invariant: the vision cache's stats and /metrics count audio-feature lookups under
    media "audio" and image lookups under "image" (one cache, two labels)."""
    from PIL import Image

    from gateway.engine.cache_ops import cache_stats
    from gateway.metrics import CacheCollector

    h = EngineHarness(path=tiny_model("gemma4"), max_batch=2)
    try:
        h.run(audio_body(QUESTION, max_tokens=2), [clips[0]])
        h.run(audio_body("Again?", max_tokens=2), [clips[0]])
        image = Image.new("RGB", (96, 96), (200, 30, 30))
        body = {**audio_body("A picture?", max_tokens=2)}
        body["messages"] = [{"role": "user", "content": [
            {"type": "image_url", "image_url": {"url": "x"}}, {"type": "text", "text": "Hi?"}
        ]}]  # fmt: skip
        h.run(body, [image])
        engine = h.engine
        stats = cache_stats(engine.vision_cache, engine.prefix_cache)
        assert stats["vision"]["media"] == {
            "audio": {"queries": 2, "hits": 1},
            "image": {"queries": 1, "hits": 0},
        }
        samples = {
            (m.name, s.labels.get("media")): s.value
            for m in CacheCollector(lambda: stats).collect()
            for s in m.samples
            if "media" in m.name
        }
        assert samples[("vision_gateway_vision_cache_media_hits", "audio")] == 1
    finally:
        h.close()


def test_a_restarted_engine_reads_audio_features_and_blocks_from_disk(
    clips: list[DecodedAudio], tmp_path: Path
) -> None:
    """Invariant: the disk tier holds audio like images: a new engine on the same
    `--cache-dir` takes a clip's features (a question placed before the clip) and the
    prompt's blocks over it (the same question) from disk, with the uncached answers."""
    from support import assert_same_answers

    from gateway.config import CacheConfig
    from gateway.engine.request import AdmittedEvent
    from tests.gateway.engine.families.common import NO_CACHES

    def ask(h: EngineHarness, question: str) -> tuple[Run, AdmittedEvent]:
        run = h.run(_body(question, ["audio"], 6), [clips[1]])
        return run, next(e for e in run.events if isinstance(e, AdmittedEvent))

    other = "Before anything else, which language is it?"
    cold = EngineHarness("gemma4", cache=NO_CACHES, warmup=False)
    try:
        want = [ask(cold, QUESTION)[0], ask(cold, other)[0]]
    finally:
        cold.close()
    writer = EngineHarness("gemma4", cache=CacheConfig(cache_dir=tmp_path), warmup=False)
    try:
        ask(writer, QUESTION)
    finally:
        writer.close()  # drains the writer thread
    reader = EngineHarness("gemma4", cache=CacheConfig(cache_dir=tmp_path), warmup=False)
    try:
        features, admitted = ask(reader, other)
        assert admitted.vision_disk_hits == 1
        blocks, admitted = ask(reader, QUESTION)
        assert admitted.disk_cached_tokens > 0
        assert_same_answers([blocks, features], want)
    finally:
        reader.close()


def test_two_cache_scopes_never_share_a_clip(clips: list[DecodedAudio]) -> None:
    """Invariant: a clip's cache entries are scoped like an image's: the same samples under
    another scope (another tenant, or a `cache_salt`) read no feature and no block of the
    first scope's, and answer the same."""
    from dataclasses import replace

    from caches.scope import scope_tag
    from gateway.api.openai.parse import parse_chat_request

    h = EngineHarness(path=tiny_model("gemma4"), max_batch=2)
    try:
        chat = parse_chat_request(audio_body(QUESTION, max_tokens=4))
        first = h.submit_chat(replace(chat, cache_scope=scope_tag("alice", "")), [clips[0]]).wait()
        other = h.submit_chat(replace(chat, cache_scope=scope_tag("bob", "")), [clips[0]]).wait()
        assert other.finish.usage.vision_hits == 0 and other.finish.usage.cached_tokens == 0
        assert other.token_ids == first.token_ids and other.logprobs == first.logprobs
        again = h.submit_chat(replace(chat, cache_scope=scope_tag("alice", "")), [clips[0]]).wait()
        assert again.finish.usage.cached_tokens > 0
    finally:
        h.close()
