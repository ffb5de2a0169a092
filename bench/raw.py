"""The raw MLX ceiling: the checkpoint's own language model in mlx-lm, no gateway at all.

A text checkpoint (qwen3, llama, any mlx-lm model the gateway serves as a text model) is
mlx-lm's own model, loaded by mlx-lm's loader: the very module the gateway's text family
runs. The language-model weights of a Qwen-VL checkpoint (as the gateway loads them) go into
mlx-lm's own text model (`qwen2` for Qwen2/2.5-VL, `qwen3` for Qwen3-VL) built from the
config's text part. For text tokens the three mRoPE position components are equal, which
makes multimodal rope exactly plain rope, so this model computes the same logits as the
gateway's `TextCore` (pinned by a test): its speed is the ceiling the gateway's figures are
divided by.

`python -m bench.raw --model DIR` prints progress on stderr and one JSON object on
stdout (the hotpath bench runs it as a subprocess, so its memory is gone before the server
starts). Measurements live in `bench.raw_measure`.
"""

from __future__ import annotations

import argparse
import gc
import glob
import json
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import mlx.core as mx
import mlx.nn as nn

from bench.raw_measure import RawSettings, measure

Log = Callable[[str], None]

_QWEN2_ARCHS = ("qwen2_vl", "qwen2_5_vl")
_QWEN3_ARCHS = ("qwen3_vl",)
# Vision-language checkpoints whose mlx-lm model class drops the vision tower itself (its
# `sanitize`) and runs the language model mlx-vlm's family runs: mlx-lm loads them as they are.
_MLX_LM_VLM_ARCHS = ("gemma3", "mistral3")
# Checkpoint key prefixes -> mlx-lm key prefixes. mlx-vlm conversions (our offline models,
# mlx-community) use the first two; HF transformers >= 4.52 the third; older HF the last two.
_PREFIXES = (
    ("language_model.model.", "model."),
    ("language_model.lm_head.", "lm_head."),
    ("model.language_model.", "model."),
    ("lm_head.", "lm_head."),
    ("model.", "model."),
)


def text_config(config: dict[str, Any]) -> dict[str, Any]:
    """The text tower's settings, read the way mlx-vlm reads each arch (see offline_model's
    shapes): Qwen2/2.5-VL keep them at the top level (which wins over a nested copy),
    Qwen3-VL nests them in `text_config` (which wins)."""
    arch = config.get("model_type")
    nested = dict(config.get("text_config") or {})
    top = {k: v for k, v in config.items() if k not in ("text_config", "vision_config")}
    if arch in _QWEN2_ARCHS:
        merged, model_type = {**nested, **top}, "qwen2"
    elif arch in _QWEN3_ARCHS:
        merged, model_type = {**top, **nested}, "qwen3"
    else:
        raise ValueError(f"no raw baseline for model type {arch!r}")
    params = merged.get("rope_parameters") or {}
    merged.setdefault("rope_theta", params.get("rope_theta", 1_000_000.0))
    # Text positions are equal in all three mRoPE sections: plain rope is the same function.
    merged.update(model_type=model_type, rope_scaling=None, rope_parameters=None)
    merged["tie_word_embeddings"] = bool(merged.get("tie_word_embeddings", False))
    return merged


def text_key(key: str) -> str | None:
    """A checkpoint key's name in mlx-lm's text model, or None for vision-tower weights."""
    if "visual" in key or "vision_tower" in key or "rotary_emb.inv_freq" in key:
        return None
    for prefix, new in _PREFIXES:
        if key.startswith(prefix):
            return new + key[len(prefix) :]
    return None


def language_weights(model_dir: Path) -> dict[str, mx.array]:
    """The language-model tensors of every `*.safetensors` in `model_dir`, renamed for mlx-lm
    (lazily loaded: nothing is read until evaluated)."""
    weights: dict[str, mx.array] = {}
    for name in sorted(glob.glob(str(model_dir / "*.safetensors"))):
        for key, value in mx.load(name).items():
            new = text_key(key)
            if new is not None:
                weights[new] = value
    if not weights:
        raise FileNotFoundError(f"no language-model weights in {model_dir}/*.safetensors")
    return weights


def is_vision_checkpoint(model_dir: str | Path) -> bool:
    """True for a vision-language checkpoint (its config.json has a `vision_config`)."""
    config = json.loads((Path(model_dir) / "config.json").read_text())
    return bool(config.get("vision_config"))


