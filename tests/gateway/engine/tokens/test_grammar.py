"""Grammar masks on the tiny model's real tokenizer, without the engine.

Pinned here: a bounded schema always closes within a fixed number of tokens whatever the
model picks (adversarial and random walks through the allowed tokens), whitespace outside
strings is not free even if the schema asks for it, the batched bit mask applies exactly the
bits llguidance computed, a row's matcher reads each of its tokens once whichever way it
arrives, and a grammar compiles once per hash.
"""

from __future__ import annotations

import json
import random

import jsonschema
import mlx.core as mx
import numpy as np
import pytest
from support import LEXER_BOMB, tiny_model
from transformers import AutoTokenizer

from gateway.engine.tokens.grammar import GrammarRow, Grammars
from gateway.structured.response_format import response_format_grammar

BOUNDED = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 8},
        "tags": {"type": "array", "items": {"enum": ["red", "green"]}, "maxItems": 3},
        "n": {"type": "integer", "minimum": 0, "maximum": 999},
        "price": {"type": "number", "minimum": 0, "maximum": 1000, "multipleOf": 0.25},
        "ok": {"type": "boolean"},
    },
    "required": ["name", "tags", "n", "price", "ok"],
}
# The longest output: every character of `name` as a 12-byte surrogate-pair escape, three
# tags of the longest value, the longest number, separators: well under 300 bytes, and every
# token is at least one byte.
MAX_TOKENS = 300


def _schema_format(schema: dict, strict: bool = True) -> dict:
    return {"type": "json_schema", "json_schema": {"name": "t", "schema": schema, "strict": strict}}


@pytest.fixture(scope="module")
def grammars() -> Grammars:
    path = tiny_model("qwen2_vl")
    tokenizer = AutoTokenizer.from_pretrained(str(path))
    vocab = json.loads((path / "config.json").read_text())["vocab_size"]
    return Grammars(tokenizer, vocab, [tokenizer.eos_token_id], 1 << 20)


def _row(grammars: Grammars, response_format: dict) -> GrammarRow:
    grammar = response_format_grammar(response_format)
    assert grammar is not None
    return grammars.start(grammars.prepare(grammar).result(timeout=60))


def _allowed(grammars: Grammars, row: GrammarRow) -> list[int]:
    mask = grammars.masker.bitmask([row])
    bits = np.unpackbits(mask[0].view(np.uint8), bitorder="little")[: grammars.masker.vocab_size]
    return np.flatnonzero(bits).tolist()


def _walk(grammars: Grammars, row: GrammarRow, pick, limit: int) -> list[int]:  # noqa: ANN001
    """Generate with `pick(allowed non-EOS tokens)` until only EOS is allowed; the tokens."""
    eos = grammars._eos_ids[0]
    out: list[int] = []
    for _ in range(limit):
        allowed = _allowed(grammars, row)
        choices = [t for t in allowed if t != eos]
        if not choices:
            assert allowed == [eos]
            return out
        token = pick(choices)
        row.accept(len(out), token)
        assert row.error is None
        out.append(token)
    raise AssertionError(f"did not close within {limit} tokens: {out}")


def test_a_bounded_schema_closes_whatever_the_model_picks(grammars: Grammars) -> None:
    """Invariant: with bounded strings, arrays, enums and numbers, every path through the
    allowed tokens (the longest-first adversary and random walks) ends in valid JSON within
    a fixed number of tokens: no indentation loop, no endless value."""
    tokenizer = grammars._hf_tokenizer

    def stall(tokens: list[int]) -> int:  # whitespace if it may, else the shortest token
        texts = {t: tokenizer.decode([t]) for t in tokens}
        return min(tokens, key=lambda t: (not texts[t].isspace(), len(texts[t]), t))

    pickers = [stall] + [random.Random(seed).choice for seed in range(12)]
    for pick in pickers:
        tokens = _walk(grammars, _row(grammars, _schema_format(BOUNDED)), pick, MAX_TOKENS)
        jsonschema.validate(json.loads(tokenizer.decode(tokens)), BOUNDED)


def test_whitespace_between_tokens_is_not_free(grammars: Grammars) -> None:
    """Invariant: outside strings no whitespace token is allowed (separators are fixed), even
    when the schema's own `x-guidance` asks for flexible whitespace."""
    tokenizer = grammars._hf_tokenizer
    schema = {**BOUNDED, "x-guidance": {"whitespace_flexible": True}}
    row = _row(grammars, _schema_format(schema))
    assert all(tokenizer.decode([t]).strip() for t in _allowed(grammars, row))
    first = tokenizer.encode("{", add_special_tokens=False)
    assert len(first) == 1
    row.accept(0, first[0])
    texts = [tokenizer.decode([t]) for t in _allowed(grammars, row)]
    assert texts and all(not t[:1].isspace() for t in texts)


