"""What mlx-vlm (or mlx-lm) makes of a config: validation, parameter names, shapes, init.

The checkpoint's tensor names and shapes are never written down by hand: they are read off
the `Model` that the family's runtime (mlx-vlm for vision-language families, mlx-lm for text
models) builds from the config, exactly as its `load` builds it. MLX initialises module
parameters lazily, so building even the 7b model allocates nothing.
"""

from __future__ import annotations

import copy
import math
from dataclasses import dataclass
from typing import Any

RUNTIMES: tuple[str, ...] = ("mlx-vlm", "mlx-lm")


def instantiate(config: dict[str, Any], runtime: str = "mlx-vlm") -> Any:
    """Build the (lazily initialised) Model for a config, the way `runtime`'s load does.

    Nothing is evaluated, so even 7b shapes cost no memory: use it for parameter names and
    shapes. Raises whatever mlx-vlm / mlx-lm raises for a config it does not accept.
    """
    return _instantiate(config, runtime)[0]


def _instantiate(config: dict[str, Any], runtime: str) -> tuple[Any, Any]:
    """(model, its mlx-vlm model module, or None for mlx-lm)."""
    if runtime == "mlx-lm":
        from mlx_lm.utils import _get_classes  # what mlx_lm.load_model uses (pinned version)

        model_class, args_class = _get_classes(copy.deepcopy(config))
        return model_class(args_class.from_dict(copy.deepcopy(config))), None
    if runtime != "mlx-vlm":
        raise ValueError(f"unknown runtime {runtime!r}; expected one of {RUNTIMES}")
    from mlx_vlm.utils import get_model_and_args, update_module_configs

    # As mlx_vlm.utils.load_model prepares the config.
    cfg = copy.deepcopy(config)
    module, _ = get_model_and_args(cfg)
    cfg.setdefault("text_config", cfg.pop("llm_config", {}))
    cfg.setdefault("vision_config", {})
    cfg.setdefault("audio_config", {})
    model_cfg = module.ModelConfig.from_dict(cfg)
    modules = ["text", "vision", "perceiver", "projector", "audio"]
    model_cfg = update_module_configs(model_cfg, module, cfg, modules)
    return module.Model(model_cfg), module


def _sanitized(model: Any, module: Any, weights: dict[str, Any]) -> dict[str, Any]:
    """`weights` after the sanitize steps the model's runtime applies while loading
    (`module`: the mlx-vlm model module, None for mlx-lm)."""
    if module is None:  # mlx-lm: the model's own sanitize
        return model.sanitize(dict(weights)) if hasattr(model, "sanitize") else dict(weights)
    from mlx_vlm.utils import sanitize_weights

    out = sanitize_weights(model, dict(weights))
    for part, key in (
        ("VisionModel", "vision"),
        ("LanguageModel", "text"),
        ("AudioModel", "audio"),
    ):
        config = getattr(model.config, f"{key}_config", None)
        if hasattr(module, part) and config is not None:
            out = sanitize_weights(getattr(module, part), out, config)
    return out


def _written(model: Any, module: Any, specs: dict[str, ParamSpec]) -> dict[str, ParamSpec]:
    """The specs a checkpoint must hold: those the load keeps as written.

    A parameter the load derives from another one (mlx-vlm's gemma3 always copies the
    embedding into lm_head) is left out, as upstream checkpoints leave it out. A parameter the
    load would transform (transpose, rename) is an error: the builder writes final names and
    layouts only. Runs the sanitize chain on lazy zeros, so it allocates nothing.
    """
    import mlx.core as mx

    zeros = {name: mx.zeros(spec.shape, dtype=mx.float32) for name, spec in specs.items()}
    out = _sanitized(model, module, zeros)
    by_id = {id(v): k for k, v in zeros.items()}
    keep = {}
    for name, spec in specs.items():
        got = out.get(name)
        if got is zeros[name]:
            keep[name] = spec
        elif got is None or id(got) not in by_id:
            raise ValueError(f"the runtime's sanitize drops or transforms {name}")
        # else: derived from another parameter at load time; not written
    return keep


