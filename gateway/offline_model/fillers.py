"""Filler vocabulary: pseudo-words for the ids between the trained tokenizer and the embedding.

The 7b shapes embed ~152k ids (the upstream Qwen vocabulary size) while the offline BPE
tokenizer is trained to only `tokenizer.VOCAB_SIZE` ids. A random-weight model samples ids
from the whole embedding, so every id must decode to text: an id the tokenizer does not know
decodes to "" and a streamed completion would arrive as a handful of chunks. The ids above
the trained vocabulary therefore get filler entries:

- each is a space followed by 1-3 lowercase consonant-vowel syllables (" ba", " rokapi"), so
  noise output reads like words separated by spaces, one word per sampled token;
- each is plain printable ASCII, so it decodes alone to valid UTF-8 and is never held back by
  an incremental detokenizer waiting for the rest of a multi-byte character;
- none is in the trained vocabulary. BPE only builds tokens that a merge produces and every
  merge produces a trained token, so the encoder never emits a filler id: encoding any text
  is exactly what it is without the fillers.

The list is a pure function of its arguments (no randomness, no environment), which keeps the
tokenizer, and so the checkpoint, byte-for-byte reproducible.
"""

from __future__ import annotations

from collections.abc import Collection, Iterator
from itertools import product

# Byte-level BPE spells a space as "Ġ" (bytes are mapped to printable code points).
_SPACE = "\u0120"
_CONSONANTS = "bdfgklmnprstvz"
_VOWELS = "aeiou"
_SYLLABLES: tuple[str, ...] = tuple(c + v for c in _CONSONANTS for v in _VOWELS)  # 70
# Stride through the 70**3 three-syllable words, so consecutive ids do not all share a
# prefix. It is prime and does not divide 70**3, so the walk visits every word exactly once.
_STRIDE = 104729
MAX_FILLERS = len(_SYLLABLES) + len(_SYLLABLES) ** 2 + len(_SYLLABLES) ** 3


def _candidates() -> Iterator[str]:
    """Every pseudo-word once, in a fixed order: short ones first, then the strided walk."""
    for n in (1, 2):
        for parts in product(_SYLLABLES, repeat=n):
            yield "".join(parts)
    s = len(_SYLLABLES)
    for k in range(s**3):
        i = k * _STRIDE % s**3
        yield _SYLLABLES[i // (s * s)] + _SYLLABLES[i // s % s] + _SYLLABLES[i % s]


def filler_tokens(count: int, taken: Collection[str], space: str = _SPACE) -> list[str]:
    """`count` distinct filler tokens, none of them in `taken`, each `space` + a pseudo-word:
    byte-level spelling ("Ġba") by default, SentencePiece's ("▁ba") with space="\u2581".

    `taken` is the vocabulary being extended (trained tokens and special tokens). The result
    depends only on `count` and `taken`. Raises ValueError if `count` is negative or more
    than the generator can supply (about 348k, well above any Qwen vocabulary).
    """
    if count < 0:
        raise ValueError(f"count must be >= 0, got {count}")
    out: list[str] = []
    if count == 0:
        return out
    for word in _candidates():
        token = space + word
        if token not in taken:
            out.append(token)
            if len(out) == count:
                return out
    raise ValueError(f"cannot make {count} filler tokens; at most {MAX_FILLERS} exist")
