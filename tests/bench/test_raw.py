"""The raw ceiling: same weights as the gateway, loaded into mlx-lm's own text model.

Invariant: the raw baseline runs the same weights and computes the same function as the
gateway's TextCore for text (otherwise its speed would be no ceiling for ours).
"""

from __future__ import annotations

import json

import mlx.core as mx
import mlx.nn as nn
import pytest
from mlx.utils import tree_flatten
from mlx_lm.models.cache import make_prompt_cache
from support import tiny_model

from bench.hotpath import image_prompt_tokens
from bench.raw import load_text_model, text_config, text_key
from bench.raw_measure import RawSettings, measure, steady_window, wave_window


def _logits_with_decode(model, cache, prompt: list[int], steps: int) -> list[mx.array]:
    """Prompt logits, then `steps` greedy decode steps' logits (positions past the prompt)."""
    out = [model(mx.array([prompt]), cache=cache)]
    for _ in range(steps):
        token = mx.argmax(out[-1][:, -1, :], axis=-1)
        out.append(model(token[None], cache=cache))
    return out


@pytest.mark.parametrize("arch", ["qwen2_vl", "qwen2_5_vl", "qwen3_vl"])
def test_raw_model_computes_the_gateways_logits(arch: str) -> None:
    """Same greedy tokens, logits within 1e-4, over a prompt and decode steps."""
    from gateway.engine.families.qwen_vl import QwenVL

    root = tiny_model(arch)
    raw = load_text_model(root)
    gateway = QwenVL(str(root))
    prompt = [5, 100, 200, 300, 1500, 7, 8, 9, 10, 11, 12, 1999]
    ours = _logits_with_decode(gateway.text_core, gateway.new_cache(), prompt, 4)
    theirs = _logits_with_decode(raw, make_prompt_cache(raw), prompt, 4)
    for a, b in zip(ours, theirs):
        assert a.shape == b.shape
        assert mx.allclose(a, b, atol=1e-4).item()
        assert (mx.argmax(a, axis=-1) == mx.argmax(b, axis=-1)).all().item()
    # Every language-model tensor of the checkpoint was used (strict load), nothing random.
    loaded = dict(tree_flatten(raw.parameters()))
    assert mx.array_equal(
        loaded["model.embed_tokens.weight"],
        gateway.model.language_model.model.embed_tokens.weight,
    )


def test_quantized_checkpoint_loads(tmp_path) -> None:
    """A checkpoint quantized as mlx does it (`quantization` block, .scales/.biases) loads
    into the same quantized layers and logits."""
    root = tiny_model("qwen2_vl")
    reference = load_text_model(root)
    nn.quantize(reference, group_size=32, bits=8)
    weights = {"language_model." + k: v for k, v in tree_flatten(reference.parameters())}
    mx.save_safetensors(str(tmp_path / "model.safetensors"), weights)
    config = json.loads((root / "config.json").read_text())
    config["quantization"] = {"group_size": 32, "bits": 8}
    (tmp_path / "config.json").write_text(json.dumps(config))
    loaded = load_text_model(tmp_path)
    assert isinstance(loaded.model.layers[0].mlp.up_proj, nn.QuantizedLinear)
    ids = mx.array([[5, 6, 7, 8, 9]])
    assert mx.array_equal(loaded(ids), reference(ids)).item()


def test_checkpoint_key_layouts() -> None:
    assert text_key("language_model.model.layers.0.mlp.up_proj.weight") == (
        "model.layers.0.mlp.up_proj.weight"
    )
    assert text_key("language_model.lm_head.scales") == "lm_head.scales"
    assert text_key("model.language_model.norm.weight") == "model.norm.weight"  # HF >= 4.52
    assert text_key("model.embed_tokens.weight") == "model.embed_tokens.weight"  # older HF
    assert text_key("lm_head.weight") == "lm_head.weight"
    for vision in ("vision_tower.blocks.0.attn.qkv.weight", "visual.merger.mlp.0.weight"):
        assert text_key(vision) is None
    assert text_key("model.visual.patch_embed.proj.weight") is None
    assert text_key("language_model.model.layers.0.self_attn.rotary_emb.inv_freq") is None


def test_text_config_per_arch() -> None:
    flat = {"model_type": "qwen2_vl", "hidden_size": 64, "text_config": {"hidden_size": 8}}
    assert text_config(flat)["hidden_size"] == 64  # Qwen2/2.5-VL: the top level wins
    assert text_config(flat)["model_type"] == "qwen2"
    assert text_config(flat)["tie_word_embeddings"] is False  # HF's default, not mlx-lm's
    nested = {"model_type": "qwen3_vl", "hidden_size": 8, "text_config": {"hidden_size": 64}}
    assert text_config(nested)["hidden_size"] == 64  # Qwen3-VL: text_config wins
    assert text_config(nested)["rope_scaling"] is None  # plain rope at text positions
    with pytest.raises(ValueError):
        text_config({"model_type": "llava"})


def test_steady_window() -> None:
    # Two rows of 5 tokens, one step (10 ms) apart; row b starts a step later.
    a = [0.00, 0.01, 0.02, 0.03, 0.04]
    b = [0.01, 0.02, 0.03, 0.04, 0.05]
    # Opens when both have 2 tokens (0.02), closes when a ends (0.04): 2 steps x 2 rows.
    tokens, seconds = steady_window([a, b], skip=2)
    assert tokens == 4 and seconds == pytest.approx(0.02)
    assert steady_window([a, b[:2]], skip=2) == (0, 0.0)
    assert steady_window([], skip=2) == (0, 0.0)


