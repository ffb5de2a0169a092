"""`POST /v1/embeddings`' parser and renderer (api/openai/embeddings.py).

Pinned: every `input` shape OpenAI takes (a string, strings, token ids, lists of ids) and
the multimodal ones (an image part, a list of parts) becomes the inputs it says, each named
by its field; a bad body is a 400 naming the field (an empty list, an empty id list, a
part of an unknown type, a bad `encoding_format` or `dimensions`); base64 is little-endian
float32 that decodes to the float vector.
"""

from __future__ import annotations

import base64
from typing import Any

import numpy as np
import orjson
import pytest

from gateway.api.openai.embeddings import parse_embeddings_request, render
from gateway.engine.embed.request import EmbedResult
from gateway.errors import APIError
from gateway.frontend.chat import ImagePart

IMAGE = {"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}}


def _parse(**body: Any) -> Any:
    return parse_embeddings_request({"model": "m", **body})


def test_input_shapes() -> None:
    (one,) = _parse(input="hi").inputs
    assert one.text == "hi" and one.param == "input"
    two = _parse(input=["a", "b"]).inputs
    assert [i.text for i in two] == ["a", "b"] and two[1].param == "input[1]"
    (ids,) = _parse(input=[1, 2, 3]).inputs
    assert ids.ids == (1, 2, 3)
    lists = _parse(input=[[1, 2], [3]]).inputs
    assert [i.ids for i in lists] == [(1, 2), (3,)]
    image, mixed = _parse(input=[IMAGE, [{"type": "text", "text": "cap"}, IMAGE]]).inputs
    assert image.parts == (ImagePart("data:image/png;base64,AAAA", "input[0].image_url.url"),)
    assert mixed.parts is not None and mixed.parts[0] == "cap"
    assert mixed.images[0].param == "input[1][1].image_url.url"


@pytest.mark.parametrize(
    ("body", "param"),
    [
        ({"input": []}, "input"),
        ({}, "input"),
        ({"input": 5}, "input"),
        ({"input": ["a", []]}, "input[1]"),
        ({"input": ["a", [1, "x"]]}, "input[1]"),
        ({"input": [{"type": "audio"}]}, "input[0].type"),
        ({"input": [{"type": "image_url", "image_url": {}}]}, "input[0].image_url.url"),
        ({"input": "a", "encoding_format": "int8"}, "encoding_format"),
        ({"input": "a", "dimensions": 0}, "dimensions"),
        ({"input": "a", "dimensions": "8"}, "dimensions"),
        ({"input": "a", "model": 3}, "model"),
    ],
)
def test_bad_bodies_name_the_field(body: dict[str, Any], param: str) -> None:
    with pytest.raises(APIError) as error:
        _parse(**body)
    assert error.value.status == 400 and error.value.param == param


def test_too_many_inputs() -> None:
    with pytest.raises(APIError) as error:
        _parse(input=["x"] * 2049)
    assert error.value.param == "input"


def test_render_float_and_base64() -> None:
    vectors = np.array([[0.1, -2.5, 3.0], [1e-8, 0.0, 1.0]], dtype=np.float32)
    result = EmbedResult(vectors, (3, 4))
    plain = orjson.loads(render(result, _parse(input=["a", "b"])))
    assert plain["usage"] == {"prompt_tokens": 7, "total_tokens": 7}
    assert [d["index"] for d in plain["data"]] == [0, 1]
    np.testing.assert_array_equal(np.array(plain["data"][0]["embedding"], np.float32), vectors[0])
    packed = orjson.loads(render(result, _parse(input=["a", "b"], encoding_format="base64")))
    decoded = np.frombuffer(base64.b64decode(packed["data"][1]["embedding"]), dtype="<f4")
    np.testing.assert_array_equal(decoded, vectors[1])


def test_a_null_encoding_format_is_the_default() -> None:
    """Invariant: clients that send unset fields as null get floats, as from OpenAI."""
    assert _parse(input="hi", encoding_format=None) == _parse(input="hi")
