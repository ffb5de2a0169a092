"""Media loading: image references (http(s) URL, data URI, local path) -> decoded, hashed
pixels under the limits of a `MediaConfig`.

Outside this package only `MediaLoader` and `DecodedImage` are used (import them from here);
`loader` is the one module that uses the others: `sources` (data URIs, local files),
`url_fetch` + `url_policy` (SSRF-safe fetching), `image_decode` (Pillow, pixel hashing) and
`single_flight` (one fetch per URL, one decode per byte hash).
"""

from gateway.media.loader import DecodedImage, MediaLoader

__all__ = ["DecodedImage", "MediaLoader"]