def _mlx_lm_overrides(config: dict[str, Any]) -> dict[str, Any]:
    """What mlx-lm must be told beyond config.json: its gemma3 wrapper takes the vocabulary
    size from the top level (default: the released 262,208), where mlx-vlm conversions of
    smaller vocabularies keep it in `text_config` only."""
    vocab = (config.get("text_config") or {}).get("vocab_size")
    if config.get("model_type") == "gemma3" and "vocab_size" not in config and vocab:
        return {"vocab_size": vocab}
    return {}


def load_text_model(model_dir: str | Path) -> nn.Module:
    """mlx-lm's text model for the checkpoint at `model_dir`, with its weights (quantized
    checkpoints: mlx's affine quantization as described by config.json's `quantization`).

    A text checkpoint (no `vision_config`: what the gateway serves through mlx-lm's own
    model classes), Gemma 3 and Mistral 3 are loaded by mlx-lm's own loader, exactly as
    `mlx_lm.load` does; a Qwen-VL checkpoint's language model goes into mlx-lm's qwen2 /
    qwen3 (see the module doc)."""
    from mlx_lm.models import qwen2, qwen3

    root = Path(model_dir)
    config = json.loads((root / "config.json").read_text())
    if not is_vision_checkpoint(root) or config.get("model_type") in _MLX_LM_VLM_ARCHS:
        from mlx_lm.utils import load_model

        model, _ = load_model(root, model_config=_mlx_lm_overrides(config))
        model.eval()
        return model
    text = text_config(config)
    module = qwen2 if text["model_type"] == "qwen2" else qwen3
    model = module.Model(module.ModelArgs.from_dict(text))
    weights = model.sanitize(language_weights(root))
    quant = config.get("quantization") or text.get("quantization")
    if quant:

        def quantized(path: str, layer: nn.Module) -> bool | dict:
            override = quant.get(f"language_model.{path}")  # per-layer, in mlx-vlm's names
            if isinstance(override, (bool, dict)):
                return override
            return hasattr(layer, "to_quantized") and f"{path}.scales" in weights

        nn.quantize(
            model,
            quant["group_size"],
            quant["bits"],
            mode=quant.get("mode", "affine"),
            class_predicate=quantized,
        )
    model.load_weights(list(weights.items()), strict=True)
    mx.eval(model.parameters())
    model.eval()
    return model


def run(
    model_dir: str | Path, settings: RawSettings | None = None, log: Log = print
) -> dict[str, Any]:
    """Load, measure (see `raw_measure.RawSettings` for what), free. Returns the figures plus
    `load_s`; MLX's memory is released before returning (so a server can follow)."""
    settings = settings or RawSettings()
    started = time.perf_counter()
    model = load_text_model(model_dir)
    load_s = time.perf_counter() - started
    log(f"raw: language model loaded in {load_s:.1f} s")
    try:
        out = measure(model, settings, log)
    finally:
        del model
        gc.collect()
        mx.clear_cache()
    return {"load_s": round(load_s, 2), **out}


def main(argv: list[str] | None = None) -> None:
    """`python -m bench.raw --model DIR ...`: progress on stderr, JSON on stdout."""
    p = argparse.ArgumentParser(prog="python -m bench.raw", description=__doc__)
    p.add_argument("--model", required=True, help="local checkpoint dir")
    p.add_argument("--batch", type=int, nargs="+", default=[1, 16, 32])
    p.add_argument("--decode-tokens", type=int, default=128, help="timed tokens per row")
    p.add_argument("--prompt-tokens", type=int, default=128, help="decode prompt length")
    p.add_argument("--prefix-tokens", type=int, default=1400, help="warm-TTFT prefix (P)")
    p.add_argument("--text-tokens", type=int, default=30, help="text first-token prompt")
    p.add_argument("--reps", type=int, default=5, help="timed repetitions (median)")
    p.add_argument("--decode-reps", type=int, default=3, help="timed decode waves (median)")
    p.add_argument("--decode-only", action="store_true", help="decode figures alone")
    args = p.parse_args(argv)
    if args.decode_reps < 1 or args.reps < 1:
        p.error("--reps and --decode-reps must be >= 1")
    settings = RawSettings(
        batches=tuple(args.batch),
        decode_tokens=args.decode_tokens,
        prompt_tokens=args.prompt_tokens,
        prefix_tokens=args.prefix_tokens,
        text_tokens=args.text_tokens,
        reps=args.reps,
        decode_reps=args.decode_reps,
        decode_only=args.decode_only,
    )

    def log(line: str) -> None:
        print(line, file=sys.stderr, flush=True)

    print(json.dumps(run(args.model, settings, log)), flush=True)


if __name__ == "__main__":
    main()