def test_the_batched_mask_applies_exactly_the_computed_bits(grammars: Grammars) -> None:
    """Invariant: `Masker.apply` keeps a log-probability iff its bit is set, row by row, and
    leaves rows without a grammar whole."""
    masker = grammars.masker
    rows = [_row(grammars, {"type": "json_object"}), None, _row(grammars, _schema_format(BOUNDED))]
    mask = masker.bitmask(rows)
    logprobs = mx.random.normal((3, masker.vocab_size))
    out = np.array(masker.apply(logprobs, mask))
    bits = np.unpackbits(mask.view(np.uint8), axis=1, bitorder="little")[:, : masker.vocab_size]
    assert bits[1].all() and 0 < bits[0].sum() < masker.vocab_size
    np.testing.assert_array_equal(np.isfinite(out), bits.astype(bool))
    np.testing.assert_array_equal(out[bits.astype(bool)], np.array(logprobs)[bits.astype(bool)])


def test_a_row_reads_each_token_once_whichever_way_it_arrives(grammars: Grammars) -> None:
    """Invariant: the sampler's catch-up (the token fed in this step) and the engine's emit
    of the same token advance the matcher once; a mask before the last draw is read fails."""
    tokenizer = grammars._hf_tokenizer
    row = _row(grammars, {"type": "json_object"})
    brace = tokenizer.encode("{", add_special_tokens=False)[0]
    _allowed(grammars, row)  # draw 0
    row.accept(0, brace)  # emitted after the prefill
    _allowed(grammars, row)  # draw 1 (a row's first step inside the batch)
    with pytest.raises(RuntimeError):
        _allowed(grammars, row)  # draw 2 before token 1 is read
    quote = tokenizer.encode('"', add_special_tokens=False)[0]
    row.catch_up(quote)  # token 1, read by the batch sampler
    row.accept(1, quote)  # and emitted by the engine afterwards: not read twice
    assert row.consumed == 2 and row.error is None
    assert row.matcher.try_consume_tokens(tokenizer.encode('a": 1}', add_special_tokens=False))


def test_a_grammar_compiles_once_per_hash(grammars: Grammars) -> None:
    """Invariant: the second request with the same schema gets the cached compiled grammar
    (a hit), a copy per request, and a different schema is a miss."""
    grammars.reset()
    grammar = response_format_grammar(_schema_format(BOUNDED))
    assert grammar is not None
    first = grammars.prepare(grammar).result(timeout=60)
    again = grammars.prepare(grammar)
    assert again.done() and again.result() is first
    assert grammars.start(first).matcher is not grammars.start(first).matcher
    other = response_format_grammar({"type": "json_object"})
    assert other is not None
    grammars.prepare(other).result(timeout=60)
    stats = grammars.stats()
    assert (stats["hits"], stats["misses"], stats["entries"]) == (1, 2, 2)
    assert 0 < stats["bytes"] <= stats["capacity_bytes"]


def test_a_schema_beyond_the_lexers_limits_ends_its_row_as_a_limit_and_leaves_the_cache(
    grammars: Grammars,
) -> None:
    """Invariant: a grammar whose lexer gives up while decoding marks its row with a limit
    error (the schema's fault, not a token that broke the grammar), the row ends (EOS only),
    and the compiled grammar leaves the cache, so the next request does not start from the
    broken shared lexer state (it compiles afresh and fails at the same point)."""
    grammars.reset()
    eos = grammars._eos_ids[0]
    for attempt in range(2):
        row = _row(grammars, _schema_format(LEXER_BOMB))
        tokens: list[int] = []
        for _ in range(20):
            allowed = _allowed(grammars, row)
            if row.error is not None:
                assert allowed == [eos]
                break
            token = next(t for t in allowed if t != eos)
            row.accept(len(tokens), token)
            tokens.append(token)
        assert row.error is not None and row.limit, (attempt, row.error)
        assert "\n" not in row.error and "lexer" in row.error
        assert tokens, "the first mask of a fresh compile is fine: the error comes later"
        assert grammars.stats()["entries"] == 0


def test_a_token_outside_the_grammar_is_no_limit(grammars: Grammars) -> None:
    """Invariant: a token the mask forbade (a server fault) is an error but not a limit."""
    row = _row(grammars, _schema_format({"type": "integer"}))
    _allowed(grammars, row)
    tokenizer = grammars._hf_tokenizer
    row.accept(0, tokenizer.encode('"', add_special_tokens=False)[0])
    assert row.error is not None and not row.limit
