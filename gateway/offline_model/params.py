"""What mlx-vlm makes of a config: validation, parameter names, shapes and initialisation.

The checkpoint's tensor names and shapes are never written down by hand: they are read off
the mlx-vlm `Model` built from the config, exactly as `mlx_vlm.load` builds it. MLX
initialises module parameters lazily, so building even the 7b model allocates nothing.
"""

from __future__ import annotations

import copy
import math
from dataclasses import dataclass
from typing import Any


def instantiate(config: dict[str, Any]) -> Any:
    """Build the (lazily initialised) mlx-vlm Model for a config, the way `load_model` does.

    Nothing is evaluated, so even 7b shapes cost no memory: use it for parameter names and
    shapes. Raises whatever mlx-vlm raises for a config it does not accept.
    """
    from mlx_vlm.utils import get_model_and_args, update_module_configs

    cfg = copy.deepcopy(config)
    module, _ = get_model_and_args(cfg)
    cfg.setdefault("text_config", {})
    cfg.setdefault("vision_config", {})
    model_cfg = module.ModelConfig.from_dict(cfg)
    model_cfg = update_module_configs(model_cfg, module, cfg, ["text", "vision"])
    return module.Model(model_cfg)


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
    init: str  # "normal" (random, std 0.02), "ones" (norm scales) or "zeros" (norm shifts)

    @property
    def numel(self) -> int:
        return math.prod(self.shape)


def validate_config(config: dict[str, Any]) -> dict[str, ParamSpec]:
    """Check mlx-vlm accepts `config`; return {parameter name: spec}, sorted by name.

    The names are mlx-vlm's post-`sanitize` names, which every Qwen-VL `sanitize` maps to
    themselves, so a checkpoint written under them loads unchanged. Norm layers (found by
    module type, not by name) get ones/zeros so activations keep a sane scale.
    """
    import mlx.nn as nn
    from mlx.utils import tree_flatten

    model = instantiate(config)
    cfg = model.config
    text = cfg.text_config
    head_dim = getattr(text, "head_dim", None) or text.hidden_size // text.num_attention_heads
    if 2 * sum(text.rope_scaling["mrope_section"]) != head_dim:
        raise ValueError(
            f"mrope_section {text.rope_scaling['mrope_section']} does not cover head_dim {head_dim}"
        )
    for key in ("image_token_id", "video_token_id", "vision_start_token_id"):
        if not 0 <= getattr(cfg, key) < text.vocab_size:
            raise ValueError(f"{key} {getattr(cfg, key)} outside the vocabulary")
    _validate_with_transformers(config)
    norm_types = (nn.RMSNorm, nn.LayerNorm)
    norms = {name for name, m in model.named_modules() if isinstance(m, norm_types)}
    specs = {}
    for name, value in tree_flatten(model.parameters()):
        owner, _, leaf = name.rpartition(".")
        init = ("ones" if leaf == "weight" else "zeros") if owner in norms else "normal"
        specs[name] = ParamSpec(tuple(value.shape), init)
    return dict(sorted(specs.items()))


def param_count(config: dict[str, Any]) -> int:
    """Number of parameters of the model `config` describes, without allocating any."""
    return sum(spec.numel for spec in validate_config(config).values())
