"""A family's BPE tokenizer, trained offline and deterministically, in the family's own pipeline.

    build_tokenizer(spec) -> tokenizers.Tokenizer with exactly spec.vocab_size ids

Each family's tokenizer is a BPE trained here on `corpus.build_corpus()` (about 0.1 s) with
that family's normaliser, pre-tokeniser, post-processor and decoder (`STYLES`), so the
checkpoint's tokenizer.json is loaded the way the real family's is:

- byte-level styles (`qwen2`, `llama3`, `gpt2`, `tekken`): GPT-2 byte symbols, every byte is
  a token, spaces are spelled "Ġ"; they differ in the split regex, in NFC, and in whether the
  post-processor prepends a BOS (Llama 3 and Tekken do);
- `gemma`: SentencePiece-style BPE as transformers' GemmaTokenizer rebuilds it (spaces are
  "▁", no pre-tokenisation, characters outside the trained alphabet fall back to the 256
  `<0xNN>` byte tokens), with a `<bos>`-prepending post-processor.

Id layout, for n = len(spec.specials) and t = spec.trained:

    specials_first=False (Qwen, Llama 3):  [0, t) BPE, [t, t+n) specials, fillers up to vocab_size
    specials_first=True (Gemma, Mistral, SmolLM):  [0, n) specials, [n, n+t) BPE, fillers after

(for `gemma` the BPE block is the 256 byte tokens then t - 256 trained pieces). Specials sit
in the BPE model's own vocabulary as well as in the added-token table, so a loader that
rebuilds the model from vocab/merges (transformers' Qwen2Tokenizer, GemmaTokenizer) keeps
their ids. Fillers (see `fillers`) are words the encoder never produces, so every id a
random-weight model samples decodes to text. Everything is a pure function of the spec.
"""

from __future__ import annotations

import functools
import json
from dataclasses import dataclass

from tokenizers import AddedToken, Regex, Tokenizer, decoders, normalizers, pre_tokenizers
from tokenizers import processors as tk_processors
from tokenizers.models import BPE
from tokenizers.trainers import BpeTrainer

from .corpus import build_corpus
from .fillers import filler_tokens

