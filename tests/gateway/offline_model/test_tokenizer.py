"""The offline tokenizer's id layout: every id a random-weight model can sample decodes to
text, the special ids never move, and padding the vocabulary never changes an encoding."""

from __future__ import annotations

import functools
import json
import os
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

import mlx_vlm  # noqa: E402
import pytest  # noqa: E402
import transformers  # noqa: E402
from tokenizers import Tokenizer  # noqa: E402

from gateway import offline_model as om  # noqa: E402
from gateway.offline_model import fillers, shapes, tokenizer  # noqa: E402

# Where config.json says the specials are, for every size (Qwen2-VL's order from 2034 up).
SPECIAL_IDS = {t: 2034 + i for i, t in enumerate(tokenizer.SPECIAL_TOKENS)}
# Every vocabulary size a checkpoint is built with: tiny, Qwen3-VL-8B, Qwen2/2.5-VL-7B.
VOCAB_SIZES = sorted({shapes.text_vocab_size(a, s) for a in shapes.ARCHS for s in shapes.SIZES})

# Ids recorded from the tokenizer before the vocabulary was padded: padding must not move them.
SAMPLES = {
    "A red cat sits on the table.\nWhat is in this picture? It's 42% done: déjà vu, 猫 🐈!": [
        32, 506, 393, 268, 285, 82, 301, 263, 377, 276, 475, 278, 277, 474, 354, 30, 220, 472,
        348, 220, 19, 17, 4, 282, 541, 25, 282, 127, 102, 73, 127, 254, 535, 84, 11, 220, 163,
        234, 104, 220, 172, 253, 238, 230, 0,
    ],
    "<|im_start|>user\n<|vision_start|><|image_pad|><|vision_end|>Describe it.<|im_end|>\n"
    "<|im_start|>assistant\n": [2035, 331, 198, 2043, 2046, 2044, 469, 337, 13, 2036, 198, 2035,
                                338, 198],
    # Text made of filler words encodes through the trained tokens, never to a filler id.
    " ba bi pero bababa rokapi tok123": [
        266, 64, 266, 72, 272, 858, 266, 64, 1825, 1825, 438, 74, 592, 72, 334, 74, 16, 17, 18,
    ],
}  # fmt: skip


@functools.cache
def _fast(vocab_size: int) -> Tokenizer:
    return tokenizer.train_tokenizer(vocab_size)


@pytest.fixture(scope="module")
def hf(tmp_path_factory: pytest.TempPathFactory) -> Callable[[int], Any]:
    """vocab_size -> the transformers tokenizer loaded from the files the builder writes
    (the class `mlx_vlm.load` hands out; a 7b checkpoint's weights are not needed for it)."""

    @functools.cache
    def load(vocab_size: int) -> Any:
        out = tmp_path_factory.mktemp(f"tok{vocab_size}")
        tokenizer.write_tokenizer_files(out, _fast(vocab_size))
        return transformers.AutoTokenizer.from_pretrained(str(out))

    return load


def _byte_symbols() -> dict[int, str]:
    """GPT-2's byte -> printable-symbol table that byte-level BPE spells tokens in."""
    keep = [*range(0x21, 0x7F), *range(0xA1, 0xAD), *range(0xAE, 0x100)]
    moved = [b for b in range(256) if b not in keep]
    return {**{b: chr(b) for b in keep}, **{b: chr(256 + i) for i, b in enumerate(moved)}}


def _check_every_id_decodes(decode: Callable[[int], str], fast: Tokenizer, n: int) -> None:
    """The invariant, for ids 0..n-1 decoded one at a time with skip_special_tokens."""
    texts = [decode(i) for i in range(n)]
    special = set(SPECIAL_IDS.values())
    assert [i for i, t in enumerate(texts) if not t and i not in special] == []
    assert all(texts[i] == "" for i in special)  # skipped, as streamed output skips them
    for t in texts:
        t.encode("utf-8")  # no lone surrogates
    # A lone UTF-8 lead or continuation byte cannot decode to valid text on its own, and the
    # byte-level encoder needs those 128 one-byte tokens to spell any non-ASCII text. They
    # are the only ids allowed to decode to U+FFFD (an incremental detokenizer holds them
    # back until the character completes, as it does for upstream Qwen).
    symbols = _byte_symbols()
    lone_bytes = sorted(fast.token_to_id(symbols[b]) for b in range(0x80, 0x100))
    assert [i for i, t in enumerate(texts) if "\ufffd" in t] == lone_bytes
    # Fillers: one distinct space-led lowercase word each, so noise reads as words.
    extra = texts[tokenizer.VOCAB_SIZE :]
    assert all(re.fullmatch(r" [a-z]{2,6}", t) for t in extra)
    assert len(set(extra)) == len(extra) == n - tokenizer.VOCAB_SIZE


def test_vocab_sizes_cover_tiny_and_7b() -> None:
    assert VOCAB_SIZES == [2048, 151936, 152064]
    assert [shapes.text_vocab_size(a, "7b") for a in shapes.ARCHS] == [152064, 152064, 151936]


