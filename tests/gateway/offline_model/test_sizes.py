"""The benchmark sizes of the non-Qwen families: `small` (CPU, real image path) and gemma3's
`4b` (real shapes, GPU).

Invariants: a `small` checkpoint builds byte-for-byte deterministically, loads with the
reference implementation and answers about an image; its tower sees a 448 px image at the
real model's resolution and the prompt holds the real model's image tokens (gemma3: 896 px,
256 soft tokens; smolvlm: 512 px tiles of 16 px patches, 64 tokens per tile; mistral3:
14 px patches, unscaled, 16 x 16 [IMG]; gemma4: the 280 budget, 768 px, 256 soft tokens),
and its tower costs about as many times its prefill as the real model's does, so a
cold/warm ratio measured on it reflects that split. The `4b` config is gemma-3-4b-it's,
accepted by mlx-vlm's and transformers' config classes (never built here: 8.6 GB).
"""

from __future__ import annotations

import hashlib
import json
import math
import os
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

import pytest  # noqa: E402
from reference import ReferenceOutput, reference_generate  # noqa: E402
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
SMALL = ("gemma3", "smolvlm", "mistral3", "gemma4")
# For the 448 px image: (pixel_values shape, image tokens in the prompt), as upstream's.
REAL_IMAGE_PATH = {
    "gemma3": ((1, 3, 896, 896), 256),  # resized to 896 px, 64 x 64 patches pooled 4 x 4
    "smolvlm": ((1, 5, 3, 512, 512), 5 * 64),  # 2 x 2 tiles + global, 64 tokens each
    "mistral3": ((1, 3, 448, 448), 16 * 16),  # never scaled up: 32 x 32 patches merged 2 x 2
    "gemma4": ((1, 3, 768, 768), 256),  # budget 280: 48 x 48 patches pooled 3 x 3
}


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


@pytest.fixture(scope="module")
def answers(built: dict[str, Path]) -> dict[str, ReferenceOutput]:
    return {
        arch: reference_generate(path, QUESTION, [IMAGE_448], max_tokens=4)
        for arch, path in built.items()
    }


@pytest.mark.parametrize("arch", SMALL)
def test_small_answers_about_an_image_through_the_reference(
    built: dict[str, Path], answers: dict[str, ReferenceOutput], arch: str
) -> None:
    out = answers[arch]
    assert len(out.token_ids) >= 1 and len(out.token_ids) == len(out.logprobs)
    assert all(lp <= 0.0 for lp in out.logprobs)
    config = json.loads((built[arch] / "config.json").read_text())
    image_id = config.get("image_token_index", config.get("image_token_id"))
    assert out.prompt_ids.count(image_id) == REAL_IMAGE_PATH[arch][1]


@pytest.mark.parametrize("arch", SMALL)
def test_small_towers_see_the_real_resolution(built: dict[str, Path], arch: str) -> None:
    assert _pixel_shape(built[arch]) == REAL_IMAGE_PATH[arch][0]


def _pixel_shape(path: Path) -> tuple[int, ...]:
    """The shape of the pixels mlx-vlm's own processor makes of the 448 px image."""
    import mlx_vlm
    from mlx_vlm.prompt_utils import apply_chat_template
    from mlx_vlm.utils import prepare_inputs

    model, processor = mlx_vlm.load(str(path))
    prompt = apply_chat_template(processor, model.config, QUESTION, num_images=1)
    inputs = prepare_inputs(processor, images=[str(IMAGE_448)], prompts=prompt)
    return tuple(inputs["pixel_values"].shape)


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


# The upstream towers the small presets are scaled from, only the fields `cost` reads:
# HuggingFaceTB/SmolVLM-256M-Instruct (SigLIP base/16 at 512 px, SmolLM2-135M),
# mistralai/Mistral-Small-3.1-24B-Instruct-2503 (Pixtral 24 x 1024, Mistral 40 x 5120) and
# Gemma 4 E2B (mlx-vlm 0.7.10's gemma4 config defaults). gemma3's is the `4b` size.
UPSTREAM = {
    "smolvlm": {
        "vision_config": dict(hidden_size=768, intermediate_size=3072, num_attention_heads=12,
                              num_hidden_layers=12, patch_size=16),
        "text_config": dict(hidden_size=576, intermediate_size=1536, num_attention_heads=9,
                            num_key_value_heads=3, num_hidden_layers=30, vocab_size=49280),
    },
    "mistral3": {
        "vision_config": dict(model_type="pixtral", hidden_size=1024, intermediate_size=4096,
                              num_attention_heads=16, head_dim=64, num_hidden_layers=24,
                              patch_size=14),
        "text_config": dict(hidden_size=5120, intermediate_size=32768, num_attention_heads=32,
                            num_key_value_heads=8, head_dim=128, num_hidden_layers=40,
                            vocab_size=131072),
    },
    "gemma4": {
        "vision_config": dict(model_type="gemma4_vision", hidden_size=768,
                              intermediate_size=3072, num_attention_heads=12, head_dim=64,
                              num_hidden_layers=16, patch_size=16),
        "text_config": dict(hidden_size=1536, intermediate_size=6144, num_attention_heads=8,
                            num_key_value_heads=1, head_dim=256, num_hidden_layers=35,
                            vocab_size=262144),
    },
}  # fmt: skip


@pytest.mark.parametrize("arch", SMALL)
def test_small_tower_to_prefill_cost_is_the_real_models(
    built: dict[str, Path], answers: dict[str, ReferenceOutput], arch: str
) -> None:
    """For the same 448 px request (same tiles, same prompt), the small preset's tower costs
    about as many times its language model's prefill as the real model's does (within 2x
    either way): the split a cold/warm ratio measures. Upstream: gemma-3-4b-it ~3x,
    SmolVLM-256M ~13x, Gemma 4 E2B ~1.3x, Mistral Small 3.1 ~0.04x (its prefill dominates)."""
    from gateway.offline_model.cost import image_cost

    config = json.loads((built[arch] / "config.json").read_text())
    *tiles, _, height, width = REAL_IMAGE_PATH[arch][0]
    patch = config["vision_config"]["patch_size"]
    patches = [height * width // patch**2] * math.prod(tiles)
    prompt = len(answers[arch].prompt_ids)
    real = gemma3.model_config("4b", "bfloat16") if arch == "gemma3" else UPSTREAM[arch]
    ours, theirs = image_cost(config, patches, prompt), image_cost(real, patches, prompt)
    assert 0.5 < ours.ratio / theirs.ratio < 2, (ours.ratio, theirs.ratio)
