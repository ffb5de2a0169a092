"""No silent ignoring on /v1/embeddings and /v1/rerank either: the tables of
gateway.api.accepted cover every field the `openai` SDK documents for embeddings; walking
each table against the real parser, an APPLIED field changes the parsed request, an
INFORMATIONAL one parses and changes nothing, and a REFUSED one is a 400 naming it (and
is fine with its neutral value)."""

from __future__ import annotations

import typing
from typing import Any

import pytest
from openai.types import embedding_create_params

from gateway.api import accepted
from gateway.api.openai.embeddings import parse_embeddings_request
from gateway.api.rerank import parse_rerank_request
from gateway.errors import APIError

EMBED_BASE = {"model": "m", "input": "hello"}
RERANK_BASE = {"model": "m", "query": "q", "documents": ["a", "b"]}
# field -> a value that asks for something
EMBED_VALUES = {
    "model": "other",
    "input": ["a", "b"],
    "dimensions": 8,
    "encoding_format": "base64",
    "user": "someone",
    "cache_salt": "salt",
    "keep_alive": 5,
}
RERANK_VALUES = {
    "model": "other",
    "query": "another",
    "documents": ["c"],
    "top_n": 1,
    "return_documents": True,
    "instruction": "be strict",
    "cache_salt": "salt",
    "keep_alive": 5,
    "max_tokens_per_doc": 100,
    "max_chunks_per_doc": 2,
    "rank_fields": ["title"],
}


def _parse_embed(body: dict[str, Any]) -> Any:
    return parse_embeddings_request(body)


def _parse_rerank(body: dict[str, Any]) -> Any:
    return parse_rerank_request(body)


def test_the_embeddings_table_covers_the_sdk() -> None:
    documented = set(typing.get_type_hints(embedding_create_params.EmbeddingCreateParams))
    assert documented <= set(accepted.OPENAI_EMBEDDINGS)


@pytest.mark.parametrize(
    ("table", "base", "values", "parse"),
    [
        (accepted.OPENAI_EMBEDDINGS, EMBED_BASE, EMBED_VALUES, _parse_embed),
        (accepted.RERANK, RERANK_BASE, RERANK_VALUES, _parse_rerank),
    ],
    ids=["embeddings", "rerank"],
)
def test_each_field_does_what_its_table_says(
    table: dict[str, tuple[str, str]],
    base: dict[str, Any],
    values: dict[str, Any],
    parse: Any,
) -> None:
    assert set(values) == set(table)
    plain = parse(dict(base))
    for name, (kind, _) in table.items():
        body = {**base, name: values[name]}
        if kind == accepted.REFUSED:
            with pytest.raises(APIError) as refused:
                parse(body)
            assert refused.value.param == name
            parse({**base, name: None})  # its neutral value is fine
        elif kind == accepted.APPLIED and name != "cache_salt":  # (the route scopes it)
            assert parse(body) != plain, name
        else:
            parse(body)


def test_unknown_fields_are_named_back() -> None:
    body = {**EMBED_BASE, "truncate_prompt_tokens": 4}
    assert accepted.unknown_fields(body, accepted.OPENAI_EMBEDDINGS) == ("truncate_prompt_tokens",)
