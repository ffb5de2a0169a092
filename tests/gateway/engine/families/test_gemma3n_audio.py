"""Gemma 3n's audio tower through the engine (families/gemma3n.py) on the tiny offline
checkpoint (`make-model --arch gemma3n`: a 2-layer Conformer, upstream's feature extractor
settings; every clip 188 soft tokens, padding embeddings after the tower's rows).

Pinned at tolerance zero (token ids and logprobs): the engine's greedy answer to an audio +
text question equals mlx-vlm's own generate (a short and a longer clip; an image and a clip
in one prompt); cached == uncached
(a follow-up turn resending the clip, a new question about it: an audio-feature hit);
batched == alone (audio and text rows); a clip longer than the soft tokens cover (30 s) is
refused, a clip at another rate is refused, the clip's settings are in the cache key.
"""

from __future__ import annotations

import numpy as np
import pytest
from audio_clips import chirp, encode
from support import EngineHarness, Run, tiny_model

from gateway.engine.families.gemma3n import Gemma3n
from gateway.media.audio_decode import DecodedAudio, decode_audio
from gateway.processors.audio import AudioGrid
from tests.gateway.engine.families.common import (
    assert_batched_equals_alone,
    assert_cached_equals_uncached,
    conversation,
    engine_request,
)

RATE = 16000
QUESTION = "What is this sound?"


@pytest.fixture(scope="module")
def clips() -> list[DecodedAudio]:
    """A 1.3 s clip recorded at 16 kHz and a 4.07 s one at 44.1 kHz (resampled), as WAV."""
    return [
        decode_audio(encode(chirp(1.3, RATE, 440.0), RATE, "wav"), RATE, 60.0, "data"),
        decode_audio(encode(chirp(4.07, 44100, 300.0), 44100, "wav"), RATE, 60.0, "data"),
    ]


def audio_body(question: str, max_tokens: int = 10, clips: int = 1) -> dict:
    """A greedy OpenAI chat body: the question, then `clips` `input_audio` parts (their data
    is a placeholder: the engine harness hands the decoded clips in)."""
    part = {"type": "input_audio", "input_audio": {"data": "UklGRg==", "format": "wav"}}
    content = [{"type": "text", "text": question}] + [part] * clips
    return {
        "model": "test",
        "temperature": 0,
        "max_tokens": max_tokens,
        "logprobs": True,
        "messages": [{"role": "user", "content": content}],
    }


def test_greedy_answer_equals_mlx_vlm_generate(clips: list[DecodedAudio]) -> None:
    """Invariant: engine == mlx-vlm's generate (prompt ids, answer ids, logprobs) on the same
    samples, for a 1.3 s and a 4.07 s clip (8 and 26 tower rows, then padding embeddings up
    to 188 soft tokens; the run crosses 32-token blocks and the 48-token window wraps)."""
    from reference import reference_generate

    path = tiny_model("gemma3n")
    h = EngineHarness(path=path, max_batch=2)
    try:
        assert isinstance(h.engine.model, Gemma3n)
        assert "audio" in h.engine.model.media
        for clip in clips:
            body = audio_body(QUESTION)
            request = engine_request(h, body, [clip])
            assert request.images[0].grid_thw == AudioGrid.of(188)
            messages = [{"role": "user", "content": [{"type": "text", "text": QUESTION}]}]
            ref = reference_generate(path, messages, max_tokens=10, audio=[clip.samples])
            assert list(request.prompt_ids) == list(ref.prompt_ids)
            run = h.run(body, [clip])
            assert run.token_ids == list(ref.token_ids)
            assert run.logprobs == list(ref.logprobs)  # tolerance zero
    finally:
        h.close()