def test_wave_window_counts_the_ramp() -> None:
    """Invariant: a whole wave runs from the first row's first token to the last row's last
    token and counts every token (what a server's wave aggregate counts)."""
    a = [0.00, 0.01, 0.02]
    b = [0.05, 0.06, 0.07]  # admitted later: its wait is inside the wave
    assert wave_window([a, b]) == (6, pytest.approx(0.07))
    assert wave_window([]) == (0, 0.0) and wave_window([[0.1]]) == (0, 0.0)


def test_image_prompt_tokens(tmp_path) -> None:
    root = tiny_model("qwen2_vl")  # max_pixels 200704: a 1024 image becomes 448 x 448
    assert image_prompt_tokens(root, 1024) == (448 // 28) ** 2 + 24
    config = {"patch_size": 14, "merge_size": 2, "min_pixels": 3136, "max_pixels": 12845056}
    (tmp_path / "preprocessor_config.json").write_text(json.dumps(config))
    assert image_prompt_tokens(tmp_path, 1024) == 37 * 37 + 24  # Qwen2.5-VL-7B's processor


def test_measure_gives_every_figure() -> None:
    settings = RawSettings(
        batches=(1, 2), decode_tokens=4, skip_tokens=2, prompt_tokens=8, prefix_tokens=32,
        suffix_tokens=4, text_tokens=8, reps=1, warmups=1,
    )  # fmt: skip
    lines: list[str] = []
    out = measure(load_text_model(tiny_model("qwen2_vl")), settings, lines.append)
    for key in (
        "text_first_token_ms",
        "warm_ttft_ms",
        "prefill_ms",
        "decode_tok_s_b2",
        "decode_wave_tok_s_b2",
    ):
        assert out[key] > 0, key
    assert out["decode_step_ms_b1"] > 0 and len(lines) == 5
    assert out["settings"]["batches"] == [1, 2]


def test_decode_only_skips_the_latency_figures() -> None:
    """Invariant: `decode_only` (the hotpath's drift re-check) measures decode alone."""
    settings = RawSettings(
        batches=(2,), decode_tokens=4, skip_tokens=2, prompt_tokens=8, reps=1, warmups=1,
        decode_only=True,
    )  # fmt: skip
    lines: list[str] = []
    out = measure(load_text_model(tiny_model("qwen2_vl")), settings, lines.append)
    assert out["decode_tok_s_b2"] > 0 and len(lines) == 1
    assert not {"text_first_token_ms", "warm_ttft_ms", "prefill_ms"} & set(out)


def test_cli_prints_json_on_stdout(capsys) -> None:
    from bench.raw import main

    root = tiny_model("qwen2_vl")
    main(["--model", str(root), "--batch", "1", "--decode-tokens", "4", "--reps", "1"]
         + ["--prefix-tokens", "32", "--prompt-tokens", "8"])  # fmt: skip
    captured = capsys.readouterr()
    data = json.loads(captured.out)
    assert data["decode_tok_s_b1"] > 0 and "raw: decode batch" in captured.err


@pytest.mark.parametrize("arch", ["qwen3", "llama"])
def test_raw_text_model_computes_the_text_familys_logits(arch: str) -> None:
    """A text checkpoint's raw ceiling is mlx-lm's own model class on the same weights, and
    its logits over a prompt and decode steps are the gateway's text family's, bit for bit
    (the text family runs mlx-lm's module itself)."""
    from gateway.engine.families.text import TextModel

    root = tiny_model(arch)
    raw = load_text_model(root)
    gateway = TextModel(str(root))
    assert type(raw) is type(gateway.model)
    assert type(raw).__module__ == f"mlx_lm.models.{arch}"
    prompt = [5, 100, 200, 300, 1500, 7, 8, 9, 10, 11, 12, 1999]
    ours = _logits_with_decode(gateway.text_core, gateway.new_cache(), prompt, 4)
    theirs = _logits_with_decode(raw, make_prompt_cache(raw), prompt, 4)
    for a, b in zip(ours, theirs, strict=True):
        assert mx.array_equal(a, b).item()


@pytest.mark.parametrize("arch", ["gemma3", "mistral3"])
def test_raw_vlm_is_mlx_lms_own_class_with_the_familys_logits(arch: str) -> None:
    """Gemma 3 and Mistral 3 checkpoints load into mlx-lm's own model class (which drops the
    tower), and its logits are the gateway family's text core's: bit for bit over a prompt
    that fills the tiny sliding window (48) and decode steps past it; for a longer prompt
    mlx-lm's windowed prompt mask rounds the last prompt row differently from mlx-vlm's
    (the gateway's reference), within 1e-5, same greedy tokens. The ceiling computes our
    function."""
    from gateway.engine.families.registry import load_model

    root = tiny_model(arch)
    raw = load_text_model(root)
    gateway = load_model(str(root))
    assert type(raw).__module__ == f"mlx_lm.models.{arch}"
    for n, exact in ((48, True), (60, False)):
        prompt = ([5, 100, 200, 300, 1500, 7, 8, 9, 10, 11, 12, 1999] * 5)[:n]
        ours = _logits_with_decode(gateway.text_core, gateway.new_cache(), prompt, 6)
        theirs = _logits_with_decode(raw, make_prompt_cache(raw), prompt, 6)
        for a, b in zip(ours, theirs, strict=True):
            assert mx.array_equal(a, b).item() or not exact
            assert mx.allclose(a, b, atol=1e-5).item()
            assert (mx.argmax(a, axis=-1) == mx.argmax(b, axis=-1)).all().item()
