"""The tokenizer files of a checkpoint dir, as transformers, mlx-lm and mlx-vlm read them.

    write_tokenizer_files(out_dir, tok, config, named, chat_template, vocab_merges)

Files: tokenizer.json (the fast tokenizer, the source of truth), tokenizer_config.json (the
family's settings plus `added_tokens_decoder` and `chat_template`), special_tokens_map.json,
chat_template.jinja (transformers >= 4.43 and mlx-vlm's processors re-read the template from
there) and, for byte-level families whose transformers class rebuilds the BPE from them,
vocab.json + merges.txt. Every file is written with fixed separators, indent and key order
and a trailing newline, so the same arguments give the same bytes.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from tokenizers import Tokenizer


def dump_json(path: Path, obj: object) -> None:
    """`obj` as indented JSON (non-ASCII kept) with a trailing newline: byte-stable."""
    path.write_text(json.dumps(obj, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")


def added_tokens_decoder(tok: Tokenizer) -> dict[str, dict[str, Any]]:
    """tokenizer_config.json's `added_tokens_decoder`: id -> the added token's flags."""
    return {
        str(i): {
            "content": t.content,
            "lstrip": t.lstrip,
            "normalized": t.normalized,
            "rstrip": t.rstrip,
            "single_word": t.single_word,
            "special": t.special,
        }
        for i, t in sorted(tok.get_added_tokens_decoder().items())
    }


def special_tokens_map(named: dict[str, str | None], additional: list[str]) -> dict[str, Any]:
    """special_tokens_map.json: each named token (bos/eos/pad/unk) that is set, in full form."""
    flags = {"lstrip": False, "normalized": False, "rstrip": False, "single_word": False}
    out: dict[str, Any] = {"additional_special_tokens": additional} if additional else {}
    for key, content in sorted(named.items()):
        if content is not None:
            out[key] = {"content": content, **flags}
    return out


def write_tokenizer_files(
    out_dir: Path,
    tok: Tokenizer,
    config: dict[str, Any],
    named: dict[str, str | None],
    chat_template: str,
    vocab_merges: bool = False,
) -> None:
    """Write the tokenizer files for `tok` into `out_dir`.

    `config` is the family's tokenizer_config.json without `added_tokens_decoder` and
    `chat_template` (added here, from `tok` and `chat_template`); `named` maps bos_token /
    eos_token / pad_token / unk_token to their text (None: unset). `vocab_merges` also writes
    vocab.json and merges.txt (byte-level BPE only).
    """
    tok.save(str(out_dir / "tokenizer.json"), pretty=True)
    if vocab_merges:
        model = json.loads(tok.to_str())["model"]
        dump_json(out_dir / "vocab.json", model["vocab"])
        # tokenizers >= 0.20 stores merges as pairs; merges.txt wants "a b" lines.
        pairs = [" ".join(m) if isinstance(m, list) else m for m in model["merges"]]
        merges = ["#version: 0.2", *pairs]
        (out_dir / "merges.txt").write_text("\n".join(merges) + "\n", encoding="utf-8")
    full = {
        **config,
        **named,
        "added_tokens_decoder": added_tokens_decoder(tok),
        "chat_template": chat_template,
    }
    dump_json(out_dir / "tokenizer_config.json", dict(sorted(full.items())))
    additional = list(config.get("additional_special_tokens", []))
    dump_json(out_dir / "special_tokens_map.json", special_tokens_map(named, additional))
    (out_dir / "chat_template.jinja").write_text(chat_template, encoding="utf-8")
