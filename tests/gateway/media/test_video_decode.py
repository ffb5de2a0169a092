"""Video decoding, frame sampling, identity and limits (PyAV; no MLX).

Pinned: frames are sampled at the configured rate and capped (a long clip is sampled evenly
over its whole length); the content hash is the sampled frames' decoded pixels plus the
sampling parameters, so the same frames in another container hit and one changed sampled
frame misses (a changed frame that is not sampled does not matter); every unusable input is a
4xx APIError, never another exception.
"""

from __future__ import annotations

import numpy as np
import pytest
from video_clips import clip_bytes, lossy_clip, noise_frames

from gateway.errors import APIError
from gateway.media.video_decode import VideoSampling, decode_video

SAMPLING = VideoSampling(fps=2.0, max_frames=8, max_seconds=30.0, max_pixels=4_000_000)


def _decode(data: bytes, sampling: VideoSampling = SAMPLING):
    return decode_video(data, sampling, "data")


def test_samples_at_the_rate_with_exact_pixels() -> None:
    """Invariant: at 2 fps from a 4 fps clip every second frame is kept, pixels unchanged."""
    frames = noise_frames(8)
    video = _decode(clip_bytes(frames, fps=4))
    assert video.times == (0.0, 0.5, 1.0, 1.5)
    assert np.array_equal(video.frames, frames[::2])
    assert video.duration == pytest.approx(2.0)
    assert not video.frames.flags.writeable


def test_a_long_clip_is_sampled_evenly_up_to_the_cap() -> None:
    """Invariant: never more than max_frames frames, spread over the whole clip."""
    video = _decode(clip_bytes(noise_frames(40, 32, 32), fps=4))  # 10 s: 20 at 2 fps
    assert video.num_frames == SAMPLING.max_frames
    assert video.times[0] == 0.0 and video.times[-1] >= 8.0
    steps = np.diff(video.times)
    assert steps.min() > 0 and steps.max() - steps.min() <= 0.5


def test_same_frames_in_other_containers_hash_the_same() -> None:
    """Invariant: identity is the decoded pixels, not the container or its bytes."""
    frames = noise_frames(6)
    hashes = {c: _decode(clip_bytes(frames, 4, c)).content_hash for c in ("mov", "mkv", "avi")}
    assert len(set(hashes.values())) == 1, hashes
    assert _decode(lossy_clip(frames)).content_hash != hashes["mov"]  # lossy: other pixels


def test_one_changed_sampled_frame_misses_and_an_unsampled_one_does_not() -> None:
    """Invariant: one pixel of one sampled frame changes the hash; a skipped frame cannot."""
    frames = noise_frames(8)
    base = _decode(clip_bytes(frames)).content_hash
    sampled, skipped = frames.copy(), frames.copy()
    sampled[2, 5, 5, 0] ^= 1  # frame 2 is sampled at 2 fps
    skipped[3, 5, 5, 0] ^= 1  # frame 3 is not
    assert _decode(clip_bytes(sampled)).content_hash != base
    assert _decode(clip_bytes(skipped)).content_hash == base


def test_sampling_parameters_are_part_of_the_identity() -> None:
    """Invariant: the same bytes sampled differently are a different video."""
    data = clip_bytes(noise_frames(8))
    other = VideoSampling(fps=4.0, max_frames=8, max_seconds=30.0, max_pixels=4_000_000)
    assert _decode(data).content_hash != _decode(data, other).content_hash
    capped = VideoSampling(fps=2.0, max_frames=2, max_seconds=30.0, max_pixels=4_000_000)
    assert _decode(data, capped).num_frames == 2


@pytest.mark.parametrize(
    ("data", "status", "words"),
    [
        (b"", 400, "empty"),
        (b"\x00\x00\x00\x18ftypmp42" + b"\x00" * 64, 400, "could not"),
        (b"GIF89a not really a video", 400, "could not"),
        (b"x" * 5000, 400, "could not"),
    ],
    ids=["zero-length", "truncated-mp4", "wrong-type", "garbage"],
)
def test_unusable_bytes_are_400(data: bytes, status: int, words: str) -> None:
    """Invariant: bad containers and empty input are a 4xx APIError saying what is wrong."""
    with pytest.raises(APIError) as caught:
        _decode(data)
    assert caught.value.status == status and words in caught.value.message


def test_a_clip_over_the_length_limit_is_413() -> None:
    """Invariant: --max-video-seconds is enforced (from the header, before decoding)."""
    short = VideoSampling(fps=2.0, max_frames=8, max_seconds=1.0, max_pixels=4_000_000)
    with pytest.raises(APIError) as caught:
        _decode(clip_bytes(noise_frames(12), fps=4), short)  # 3 s
    assert caught.value.status == 413 and "--max-video-seconds" in caught.value.message


def test_a_huge_frame_count_is_refused_without_decoding_it_all() -> None:
    """Invariant: a clip packing more frames than max_seconds * 240 fps is a 413."""
    short = VideoSampling(fps=2.0, max_frames=8, max_seconds=1.0, max_pixels=4_000_000)
    with pytest.raises(APIError) as caught:
        _decode(clip_bytes(noise_frames(300, 16, 16), fps=1000), short)  # 0.3 s, 300 frames
    assert caught.value.status == 413 and "frames" in caught.value.message


def test_frames_over_the_pixel_limit_are_413() -> None:
    """Invariant: the per-frame pixel limit (--max-image-pixels) applies to video frames."""
    small = VideoSampling(fps=2.0, max_frames=8, max_seconds=30.0, max_pixels=1000)
    with pytest.raises(APIError) as caught:
        _decode(clip_bytes(noise_frames(2)), small)
    assert caught.value.status == 413


def test_large_frames_are_held_scaled_down_with_their_aspect() -> None:
    """Invariant: a sampled frame is held at <= HELD_PIXELS pixels, aspect ratio kept, so
    decoding memory is bounded whatever the clip's resolution."""
    from gateway.media.video_decode import HELD_PIXELS

    video = _decode(clip_bytes(noise_frames(2, 1600, 1200), fps=4))
    assert video.width * video.height <= HELD_PIXELS
    assert abs(video.width / video.height - 1600 / 1200) < 0.01
