"""A Qwen2-style byte-level BPE tokenizer, trained offline and deterministically.

The pipeline (NFC normaliser, Qwen's pre-tokenisation regex, byte-level BPE, byte-level
decoder) is the one `transformers.Qwen2Tokenizer` rebuilds for itself, so the fast tokenizer
loaded from `tokenizer.json` and any path that reconstructs the tokenizer from
`vocab.json`/`merges.txt` encode identically.

The special tokens are Qwen2-VL's, in Qwen2-VL's order, appended after the trained vocabulary,
so their ids keep Qwen's relative layout (`<|endoftext|>` first, `<|video_pad|>` last) at a
much smaller base. Each encodes to exactly one id and is never split or normalised.

Above them, up to the model's embedding size, come filler pseudo-words (see `fillers`) that
the encoder never produces, so that every id a random-weight model can sample decodes to
text. Id layout, for a tokenizer of `vocab_size` ids:

    [0, 2034)            trained BPE tokens (the first 256 are the byte alphabet)
    [2034, 2048)         SPECIAL_TOKENS, at the same ids for every vocab_size
    [2048, vocab_size)   fillers (none for the tiny size, whose embedding is 2048 ids)
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from tokenizers import AddedToken, Regex, Tokenizer, decoders, normalizers, pre_tokenizers
from tokenizers import processors as tk_processors
from tokenizers.models import BPE
from tokenizers.trainers import BpeTrainer

from .corpus import build_corpus
from .fillers import filler_tokens

# Qwen2-VL's special tokens, in its id order (151643 ... 151656 upstream).
SPECIAL_TOKENS: tuple[str, ...] = (
    "<|endoftext|>",
    "<|im_start|>",
    "<|im_end|>",
    "<|object_ref_start|>",
    "<|object_ref_end|>",
    "<|box_start|>",
    "<|box_end|>",
    "<|quad_start|>",
    "<|quad_end|>",
    "<|vision_start|>",
    "<|vision_end|>",
    "<|vision_pad|>",
    "<|image_pad|>",
    "<|video_pad|>",
)
VOCAB_SIZE = 2048  # trained tokens + specials; a power of two keeps embedding shapes tidy
_N_TRAINED = VOCAB_SIZE - len(SPECIAL_TOKENS)  # BPE tokens; also the id of the first special

# transformers.models.qwen2.tokenization_qwen2.PRETOKENIZE_REGEX, verbatim.
_PRETOKENIZE_REGEX = (
    r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"""
    r"""|\s*[\r\n]+|\s+(?!\S)|\s+"""
)

# Qwen2-VL-style chat template, deliberately simpler than upstream's:
# - no default system message is injected (what the caller sends is what the model sees);
# - content is a string, or a list of parts rendered in the order given: a text part as its
#   text, an image part as <|vision_start|><|image_pad|><|vision_end|> in place (so an
#   image's tokens never depend on the text after it), a video part likewise;
# - add_generation_prompt appends "<|im_start|>assistant\n".
# One line with explicit string literals, so Jinja whitespace handling cannot add newlines.
CHAT_TEMPLATE = (
    "{%- for message in messages -%}"
    "{{- '<|im_start|>' + message['role'] + '\\n' -}}"
    "{%- if message['content'] is string -%}{{- message['content'] -}}"
    "{%- elif message['content'] is not none -%}"
    "{%- for part in message['content'] -%}"
    "{%- if part['type'] == 'text' -%}{{- part['text'] -}}"
    "{%- elif part['type'] in ('image', 'image_url') -%}"
    "{{- '<|vision_start|><|image_pad|><|vision_end|>' -}}"
    "{%- elif part['type'] in ('video', 'video_url') -%}"
    "{{- '<|vision_start|><|video_pad|><|vision_end|>' -}}"
    "{%- endif -%}"
    "{%- endfor -%}"
    "{%- endif -%}"
    "{{- '<|im_end|>\\n' -}}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}{{- '<|im_start|>assistant\\n' -}}{%- endif -%}"
)


