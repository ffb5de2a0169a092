"""The reference harness (tests/reference.py) returns exactly what the reference library
computes: max_tokens greedy ids with their log-probabilities, the prompt ids it prefilled,
deterministically, for every new family's tiny checkpoint."""

from __future__ import annotations

import math
from collections import Counter
from pathlib import Path
from typing import Any

import mlx.core as mx
import pytest
from reference import load_reference, reference_generate

from gateway import offline_model as om

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"
IMAGE = FIXTURES / "shapes.png"
TEXT_ARCHS = ("qwen3", "llama")
VISION_ARCHS = ("gemma3", "smolvlm", "mistral3", "gemma4", "lfm2_vl")
QUESTION = "Describe the picture."
# Image soft tokens of one 448 px image, by family (see test_vlm_families.py).
IMAGE_TOKENS = {
    "gemma3": ("<image_soft_token>", 64),
    "smolvlm": ("<image>", 160),
    "mistral3": ("[IMG]", 64),
    "gemma4": ("<|image|>", 64),
    "lfm2_vl": ("<image>", 160),
}


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("reference")
    archs = TEXT_ARCHS + VISION_ARCHS
    return {arch: om.build_model(root / arch, arch, "tiny", seed=0) for arch in archs}


def _messages(with_image: bool) -> list[dict[str, Any]]:
    if not with_image:
        return [{"role": "user", "content": QUESTION}]
    return [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": QUESTION}]}]


@pytest.mark.parametrize("arch", TEXT_ARCHS + VISION_ARCHS)
def test_returns_max_tokens_greedy_ids_deterministically(built: dict[str, Path], arch: str) -> None:
    image = arch in VISION_ARCHS
    images = [IMAGE] if image else []
    out = reference_generate(built[arch], _messages(image), images, max_tokens=7)
    assert out.finish_reason == "length"
    assert len(out.token_ids) == len(out.logprobs) == 7
    assert all(math.isfinite(p) and p <= 0.0 for p in out.logprobs)
    again = reference_generate(built[arch], _messages(image), images, max_tokens=7)
    assert again == out  # ids, logprobs (bitwise) and prompt
    shorter = reference_generate(built[arch], _messages(image), images, max_tokens=3)
    assert shorter.token_ids == out.token_ids[:3] and shorter.logprobs == out.logprobs[:3]


@pytest.mark.parametrize("arch", TEXT_ARCHS)
def test_text_logprobs_are_the_models_log_softmax(built: dict[str, Path], arch: str) -> None:
    """The first answer id is the argmax of one plain forward over the prompt ids, and its
    logprob that row's log-softmax, bit for bit."""
    out = reference_generate(built[arch], _messages(False), max_tokens=2)
    model, tokenizer = load_reference(built[arch])
    assert list(out.prompt_ids) == tokenizer.apply_chat_template(
        _messages(False), add_generation_prompt=True
    )
    logits = model(mx.array(out.prompt_ids)[None])[0, -1].astype(mx.float32)
    logprobs = logits - mx.logsumexp(logits)
    assert out.token_ids[0] == int(mx.argmax(logits).item())
    assert out.logprobs[0] == float(logprobs[out.token_ids[0]].item())


@pytest.mark.parametrize("arch", VISION_ARCHS)
def test_prompt_ids_hold_the_expanded_image(built: dict[str, Path], arch: str) -> None:
    out = reference_generate(built[arch], _messages(True), [IMAGE], max_tokens=1)
    _, processor = load_reference(built[arch])
    name, count = IMAGE_TOKENS[arch]
    token = processor.tokenizer.convert_tokens_to_ids(name)
    assert Counter(out.prompt_ids)[token] == count
    text_only = reference_generate(built[arch], _messages(False), max_tokens=1)
    assert token not in text_only.prompt_ids


@pytest.mark.parametrize(
    ("arch", "image", "bos"),
    [
        ("gemma3", True, 2),
        ("gemma3", False, 2),
        ("mistral3", True, 2),
        ("mistral3", False, 2),
        ("gemma4", True, 2),
        ("gemma4", False, 1),
        ("smolvlm", True, 1),
        ("lfm2_vl", True, 1),  # its processor encodes without special tokens
        ("lfm2_vl", False, 1),
    ],
)
def test_reference_bos_count_as_mlx_vlm_makes_it(
    built: dict[str, Path], arch: str, image: bool, bos: int
) -> None:
    """Pins a reference quirk: mlx-vlm 0.7.10 encodes these families' rendered templates
    (which already start with BOS) with special tokens, so its own prefill starts with two
    BOS ids (`single_bos=False`); the default comparison input has the template's one. If
    mlx-vlm changes, this test says so."""
    images = [IMAGE] if image else []
    as_mlx_vlm = reference_generate(
        built[arch], _messages(image), images, max_tokens=1, single_bos=False
    )
    _, processor = load_reference(built[arch])
    first = processor.tokenizer.convert_tokens_to_ids(processor.tokenizer.bos_token)
    assert as_mlx_vlm.prompt_ids[:bos] == (first,) * bos and as_mlx_vlm.prompt_ids[bos] != first
    assert as_mlx_vlm.prompt.count(processor.tokenizer.bos_token) == 1  # the template wrote one
    single = reference_generate(built[arch], _messages(image), images, max_tokens=1)
    assert single.prompt_ids == as_mlx_vlm.prompt_ids[bos - 1 :]


def test_images_for_a_text_model_and_zero_tokens_are_refused(built: dict[str, Path]) -> None:
    with pytest.raises(ValueError, match="text model"):
        reference_generate(built["llama"], _messages(False), [IMAGE], max_tokens=1)
    with pytest.raises(ValueError, match="max_tokens"):
        reference_generate(built["llama"], _messages(False), max_tokens=0)


def test_a_rebuilt_checkpoint_is_loaded_again(tmp_path: Path) -> None:
    path = om.build_model(tmp_path / "m", "llama", "tiny", seed=0)
    first = reference_generate(path, _messages(False), max_tokens=3)
    om.build_model(tmp_path / "m", "llama", "tiny", seed=1)  # other weights, same dir
    second = reference_generate(path, _messages(False), max_tokens=3)
    assert first.prompt_ids == second.prompt_ids and first.logprobs != second.logprobs