def test_image_and_clip_answer_equals_mlx_vlm_generate(clips: list[DecodedAudio]) -> None:
    """Invariant: an image and a clip in one prompt (both merges, both marker pairs, in
    prompt order) answer as mlx-vlm's generate does. (One image: the tower costs tens of
    seconds on a CPU.)"""
    from pathlib import Path

    from PIL import Image
    from reference import reference_generate

    fixtures = Path(__file__).resolve().parents[4] / "fixtures"
    image = Image.open(fixtures / "shapes.png").convert("RGB")
    path = tiny_model("gemma3n")
    h = EngineHarness(path=path, max_batch=2)
    try:
        body = audio_body(QUESTION)
        picture = {"type": "image_url", "image_url": {"url": "x"}}
        body["messages"][0]["content"].insert(0, picture)
        parts = [{"type": "image"}, {"type": "text", "text": QUESTION}]
        messages = [{"role": "user", "content": parts}]
        ref = reference_generate(path, messages, [image], max_tokens=10, audio=[clips[0].samples])
        assert list(engine_request(h, body, [image, clips[0]]).prompt_ids) == list(ref.prompt_ids)
        run = h.run(body, [image, clips[0]])
        assert run.token_ids == list(ref.token_ids)
        assert run.logprobs == list(ref.logprobs)  # tolerance zero
    finally:
        h.close()


def test_cached_equals_uncached(clips: list[DecodedAudio]) -> None:
    """Invariant: a follow-up turn resending the clip (prefix blocks over the audio run and
    the KV-sharing layers) and a new question about it (an audio-feature hit) change no
    token id and no logprob."""

    def talk(h: EngineHarness) -> list[Run]:
        first = (audio_body(QUESTION), [clips[1]])
        then = [(audio_body("Again: what do you hear?"), [clips[1]])]
        return conversation(h, first, 2, lambda t: f"And part {t}?", then)

    def check(cached: EngineHarness, runs: list[Run]) -> None:
        del cached
        # The follow-up reads the first turn's blocks; the new question's text comes before
        # the clip (mlx-vlm's template order), so it shares only the clip's features.
        assert runs[1].finish.usage.cached_tokens >= 192
        assert runs[2].finish.usage.vision_hits == 1

    assert_cached_equals_uncached(tiny_model("gemma3n"), talk, check, max_batch=2)


def test_batched_equals_alone(clips: list[DecodedAudio]) -> None:
    """Invariant: audio rows decoded together with text rows (other prompt lengths, ring
    phases, left padding) answer as each does alone."""
    h = EngineHarness(path=tiny_model("gemma3n"), max_batch=4)
    try:
        requests = [
            (audio_body(QUESTION, 12), [clips[0]]),
            (audio_body("Hi", 12, clips=0), []),
            (audio_body("Short?", 12), [clips[1]]),
        ]
        assert_batched_equals_alone(h, requests, clear_caches=True)
    finally:
        h.close()


def test_clip_bounds_and_cache_key() -> None:
    """Invariant: a clip the soft tokens do not cover (over 30 s: the feature extractor
    would cut it) or at another rate is refused with the reason; the feature extractor's
    settings are part of the processor fingerprint."""
    model = Gemma3n(str(tiny_model("gemma3n")), lazy=True)
    prompt = model.prompt
    assert prompt.audio_grid(30 * RATE, RATE) == AudioGrid.of(188)
    with pytest.raises(ValueError, match="at most 30 s"):
        prompt.audio_grid(30 * RATE + 1, RATE)
    with pytest.raises(ValueError, match="16000 Hz"):
        prompt.audio_grid(RATE, 44100)
    with pytest.raises(ValueError, match="no samples"):
        prompt.audio_grid(0, RATE)
    extractor = model.processor.feature_extractor
    before = model.processor_fingerprint
    extractor.preemphasis = float(np.float32(extractor.preemphasis) / 2)
    again = Gemma3n(str(tiny_model("gemma3n")), lazy=True)
    assert again.processor_fingerprint == before  # a fresh load: the checkpoint's settings
    assert model._audio_fingerprint() != again._audio_fingerprint()
