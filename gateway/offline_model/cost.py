"""How much work one image costs a checkpoint: vision tower vs language-model prefill, in MACs.

    image_cost(config, tiles, prompt_tokens) -> ImageCost(tower_macs, lm_macs)

A size preset for benchmarks is only meaningful if the tower/LM cost ratio resembles the real
model's: a cold image request pays the tower and the prefill of the image tokens, a warm one
(the prefix cache holding the image) pays neither, so `cold / warm` follows that split. This
module counts the multiply-accumulates (MACs) of both sides from a config.json dict, so a
preset's ratio can be compared with the upstream model's (tests pin it for each `small`).

What is counted (approximate by design, the same way on both sides of a comparison):
- tower, per layer and per patch: the q/k/v/o projections and the MLP (two matrices, three
  when gated: Pixtral, Gemma 4), plus full (non-causal) attention within each tile, 2 x n^2 x
  heads x head_dim for a tile of n patches; the patch embedding once;
- language model, per layer and per token: q/k/v/o projections (grouped KV heads), a gated
  MLP, causal attention n^2 x heads x head_dim over the prompt; the lm_head for one token.
Norms, activations, pooling, pixel shuffle and the projector are left out (each well under
a few percent at these shapes).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

_GATED_TOWERS = ("pixtral", "gemma4_vision")


@dataclass(frozen=True)
class ImageCost:
    """MACs of one image request: `tower_macs` (every tile through the vision tower) and
    `lm_macs` (the prompt's prefill through the language model)."""

    tower_macs: int
    lm_macs: int

    @property
    def ratio(self) -> float:
        """tower / language model: > 1 when the tower dominates a cold request."""
        return self.tower_macs / self.lm_macs


def _head_dim(cfg: Mapping[str, Any]) -> int:
    return int(cfg.get("head_dim") or cfg["hidden_size"] // cfg["num_attention_heads"])


def tower_macs(vision: Mapping[str, Any], tiles: Sequence[int]) -> int:
    """MACs of the tower over `tiles` sequences of patches (one entry per tile or image,
    the number of patches it holds)."""
    w, mlp = int(vision["hidden_size"]), int(vision["intermediate_size"])
    heads, hd = int(vision["num_attention_heads"]), _head_dim(vision)
    layers = int(vision["num_hidden_layers"])
    patch = int(vision.get("patch_size", 14))
    mats = 3 if vision.get("model_type") in _GATED_TOWERS else 2
    per_patch = 4 * w * heads * hd + mats * w * mlp
    total = 0
    for n in tiles:
        total += n * 3 * patch * patch * w  # patch embedding
        total += layers * (n * per_patch + 2 * n * n * heads * hd)
    return total


def lm_macs(text: Mapping[str, Any], tokens: int) -> int:
    """MACs of prefilling `tokens` prompt tokens (and one lm_head row)."""
    w, mlp = int(text["hidden_size"]), int(text["intermediate_size"])
    heads, hd = int(text["num_attention_heads"]), _head_dim(text)
    kv = int(text.get("num_key_value_heads") or heads)
    layers = int(text["num_hidden_layers"])
    per_token = w * hd * (2 * heads + 2 * kv) + 3 * w * mlp
    attention = tokens * tokens * heads * hd
    return layers * (tokens * per_token + attention) + w * int(text["vocab_size"])


def text_part(config: Mapping[str, Any]) -> Mapping[str, Any]:
    """The language model's settings: `text_config`, completed by the top level where the
    nested one leaves a field out (mlx-vlm's ModelConfig reads both)."""
    return {**config, **(config.get("text_config") or {})}


def image_cost(config: Mapping[str, Any], tiles: Sequence[int], prompt_tokens: int) -> ImageCost:
    """The cost of a prompt of `prompt_tokens` tokens holding one image cut into `tiles`
    (patches per tile), for the checkpoint whose config.json is `config`."""
    return ImageCost(
        tower_macs(config["vision_config"], tiles), lm_macs(text_part(config), prompt_tokens)
    )
