"""Every family's trained tokenizer (offline_model/bpe.py): the id layout its spec promises,
every id the model can sample decodes to text, text round-trips, fillers never encode, and
the same spec gives the same tokenizer."""

from __future__ import annotations

import pytest
from tokenizers import Tokenizer

from gateway.offline_model import bpe, gemma3, gemma4, llama, mistral3, qwen3, smolvlm

SPECS = {
    "qwen3": qwen3.spec(),
    "llama": llama.spec(),
    "gemma3": gemma3.spec(),
    "smolvlm": smolvlm.spec(),
    "mistral3": mistral3.spec(),
    "gemma4": gemma4.spec(),
}
SAMPLE = "A red cat sits on the table.\n\tIt's 42% done: déjà vu, 猫 🐈!  12345 x"


@pytest.fixture(scope="module")
def built() -> dict[str, Tokenizer]:
    return {name: bpe.build_tokenizer(spec) for name, spec in SPECS.items()}


@pytest.mark.parametrize("name", SPECS)
def test_specials_sit_where_the_spec_puts_them(built: dict[str, Tokenizer], name: str) -> None:
    spec, tok = SPECS[name], built[name]
    assert tok.get_vocab_size(with_added_tokens=True) == spec.vocab_size
    first = 0 if spec.specials_first else spec.trained
    want = {s.content: first + i for i, s in enumerate(spec.specials)}
    assert {s: tok.token_to_id(s) for s in want} == want
    for s in spec.specials:  # one id each, never split, flags as declared
        assert (
            tok.encode(f"x{s.content}y", add_special_tokens=False).ids.count(want[s.content]) == 1
        )
    decoder = tok.get_added_tokens_decoder()
    assert {decoder[want[s.content]].special for s in spec.specials if not s.special} <= {False}


@pytest.mark.parametrize("name", SPECS)
def test_every_sampled_id_decodes_to_text(built: dict[str, Tokenizer], name: str) -> None:
    """Ids that are neither special nor a lone byte decode, alone, to non-empty text; the
    fillers above the real vocabulary to one space-led pseudo-word each."""
    spec, tok = SPECS[name], built[name]
    special = {tok.token_to_id(s.content) for s in spec.specials if s.special}
    lone_bytes = {i for i in range(spec.vocab_size) if "\ufffd" in tok.decode([i])}
    assert len(lone_bytes) <= 128  # byte-level: 0x80-0xFF alone; gemma: those <0xNN> tokens
    empty = [
        i
        for i in range(spec.vocab_size)
        if i not in special and not tok.decode([i], skip_special_tokens=True)
    ]
    assert empty == []
    fillers = [tok.decode([i]) for i in range(spec.first_filler, spec.vocab_size)]
    assert all(f.startswith(" ") and f[1:].isalpha() for f in fillers)
    assert len(set(fillers)) == len(fillers)


@pytest.mark.parametrize("name", SPECS)
def test_text_round_trips_and_never_encodes_a_filler(
    built: dict[str, Tokenizer], name: str
) -> None:
    spec, tok = SPECS[name], built[name]
    filler_text = "".join(tok.decode([i]) for i in range(spec.first_filler, spec.vocab_size))
    for text in (SAMPLE, filler_text):
        ids = tok.encode(text, add_special_tokens=False).ids
        assert max(ids, default=0) < spec.first_filler  # (llama, smolvlm, mistral3: no fillers)
        assert tok.decode(ids) == text


@pytest.mark.parametrize("name", SPECS)
def test_bos_is_prepended_only_where_the_family_does(
    built: dict[str, Tokenizer], name: str
) -> None:
    spec, tok = SPECS[name], built[name]
    plain = tok.encode("hi", add_special_tokens=False).ids
    full = tok.encode("hi").ids
    if spec.add_bos:
        assert full == [tok.token_to_id(spec.bos), *plain]
    else:
        assert full == plain


def test_gemma_style_is_sentencepiece_with_byte_fallback(built: dict[str, Tokenizer]) -> None:
    tok, spec = built["gemma3"], SPECS["gemma3"]
    n = len(spec.specials)
    assert [tok.id_to_token(n + b) for b in (0, 0x41, 0xFF)] == ["<0x00>", "<0x41>", "<0xFF>"]
    # Spaces are "▁" and start the next piece; 猫 is outside the trained alphabet, so it is
    # spelled by its UTF-8 bytes.
    pieces = tok.encode("the cat 猫", add_special_tokens=False).tokens
    assert pieces == ["the", "▁cat", "▁", "<0xE7>", "<0x8C>", "<0xAB>"]
    assert tok.decode(tok.encode("  two  spaces ").ids) == "  two  spaces "


def test_same_spec_same_tokenizer_and_bad_specs_refused() -> None:
    spec = SPECS["mistral3"]
    assert bpe.build_tokenizer(spec).to_str() == bpe.build_tokenizer(spec).to_str()
    small = bpe.TokenizerSpec("llama3", spec.specials, vocab_size=1000, trained=990)
    with pytest.raises(ValueError, match="vocab_size"):  # 990 + 20 specials > 1000 ids
        bpe.build_tokenizer(small)
    with pytest.raises(ValueError, match="trained"):
        bpe.build_tokenizer(bpe.TokenizerSpec("llama3", (), 2048, 200))
    with pytest.raises(ValueError, match="style"):
        bpe.build_tokenizer(bpe.TokenizerSpec("wordpiece", (), 2048, 2000))
    with pytest.raises(ValueError, match="bos"):
        bpe.build_tokenizer(bpe.TokenizerSpec("llama3", (), 2048, 2000, bos="<s>", add_bos=True))
