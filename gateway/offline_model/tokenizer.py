"""The Qwen-VL checkpoints' tokenizer: Qwen2-VL's special tokens and a Qwen2-VL-style template.

A `bpe.TokenizerSpec` of style `qwen2`: the pipeline (NFC normaliser, Qwen's pre-tokenisation
regex, byte-level BPE, byte-level decoder) is the one `transformers.Qwen2Tokenizer` rebuilds
for itself, so the fast tokenizer loaded from `tokenizer.json` and any path that reconstructs
the tokenizer from `vocab.json`/`merges.txt` encode identically.

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

from dataclasses import dataclass
from pathlib import Path

from tokenizers import Tokenizer

from .bpe import Special, TokenizerSpec, build_tokenizer
from .tokenizer_files import write_tokenizer_files as _write_files

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

# Qwen2-VL-style chat template, deliberately simpler than upstream's:
# - no default system message is injected (what the caller sends is what the model sees);
# - content is a string, or a list of parts rendered in the order given: a text part as its
#   text, an image part as <|vision_start|><|image_pad|><|vision_end|> in place (so an
#   image's tokens never depend on the text after it), a video part likewise;
# - add_generation_prompt appends "<|im_start|>assistant\n".
# Tools as Qwen2.5-VL's and Qwen3-VL's templates render them (hermes style): a `tools` list
# opens a system turn with the "# Tools" section (a first string system message's text
# first), an assistant's `tool_calls` follow its text as
# `<tool_call>\n{"name": ..., "arguments": ...}\n</tool_call>` lines, and consecutive
# `tool` messages share one user turn, each as `<tool_response>\n...\n</tool_response>`,
# their content parts (images included, as Qwen3-VL's template allows) in place. Without
# tools or tool messages the prompt is byte for byte the one before tools were added.
# One line per piece with explicit string literals, so Jinja whitespace handling cannot add
# newlines.
_CONTENT = (
    "{%- if content is string -%}{{- content -}}"
    "{%- elif content is not none -%}"
    "{%- for part in content -%}"
    "{%- if part['type'] == 'text' -%}{{- part['text'] -}}"
    "{%- elif part['type'] in ('image', 'image_url') -%}"
    "{{- '<|vision_start|><|image_pad|><|vision_end|>' -}}"
    "{%- elif part['type'] in ('video', 'video_url') -%}"
    "{{- '<|vision_start|><|video_pad|><|vision_end|>' -}}"
    "{%- endif -%}"
    "{%- endfor -%}"
    "{%- endif -%}"
)
_TOOLS = (
    "{%- if tools -%}"
    "{{- '<|im_start|>system\\n' -}}"
    "{%- if messages[0]['role'] == 'system' and messages[0]['content'] is string -%}"
    "{{- messages[0]['content'] + '\\n\\n' -}}{%- endif -%}"
    "{{- '# Tools\\n\\nYou may call one or more functions to assist with the user query."
    "\\n\\nYou are provided with function signatures within <tools></tools> XML tags:"
    "\\n<tools>' -}}"
    "{%- for tool in tools -%}{{- '\\n' -}}{{- tool | tojson -}}{%- endfor -%}"
    "{{- '\\n</tools>\\n\\nFor each function call, return a json object with function "
    "name and arguments within <tool_call></tool_call> XML tags:\\n<tool_call>\\n"
    '{\\"name\\": <function-name>, \\"arguments\\": <args-json-object>}\\n'
    "</tool_call><|im_end|>\\n' -}}"
    "{%- endif -%}"
)
_CALLS = (
    "{%- for call in message['tool_calls'] -%}"
    "{%- if not loop.first or message['content'] -%}{{- '\\n' -}}{%- endif -%}"
    "{%- set f = call['function'] if call['function'] is defined else call -%}"
    "{{- '<tool_call>\\n{\"name\": \"' + f['name'] + '\", \"arguments\": ' -}}"
    "{%- if f['arguments'] is string -%}{{- f['arguments'] -}}"
    "{%- else -%}{{- f['arguments'] | tojson -}}{%- endif -%}"
    "{{- '}\\n</tool_call>' -}}"
    "{%- endfor -%}"
)
CHAT_TEMPLATE = (
    _TOOLS + "{%- for message in messages -%}"
    "{%- set content = message['content'] -%}"
    "{%- if tools and loop.first and message['role'] == 'system' and content is string -%}"
    "{%- elif message['role'] == 'tool' -%}"
    "{%- if loop.first or messages[loop.index0 - 1]['role'] != 'tool' -%}"
    "{{- '<|im_start|>user' -}}{%- endif -%}"
    "{{- '\\n<tool_response>\\n' -}}" + _CONTENT + "{{- '\\n</tool_response>' -}}"
    "{%- if loop.last or messages[loop.index0 + 1]['role'] != 'tool' -%}"
    "{{- '<|im_end|>\\n' -}}{%- endif -%}"
    "{%- else -%}"
    "{{- '<|im_start|>' + message['role'] + '\\n' -}}"
    + _CONTENT
    + "{%- if message['tool_calls'] -%}"
    + _CALLS
    + "{%- endif -%}"
    "{{- '<|im_end|>\\n' -}}"
    "{%- endif -%}"
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


def spec(vocab_size: int = VOCAB_SIZE) -> TokenizerSpec:
    """The Qwen-VL tokenizer's spec at `vocab_size` ids (Qwen3's text models extend it)."""
    return TokenizerSpec(
        style="qwen2",
        specials=tuple(Special(t) for t in SPECIAL_TOKENS),
        vocab_size=vocab_size,
        trained=_N_TRAINED,
    )


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
    return build_tokenizer(spec(vocab_size))


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


def write_tokenizer_files(out_dir: Path, tok: Tokenizer) -> TokenIds:
    """Write every tokenizer file `mlx_vlm.load` / `AutoTokenizer` / `AutoProcessor` read.

    Files: tokenizer.json (the fast tokenizer, the source of truth), vocab.json + merges.txt
    (for loaders that rebuild a Qwen2Tokenizer from them), tokenizer_config.json (class, eos
    `<|im_end|>`, pad `<|endoftext|>`, chat template), special_tokens_map.json and
    chat_template.jinja (mlx-vlm's processors re-read the template from there).
    """
    config = {
        "add_bos_token": False,
        "add_prefix_space": False,
        "additional_special_tokens": [t for t in SPECIAL_TOKENS if t != "<|endoftext|>"],
        "clean_up_tokenization_spaces": False,
        "errors": "replace",
        "model_max_length": 32768,
        "padding_side": "left",  # batched generation pads on the left
        "split_special_tokens": False,
        "tokenizer_class": "Qwen2Tokenizer",
    }
    named = {
        "bos_token": None,
        "eos_token": "<|im_end|>",
        "pad_token": "<|endoftext|>",
        "unk_token": None,
    }
    _write_files(out_dir, tok, config, named, CHAT_TEMPLATE, vocab_merges=True)
    return token_ids(tok)