@dataclass(frozen=True)
class TokenIds:
    """Ids of the tokens that config.json and generation_config.json must agree on."""

    endoftext: int
    im_start: int
    im_end: int
    vision_start: int
    vision_end: int
    vision_pad: int
    image_pad: int
    video_pad: int
    vocab_size: int  # number of ids the tokenizer knows (trained + special + filler)


def _train_bpe() -> Tokenizer:
    """The trained part alone: `_N_TRAINED` byte-level BPE tokens.

    Raises RuntimeError if the corpus no longer yields exactly that many tokens (the
    vocabulary size is part of the checkpoint's contract, so it must not drift silently).
    """
    tok = Tokenizer(
        BPE(
            unk_token=None,
            continuing_subword_prefix="",
            end_of_word_suffix="",
            fuse_unk=False,
            byte_fallback=False,
        )
    )
    tok.normalizer = normalizers.NFC()
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(_PRETOKENIZE_REGEX), behavior="isolated", invert=False),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )
    tok.decoder = decoders.ByteLevel()
    tok.post_processor = tk_processors.ByteLevel(trim_offsets=False)
    trainer = BpeTrainer(
        vocab_size=_N_TRAINED,
        min_frequency=2,
        show_progress=False,
        # All 256 byte symbols up front: every byte string is encodable (no unknown token),
        # and symbol ids are assigned in a fixed order rather than in corpus-hash order.
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        special_tokens=[],
    )
    tok.train_from_iterator(build_corpus(), trainer=trainer)
    if tok.get_vocab_size() != _N_TRAINED:
        raise RuntimeError(
            f"BPE training gave {tok.get_vocab_size()} tokens, expected "
            f"{_N_TRAINED}: the corpus is too small for VOCAB_SIZE"
        )
    return tok


def train_tokenizer(vocab_size: int = VOCAB_SIZE) -> Tokenizer:
    """The tokenizer with exactly `vocab_size` ids; a pure function of the corpus and the size.

    Contract (see the module docstring for the layout): ids 0..vocab_size-1 are all assigned;
    the trained tokens and SPECIAL_TOKENS have the same ids for every `vocab_size`; ids from
    VOCAB_SIZE up are filler tokens that encoding never produces, so any text encodes to the
    same ids whatever `vocab_size` is. Pass the model's embedding size (`shapes.text_vocab_size`).
    Raises ValueError if `vocab_size` < VOCAB_SIZE, RuntimeError if training drifts.
    """
    if vocab_size < VOCAB_SIZE:
        raise ValueError(f"vocab_size must be >= {VOCAB_SIZE}, got {vocab_size}")
    spec = json.loads(_train_bpe().to_str())
    vocab: dict[str, int] = spec["model"]["vocab"]
    # The specials and fillers go into the BPE model's own vocabulary, not only into the
    # added-token table: loading a tokenizer.json (tokenizers) or rebuilding the BPE model
    # from vocab.json (transformers' Qwen2Tokenizer) gives an added token that the model
    # vocabulary lacks the next id after the model's last one, so with fillers above them
    # the specials would move. A model-vocabulary entry pins the id; no merge produces it,
    # so BPE never emits it from text, and the special added token (registered below) is
    # what matches it in input text and what skip_special_tokens drops.
    for i, token in enumerate(SPECIAL_TOKENS):
        vocab[token] = _N_TRAINED + i
    for i, token in enumerate(filler_tokens(vocab_size - VOCAB_SIZE, taken=vocab.keys())):
        vocab[token] = VOCAB_SIZE + i
    tok = Tokenizer.from_str(json.dumps(spec))
    tok.add_special_tokens(
        [
            AddedToken(
                t, special=True, normalized=False, lstrip=False, rstrip=False, single_word=False
            )
            for t in SPECIAL_TOKENS
        ]
    )
    # Guard the layout (cheaply: a full vocabulary scan costs about a second at 152k): the
    # model vocabulary holds distinct ids 0..vocab_size-1 by construction, so what remains is
    # that no special moved and nothing was appended past the end.
    moved = [t for i, t in enumerate(SPECIAL_TOKENS) if tok.token_to_id(t) != _N_TRAINED + i]
    size = tok.get_vocab_size(with_added_tokens=True)
    if moved or size != vocab_size:
        raise RuntimeError(f"tokenizer layout broken: specials moved {moved}, {size} ids")
    return tok


