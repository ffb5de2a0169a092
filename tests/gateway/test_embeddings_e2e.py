"""Embeddings and rerank end to end: a real `vision-gateway serve` on 127.0.0.1 offering the
tiny Qwen3-VL-Embedding, Qwen3-Embedding, a Qwen3 reranker (`task = "rerank"` in the models
file) and a Qwen3 chat model through one pool; the real OpenAI SDK's
`client.embeddings.create`, Cohere's own SDK (v1 and v2 clients) and Cohere- / Jina-shaped
rerank requests as the clients.

Pinned: the SDK's vectors (its default base64 and plain floats alike) equal the embedder's
own in this process, bit for bit; an image sent as a data URI and as a file path is one
vision-cache entry (the second costs no tower pass: the stats and the metric say so);
`dimensions` gives a unit vector of that size; `usage.prompt_tokens` counts the inputs'
tokens; bad input is a 400 naming the field (an empty list, an empty string, an image to
the text embedder, dimensions too large), a chat request to an embedding model and an
embeddings request to a chat model are 400s naming `model`; chat keeps working beside them;
rerank returns the reference's scores sorted (indices kept, `top_n`, `return_documents`,
on /v1/rerank and Cohere v2's /v2/rerank), its bad input a 400 naming the field; the HTTP
process never mapped MLX.
"""

from __future__ import annotations

import functools
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest
from support import ServerProcess, data_uri, noise_image, noise_png, tiny_model

from bench.server import LocalServer
from gateway.engine.embed.qwen3_vl import QwenVLEmbedder
from gateway.engine.embed.request import EmbedItem
from tests.gateway.engine.embed.common import embed_image, vectors

PNG = noise_png(11, 64, 48)


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Any:
    folder = tmp_path_factory.mktemp("media")
    (folder / "photo.png").write_bytes(PNG)
    models = folder / "models.toml"
    models.write_text(
        f'[models.vl]\npath = "{tiny_model("qwen3_vl_embedding")}"\n'
        f'[models.text]\npath = "{tiny_model("qwen3_embedding")}"\n'
        f'[models.rerank]\npath = "{tiny_model("qwen3_reranker")}"\ntask = "rerank"\n'
        f'[models.vlrerank]\npath = "{tiny_model("qwen3_vl_reranker")}"\ntask = "rerank"\n'
        f'[models.chat]\npath = "{tiny_model("qwen3")}"\n'
    )
    args = [
        "--models",
        str(models),
        "--no-warmup",
        "--allowed-media-dir",
        str(folder),
    ]
    with LocalServer(args) as running:
        running.media = folder  # type: ignore[attr-defined]
        yield running


@functools.cache
def _local() -> QwenVLEmbedder:
    return QwenVLEmbedder(str(tiny_model("qwen3_vl_embedding")))


def _error(server: LocalServer, path: str, body: dict[str, Any]) -> dict[str, Any]:
    response = httpx.post(server.base_url + path, json=body, timeout=60)
    assert response.status_code == 400, response.text
    return response.json()["error"]


def test_sdk_vectors_equal_the_embedder_in_process(server: LocalServer) -> None:
    client = server.client()
    texts = ["a photo of a cat", "the stock market fell"]
    packed = client.embeddings.create(model="vl", input=texts)  # the SDK asks for base64
    plain = client.embeddings.create(model="vl", input=texts, encoding_format="float")
    local = vectors(_local(), [EmbedItem(text=t) for t in texts])
    for i in range(2):
        np.testing.assert_array_equal(np.array(packed.data[i].embedding, np.float32), local[i])
        np.testing.assert_array_equal(np.array(plain.data[i].embedding, np.float32), local[i])
    tokens = sum(len(_local().prepare(EmbedItem(text=t)).ids) for t in texts)
    assert packed.usage.prompt_tokens == tokens


def test_image_by_any_delivery_is_one_tower_pass(server: LocalServer) -> None:
    client = server.client()
    media: Path = server.media  # type: ignore[attr-defined]
    before = _stats(server)["vision"]
    by_uri = client.embeddings.create(
        model="vl", input=[{"type": "image_url", "image_url": {"url": data_uri(PNG)}}]
    )
    by_path = client.embeddings.create(
        model="vl",
        input=[[{"type": "text", "text": "caption"}, _image(str(media / "photo.png"))]],
    )
    after = _stats(server)["vision"]
    assert after["misses"] - before["misses"] == 1 and after["hits"] - before["hits"] == 1
    image = embed_image(noise_image(11, 64, 48))
    uri_vector, both_vector = vectors(
        _local(), [EmbedItem(parts=(image,)), EmbedItem(parts=("caption", image))]
    )
    np.testing.assert_array_equal(np.array(by_uri.data[0].embedding, np.float32), uri_vector)
    np.testing.assert_array_equal(np.array(by_path.data[0].embedding, np.float32), both_vector)
    metrics = server.metrics()
    assert metrics['vision_gateway_embedding_tower_passes_total{model="vl"}'] == 1


