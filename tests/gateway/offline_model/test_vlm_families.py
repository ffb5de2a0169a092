"""The new vision-language checkpoints: mlx-vlm loads each as the real family (its own model
classes and processor), renders the family's real template, expands images into the family's
token layout, keeps the family's cache layout, and generates offline."""

from __future__ import annotations

import hashlib
import os
from collections import Counter
from datetime import datetime
from pathlib import Path
from typing import Any

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

import mlx.core as mx  # noqa: E402
import mlx_vlm  # noqa: E402
import pytest  # noqa: E402
from mlx.utils import tree_flatten  # noqa: E402
from mlx_vlm.models.cache import make_prompt_cache  # noqa: E402
from mlx_vlm.prompt_utils import apply_chat_template  # noqa: E402
from mlx_vlm.utils import prepare_inputs  # noqa: E402
from tokenizers import Tokenizer  # noqa: E402

from gateway import offline_model as om  # noqa: E402

FIXTURES = Path(__file__).resolve().parents[3] / "fixtures"
IMAGE_448 = str(FIXTURES / "shapes.png")  # 448 x 448
IMAGE_56 = str(FIXTURES / "shapes-56.png")
QUESTION = "What is in this picture?"

# What each family's tiny checkpoint is, as the family's tests pin it.
EXPECT: dict[str, dict[str, Any]] = {
    "gemma3": dict(
        processor="Gemma3Processor",
        tokenizer="GemmaTokenizer",
        image_token="<image_soft_token>",
        tokens_448=64,
        tokens_56=64,  # every image is resized to the tower's 224 px
        tokens_wide=64,
        caches=["RotatingKVCache"] * 5 + ["KVCache"],
        window=48,
        derived={"language_model.lm_head.weight": "language_model.model.embed_tokens.weight"},
        prompt=(
            "<bos><start_of_turn>user\n<start_of_image>What is in this picture?<end_of_turn>\n"
            "<start_of_turn>model\n"
        ),
    ),
    "smolvlm": dict(
        processor="SmolVLMProcessor",
        tokenizer="TokenizersBackend",
        image_token="<image>",
        tokens_448=160,  # 3 x 3 tiles + the global image, 16 tokens each
        tokens_56=160,  # small images are scaled up to the 192 px longest edge too
        tokens_wide=112,  # 640 x 360: 3 x 2 tiles + global
        caches=["KVCache"] * 2,  # no make_cache: the default prompt cache
        prompt="<|im_start|>User:<image>What is in this picture?<end_of_utterance>\nAssistant:",
    ),
    "mistral3": dict(
        processor="Mistral3Processor",
        tokenizer="TokenizersBackend",
        image_token="[IMG]",
        tokens_448=64,  # 8 x 8 cells of 28 px (+ 7 [IMG_BREAK] + [IMG_END])
        tokens_56=4,  # never scaled up: 2 x 2 cells
        tokens_wide=40,  # 640 x 360 -> 224 x 126 -> 8 x 5 cells
        caches=["KVCache"] * 2,
        # Mistral's default system message names today's date (strftime_now).
        prompt="<s>[SYSTEM_PROMPT]You are Mistral Small 3, a Large Language Model (LLM) "
        "created by Mistral AI, a French startup headquartered in Paris.\nYour knowledge base "
        "was last updated on 2023-10-01. The current date is {today}.\n\nWhen you're not "
        "sure about some information, you say that you don't have the information and don't "
        "make up anything.\nIf the user's question is not clear, ambiguous, or does not "
        "provide enough context for you to accurately answer the question, you do not try to "
        "answer it right away and you rather ask the user to clarify their request (e.g. "
        '"What are some good restaurants around me?" => "Where are you?" or "When is the next '
        'flight to Tokyo" => "Where do you travel from?")[/SYSTEM_PROMPT][INST][IMG]What is '
        "in this picture?[/INST]",
    ),
    "gemma4": dict(
        processor="Gemma4Processor",
        tokenizer="GemmaTokenizer",
        image_token="<|image|>",
        tokens_448=64,  # budget 70: 384 x 384 px, 24 x 24 patches pooled 3 x 3
        tokens_56=64,  # scaled up to the budget too
        tokens_wide=66,  # 640 x 360 -> 528 x 288 px: 11 x 6
        # 10 layers, the last 4 share earlier layers' KV: 6 caches.
        caches=["RotatingKVCache"] * 4 + ["KVCache", "RotatingKVCache"],
        window=48,
        prompt="<bos><|turn>user\n\n\n<|image|>\n\nWhat is in this picture?<turn|>\n"
        "<|turn>model\n<|channel>thought\n<channel|>",
    ),
    "qwen3_5": dict(
        processor="Qwen3VLProcessor",
        tokenizer="Qwen3_5Tokenizer",
        image_token="<|image_pad|>",
        tokens_448=196,  # 14 x 14 merged 32 px patches
        tokens_56=4,  # 64 x 64 px after the resize to whole merged patches
        tokens_wide=220,  # 640 x 352 px: 20 x 11
        caches=["ArraysCache"] * 3 + ["KVCache"],  # 3 gated-delta : 1 full attention
        # mlx-vlm renders with enable_thinking=False: the template closes the think block
        prompt="<|im_start|>user\n<|vision_start|><|image_pad|><|vision_end|>What is in this "
        "picture?<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n",
    ),
    "lfm2_vl": dict(
        processor="Lfm2VlProcessor",
        # transformers' class, patched in place by mlx-vlm's processing_lfm2_vl on import
        processor_module="transformers.models.lfm2_vl.",
        image_processor="Lfm2VlNumpyImageProcessor",  # mlx-vlm's (the official tiling)
        tokenizer="TokenizersBackend",
        image_token="<image>",
        tokens_448=160,  # 3 x 3 tiles of 64 px + a 64 px thumbnail, 16 tokens each
        tokens_56=16,  # one smart-resized 64 x 64 px view
        tokens_wide=143,  # 640 x 360: 2 x 4 tiles + a 48 x 80 px thumbnail (15 tokens)
        caches=["ArraysCache"] * 2 + ["KVCache", "ArraysCache"],  # conv, conv, attention, conv
        prompt="<|startoftext|><|im_start|>user\n<image>What is in this picture?<|im_end|>\n"
        "<|im_start|>assistant\n",
    ),
}
ARCHS = tuple(EXPECT)


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("vlm")
    return {arch: om.build_model(root / arch, arch, "tiny", seed=0) for arch in ARCHS}


