"""The offline Qwen-VL checkpoint builder: loadable, processable, runnable, reproducible."""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

import mlx.core as mx  # noqa: E402
import mlx_vlm  # noqa: E402
import numpy as np  # noqa: E402
import pytest  # noqa: E402
from PIL import Image  # noqa: E402

from gateway import offline_model as om  # noqa: E402
from gateway.offline_model import checkpoint, params, shapes, tokenizer  # noqa: E402

SPECIALS = (
    "<|endoftext|>",
    "<|im_start|>",
    "<|im_end|>",
    "<|vision_start|>",
    "<|vision_end|>",
    "<|vision_pad|>",
    "<|image_pad|>",
    "<|video_pad|>",
)


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("models")
    return {arch: om.build_model(root / arch, arch, "tiny", seed=0) for arch in shapes.ARCHS}


def _hashes(path: Path) -> dict[str, str]:
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(path.iterdir())}


def _image(width: int, height: int) -> Image.Image:
    rng = np.random.default_rng(width * 1000 + height)
    return Image.fromarray(rng.integers(0, 256, (height, width, 3), dtype=np.uint8))


@pytest.mark.parametrize("arch", shapes.ARCHS)
@pytest.mark.parametrize("size", [(56, 56), (84, 28)])
def test_load_process_and_run(built: dict[str, Path], arch: str, size: tuple[int, int]) -> None:
    model, processor = mlx_vlm.load(str(built[arch]))
    cfg = model.config
    tok = processor.tokenizer
    assert type(processor).__module__.startswith("mlx_vlm.models.")  # not the HF fallback
    assert cfg.image_token_id == tok.convert_tokens_to_ids("<|image_pad|>")
    assert cfg.video_token_id == tok.convert_tokens_to_ids("<|video_pad|>")
    assert cfg.vision_start_token_id == tok.convert_tokens_to_ids("<|vision_start|>")
    assert tok.eos_token == "<|im_end|>" and tok.pad_token == "<|endoftext|>"

    messages = [
        {
            "role": "user",
            "content": [{"type": "image"}, {"type": "text", "text": "What is in this picture?"}],
        }
    ]
    prompt = processor.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    assert prompt == (
        "<|im_start|>user\n<|vision_start|><|image_pad|><|vision_end|>"
        "What is in this picture?<|im_end|>\n<|im_start|>assistant\n"
    )

    inputs = processor(text=[prompt], images=[_image(*size)], return_tensors="mlx")
    ids, grid = inputs["input_ids"], inputs["image_grid_thw"]
    n_image = int((ids == cfg.image_token_id).sum().item())
    patch = 16 if arch == "qwen3_vl" else 14
    # 56x56 and 84x28 are below min_pixels (56*56): upscaled to the next merge-unit multiple.
    expected = {(56, 56): 4, (84, 28): 8}[size]
    assert n_image == expected == int(np.prod(np.array(grid))) // 4
    assert n_image == processor.image_processor.num_image_tokens(size[1], size[0])
    assert inputs["pixel_values"].shape == (4 * n_image, 3 * 2 * patch * patch)
    # The placeholder run sits between vision_start and vision_end, where the template put it.
    row = ids[0].tolist()
    start = row.index(cfg.vision_start_token_id)
    assert row[start + 1 : start + 1 + n_image] == [cfg.image_token_id] * n_image
    assert row[start + 1 + n_image] == tok.convert_tokens_to_ids("<|vision_end|>")

    feats = model.get_input_embeddings(ids, inputs["pixel_values"], image_grid_thw=grid)
    extra = {}
    if arch == "qwen3_vl":
        deep = feats.deepstack_visual_embeds
        assert deep is not None and len(deep) == 2  # one per deepstack_visual_indexes entry
        assert all(d.shape == (n_image, cfg.text_config.hidden_size) for d in deep)
        extra = {"visual_pos_masks": feats.visual_pos_masks, "deepstack_visual_embeds": deep}
    out = model.language_model(
        ids, inputs_embeds=feats.inputs_embeds, position_ids=feats.position_ids, **extra
    )
    assert out.logits.shape == (1, ids.shape[1], cfg.text_config.vocab_size)
    assert bool(mx.isfinite(out.logits).all().item())
    if arch == "qwen3_vl":  # the deepstack features reach the logits
        plain = model.language_model(
            ids, inputs_embeds=feats.inputs_embeds, position_ids=feats.position_ids
        )
        assert not bool(mx.allclose(plain.logits, out.logits).item())


