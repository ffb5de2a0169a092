"""The context a server runs with: prompt + answer tokens, the prompt builder's limit
(gateway.frontend.prompt) and `max_model_len` in /v1/models. Decided once, at start-up.

- Default: the checkpoint's own context, read from its config.json (`text_config` first, the
  language model's, then the top level): `max_position_embeddings`, `max_sequence_length`,
  `seq_length` or `n_positions`, times a YaRN `rope_scaling` factor as vLLM reads it; else
  the tokenizer's `model_max_length`; else 32768. `sliding_window` is no context limit.
- Bounded by memory: one row holding a whole context's KV must fit in the memory left after
  the weights and the two caches' budgets (`--kv-cache-mb`, `--vision-cache-mb`):
  context <= (memory - weights - budgets) / KV bytes per token. Memory is what the engine
  reports of its device (`EngineClient.device_memory`: the GPU's, Metal's recommended working
  set or CUDA's total, else the machine's RAM; asked there, so this process imports no MLX);
  weights are the checkpoint's *.safetensors sizes; KV bytes per token are 2 (K and V) x KV
  heads x head dim x the KV dtype's size, over the layers that keep every token's KV (full
  attention: a sliding window keeps at most its window, a recurrent layer a fixed state, a
  layer that reuses an earlier one's KV nothing of its own). Several long rows at once need a
  row's KV each: `--max-context` (or `--max-batch`) is the operator's lever there.
- `--max-context N` overrides both; above either it is served as asked, with a warning.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gateway.config import EngineConfig
from gateway.processors.checkpoint import read_config
from gateway.processors.processor import PromptSide

log = logging.getLogger(__name__)

FALLBACK_CONTEXT = 32768  # no key in the checkpoint says its context
CONTEXT_KEYS = ("max_position_embeddings", "max_sequence_length", "seq_length", "n_positions")
# Layer kinds whose KV does not grow with the context (layer_types' names; LFM2's "conv":
# a short convolution's fixed-size state).
BOUNDED_LAYERS = frozenset({"sliding_attention", "linear_attention", "chunked_attention", "conv"})
MIN_CONTEXT = 16  # what --max-context accepts at least


@dataclass(frozen=True)
class ContextWindow:
    """The context served (`tokens`) and what chose it (`chosen_by`: "--max-context",
    "checkpoint", "memory" or "default"); the checkpoint's own context and the key it came
    from (None, "": none found); the memory bound (None: not known, see `_explain`)."""

    tokens: int
    chosen_by: str
    checkpoint: int | None
    key: str
    memory_bound: int | None


def checkpoint_context(config: dict[str, Any], tokenizer_max: Any = None) -> tuple[int, str] | None:
    """The checkpoint's own context and the key it was read from, else None."""
    text = config.get("text_config")
    scopes = [("text_config.", text)] if isinstance(text, dict) else []
    for prefix, scope in [*scopes, ("", config)]:
        for key in CONTEXT_KEYS:
            value = scope.get(key)
            if _count(value):
                return _yarn(value, scope, f"{prefix}{key}")
    if _count(tokenizer_max) and tokenizer_max < 10**8:  # transformers' "unset" is ~1e30
        return tokenizer_max, "tokenizer_config.json model_max_length"
    return None