def token_ids(tok: Tokenizer) -> TokenIds:
    """The special ids of a tokenizer built by `train_tokenizer`."""

    def tid(token: str) -> int:
        i = tok.token_to_id(token)
        if i is None:
            raise RuntimeError(f"{token} missing from the tokenizer")
        return i

    return TokenIds(
        endoftext=tid("<|endoftext|>"),
        im_start=tid("<|im_start|>"),
        im_end=tid("<|im_end|>"),
        vision_start=tid("<|vision_start|>"),
        vision_end=tid("<|vision_end|>"),
        vision_pad=tid("<|vision_pad|>"),
        image_pad=tid("<|image_pad|>"),
        video_pad=tid("<|video_pad|>"),
        vocab_size=tok.get_vocab_size(with_added_tokens=True),
    )


def _dump(path: Path, obj: object) -> None:
    # Fixed separators/indent/key order and a trailing newline: byte-identical on every build.
    path.write_text(json.dumps(obj, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")


def write_tokenizer_files(out_dir: Path, tok: Tokenizer) -> TokenIds:
    """Write every tokenizer file `mlx_vlm.load` / `AutoTokenizer` / `AutoProcessor` read.

    Files: tokenizer.json (the fast tokenizer, the source of truth), vocab.json + merges.txt
    (for loaders that rebuild a Qwen2Tokenizer from them), tokenizer_config.json (class, eos
    `<|im_end|>`, pad `<|endoftext|>`, chat template), special_tokens_map.json and
    chat_template.jinja (mlx-vlm's processors re-read the template from there).
    """
    ids = token_ids(tok)
    tok.save(str(out_dir / "tokenizer.json"), pretty=True)
    model = json.loads(tok.to_str())["model"]
    _dump(out_dir / "vocab.json", model["vocab"])
    # tokenizers >= 0.20 stores merges as pairs; merges.txt wants "a b" lines.
    pairs = [" ".join(m) if isinstance(m, list) else m for m in model["merges"]]
    merges = ["#version: 0.2", *pairs]
    (out_dir / "merges.txt").write_text("\n".join(merges) + "\n", encoding="utf-8")

    added = {
        str(tok.token_to_id(t)): {
            "content": t,
            "lstrip": False,
            "normalized": False,
            "rstrip": False,
            "single_word": False,
            "special": True,
        }
        for t in SPECIAL_TOKENS
    }
    extra = [t for t in SPECIAL_TOKENS if t != "<|endoftext|>"]
    _dump(
        out_dir / "tokenizer_config.json",
        {
            "add_bos_token": False,
            "add_prefix_space": False,
            "added_tokens_decoder": added,
            "additional_special_tokens": extra,
            "bos_token": None,
            "chat_template": CHAT_TEMPLATE,
            "clean_up_tokenization_spaces": False,
            "eos_token": "<|im_end|>",
            "errors": "replace",
            "model_max_length": 32768,
            "pad_token": "<|endoftext|>",
            "padding_side": "left",  # batched generation pads on the left
            "split_special_tokens": False,
            "tokenizer_class": "Qwen2Tokenizer",
            "unk_token": None,
        },
    )
    special = {
        "content": "",
        "lstrip": False,
        "normalized": False,
        "rstrip": False,
        "single_word": False,
    }
    _dump(
        out_dir / "special_tokens_map.json",
        {
            "additional_special_tokens": extra,
            "eos_token": {**special, "content": "<|im_end|>"},
            "pad_token": {**special, "content": "<|endoftext|>"},
        },
    )
    (out_dir / "chat_template.jinja").write_text(CHAT_TEMPLATE, encoding="utf-8")
    return ids