def test_tokenizer_specials_and_determinism(built: dict[str, Path]) -> None:
    _, processor = mlx_vlm.load(str(built["qwen2_vl"]))
    tok = processor.tokenizer
    for special in SPECIALS:
        assert len(tok.encode(special, add_special_tokens=False)) == 1, special
    text = "A red cat sits on the table.\n<|vision_start|><|image_pad|><|vision_end|> Hi!"
    ids = tok.encode(text, add_special_tokens=False)
    assert ids == tok.encode(text, add_special_tokens=False)
    assert tok.decode(ids) == text
    # Retraining gives the same tokenizer.json, byte for byte.
    assert tokenizer.train_tokenizer().to_str() == tokenizer.train_tokenizer().to_str()
    assert len(tok) == tokenizer.VOCAB_SIZE


def test_string_content_and_no_default_system(built: dict[str, Path]) -> None:
    _, processor = mlx_vlm.load(str(built["qwen2_vl"]))
    messages = [
        {"role": "user", "content": "hi"},
        {"role": "assistant", "content": "hello"},
        {
            "role": "user",
            "content": [
                {"type": "text", "text": "a"},
                {"type": "image"},
                {"type": "text", "text": "b"},
                {"type": "image"},
            ],
        },
    ]
    prompt = processor.apply_chat_template(messages, tokenize=False)
    assert prompt == (
        "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\nhello<|im_end|>\n"
        "<|im_start|>user\na<|vision_start|><|image_pad|><|vision_end|>b"
        "<|vision_start|><|image_pad|><|vision_end|><|im_end|>\n"
    )


def test_same_seed_same_bytes_other_seed_other_weights(
    built: dict[str, Path], tmp_path: Path
) -> None:
    again = om.build_model(tmp_path / "again", "qwen2_vl", "tiny", seed=0)
    assert _hashes(again) == _hashes(built["qwen2_vl"])
    other = om.build_model(tmp_path / "other", "qwen2_vl", "tiny", seed=1)
    a, b = _hashes(again), _hashes(other)
    assert a["model.safetensors"] != b["model.safetensors"]
    assert {k: v for k, v in a.items() if k not in ("model.safetensors", om.MARKER)} == {
        k: v for k, v in b.items() if k not in ("model.safetensors", om.MARKER)
    }
    # Rebuilding over an existing dir replaces it, leaving no temp dirs behind.
    om.build_model(tmp_path / "other", "qwen2_vl", "tiny", seed=0)
    assert _hashes(tmp_path / "other") == a
    assert sorted(p.name for p in tmp_path.iterdir()) == ["again", "other"]


def test_sharded_bfloat16_weights_load_and_match(built: dict[str, Path], tmp_path: Path) -> None:
    src = built["qwen2_vl"]
    dst = tmp_path / "sharded"
    dst.mkdir()
    for p in src.iterdir():
        if p.suffix != ".safetensors":
            (dst / p.name).write_bytes(p.read_bytes())
    specs = params.validate_config(json.loads((src / "config.json").read_text()))
    files = checkpoint.write_weights(
        dst, specs, seed=0, dtype="bfloat16", shard_bytes=200_000, workers=3
    )
    assert len(files) > 2 and (dst / "model.safetensors.index.json").exists()
    model, _ = mlx_vlm.load(str(dst))
    ref = mx.load(str(src / "model.safetensors"))
    got = dict(model.parameters()["language_model"]["model"]["embed_tokens"])
    assert got["weight"].dtype == mx.bfloat16
    assert mx.array_equal(
        got["weight"], ref["language_model.model.embed_tokens.weight"].astype(mx.bfloat16)
    ).item()


