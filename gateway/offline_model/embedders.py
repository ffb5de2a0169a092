"""The embedding families' tiny checkpoints: `--arch qwen3_embedding` (Qwen3-Embedding: a
Qwen3 text model in the sentence-transformers layout), `--arch qwen3_vl_embedding`
(Qwen3-VL-Embedding: a Qwen3-VL model whose last hidden state is pooled) and `--arch
qwen3_reranker` (Qwen3-Reranker: a Qwen3 chat model whose tokenizer holds "yes" and "no"
whole, "yes" added, served with `--task rerank`) and `--arch qwen3_vl_reranker` (its
Qwen3-VL counterpart: text and images, the same way).

Both reuse their chat family's files and change only what makes the checkpoint an embedder,
as the upstream checkpoints do:

- qwen3_embedding: config.json stays `model_type: qwen3` (mlx-vlm's embedding loader maps it
  to its `qwen3_embedding` model); `modules.json` and `1_Pooling/config.json` (last-token
  pooling, as Qwen3-Embedding ships) say it is a sentence-transformers embedder, and
  `config_sentence_transformers.json` holds the similarity function. The weights are the
  Qwen3 text model's (tied embeddings: no `lm_head`).
- qwen3_vl_embedding: `model_type: qwen3_vl_embedding` with `normalize: true` (mlx-vlm's
  `qwen3_vl_embedding.ModelConfig`); the weights are Qwen3-VL's without `lm_head` (the
  embedding model drops it). transformers has no config class for that type, so the config
  is validated as `qwen3_vl` with tied embeddings (the same parameters minus `lm_head`)
  and written to disk under its embedding type.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

from . import qwen3, qwen_vl
from . import tokenizer as qwen_vl_tokenizer
from .bpe import Special, TokenizerSpec, build_tokenizer
from .family import Family
from .shapes import generation_config, model_config, preprocessor_config, text_vocab_size
from .tokenizer_files import dump_json

VL_EMBEDDING_TYPE = "qwen3_vl_embedding"
RERANKER_WORDS = ("yes",)  # the trained vocabulary holds "no" whole already
VL_RERANKER_ROWS = 2112  # Qwen3-VL tiny's 2048 ids, "yes", fillers: a multiple of 64
POOLING = {
    "word_embedding_dimension": None,  # filled with the hidden size
    "pooling_mode_cls_token": False,
    "pooling_mode_mean_tokens": False,
    "pooling_mode_max_tokens": False,
    "pooling_mode_mean_sqrt_len_tokens": False,
    "pooling_mode_weightedmean_tokens": False,
    "pooling_mode_lasttoken": True,
    "include_prompt": True,
}
MODULES = [
    {"idx": i, "name": str(i), "path": path, "type": f"sentence_transformers.models.{kind}"}
    for i, (path, kind) in enumerate(
        (("", "Transformer"), ("1_Pooling", "Pooling"), ("2_Normalize", "Normalize"))
    )
]


def write_text_files(out: Path, size: str, dtype: str) -> dict[str, Any]:
    """Qwen3's files plus the sentence-transformers ones; returns config.json's dict."""
    config = qwen3.write_files(out, size, dtype)
    dump_json(out / "modules.json", MODULES)
    (out / "1_Pooling").mkdir(exist_ok=True)
    pooling = {**POOLING, "word_embedding_dimension": config["hidden_size"]}
    dump_json(out / "1_Pooling" / "config.json", pooling)
    (out / "2_Normalize").mkdir(exist_ok=True)
    dump_json(
        out / "config_sentence_transformers.json",
        {"prompts": {"query": "", "document": ""}, "similarity_fn_name": "cosine"},
    )
    return config


def write_reranker_files(out: Path, size: str, dtype: str) -> dict[str, Any]:
    """Qwen3's files with "yes" a token of its own (the reranker scores the logits of "yes"
    and "no", each one token in a real vocabulary; the tiny trained one holds only "no")."""
    return qwen3.write_files(out, size, dtype, RERANKER_WORDS)


def write_vl_reranker_files(out: Path, size: str, dtype: str) -> dict[str, Any]:
    """Qwen3-VL's files with "yes" a token of its own (as `write_reranker_files`): the text
    embedding grows to `VL_RERANKER_ROWS` rows so the added token (and fillers after it) have
    rows; every other id is Qwen3-VL's (the specials follow the trained tokens, so they do
    not move). config.json stays `model_type: qwen3_vl` (mlx-vlm's `qwen3_vl` reranker)."""
    base = qwen_vl_tokenizer.spec(VL_RERANKER_ROWS)
    words = tuple(Special(w, special=False) for w in RERANKER_WORDS)
    spec = TokenizerSpec(
        style=base.style,
        specials=base.specials + words,
        vocab_size=VL_RERANKER_ROWS,
        trained=base.trained,
    )
    ids = qwen_vl_tokenizer.write_tokenizer_files(out, build_tokenizer(spec))
    shaped = dataclasses.replace(ids, vocab_size=text_vocab_size("qwen3_vl", size))
    config = model_config("qwen3_vl", size, shaped, dtype)
    config["text_config"]["vocab_size"] = VL_RERANKER_ROWS
    dump_json(out / "config.json", config)
    dump_json(out / "generation_config.json", generation_config(ids))
    dump_json(out / "preprocessor_config.json", preprocessor_config("qwen3_vl", size))
    return config


def write_vl_files(out: Path, size: str, dtype: str) -> dict[str, Any]:
    """Qwen3-VL's files with config.json under the embedding type (see the module doc);
    returns the dict the builder validates (the `qwen3_vl` one, tied, without `lm_head`)."""
    config = qwen_vl.write_files("qwen3_vl", out, size, dtype)
    config["tie_word_embeddings"] = True
    config["text_config"]["tie_word_embeddings"] = True
    on_disk = {
        **config,
        "model_type": VL_EMBEDDING_TYPE,
        "architectures": ["Qwen3VLForEmbedding"],
        "normalize": True,
    }
    dump_json(out / "config.json", on_disk)
    return config


TEXT_FAMILY = Family(
    "qwen3_embedding", "mlx-lm", ("tiny",), "Qwen3-Embedding (text embedder)", write_text_files
)
RERANKER_FAMILY = Family(
    "qwen3_reranker",
    "mlx-lm",
    ("tiny",),
    "Qwen3-Reranker (a Qwen3 text model; serve it with --task rerank)",
    write_reranker_files,
)
VL_RERANKER_FAMILY = Family(
    "qwen3_vl_reranker",
    "mlx-vlm",
    ("tiny",),
    "Qwen3-VL-Reranker (a Qwen3-VL model; serve it with --task rerank)",
    write_vl_reranker_files,
)
VL_FAMILY = Family(
    VL_EMBEDDING_TYPE,
    "mlx-vlm",
    ("tiny", "7b"),  # 7b: Qwen3-VL-Embedding-8B's shapes (Qwen3-VL-8B's), for GPU benches
    "Qwen3-VL-Embedding (text and image embedder)",
    write_vl_files,
)