# transformers.models.qwen2.tokenization_qwen2.PRETOKENIZE_REGEX, verbatim.
QWEN2_REGEX = (
    r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"""
    r"""|\s*[\r\n]+|\s+(?!\S)|\s+"""
)
# Llama 3's (tiktoken cl100k): digits in runs of up to three.
LLAMA3_REGEX = (
    r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}"""
    r"""| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"""
)
# Mistral's Tekken (the pattern transformers' `fix_mistral_regex` installs).
TEKKEN_REGEX = (
    r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+"
    r"|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*"
    r"|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
_SPLIT = {"qwen2": QWEN2_REGEX, "llama3": LLAMA3_REGEX, "tekken": TEKKEN_REGEX}
STYLES: tuple[str, ...] = ("qwen2", "llama3", "gpt2", "tekken", "gemma")
SPM_SPACE = "\u2581"  # "▁"
_BYTE_SPACE = "\u0120"  # "Ġ"
BYTE_TOKENS: tuple[str, ...] = tuple(f"<0x{b:02X}>" for b in range(256))


@dataclass(frozen=True)
class Special:
    """A control token: one id, never split, never normalised. `special=False` makes it an
    added token that `skip_special_tokens` keeps (Qwen3's `<think>`, `<tool_call>`)."""

    content: str
    special: bool = True


@dataclass(frozen=True)
class TokenizerSpec:
    """What a family's tokenizer is. `vocab_size` is the embedding's row count; `trained` the
    number of BPE tokens (byte-level: including the 256 byte symbols; gemma: including the
    256 `<0xNN>` tokens); `bos` is prepended by the post-processor when `add_bos`."""

    style: str
    specials: tuple[Special, ...]
    vocab_size: int
    trained: int
    specials_first: bool = False
    bos: str | None = None
    add_bos: bool = False

    @property
    def first_filler(self) -> int:
        """The lowest filler id: everything from here up is padding to the embedding size."""
        return self.trained + len(self.specials)


def _byte_level(style: str) -> Tokenizer:
    tok = Tokenizer(BPE(continuing_subword_prefix="", end_of_word_suffix="", fuse_unk=False))
    if style == "qwen2":
        tok.normalizer = normalizers.NFC()
    if style == "gpt2":  # GPT-2's own regex inside ByteLevel
        tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    else:
        tok.pre_tokenizer = pre_tokenizers.Sequence(
            [
                pre_tokenizers.Split(Regex(_SPLIT[style]), behavior="isolated", invert=False),
                pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
            ]
        )
    tok.decoder = decoders.ByteLevel()
    return tok


@functools.cache
def _trained_byte_level(style: str, trained: int) -> str:
    """tokenizer.json text of the bare trained byte-level BPE (`trained` tokens)."""
    tok = _byte_level(style)
    trainer = BpeTrainer(
        vocab_size=trained,
        min_frequency=2,
        show_progress=False,
        # All 256 byte symbols up front: every byte string is encodable (no unknown token),
        # and symbol ids are assigned in a fixed order rather than in corpus-hash order.
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        special_tokens=[],
    )
    tok.train_from_iterator(build_corpus(), trainer=trainer)
    return tok.to_str()


@functools.cache
def _trained_spm(pieces: int) -> str:
    """tokenizer.json text of a bare SentencePiece-style BPE with `pieces` trained pieces.

    Trained on words split before each "▁" (SentencePiece's whitespace split), so no merge
    crosses a word boundary; encoding then runs without any split, as Gemma's does."""
    corpus = build_corpus()
    alphabet = sorted({c for doc in corpus for c in doc if c != " "} | {SPM_SPACE})
    tok = Tokenizer(BPE(unk_token="<unk>", byte_fallback=True, fuse_unk=True))
    tok.pre_tokenizer = pre_tokenizers.Metaspace(SPM_SPACE, prepend_scheme="never", split=True)
    trainer = BpeTrainer(
        vocab_size=pieces,
        min_frequency=2,
        show_progress=False,
        initial_alphabet=alphabet,
        limit_alphabet=len(alphabet),
        special_tokens=[],
    )
    tok.train_from_iterator(corpus, trainer=trainer)
    return tok.to_str()


def _check_spec(spec: TokenizerSpec) -> None:
    if spec.style not in STYLES:
        raise ValueError(f"unknown tokenizer style {spec.style!r}; expected one of {STYLES}")
    if spec.trained <= len(BYTE_TOKENS):  # the 256 byte tokens come before any merge
        raise ValueError(f"trained must be > {len(BYTE_TOKENS)}, got {spec.trained}")
    if spec.vocab_size < spec.first_filler:
        raise ValueError(
            f"vocab_size must be >= {spec.first_filler} (trained + specials), got {spec.vocab_size}"
        )
    if spec.add_bos and spec.bos not in {s.content for s in spec.specials}:
        raise ValueError(f"bos {spec.bos!r} must be one of the specials")


def _trained_model(spec: TokenizerSpec) -> dict:
    """The trained BPE's tokenizer.json dict, with its vocabulary in trained-id order."""
    if spec.style == "gemma":
        raw = json.loads(_trained_spm(spec.trained - len(BYTE_TOKENS)))
        pieces = sorted(raw["model"]["vocab"].items(), key=lambda kv: kv[1])
        vocab = {t: i for i, t in enumerate([*BYTE_TOKENS, *(t for t, _ in pieces)])}
        raw["model"]["vocab"] = vocab
    else:
        raw = json.loads(_trained_byte_level(spec.style, spec.trained))
    if len(raw["model"]["vocab"]) != spec.trained:
        raise RuntimeError(
            f"BPE training gave {len(raw['model']['vocab'])} tokens, expected {spec.trained}: "
            "the corpus is too small for this vocabulary"
        )
    return raw


def _runtime_pipeline(tok: Tokenizer, spec: TokenizerSpec) -> None:
    """Install the family's encode/decode pipeline (gemma: transformers' GemmaTokenizer's)."""
    if spec.style == "gemma":
        tok.normalizer = normalizers.Replace(" ", SPM_SPACE)
        tok.pre_tokenizer = pre_tokenizers.Split(" ", "merged_with_previous", invert=False)
        tok.decoder = decoders.Sequence(
            [decoders.Replace(SPM_SPACE, " "), decoders.ByteFallback(), decoders.Fuse()]
        )
        tok.post_processor = None
    else:
        template = _byte_level(spec.style)
        tok.normalizer = template.normalizer
        tok.pre_tokenizer = template.pre_tokenizer
        tok.decoder = template.decoder
        tok.post_processor = tk_processors.ByteLevel(trim_offsets=False)
    if spec.add_bos:
        assert spec.bos is not None
        bos = (spec.bos, tok.token_to_id(spec.bos))
        prepend = tk_processors.TemplateProcessing(
            single=f"{spec.bos} $A", pair=f"{spec.bos} $A {spec.bos} $B:1", special_tokens=[bos]
        )
        steps = [tok.post_processor, prepend] if tok.post_processor is not None else [prepend]
        tok.post_processor = steps[0] if len(steps) == 1 else tk_processors.Sequence(steps)


def build_tokenizer(spec: TokenizerSpec) -> Tokenizer:
    """The tokenizer `spec` describes (see the module docstring for the id layout).

    Raises ValueError for an inconsistent spec, RuntimeError if training drifts (the
    vocabulary layout is part of the checkpoint's contract, so it must not move silently).
    """
    _check_spec(spec)
    raw = _trained_model(spec)
    trained: dict[str, int] = raw["model"]["vocab"]
    n = len(spec.specials)
    base = n if spec.specials_first else 0
    vocab = {t: base + i for t, i in trained.items()}
    first_special = 0 if spec.specials_first else spec.trained
    for i, s in enumerate(spec.specials):
        vocab[s.content] = first_special + i
    space = SPM_SPACE if spec.style == "gemma" else _BYTE_SPACE
    extra = filler_tokens(spec.vocab_size - spec.first_filler, taken=vocab.keys(), space=space)
    for i, token in enumerate(extra):
        vocab[token] = spec.first_filler + i
    raw["model"]["vocab"] = vocab
    tok = Tokenizer.from_str(json.dumps(raw))
    for s in spec.specials:  # one at a time, in id order: added tokens list in that order
        token = AddedToken(
            s.content, special=s.special, normalized=False, lstrip=False, rstrip=False
        )
        (tok.add_special_tokens if s.special else tok.add_tokens)([token])
    _runtime_pipeline(tok, spec)
    moved = [
        s.content
        for i, s in enumerate(spec.specials)
        if tok.token_to_id(s.content) != first_special + i
    ]
    size = tok.get_vocab_size(with_added_tokens=True)
    if moved or size != spec.vocab_size:
        raise RuntimeError(f"tokenizer layout broken: specials moved {moved}, {size} ids")
    return tok