def _count(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value > 0


def _yarn(value: int, scope: dict[str, Any], source: str) -> tuple[int, str]:
    """A YaRN-scaled checkpoint serves factor x its original context (vLLM's reading); other
    scalings (llama3, linear) are already in `max_position_embeddings`."""
    scaling = scope.get("rope_scaling") or {}
    if not isinstance(scaling, dict) or (scaling.get("rope_type") or scaling.get("type")) != "yarn":
        return value, source
    factor = scaling.get("factor")
    if not isinstance(factor, (int, float)) or factor <= 1:
        return value, source
    original = scaling.get("original_max_position_embeddings")
    scaled = int(factor * (original if _count(original) else value))
    return (scaled, f"{source} with YaRN x{factor:g}") if scaled > value else (value, source)


def kv_bytes_per_token(config: dict[str, Any], dtype_bytes: int) -> int | None:
    """KV bytes one token adds to one row (see the module doc), None when the config does not
    say (no layer or head counts), 0 when no layer keeps every token's KV."""
    text = config.get("text_config") if isinstance(config.get("text_config"), dict) else config
    layers, heads = text.get("num_hidden_layers"), text.get("num_attention_heads")
    if not (_count(layers) and _count(heads)):
        return None
    kv = text.get("num_key_value_heads") or heads
    head_dim = text.get("head_dim") or (text.get("hidden_size") or 0) // heads
    # Full-attention layers of Gemma 4 have their own head size and KV heads.
    head_dim = text.get("global_head_dim") or head_dim
    kv = text.get("num_global_key_value_heads") or kv
    if not (_count(kv) and _count(head_dim)):
        return None
    return _full_layers(text, layers) * 2 * kv * head_dim * dtype_bytes


def _full_layers(text: dict[str, Any], layers: int) -> int:
    """The layers that keep every token's KV (unknown layer kinds count as full)."""
    shared = text.get("num_kv_shared_layers") or 0  # the last ones reuse earlier layers' KV
    own = max(0, layers - shared) if isinstance(shared, int) else layers
    types = text.get("layer_types")
    if isinstance(types, list) and len(types) >= own:
        return sum(1 for kind in types[:own] if kind not in BOUNDED_LAYERS)
    for key in ("full_attention_interval", "sliding_window_pattern"):  # every n-th is full
        every = text.get(key)
        if _count(every):
            return own // every
    return own


def memory_bound(
    per_token: int | None, memory: int | None, weights: int, reserved: int
) -> int | None:
    """The longest context whose KV fits one row in the memory left after the weights and
    the caches' budgets; None when it cannot be told or nothing is left (said by the
    caller's log line)."""
    if not per_token or not memory:
        return None
    left = memory - weights - reserved
    return left // per_token if left > 0 else None


def choose(
    requested: int, own: tuple[int, str] | None, bound: int | None
) -> tuple[ContextWindow, list[str]]:
    """The context from `--max-context` (0: not given), the checkpoint's own and the memory
    bound, with the warnings to log."""
    checkpoint, key = own if own is not None else (None, "")
    warnings = []
    if requested:
        if checkpoint is not None and requested > checkpoint:
            warnings.append(
                f"--max-context {requested} is above the checkpoint's own context ({checkpoint}, "
                f"{key}): answers past it may lose coherence"
            )
        if bound is not None and requested > bound:
            warnings.append(
                f"--max-context {requested} is above what memory holds for one row's KV "
                f"({bound} tokens): a long prompt may run out of memory"
            )
        return ContextWindow(requested, "--max-context", checkpoint, key, bound), warnings
    if checkpoint is None:
        warnings.append(
            f"the checkpoint's config names no context length ({', '.join(CONTEXT_KEYS)}, nor "
            f"the tokenizer's model_max_length): serving {FALLBACK_CONTEXT} tokens; set "
            "--max-context to choose"
        )
    tokens, chosen_by = (checkpoint, "checkpoint") if checkpoint else (FALLBACK_CONTEXT, "default")
    if bound is not None and bound < tokens:
        tokens, chosen_by = max(bound, MIN_CONTEXT), "memory"
    return ContextWindow(tokens, chosen_by, checkpoint, key, bound), warnings


def context_window(model: PromptSide, config: EngineConfig, memory: int | None) -> ContextWindow:
    """The context to serve `model` with under `config` on a device of `memory` bytes (the
    engine's `device_memory`; None: not reported, so no memory bound), as the module doc
    says, logged in one line (and a warning for an override above a bound or a missing
    key)."""
    raw = _read_config(model)
    own = checkpoint_context(raw, getattr(model.tokenizer, "model_max_length", None))
    per_token = kv_bytes_per_token(raw, model.embed_bytes) if raw else None
    weights = weights_bytes(model.path)
    reserved = config.cache.kv_capacity_bytes + config.cache.vision_capacity_bytes
    bound = memory_bound(per_token, memory, weights, reserved)
    window, warnings = choose(config.max_context_tokens, own, bound)
    for warning in warnings:
        log.warning("%s", warning)
    log.info("context: %d tokens (%s)", window.tokens, _explain(window, per_token, memory))
    return window


def _explain(window: ContextWindow, per_token: int | None, memory: int | None) -> str:
    """What chose the context and the two limits, for the start-up line."""
    chosen = {
        "--max-context": "--max-context",
        "checkpoint": "the checkpoint's own",
        "memory": "bounded by memory",
        "default": "the default",
    }[window.chosen_by]
    own = window.checkpoint
    checkpoint = f"checkpoint: {own} ({window.key})" if own else "checkpoint: no context key"
    if window.memory_bound is not None:
        fits = f"memory: {window.memory_bound} tokens of KV fit one row ({per_token} B/token)"
    elif not memory:
        fits = "memory: no bound, the device reports no memory size"
    elif not per_token:
        fits = "memory: no bound, the KV per token is unknown or does not grow"
    else:
        fits = "memory: no bound, the weights and cache budgets fill it"
    return f"{chosen}; {checkpoint}; {fits}"


def _read_config(model: PromptSide) -> dict[str, Any]:
    """The checkpoint's config.json ({} if it cannot be read: the fallbacks apply)."""
    try:
        config = read_config(model.path)
    except Exception as exc:  # noqa: BLE001 - the model loaded; only the context falls back
        log.warning("could not read %s/config.json for its context: %s", model.path, exc)
        return {}
    return config if isinstance(config, dict) else {}


def weights_bytes(path: str) -> int:
    """The sizes of the checkpoint's *.safetensors files (a hub id: in the local cache; 0
    when they cannot be found)."""
    folder = Path(path).expanduser()
    if not folder.is_dir():
        from huggingface_hub import try_to_load_from_cache

        cached = try_to_load_from_cache(path, "config.json")
        if not isinstance(cached, str):
            return 0
        folder = Path(cached).parent
    return sum(f.stat().st_size for f in folder.glob("*.safetensors"))