@pytest.fixture(scope="module")
def wide_image(tmp_path_factory: pytest.TempPathFactory) -> str:
    from PIL import Image

    path = tmp_path_factory.mktemp("images") / "wide.png"
    Image.open(IMAGE_448).convert("RGB").resize((640, 360)).save(path)
    return str(path)


@pytest.fixture(scope="module")
def loaded(built: dict[str, Path]) -> dict[str, tuple[Any, Any]]:
    return {arch: mlx_vlm.load(str(path)) for arch, path in built.items()}


def _hashes(path: Path) -> dict[str, str]:
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(path.iterdir())}


def _prompt(arch: str, loaded: dict[str, tuple[Any, Any]], n_images: int) -> str:
    model, processor = loaded[arch]
    content = [{"type": "image"}] * n_images + [{"type": "text", "text": QUESTION}]
    messages = [{"role": "user", "content": content}]
    return apply_chat_template(processor, model.config, messages, num_images=n_images)


@pytest.mark.parametrize("arch", ARCHS)
def test_same_seed_same_bytes_other_seed_other_weights(
    built: dict[str, Path], tmp_path: Path, arch: str
) -> None:
    again = _hashes(om.build_model(tmp_path / "again", arch, "tiny", seed=0))
    assert again == _hashes(built[arch])
    other = _hashes(om.build_model(tmp_path / "other", arch, "tiny", seed=1))
    assert other["model.safetensors"] != again["model.safetensors"]
    rest = {k for k in again if k not in ("model.safetensors", om.MARKER)}
    assert {k: other[k] for k in rest} == {k: again[k] for k in rest}


@pytest.mark.parametrize("arch", ARCHS)
def test_loads_with_the_familys_own_classes_and_every_tensor_as_written(
    built: dict[str, Path], loaded: dict[str, tuple[Any, Any]], arch: str
) -> None:
    model, processor = loaded[arch]
    want = EXPECT[arch]
    assert type(model).__module__ == f"mlx_vlm.models.{arch}.{arch}"
    assert type(processor).__name__ == want["processor"]
    # not the HF fallback (LFM2-VL's is transformers' class, which mlx-vlm patches)
    assert type(processor).__module__.startswith(want.get("processor_module", "mlx_vlm.models."))
    assert type(processor.tokenizer).__name__ == want["tokenizer"]
    if "image_processor" in want:
        assert type(processor.image_processor).__name__ == want["image_processor"]
    written = mx.load(str(built[arch] / "model.safetensors"))
    params = dict(tree_flatten(model.parameters()))
    derived = want.get("derived", {})
    assert sorted(params) == sorted([*written, *derived])
    assert all(mx.array_equal(params[k], written[k]).item() for k in written)
    for name, source in derived.items():  # tied at load time, as upstream checkpoints are
        assert mx.array_equal(params[name], written[source]).item()


@pytest.mark.parametrize("arch", ARCHS)
def test_tokenizer_json_and_transformers_encode_alike(
    built: dict[str, Path], loaded: dict[str, tuple[Any, Any]], arch: str
) -> None:
    tok = loaded[arch][1].tokenizer
    fast = Tokenizer.from_file(str(built[arch] / "tokenizer.json"))
    text = "A red cat sits on the table.\nIt's 42% done: déjà vu, 猫 🐈! " + EXPECT[arch]["prompt"]
    plain = tok.encode(text, add_special_tokens=False)
    assert plain == fast.encode(text, add_special_tokens=False).ids
    assert tok.encode(text) == fast.encode(text).ids
    assert tok.decode(plain) == text
    assert len(tok) == loaded[arch][0].config.text_config.vocab_size