def test_identical_input_hits_the_embedding_cache(server: LocalServer) -> None:
    client = server.client()
    first = client.embeddings.create(model="text", input="repeat me")
    hits = _stats(server, "text")["embedding"]["hits"]
    second = client.embeddings.create(model="text", input="repeat me")
    assert first.data[0].embedding == second.data[0].embedding
    assert _stats(server, "text")["embedding"]["hits"] == hits + 1


def test_dimensions_give_a_shorter_unit_vector(server: LocalServer) -> None:
    reply = server.client().embeddings.create(model="text", input="short", dimensions=16)
    vector = np.array(reply.data[0].embedding)
    assert vector.shape == (16,) and abs(np.linalg.norm(vector) - 1) < 1e-5


@pytest.mark.parametrize(
    ("body", "param"),
    [
        ({"model": "vl", "input": []}, "input"),
        ({"model": "vl", "input": ["fine", ""]}, "input[1]"),
        ({"model": "vl", "input": "fine", "dimensions": 100000}, "dimensions"),
        (
            {"model": "text", "input": [{"type": "image_url", "image_url": {"url": "x.png"}}]},
            "input[0].image_url.url",
        ),
        ({"model": "chat", "input": "hello"}, "model"),
    ],
)
def test_bad_input_is_a_400_naming_the_field(
    server: LocalServer, body: dict[str, Any], param: str
) -> None:
    assert _error(server, "/v1/embeddings", body)["param"] == param


def test_over_long_input_is_a_400_naming_it(server: LocalServer) -> None:
    error = _error(server, "/v1/embeddings", {"model": "text", "input": ["ok", [5] * 8193]})
    assert error["param"] == "input[1]" and "over this model's" in error["message"]


