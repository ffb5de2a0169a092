"""The benchmark sizes of the non-Qwen families: `small` (CPU, real image path) and gemma3's
`4b` (real shapes, GPU).

Invariants: a `small` checkpoint builds byte-for-byte deterministically, loads with the
reference implementation and answers about an image; its tower sees the image at the real
model's resolution and the prompt holds the real model's image tokens (gemma3: 896 px, 256
soft tokens; smolvlm: 512 px tiles of 16 px patches, 64 tokens per tile), so a cold/warm
ratio measured on it reflects that work. The `4b` config is gemma-3-4b-it's, accepted by
mlx-vlm's and transformers' config classes (it is never built here: 8 GB).
"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

import pytest  # noqa: E402
from reference import reference_generate  # noqa: E402
from tokenizers import Tokenizer  # noqa: E402

from gateway import offline_model as om  # noqa: E402
from gateway.offline_model import checkpoint, gemma3, params  # noqa: E402

FIXTURES = Path(__file__).resolve().parents[3] / "fixtures"
IMAGE_448 = FIXTURES / "shapes.png"  # 448 x 448
QUESTION = [
    {
        "role": "user",
        "content": [{"type": "image"}, {"type": "text", "text": "What is in this picture?"}],
    }
]
SMALL = ("gemma3", "smolvlm")


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("small")
    return {arch: om.build_model(root / arch, arch, "small", seed=0) for arch in SMALL}


def _hashes(path: Path) -> dict[str, str]:
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(path.iterdir())}


@pytest.mark.parametrize("arch", SMALL)
def test_small_builds_the_same_bytes_again(
    built: dict[str, Path], tmp_path: Path, arch: str
) -> None:
    again = _hashes(om.build_model(tmp_path / "again", arch, "small", seed=0))
    assert again == _hashes(built[arch])
    info = (built[arch] / om.MARKER).read_text()
    assert '"size": "small"' in info and '"dtype": "float32"' in info


def _image_tokens(arch: str, prompt_ids: tuple[int, ...], path: Path) -> int:
    import json

    config = json.loads((path / "config.json").read_text())
    image_id = config.get("image_token_index", config.get("image_token_id"))
    return sum(1 for i in prompt_ids if i == image_id)


@pytest.mark.parametrize("arch", SMALL)
def test_small_answers_about_an_image_through_the_reference(
    built: dict[str, Path], arch: str
) -> None:
    out = reference_generate(built[arch], QUESTION, [IMAGE_448], max_tokens=4)
    assert len(out.token_ids) >= 1 and len(out.token_ids) == len(out.logprobs)
    assert all(lp <= 0.0 for lp in out.logprobs)
    # The real model's image tokens for a 448 px image: gemma3 256 (896 px pooled 4 x 4);
    # smolvlm 5 tiles (2 x 2 + global, 512 px each) of 64 tokens.
    want = {"gemma3": 256, "smolvlm": 5 * 64}[arch]
    assert _image_tokens(arch, out.prompt_ids, built[arch]) == want


def test_small_towers_see_the_real_resolution(built: dict[str, Path]) -> None:
    import mlx_vlm
    from mlx_vlm.prompt_utils import apply_chat_template
    from mlx_vlm.utils import prepare_inputs

    shapes = {}
    for arch in SMALL:
        model, processor = mlx_vlm.load(str(built[arch]))
        prompt = apply_chat_template(processor, model.config, QUESTION, num_images=1)
        inputs = prepare_inputs(processor, images=[str(IMAGE_448)], prompts=prompt)
        shapes[arch] = tuple(inputs["pixel_values"].shape)
        vision = model.config.vision_config
        assert (vision.image_size, vision.patch_size) == {
            "gemma3": (896, 14),
            "smolvlm": (512, 16),
        }[arch]
    assert shapes["gemma3"] == (1, 3, 896, 896)
    assert shapes["smolvlm"] == (1, 5, 3, 512, 512)


def test_4b_config_is_gemma_3_4b(tmp_path: Path) -> None:
    config = gemma3.model_config("4b", "bfloat16")
    # The files the builder writes before the weights: this config, and a tokenizer padded
    # to the 262208-row embedding (every id the model samples decodes to text).
    assert gemma3.write_files(tmp_path, "4b", "bfloat16") == config
    tok = Tokenizer.from_file(str(tmp_path / "tokenizer.json"))
    assert tok.get_vocab_size() == config["text_config"]["vocab_size"] == 262208
    assert config["torch_dtype"] == "bfloat16"
    assert config["mm_tokens_per_image"] == 256
    assert config["vision_config"]["image_size"] == 896
    assert config["text_config"]["sliding_window"] == 1024
    n = params.param_count(config)  # instantiates lazily: nothing is allocated
    assert 4.2e9 < n < 4.4e9, n  # gemma-3-4b-it: 4.30 B (tied lm_head not written)
    shards = checkpoint.plan_shards(params.validate_config(config), "bfloat16")
    assert 2 <= len(shards) <= 3  # ~8.6 GB in shards of at most 4 GiB


def test_4b_defaults_to_bfloat16_and_qwen_has_no_small() -> None:
    assert om.default_model_dir("gemma3", "4b").name.startswith("gemma3-4b-bfloat16-")
    assert om.default_model_dir("gemma3", "small").name.startswith("gemma3-small-float32-")
    with pytest.raises(ValueError, match="size"):
        om.default_model_dir("qwen2_vl", "small")
    with pytest.raises(ValueError, match="size"):
        om.default_model_dir("smolvlm", "4b")


# HuggingFaceTB/SmolVLM-256M-Instruct's towers (config.json): SigLIP base/16 at 512 px and
# SmolLM2-135M. Only the fields `cost` reads.
SMOLVLM_256M = {
    "vision_config": dict(hidden_size=768, intermediate_size=3072, num_attention_heads=12,
                          num_hidden_layers=12, patch_size=16),
    "text_config": dict(hidden_size=576, intermediate_size=1536, num_attention_heads=9,
                        num_key_value_heads=3, num_hidden_layers=30, vocab_size=49280),
}  # fmt: skip


@pytest.mark.parametrize("arch", SMALL)
def test_small_tower_to_prefill_cost_is_the_real_models(built: dict[str, Path], arch: str) -> None:
    """For the same 448 px request (same tiles, same prompt), the small preset's tower costs
    about as many times its language model's prefill as the real model's does (within 2x
    either way): the split a cold/warm ratio measures. Real: gemma-3-4b-it ~3x,
    SmolVLM-256M ~13x."""
    import json

    from gateway.offline_model.cost import image_cost

    config = json.loads((built[arch] / "config.json").read_text())
    prompt = len(reference_generate(built[arch], QUESTION, [IMAGE_448], 1).prompt_ids)
    vision = config["vision_config"]
    side = vision["image_size"] // vision["patch_size"]
    tiles = [side * side] * {"gemma3": 1, "smolvlm": 5}[arch]
    real = gemma3.model_config("4b", "bfloat16") if arch == "gemma3" else SMOLVLM_256M
    ours, theirs = image_cost(config, tiles, prompt), image_cost(real, tiles, prompt)
    assert theirs.ratio > 2  # the tower dominates a cold request in both real models
    assert 0.5 < ours.ratio / theirs.ratio < 2, (ours.ratio, theirs.ratio)
