"""Tiny random-weight mlx-lm text checkpoints for the text family's tests (test-only).

mlx-lm's own model classes (qwen3, llama) at tiny sizes, seeded, saved as a checkpoint that
`mlx_lm.load` reads; the tokenizer (a byte-level BPE with Qwen's special tokens and chat
template) is the tiny Qwen2-VL test checkpoint's. Built once per machine, under the test
models folder, keyed by this file's contents.
"""

from __future__ import annotations

import hashlib
import json
import shutil
import threading
from pathlib import Path

from support import MODEL_ROOT, tiny_model

_lock = threading.Lock()
_TOKENIZER_FILES = (
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "vocab.json",
    "merges.txt",
    "chat_template.jinja",
)
_COMMON = {
    "hidden_size": 64,
    "num_hidden_layers": 2,
    "intermediate_size": 128,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 16,
    "rms_norm_eps": 1e-6,
    "vocab_size": 2048,
    "max_position_embeddings": 4096,
    "rope_theta": 10000.0,
    "tie_word_embeddings": False,
}


def text_checkpoint(model_type: str = "qwen3", seed: int = 0) -> Path:
    """The directory of a tiny `model_type` ("qwen3" or "llama") checkpoint."""
    import mlx.core as mx
    from mlx.utils import tree_flatten
    from mlx_lm.utils import _get_classes

    digest = hashlib.sha256(Path(__file__).read_bytes()).hexdigest()[:10]
    out = MODEL_ROOT / f"{model_type}-text-tiny-{seed}-{digest}"
    with _lock:
        if (out / "config.json").exists():
            return out
        qwen = tiny_model("qwen2_vl")
        eos = json.loads((qwen / "config.json").read_text())["eos_token_id"]
        config = {"model_type": model_type, **_COMMON, "eos_token_id": eos}
        model_class, args_class = _get_classes(config)
        mx.random.seed(seed)
        model = model_class(args_class.from_dict(config))
        weights = dict(tree_flatten(model.parameters()))
        mx.eval(weights)
        tmp = out.with_name(out.name + ".tmp")
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir(parents=True)
        mx.save_safetensors(str(tmp / "model.safetensors"), weights)
        (tmp / "config.json").write_text(json.dumps(config, indent=1))
        for name in _TOKENIZER_FILES:
            if (qwen / name).exists():
                shutil.copy(qwen / name, tmp / name)
        tmp.rename(out)
    return out
