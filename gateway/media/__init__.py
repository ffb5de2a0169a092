"""Media loading: image references (http(s) URL, data URI, local path) -> decoded, hashed
pixels under the limits of a `MediaConfig`.

Outside this package only `MediaLoader` and the decoded types are used (import them from here);
`loader` is the one module that uses the others: `sources` (data URIs, local files),
`url_fetch` + `url_policy` (SSRF-safe fetching), `image_decode` (Pillow, pixel hashing) and
`single_flight` (one fetch per URL, one decode per byte hash). Videos and audio load through
`clip_loader` (the same sources and fetcher rules, a memo of decoded clips) and decode in
`video_decode` (PyAV, frame sampling) and `audio_decode` (PyAV: mono, resampled to the
model's rate, hashed over the samples).
"""

from gateway.media.audio_decode import DecodedAudio
from gateway.media.loader import DecodedImage, MediaLoader
from gateway.media.video_decode import DecodedVideo

__all__ = ["DecodedAudio", "DecodedImage", "DecodedVideo", "MediaLoader"]
