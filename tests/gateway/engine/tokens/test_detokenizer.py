"""The fast streaming detokenizer (id -> bytes table + incremental UTF-8).

Pinned: for the offline Qwen tokenizers the table is built (the fast path is taken), and the
streamed deltas of any id sequence concatenate to `tokenizer.decode(ids,
skip_special_tokens=True)`, with no delta ending in a split character.
"""

from __future__ import annotations

import random

import pytest
from support import tiny_model

from gateway.engine.tokens.detokenizer import ByteStreamDetokenizer, byte_table, token_bytes


@pytest.fixture(scope="module")
def tokenizer():
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(tiny_model("qwen2_vl")))


def test_table_is_built_for_the_offline_tokenizer(tokenizer) -> None:  # noqa: ANN001
    """Invariant: Qwen's byte-level BPE takes the fast path (else the test below is moot)."""
    assert byte_table(tokenizer, len(tokenizer)) is not None


def test_stream_equals_full_decode_on_random_sequences(tokenizer) -> None:  # noqa: ANN001
    """Invariant: concatenated deltas == tokenizer.decode(skip_special_tokens=True), for
    random ids including special tokens and multi-byte text; deltas hold no U+FFFD."""
    table = byte_table(tokenizer, len(tokenizer))
    assert table is not None
    rng = random.Random(7)
    texts = ["héllo wörld — ✓ 日本語のテキスト", "plain ascii words", "emoji 🎉🎉 ok"]
    sequences = [tokenizer.encode(t) for t in texts]
    sequences += [[rng.randrange(len(tokenizer)) for _ in range(30)] for _ in range(50)]
    for ids in sequences:
        stream = ByteStreamDetokenizer(table)
        deltas = [stream.add(i) for i in ids]
        assert "".join(deltas) + stream.flush() == tokenizer.decode(ids, skip_special_tokens=True)
    for ids in sequences[:3]:
        stream = ByteStreamDetokenizer(table)
        assert all("\ufffd" not in stream.add(i) for i in ids)


def test_a_table_that_disagrees_is_refused(tokenizer) -> None:  # noqa: ANN001
    """Invariant: the table is verified against decode; a tokenizer that rewrites text on
    decode (clean_up_tokenization_spaces) keeps the generic path."""
    tokenizer.clean_up_tokenization_spaces = True
    try:
        assert byte_table(tokenizer, len(tokenizer)) is None
    finally:
        tokenizer.clean_up_tokenization_spaces = False


def test_a_tokens_bytes_rebuild_a_character_split_over_tokens(tokenizer) -> None:  # noqa: ANN001
    """Invariant: a logprob's `bytes` are the token's raw bytes, so the bytes of the tokens
    of a multi-byte character join into it (their text alone is U+FFFD each), for a byte
    table, a SentencePiece byte-fallback piece and plain text alike."""
    table = byte_table(tokenizer, len(tokenizer))
    assert table is not None
    ids = tokenizer.encode("日本語 🎉")
    split = [i for i in ids if "\ufffd" in tokenizer.decode([i])]
    assert split, "no token of this text is part of a character: the test would be moot"
    joined = b"".join(
        token_bytes(table[i], p, tokenizer.decode([i]))
        for i, p in zip(ids, tokenizer.convert_ids_to_tokens(ids), strict=True)
    )
    assert joined.decode("utf-8") == tokenizer.decode(ids)
    assert token_bytes(None, "<0xD1>", "\ufffd") == b"\xd1"  # SentencePiece byte fallback
    assert token_bytes(None, "▁word", " word") == b" word"
    assert token_bytes(b"", "<|im_end|>", "<|im_end|>") == b"<|im_end|>"  # a special token