def _validate_with_transformers(config: dict[str, Any]) -> None:
    """transformers must accept config.json too, not only mlx-vlm.

    mlx-vlm's processor loading calls AutoTokenizer, which parses config.json with
    transformers' strict config classes (e.g. Qwen2-VL's vision `mlp_ratio` must be an int).
    If that fails, mlx-vlm's patched AutoProcessor swallows the error and falls back to the
    stock transformers loader, which fails later with a misleading message or needs torch.
    """
    from transformers import AutoConfig

    AutoConfig.for_model(**copy.deepcopy(config))


@dataclass(frozen=True)
class ParamSpec:
    """One tensor of the checkpoint: its shape and how the builder initialises it."""

    shape: tuple[int, ...]
    # "normal" (random, std 0.02), "ones" (norm scales), "zeros" (norm shifts), or "-inf" /
    # "inf" (the clip bounds of a clippable linear: no clipping, the runtime's own default)
    init: str

    @property
    def numel(self) -> int:
        return math.prod(self.shape)


def _vocab_size(config: dict[str, Any]) -> int:
    text = config.get("text_config") or {}
    return int(text.get("vocab_size") or config["vocab_size"])


def _check_token_ids(config: dict[str, Any]) -> None:
    """Every token id config.json names (image, boi/eoi, bos/eos/pad, ...) is a row of the
    embedding: an id outside it would index past the table at run time."""
    vocab = _vocab_size(config)
    for scope in (config, config.get("text_config") or {}):
        for key, value in scope.items():
            if not key.endswith(("_token_id", "_token_index")) or value is None:
                continue
            for v in value if isinstance(value, list) else [value]:
                if not 0 <= int(v) < vocab:
                    raise ValueError(f"{key} {v} outside the vocabulary of {vocab}")


def _norm_init(module: Any) -> str:
    """The init of a norm weight: "ones" if the norm multiplies by its weight, "zeros" if by
    1 + weight (Gemma's); either way the initial scale is 1. Found by running the module
    with a zero weight."""
    import mlx.core as mx

    weight = module.weight
    module.weight = mx.zeros(weight.shape, dtype=mx.float32)
    try:
        out = module(mx.ones((1, weight.shape[-1]), dtype=mx.float32))
        return "ones" if not bool(mx.any(out != 0).item()) else "zeros"
    except Exception:  # noqa: BLE001 - a norm that wants another input shape: plain scale
        return "ones"
    finally:
        module.weight = weight


# Gemma 4's `ClippableLinear` bounds (scalars): random values would clip every activation
# into a sliver around zero, so they are written as the unbounded defaults.
_CLIP_BOUNDS = {"input_min": "-inf", "output_min": "-inf", "input_max": "inf", "output_max": "inf"}


def param_specs(model: Any) -> dict[str, ParamSpec]:
    """{parameter name: spec} of an instantiated model, sorted by name. Norm layers (found by
    module type: a class whose name contains "Norm") get a unit scale and zero shift so
    activations keep a sane scale; everything else is random."""
    from mlx.utils import tree_flatten

    norms = {
        name: _norm_init(m)
        for name, m in model.named_modules()
        if "norm" in type(m).__name__.lower() and "weight" in m
    }
    specs = {}
    for name, value in tree_flatten(model.parameters()):
        owner, _, leaf = name.rpartition(".")
        init = "normal"
        if owner in norms:
            init = norms[owner] if leaf == "weight" else "zeros"
        elif leaf in _CLIP_BOUNDS:
            init = _CLIP_BOUNDS[leaf]
        specs[name] = ParamSpec(tuple(value.shape), init)
    return dict(sorted(specs.items()))


def validate_config(config: dict[str, Any], runtime: str = "mlx-vlm") -> dict[str, ParamSpec]:
    """Check `runtime` (mlx-vlm or mlx-lm) and transformers accept `config`; return
    {parameter name: spec}, sorted by name.

    The names are the runtime's post-`sanitize` names; a checkpoint written under them must
    load unchanged (each family's tests check that every tensor loads as written).
    """
    model, module = _instantiate(config, runtime)
    _check_token_ids(config)
    _validate_with_transformers(config)
    return _written(model, module, param_specs(model))


def param_count(config: dict[str, Any], runtime: str = "mlx-vlm") -> int:
    """Number of parameters of the model `config` describes, without allocating any."""
    return sum(spec.numel for spec in validate_config(config, runtime).values())