@pytest.mark.parametrize("arch", ARCHS)
def test_template_renders_as_the_real_one(loaded: dict[str, tuple[Any, Any]], arch: str) -> None:
    today = datetime.now().strftime("%Y-%m-%d")  # as the template's strftime_now
    assert _prompt(arch, loaded, 1) == EXPECT[arch]["prompt"].replace("{today}", today)


NEWLINE = "\u010a"  # "\n" in byte-level spelling


def _smolvlm_span(rows: int, cols: int) -> list[str]:
    """Idefics3's layout: per tile `<fake_token_around_image><row_r_col_c>` + 16 image
    tokens, a newline after each tile row, then a newline and the global image."""
    out: list[str] = []
    for r in range(1, rows + 1):
        for c in range(1, cols + 1):
            out += ["<fake_token_around_image>", f"<row_{r}_col_{c}>", *["<image>"] * 16]
        out.append(NEWLINE)
    glob = ["<fake_token_around_image>", "<global-img>", *["<image>"] * 16]
    return [*out, NEWLINE, *glob, "<fake_token_around_image>"]


# The image span each family's processor writes for the 448 px image, as token names.
SPANS = {
    "gemma3": ["<start_of_image>", *["<image_soft_token>"] * 64, "<end_of_image>"],
    "mistral3": [*(["[IMG]"] * 8 + ["[IMG_BREAK]"]) * 7, *["[IMG]"] * 8, "[IMG_END]"],
    "smolvlm": _smolvlm_span(3, 3),
    "gemma4": ["<|image>", *["<|image|>"] * 64, "<image|>"],
    "qwen3_5": ["<|vision_start|>", *["<|image_pad|>"] * 196, "<|vision_end|>"],
    "lfm2_vl": [
        "<|image_start|>",
        *[
            t
            for r in (1, 2, 3)
            for c in (1, 2, 3)
            for t in [f"<|img_row_{r}_col_{c}|>"] + ["<image>"] * 16
        ],
        "<|img_thumbnail|>",
        *["<image>"] * 16,
        "<|image_end|>",
    ],
}


@pytest.mark.parametrize("arch", ARCHS)
def test_image_span_layout(loaded: dict[str, tuple[Any, Any]], arch: str) -> None:
    model, processor = loaded[arch]
    inputs = prepare_inputs(processor, images=[IMAGE_448], prompts=_prompt(arch, loaded, 1))
    tokens = processor.tokenizer.convert_ids_to_tokens(inputs["input_ids"][0].tolist())
    span = SPANS[arch]
    starts = [i for i in range(len(tokens)) if tokens[i : i + len(span)] == span]
    assert len(starts) == 1, tokens


@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("image", ["448", "56", "wide"])
def test_image_token_count(
    loaded: dict[str, tuple[Any, Any]], wide_image: str, arch: str, image: str
) -> None:
    model, processor = loaded[arch]
    path = {"448": IMAGE_448, "56": IMAGE_56, "wide": wide_image}[image]
    inputs = prepare_inputs(processor, images=[path], prompts=_prompt(arch, loaded, 1))
    token = processor.tokenizer.convert_tokens_to_ids(EXPECT[arch]["image_token"])
    counts = Counter(inputs["input_ids"][0].tolist())
    assert counts[token] == EXPECT[arch][f"tokens_{image}"]


@pytest.mark.parametrize("arch", ARCHS)
def test_cache_layout(loaded: dict[str, tuple[Any, Any]], arch: str) -> None:
    # What mlx-vlm's generate makes: the model's make_cache, else one KVCache per layer.
    caches = make_prompt_cache(loaded[arch][0].language_model)
    assert [type(c).__name__ for c in caches] == EXPECT[arch]["caches"]
    windows = {c.max_size for c in caches if type(c).__name__ == "RotatingKVCache"}
    assert windows == ({EXPECT[arch]["window"]} if "window" in EXPECT[arch] else set())


@pytest.mark.parametrize("arch", ARCHS)
def test_two_images_per_turn_generate_greedily_offline(
    loaded: dict[str, tuple[Any, Any]], arch: str
) -> None:
    model, processor = loaded[arch]
    prompt = _prompt(arch, loaded, 2)
    images = [IMAGE_448, IMAGE_56]
    inputs = prepare_inputs(processor, images=images, prompts=prompt)
    token = processor.tokenizer.convert_tokens_to_ids(EXPECT[arch]["image_token"])
    n_image = Counter(inputs["input_ids"][0].tolist())[token]
    assert n_image == EXPECT[arch]["tokens_448"] + EXPECT[arch]["tokens_56"]
    steps = list(
        mlx_vlm.stream_generate(model, processor, prompt, image=images, max_tokens=6, temperature=0)
    )
    final = steps[-1]
    assert final.finish_reason in ("length", "stop") and final.token_ids
    assert final.prompt_tokens == inputs["input_ids"].shape[1]
    for step in steps[:-1]:  # greedy: each token is its distribution's argmax
        assert step.token == int(mx.argmax(step.logprobs).item())
    assert all(0 <= t < model.config.text_config.vocab_size for t in final.token_ids)
