"""Hostile image references, each with the exact answer it must get (the table test is
test_table.py): bad data URIs and image bytes, schemes and local paths outside the allowed
media dir (traversal, symlinks, a fifo), and SSRF attempts at the loopback image server
however its address is spelled. Invariant pinned there: each gets its exact 4xx status and an
OpenAI error object naming `messages[0].content[0].image_url.url`, and refusal comes before
any connection (the image server sees no request).
"""

from __future__ import annotations

from typing import Any

import pytest
from support import data_uri, noise_png, png_claiming

from tests.gateway.hostile.server import IMAGE_PARAM, PNG, Case, image

IMAGE_CASES: list[Any] = [
    # --- image payloads
    pytest.param(
        Case(image("data:image/png;base64,!!!not base64!!!"), 400, "invalid_data_uri", IMAGE_PARAM),
        id="data-uri-bad-base64",
    ),
    pytest.param(
        Case(image("data:image/png;base64,QUJD" + "Q"), 400, "invalid_data_uri", IMAGE_PARAM),
        id="data-uri-truncated-base64",
    ),
    pytest.param(
        Case(image(data_uri(PNG, "text/html")), 400, "invalid_data_uri", IMAGE_PARAM),
        id="data-uri-non-image-mime",
    ),
    pytest.param(
        Case(image("data:image/png," + "x" * 10), 400, "invalid_data_uri", IMAGE_PARAM),
        id="data-uri-not-base64",
    ),
    pytest.param(
        Case(image("data:image/png;base64"), 400, "invalid_data_uri", IMAGE_PARAM),
        id="data-uri-without-comma",
    ),
    pytest.param(
        Case(image(data_uri(b"%PDF-1.4 not an image")), 400, "image_decode_failed", IMAGE_PARAM),
        id="data-uri-non-image-bytes",
    ),
    pytest.param(
        Case(image(data_uri(PNG[: len(PNG) // 2])), 400, "image_decode_failed", IMAGE_PARAM),
        id="truncated-png",
    ),
    pytest.param(
        Case(image(data_uri(png_claiming(100_000, 100_000))), 413, "too_large", IMAGE_PARAM),
        id="png-header-claims-100000x100000",
    ),
    pytest.param(
        Case(image(data_uri(png_claiming(0, 5))), 400, "image_decode_failed", IMAGE_PARAM),
        id="png-header-claims-zero-width",
    ),
    pytest.param(Case(image(data_uri(noise_png(3, 1, 500)))), id="image-aspect-ratio-500-to-1"),
    pytest.param(
        Case(image(data_uri(PNG), count=3), 400, "too_many_images"),
        id="three-images-over-max-images-per-request-2",
    ),
    # --- image references: schemes and paths
    pytest.param(
        Case(image("ftp://127.0.0.1/a.png"), 400, "unsupported_image_source", IMAGE_PARAM),
        id="scheme-ftp",
    ),
    pytest.param(
        Case(image("gopher://127.0.0.1:70/_x"), 400, "unsupported_image_source", IMAGE_PARAM),
        id="scheme-gopher",
    ),
    pytest.param(
        Case(image("javascript:alert(1)"), 400, "unsupported_image_source", IMAGE_PARAM),
        id="scheme-javascript",
    ),
    pytest.param(
        Case(image("file://otherhost/x.png"), 400, "unsupported_image_source", IMAGE_PARAM),
        id="file-url-with-remote-host",
    ),
    pytest.param(
        Case(image("images/a.png"), 400, "unsupported_image_source", IMAGE_PARAM),
        id="relative-path",
    ),
    pytest.param(
        Case(
            image("{media}/../../../../../../../../etc/passwd"),
            400,
            "image_path_forbidden",
            IMAGE_PARAM,
        ),
        id="path-traversal-to-etc-passwd",
    ),
    pytest.param(
        Case(image("file://{media}/../outside/b.png"), 400, "image_path_forbidden", IMAGE_PARAM),
        id="file-url-traversal-to-sibling-dir",
    ),
    pytest.param(
        Case(image("{media}/passwd.png"), 400, "image_path_forbidden", IMAGE_PARAM),
        id="symlink-to-etc-passwd",
    ),
    pytest.param(
        Case(image("{media}/escape.png"), 400, "image_path_forbidden", IMAGE_PARAM),
        id="symlink-to-image-outside-allowed-dir",
    ),
    pytest.param(
        Case(image("{outside}/b.png"), 400, "image_path_forbidden", IMAGE_PARAM),
        id="real-image-outside-allowed-dir",
    ),
    pytest.param(
        Case(image("{media}/folder.png"), 400, "image_path_invalid", IMAGE_PARAM),
        id="path-is-a-directory",
    ),
    pytest.param(
        Case(image("{media}/pipe.png"), 400, "image_path_invalid", IMAGE_PARAM),
        id="path-is-a-fifo",
    ),
    pytest.param(
        Case(image("{media}/missing.png"), 400, "image_path_invalid", IMAGE_PARAM),
        id="path-does-not-exist",
    ),
    pytest.param(
        Case(image("{media}/a.png\x00.txt"), 400, "invalid_image_url", IMAGE_PARAM),
        id="path-with-nul-byte",
    ),
    # --- image references: SSRF (nothing may connect; the image server counts hits)
    pytest.param(
        Case(image("{images}/a.png"), 400, "image_url_forbidden", IMAGE_PARAM),
        id="loopback-url-without-allow-private-urls",
    ),
    pytest.param(
        Case(image("http://127.1:{images_port}/a.png"), 400, "image_url_forbidden", IMAGE_PARAM),
        id="ip-short-form-127.1",
    ),
    pytest.param(
        Case(
            image("http://2130706433:{images_port}/a.png"), 400, "image_url_forbidden", IMAGE_PARAM
        ),
        id="ip-decimal-2130706433",
    ),
    pytest.param(
        Case(
            image("http://0x7f.0.0.1:{images_port}/a.png"), 400, "image_url_forbidden", IMAGE_PARAM
        ),
        id="ip-hex-0x7f.0.0.1",
    ),
    pytest.param(
        Case(
            image("http://0177.0.0.1:{images_port}/a.png"), 400, "invalid_image_url", IMAGE_PARAM
        ),  # httpx itself rejects a leading-zero (octal) octet as an invalid address
        id="ip-octal-0177.0.0.1",
    ),
    pytest.param(
        Case(image("http://[::1]:{images_port}/a.png"), 400, "image_url_forbidden", IMAGE_PARAM),
        id="ipv6-loopback",
    ),
    pytest.param(
        Case(
            image("http://[::ffff:127.0.0.1]:{images_port}/a.png"),
            400,
            "image_url_forbidden",
            IMAGE_PARAM,
        ),
        id="ipv4-mapped-ipv6-loopback",
    ),
    pytest.param(
        Case(image("http://0.0.0.0:{images_port}/a.png"), 400, "image_url_forbidden", IMAGE_PARAM),
        id="unspecified-0.0.0.0",
    ),
    pytest.param(Case(image("http:///a.png"), 400, None, IMAGE_PARAM), id="http-url-without-host"),
    pytest.param(
        Case(image("http://\ud800/a.png"), 400, None, IMAGE_PARAM),
        id="url-host-with-lone-surrogate",
    ),
    pytest.param(
        Case(image("http://127.0.0.1:{images_port}/\ud800"), 400, None, IMAGE_PARAM),
        id="url-path-with-lone-surrogate",
    ),
]
