"""Streaming detokenization without calling the tokenizer per token.

Qwen-VL tokenizers are byte-level BPE: every token is a fixed byte string, and the text of a
sequence is the UTF-8 decoding of the concatenated bytes (special tokens skipped). So a table
id -> bytes, built once at load, plus Python's incremental UTF-8 decoder gives each token's
text delta in well under a microsecond, where two `tokenizer.decode` calls per token (the
generic `IncrementalDetokenizer`) cost tens of microseconds of engine-thread Python per row
per step. The table is checked against `tokenizer.decode` when it is built; a tokenizer it does
not match keeps the generic path.
"""

from __future__ import annotations

import codecs
import logging
import random
import re
from collections.abc import Callable, Sequence
from typing import Any, Protocol

log = logging.getLogger(__name__)


class Detokenizer(Protocol):
    """Token ids in, text deltas out; the deltas plus `flush()` concatenate to the decode of
    all ids. Text ending in an incomplete UTF-8 sequence is held back. One per request."""

    def add(self, token: int) -> str: ...

    def flush(self) -> str: ...


class ByteStreamDetokenizer:
    """`Detokenizer` over an id -> bytes table (see `byte_table`). Not thread-safe."""

    def __init__(self, table: Sequence[bytes]) -> None:
        self._table = table
        self._utf8 = codecs.getincrementaldecoder("utf-8")("replace")

    def add(self, token: int) -> str:
        piece = self._table[token] if 0 <= token < len(self._table) else b""
        return self._utf8.decode(piece)

    def flush(self) -> str:
        return self._utf8.decode(b"", final=True)


def _byte_decoder() -> dict[str, int]:
    """GPT-2's byte-level alphabet: printable stand-in character -> byte."""
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1)]
    printable += range(ord("®"), ord("ÿ") + 1)
    chars = list(printable)
    extra = 0
    for b in range(256):
        if b not in printable:
            printable.append(b)
            chars.append(256 + extra)
            extra += 1
    return {chr(c): b for b, c in zip(printable, chars)}


def byte_table(tokenizer: Any, vocab_size: int, check_samples: int = 200) -> list[bytes] | None:
    """id -> bytes for ids [0, vocab_size) of a transformers byte-level BPE tokenizer, as
    `tokenizer.decode(ids, skip_special_tokens=True)` sees them; None if the tokenizer is not
    byte-level BPE or the table disagrees with `decode` on a deterministic sample of sequences.
    """
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is None or type(backend.decoder).__name__ != "ByteLevel":
        return None
    if getattr(tokenizer, "clean_up_tokenization_spaces", False):
        return None  # decode() would rewrite spaces before punctuation: not a byte stream
    special = set(getattr(tokenizer, "all_special_ids", []))
    added = {i: t for i, t in getattr(tokenizer, "added_tokens_decoder", {}).items()}
    special |= {i for i, t in added.items() if getattr(t, "special", False)}
    decoder = _byte_decoder()
    pieces = tokenizer.convert_ids_to_tokens(list(range(vocab_size)))
    table: list[bytes] = []
    for i, piece in enumerate(pieces):
        if i in special or piece is None:
            table.append(b"")
        elif i in added:
            table.append(str(added[i].content).encode("utf-8"))
        elif all(c in decoder for c in piece):
            table.append(bytes(decoder[c] for c in piece))
        else:
            return None
    if not _agrees(
        table, lambda ids: tokenizer.decode(ids, skip_special_tokens=True), special, check_samples
    ):
        log.warning("byte table disagrees with tokenizer.decode; using the generic detokenizer")
        return None
    return table


def _agrees(
    table: Sequence[bytes], decode: Callable[[list[int]], str], special: set[int], samples: int
) -> bool:
    rng = random.Random(0)
    ordinary = [i for i in range(len(table)) if i not in special]
    for n in range(samples):
        ids = [rng.choice(ordinary) for _ in range(1 + n % 12)]
        if n % 5 == 0 and special:
            ids.insert(len(ids) // 2, min(special))
        stream = ByteStreamDetokenizer(table)
        text = "".join(stream.add(i) for i in ids) + stream.flush()
        if text != decode(ids):
            return False
    return True


_BYTE_PIECE = re.compile(r"<0x([0-9A-Fa-f]{2})>")


def token_bytes(entry: bytes | None, piece: str | None, text: str) -> bytes:
    """One token's bytes as an OpenAI logprob's `bytes` field wants them: the raw bytes it
    adds to the output, so a client can join a character split over several tokens (its
    `text` alone is U+FFFD there). `entry`: the token's `byte_table` entry (None: no table,
    or b"" for a special token); `piece`: its vocabulary piece (a SentencePiece byte fallback
    such as `<0xD1>` is that byte); `text`: its decoded text (UTF-8 otherwise)."""
    if entry:
        return entry
    match = _BYTE_PIECE.fullmatch(piece or "")
    if match:
        return bytes([int(match.group(1), 16)])
    return text.encode("utf-8")