@pytest.mark.parametrize("n", VOCAB_SIZES)
def test_every_non_special_id_decodes_to_nonempty_text_fast(n: int) -> None:
    tok = _fast(n)
    assert tok.get_vocab_size(with_added_tokens=True) == n
    _check_every_id_decodes(lambda i: tok.decode([i], skip_special_tokens=True), tok, n)


@pytest.mark.parametrize("n", VOCAB_SIZES)
def test_every_non_special_id_decodes_to_nonempty_text_transformers(
    hf: Callable[[int], Any], n: int
) -> None:
    tok = hf(n)
    assert type(tok).__name__ == "Qwen2Tokenizer" and len(tok) == n
    _check_every_id_decodes(lambda i: tok.decode([i], skip_special_tokens=True), _fast(n), n)


@pytest.mark.parametrize("n", VOCAB_SIZES)
def test_special_token_ids_unchanged(hf: Callable[[int], Any], n: int) -> None:
    assert {t: _fast(n).token_to_id(t) for t in SPECIAL_IDS} == SPECIAL_IDS
    assert hf(n).convert_tokens_to_ids(list(SPECIAL_IDS)) == list(SPECIAL_IDS.values())
    ids = tokenizer.token_ids(_fast(n))
    assert (ids.endoftext, ids.im_end, ids.image_pad, ids.video_pad) == (2034, 2036, 2046, 2047)
    assert ids.vocab_size == n


@pytest.mark.parametrize("n", VOCAB_SIZES)
def test_encoding_of_sample_text_unchanged(hf: Callable[[int], Any], n: int) -> None:
    for text, want in SAMPLES.items():
        assert _fast(n).encode(text).ids == want
        assert hf(n).encode(text, add_special_tokens=False) == want
        assert _fast(n).decode(want, skip_special_tokens=False) == text


def test_filler_ids_are_never_encoded() -> None:
    n = max(VOCAB_SIZES)
    tok = _fast(n)
    # Every 37th filler's text, as a "sentence": encoded with trained tokens only.
    text = "".join(tok.decode([i]) for i in range(tokenizer.VOCAB_SIZE, n, 37))
    ids = tok.encode(text).ids
    assert max(ids) < tokenizer.VOCAB_SIZE - len(SPECIAL_IDS)
    assert ids == _fast(tokenizer.VOCAB_SIZE).encode(text).ids
    assert tok.decode(ids) == text


def test_padded_build_is_deterministic() -> None:
    n = max(VOCAB_SIZES)
    assert tokenizer.train_tokenizer(n).to_str() == _fast(n).to_str()


def test_mismatched_vocab_sizes_are_refused() -> None:
    with pytest.raises(ValueError, match="vocab_size"):
        tokenizer.train_tokenizer(tokenizer.VOCAB_SIZE - 1)
    # A 7b config over the unpadded tokenizer is the bug this layout fixes: refused.
    with pytest.raises(ValueError, match="152064"):
        shapes.model_config("qwen2_vl", "7b", tokenizer.token_ids(_fast(tokenizer.VOCAB_SIZE)))


def test_filler_tokens_contract() -> None:
    assert fillers.filler_tokens(0, ()) == []
    assert fillers.filler_tokens(3, {"\u0120be"}) == ["\u0120ba", "\u0120bi", "\u0120bo"]
    everything = fillers.filler_tokens(fillers.MAX_FILLERS, ())
    assert len(set(everything)) == fillers.MAX_FILLERS  # the strided walk misses nothing
    with pytest.raises(ValueError):
        fillers.filler_tokens(fillers.MAX_FILLERS + 1, ())
    with pytest.raises(ValueError):
        fillers.filler_tokens(-1, ())


def test_padded_checkpoint_loads_with_ids_where_config_says(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A whole checkpoint with fillers, kept tiny: the tiny text tower with a 3000-row
    # embedding, loaded the way the gateway loads it.
    row = {**shapes._TEXT[("qwen2_vl", "tiny")], "vocab_size": 3000}
    monkeypatch.setitem(shapes._TEXT, ("qwen2_vl", "tiny"), row)
    path = om.build_model(tmp_path / "padded", "qwen2_vl", "tiny", seed=0)
    config = json.loads((path / "config.json").read_text())
    assert config["vocab_size"] == 3000
    assert (config["image_token_id"], config["video_token_id"]) == (2046, 2047)
    assert (config["vision_start_token_id"], config["eos_token_id"]) == (2043, 2036)
    model, processor = mlx_vlm.load(str(path))
    tok = processor.tokenizer
    assert len(tok) == 3000 == model.language_model.model.embed_tokens.weight.shape[0]
    assert tok.convert_tokens_to_ids(list(SPECIAL_IDS)) == list(SPECIAL_IDS.values())
    _check_every_id_decodes(
        lambda i: tok.decode([i], skip_special_tokens=True), _fast(tokenizer.VOCAB_SIZE), 3000
    )