def test_ensure_model_builds_once(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("VISION_GATEWAY_CACHE", str(tmp_path / "cache"))
    messages: list[str] = []
    path = om.ensure_model("qwen2_vl", "tiny", 0, progress=messages.append)
    assert path == om.default_model_dir("qwen2_vl", "tiny", 0)
    assert path.is_relative_to(tmp_path / "cache")
    assert om.BUILDER_VERSION in path.name and "qwen2_vl" in path.name and "seed0" in path.name
    assert "training tokenizer" in messages
    stamp = (path / "model.safetensors").stat().st_mtime_ns
    messages.clear()
    assert om.ensure_model("qwen2_vl", "tiny", 0, progress=messages.append) == path
    assert messages == [] and (path / "model.safetensors").stat().st_mtime_ns == stamp
    # A damaged dir is rebuilt.
    (path / "model.safetensors").write_bytes(b"broken")
    assert om.ensure_model("qwen2_vl", "tiny", 0, progress=messages.append) == path
    assert "training tokenizer" in messages
    assert _hashes(path)["model.safetensors"] != hashlib.sha256(b"broken").hexdigest()
    assert [p.name for p in path.parent.iterdir()] == [path.name]  # no temp dirs left


def test_unknown_names_raise(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="arch"):
        om.build_model(tmp_path / "x", "llava", "tiny")
    with pytest.raises(ValueError, match="size"):
        om.build_model(tmp_path / "x", "qwen2_vl", "70b")
    with pytest.raises(ValueError, match="seed"):
        om.default_model_dir("qwen2_vl", "tiny", -1)
    assert not (tmp_path / "x").exists()


@pytest.mark.parametrize("arch", shapes.ARCHS)
def test_7b_config_is_accepted_and_about_8b(arch: str) -> None:
    # The tokenizer padded to the 7b embedding, as the builder makes it (model_config
    # refuses a tokenizer whose size differs from the embedding's).
    ids = tokenizer.token_ids(tokenizer.train_tokenizer(shapes.text_vocab_size(arch, "7b")))
    config = shapes.model_config(arch, "7b", ids)
    assert config["torch_dtype"] == "bfloat16"
    n = params.param_count(config)  # instantiates lazily: nothing is allocated
    assert 8.0e9 < n < 9.0e9, n
    shards = checkpoint.plan_shards(params.validate_config(config), "bfloat16")
    assert 3 <= len(shards) <= 6


@pytest.mark.parametrize("bits", [4, 8])
def test_make_model_quantize_uses_mlx_vlm_quantization(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], bits: int
) -> None:
    """`make-model --quantize N` gives a checkpoint mlx_vlm.load reads as N-bit quantized
    language-model layers (mlx-vlm's converter) with a float vision tower, and a build marker
    that records the quantization."""
    import mlx.nn as nn

    from gateway.cli import main

    out = tmp_path / f"q{bits}"
    main(["make-model", str(out), "--quantize", str(bits), "--q-group-size", "32"])
    assert "wrote" in capsys.readouterr().out
    info = json.loads((out / om.MARKER).read_text())
    assert info["quantization"] == {"bits": bits, "group_size": 32}
    assert json.loads((out / "config.json").read_text())["quantization"]["bits"] == bits
    model, _ = mlx_vlm.load(str(out))
    layer = model.language_model.model.layers[0].self_attn.q_proj
    assert isinstance(layer, nn.QuantizedLinear) and layer.bits == bits
    assert model.vision_tower.patch_embed.proj.weight.dtype == mx.float32
    with pytest.raises(ValueError, match="bits"):
        om.build_model(tmp_path / "bad", quantize=3)
