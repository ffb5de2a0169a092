"""Limits and permissions for loading images and videos (`MediaConfig`), built once at the
edge like every config (re-exported by gateway/config.py).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from gateway.config_fields import MIB, flag
from gateway.config_fields import require as _require


@dataclass(frozen=True)
class MediaConfig:
    """Limits and permissions for loading images from URLs, data URIs and local paths."""

    allowed_media_dirs: tuple[Path, ...] = flag(
        "--allowed-media-dir",
        "serve local image paths under DIR (repeatable); none: paths are refused",
        (),
        kind="list",
        metavar="DIR",
    )
    allow_private_urls: bool = flag(
        "--allow-private-urls",
        "allow image URLs on loopback/private/link-local addresses (off: SSRF protection)",
        False,
        kind="on",
    )
    allowed_url_hosts: tuple[str, ...] = flag(  # empty: any public host
        "--allowed-url-host",
        "only fetch image URLs from these hosts (repeatable)",
        (),
        kind="list",
        metavar="HOST",
    )
    max_image_bytes: int = flag("--max-image-bytes", "per image, bytes", 20 * MIB)
    max_image_pixels: int = flag(
        "--max-image-pixels", "per image, checked from the header before decoding", 40_000_000
    )
    max_request_pixels: int = flag(
        "--max-request-pixels", "all images of one request together", 160_000_000
    )
    max_images_per_request: int = flag(
        "--max-images-per-request", "images in one request (more: 400)", 16
    )
    connect_timeout_s: float = flag(
        "--url-connect-timeout", "seconds to connect to an image or video URL's host", 5.0
    )
    read_timeout_s: float = flag(
        "--url-read-timeout",
        "seconds an image or video URL may go without sending bytes (a whole fetch: at most "
        "connect + read timeout)",
        15.0,
    )
    max_redirects: int = flag("--max-redirects", "redirects followed per image URL", 3)
    decode_memo_mb: int = 64  # encoded-bytes hash -> decoded image memo
    # Video (the `video_url` part): the encoded clip's size, its length, and how many frames
    # are sampled from it (at `video_fps` frames per second, spread evenly when the clip is
    # longer than max_video_frames / video_fps seconds).
    max_video_bytes: int = flag(
        "--max-video-bytes", "per video (the encoded clip), bytes (more: 413)", 64 * MIB
    )
    max_video_seconds: float = flag(
        "--max-video-seconds", "per video, its length in seconds (longer: 413)", 120.0
    )
    max_video_frames: int = flag(
        "--max-video-frames",
        "frames sampled per video at most (a longer clip is sampled more sparsely)",
        32,
    )
    video_fps: float = flag(
        "--video-fps", "frames sampled per second of video (up to --max-video-frames)", 2.0
    )

    # Audio (`input_audio` / `audio_url` parts): the encoded clip's size and its length (a
    # model may read less: Gemma 4 reads 30 s a clip, and says so in a 400).
    max_audio_bytes: int = flag(
        "--max-audio-bytes", "per audio clip (the encoded bytes), bytes (more: 413)", 32 * MIB
    )
    max_audio_seconds: float = flag(
        "--max-audio-seconds", "per audio clip, its length in seconds (longer: 400)", 600.0
    )

    def __post_init__(self) -> None:
        _require(self.max_image_bytes > 0, "--max-image-bytes must be > 0")
        _require(self.max_image_pixels > 0, "--max-image-pixels must be > 0")
        _require(self.max_video_bytes > 0, "--max-video-bytes must be > 0")
        _require(self.max_audio_bytes > 0, "--max-audio-bytes must be > 0")
        _require(self.max_audio_seconds > 0, "--max-audio-seconds must be > 0")
        _require(self.max_video_seconds > 0, "--max-video-seconds must be > 0")
        _require(1 <= self.max_video_frames <= 1024, "--max-video-frames must be in 1..1024")
        _require(0 < self.video_fps <= 60, "--video-fps must be in (0, 60]")
        _require(
            self.max_request_pixels >= self.max_image_pixels or self.max_request_pixels > 0,
            "--max-request-pixels must be > 0",
        )
        _require(self.max_images_per_request >= 0, "--max-images-per-request must be >= 0")
        _require(
            self.connect_timeout_s > 0 and self.read_timeout_s > 0,
            "--url-connect-timeout and --url-read-timeout must be > 0",
        )
        _require(0 <= self.max_redirects <= 10, "--max-redirects must be in 0..10")
        _require(self.decode_memo_mb >= 0, "decode memo size must be >= 0")
        folders = tuple(Path(p).expanduser().resolve() for p in self.allowed_media_dirs)
        missing = next((f for f in folders if not f.is_dir()), None)
        # (a typo here would refuse every local path, each with a 400 naming the flag)
        _require(missing is None, f"--allowed-media-dir {missing}: not a folder")
        object.__setattr__(self, "allowed_media_dirs", folders)
        object.__setattr__(
            self, "allowed_url_hosts", tuple(h.lower().rstrip(".") for h in self.allowed_url_hosts)
        )
