"""Which embedding family serves a checkpoint, and loading it (engine thread)."""

from __future__ import annotations

from gateway.engine.embed.embedder import Embedder
from gateway.processors.checkpoint import read_config


def load_embedder(path: str, task: str = "auto") -> Embedder:
    """The checkpoint at `path` loaded with its embedding family: a reranker when `task` (the
    model's --task) says so, else Qwen3-VL-Embedding by its model type, else a text embedder
    (the HTTP process checked it is one first: `processors.checkpoint.serving_task`)."""
    from gateway.engine.embed.qwen3_vl import MODEL_TYPES, QwenVLEmbedder
    from gateway.engine.embed.reranker import TextReranker
    from gateway.engine.embed.text import TextEmbedder

    if task == "rerank":
        from gateway.engine.embed.qwen3_vl_reranker import QwenVLReranker

        if str(read_config(path).get("model_type")) in QwenVLReranker.MODEL_TYPES:
            return QwenVLReranker(path)
        return TextReranker(path)
    if str(read_config(path).get("model_type")) in MODEL_TYPES:
        return QwenVLEmbedder(path)
    return TextEmbedder(path)