def test_chat_to_an_embedding_model_is_a_400_naming_model(server: LocalServer) -> None:
    body = {"model": "vl", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
    error = _error(server, "/v1/chat/completions", body)
    assert error["param"] == "model" and "embedding model" in error["message"]
    reply = server.client().chat.completions.create(
        model="chat", messages=[{"role": "user", "content": "hi"}], max_tokens=2
    )
    assert reply.choices[0].finish_reason == "length"


def test_models_list_says_what_each_model_does(server: LocalServer) -> None:
    cards = {c["id"]: c for c in httpx.get(server.base_url + "/v1/models").json()["data"]}
    assert cards["vl"]["task"] == "embed" and cards["vl"]["media"] == ["image"]
    assert cards["vl"]["embedding_dimensions"] == 64


def test_the_http_process_never_mapped_mlx(server: LocalServer) -> None:
    maps = Path(f"/proc/{server.proc.pid}/maps").read_text()
    assert "libmlx" not in maps


QUERY = "what is a cat"
DOCS = ["a cat is a small animal", "stocks fell", "x", "cats purr and sleep all day in the sun"]


def test_rerank_returns_reference_scores_sorted(server: LocalServer) -> None:
    from tests.gateway.engine.embed.test_reranker import _reference_score

    expected = [_reference_score(d, "") for d in DOCS]
    order = sorted(range(len(DOCS)), key=lambda i: (-expected[i], i))
    # Cohere v1's shape (what its SDK's `rerank` posts), documents as objects.
    cohere = {"model": "rerank", "query": QUERY, "documents": [{"text": d} for d in DOCS]}
    cohere |= {"top_n": 3, "return_documents": True}
    reply = httpx.post(server.base_url + "/v1/rerank", json=cohere, timeout=60).json()
    assert [r["index"] for r in reply["results"]] == order[:3]
    assert [r["relevance_score"] for r in reply["results"]] == [expected[i] for i in order[:3]]
    assert reply["results"][0]["document"] == {"text": DOCS[order[0]]}
    assert reply["usage"]["total_tokens"] > 0
    # Cohere v2 / Jina: strings, every result, no documents.
    plain = {"model": "rerank", "query": QUERY, "documents": DOCS}
    reply = httpx.post(server.base_url + "/v2/rerank", json=plain, timeout=60).json()
    assert [r["index"] for r in reply["results"]] == order
    assert "document" not in reply["results"][0]


@pytest.mark.parametrize(
    ("body", "param"),
    [
        ({"model": "rerank", "query": QUERY, "documents": []}, "documents"),
        ({"model": "rerank", "query": "", "documents": ["a"]}, "query"),
        ({"model": "rerank", "query": QUERY, "documents": ["a", " "]}, "documents[1]"),
        ({"model": "rerank", "query": QUERY, "documents": ["a"], "top_n": 0}, "top_n"),
        ({"model": "vl", "query": QUERY, "documents": ["a"]}, "model"),
    ],
)
def test_bad_rerank_input_is_a_400_naming_the_field(
    server: LocalServer, body: dict[str, Any], param: str
) -> None:
    assert _error(server, "/v1/rerank", body)["param"] == param


def test_cohere_sdk_reranks_unmodified(server: LocalServer) -> None:
    """Cohere's own SDK (the `clients` extra), v2 client (/v2/rerank) and v1 client
    (/v1/rerank, documents returned), pointed at the server and nothing else changed."""
    cohere = pytest.importorskip("cohere")
    from tests.gateway.engine.embed.test_reranker import _reference_score

    expected = [_reference_score(d, "") for d in DOCS]
    order = sorted(range(len(DOCS)), key=lambda i: (-expected[i], i))
    v2 = cohere.ClientV2(api_key="unused", base_url=server.base_url)
    reply = v2.rerank(model="rerank", query=QUERY, documents=DOCS, top_n=2)
    assert [(r.index, r.relevance_score) for r in reply.results] == [
        (i, expected[i]) for i in order[:2]
    ]
    v1 = cohere.Client(api_key="unused", base_url=server.base_url)
    reply = v1.rerank(model="rerank", query=QUERY, documents=DOCS, return_documents=True)
    assert [r.index for r in reply.results] == order
    assert reply.results[0].document.text == DOCS[order[0]]


def test_images_rerank_with_a_qwen3_vl_reranker(server: LocalServer) -> None:
    """Documents with images (chat's `image_url`, mlx-vlm's `image`; a data URI and a path
    to the same pixels), scored as mlx-vlm's reranker scores each; the text reranker
    refuses an image naming it."""
    from tests.gateway.engine.embed.test_qwen3_vl_reranker import _reference

    media: Path = server.media  # type: ignore[attr-defined]
    image = noise_image(11, 64, 48)
    documents = [
        {"text": "a red square"},
        {"image_url": {"url": data_uri(PNG)}},
        {"text": "its caption", "image": str(media / "photo.png")},
    ]
    body = {"model": "vlrerank", "query": QUERY, "documents": documents}
    reply = httpx.post(server.base_url + "/v1/rerank", json=body, timeout=60).json()
    scores = {r["index"]: r["relevance_score"] for r in reply["results"]}
    cases = [(QUERY, None, "a red square", None), (QUERY, None, "", image)]
    cases.append((QUERY, None, "its caption", image))
    assert scores == {i: _reference(c) for i, c in enumerate(cases)}
    stats = _stats(server, "vlrerank")["vision"]
    assert (stats["misses"], stats["hits"]) == (1, 1)  # one image, by URI then by path
    text_only = {"model": "rerank", "query": QUERY, "documents": ["a", documents[1]]}
    assert _error(server, "/v1/rerank", text_only)["param"] == "documents[1].image_url"


def test_embeddings_to_a_reranker_is_a_400_naming_model(server: LocalServer) -> None:
    error = _error(server, "/v1/embeddings", {"model": "rerank", "input": "hi"})
    assert error["param"] == "model" and "reranker" in error["message"]


def _image(url: str) -> dict[str, Any]:
    return {"type": "image_url", "image_url": {"url": url}}


def _stats(server: LocalServer, model: str = "vl") -> dict[str, Any]:
    return httpx.get(f"{server.base_url}/v1/cache/stats?model={model}", timeout=10).json()


def test_a_standalone_embedder_serves_alone() -> None:
    """`serve --model EMBEDDER` (one model, warm-up on): it starts (there is no chat
    warm-up to run), embeds, and its card gives the model's own limits."""
    with ServerProcess(arch="qwen3_embedding") as alone:
        reply = alone.client().embeddings.create(model="test", input="alone")
        assert len(reply.data[0].embedding) == 64
        (card,) = httpx.get(alone.base_url + "/v1/models").json()["data"]
        assert card["task"] == "embed" and card["max_input_tokens"] == 8192


def test_unknown_fields_are_named_in_a_header(server: LocalServer) -> None:
    body = {"model": "text", "input": "hi", "truncate_prompt_tokens": 3}
    response = httpx.post(server.base_url + "/v1/embeddings", json=body, timeout=60)
    assert response.status_code == 200
    assert response.headers["x-ignored-fields"] == "truncate_prompt_tokens"
    refused = {"model": "rerank", "query": "q", "documents": ["a"], "max_tokens_per_doc": 9}
    assert _error(server, "/v1/rerank", refused)["param"] == "max_tokens_per_doc"
