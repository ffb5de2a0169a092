"""The text-model checkpoints (qwen3, llama): mlx-lm loads them as the real families, with the
family's special tokens, flags and chat template, and generates offline."""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

import mlx.core as mx  # noqa: E402
import mlx_lm  # noqa: E402
import pytest  # noqa: E402
from mlx_lm.sample_utils import make_sampler  # noqa: E402
from tokenizers import Tokenizer  # noqa: E402

from gateway import offline_model as om  # noqa: E402

TEXT_ARCHS = ("qwen3", "llama")
SAMPLE = "A red cat sits on the table.\nIt's 42% done: déjà vu, 猫 🐈! 12345 tokens"
CHAT = [
    {"role": "system", "content": "You are terse."},
    {"role": "user", "content": "What is 2+2?"},
]


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("text")
    return {arch: om.build_model(root / arch, arch, "tiny", seed=0) for arch in TEXT_ARCHS}


def _hashes(path: Path) -> dict[str, str]:
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(path.iterdir())}


@pytest.mark.parametrize("arch", TEXT_ARCHS)
def test_same_seed_same_bytes_other_seed_other_weights(
    built: dict[str, Path], tmp_path: Path, arch: str
) -> None:
    again = _hashes(om.build_model(tmp_path / "again", arch, "tiny", seed=0))
    assert again == _hashes(built[arch])
    other = _hashes(om.build_model(tmp_path / "other", arch, "tiny", seed=1))
    assert other["model.safetensors"] != again["model.safetensors"]
    rest = {k for k in again if k not in ("model.safetensors", om.MARKER)}
    assert {k: other[k] for k in rest} == {k: again[k] for k in rest}


@pytest.mark.parametrize("arch", TEXT_ARCHS)
def test_mlx_lm_loads_every_tensor_as_written(built: dict[str, Path], arch: str) -> None:
    from mlx.utils import tree_flatten

    model, _ = mlx_lm.load(str(built[arch]))
    written = mx.load(str(built[arch] / "model.safetensors"))
    loaded = dict(tree_flatten(model.parameters()))
    assert sorted(loaded) == sorted(written)
    assert all(mx.array_equal(loaded[k], written[k]).item() for k in written)


@pytest.mark.parametrize("arch", TEXT_ARCHS)
def test_tokenizer_json_and_transformers_encode_alike(built: dict[str, Path], arch: str) -> None:
    """Whatever loads the tokenizer (tokenizers from tokenizer.json, or the transformers class
    mlx-lm hands out, which for Qwen2Tokenizer rebuilds the BPE from vocab/merges) gets the
    same ids, with and without special tokens, and decodes back to the text."""
    _, tok = mlx_lm.load(str(built[arch]))
    fast = Tokenizer.from_file(str(built[arch] / "tokenizer.json"))
    for text in (SAMPLE, "<|im_start|>user\nHi<think>x</think><|eot_id|>"):
        plain = tok.encode(text, add_special_tokens=False)
        assert plain == fast.encode(text, add_special_tokens=False).ids
        assert tok.encode(text) == fast.encode(text).ids
        assert tok.decode(plain) == text
    # The tokenizer has a (filler) word for every row of the embedding.
    assert len(tok) == json.loads((built[arch] / "config.json").read_text())["vocab_size"]


def test_qwen3_tokens_template_and_thinking(built: dict[str, Path]) -> None:
    _, tok = mlx_lm.load(str(built["qwen3"]))
    config = json.loads((built["qwen3"] / "config.json").read_text())
    assert type(tok._tokenizer).__name__ == "Qwen2Tokenizer"
    ids = {t: tok.convert_tokens_to_ids(t) for t in ("<|endoftext|>", "<|im_end|>", "<think>")}
    assert ids == {"<|endoftext|>": 2034, "<|im_end|>": 2036, "<think>": 2058}
    assert (config["eos_token_id"], config["vocab_size"], config["tie_word_embeddings"]) == (
        2036,
        2112,
        True,
    )
    assert tok.eos_token_ids == {2034, 2036}  # generation_config's list
    # <think> and <tool_call> are added tokens that skip_special_tokens keeps (Qwen3's flags).
    reasoning = "<think>\nhm\n</think>"
    think = tok.encode(reasoning, add_special_tokens=False)
    assert think[0] == 2058 and tok.decode(think, skip_special_tokens=True) == reasoning
    assert tok.decode([2036], skip_special_tokens=True) == ""
    assert tok.has_thinking and tok.think_start == "<think>"
    prompt = tok.apply_chat_template(CHAT, add_generation_prompt=True, tokenize=False)
    assert prompt == (
        "<|im_start|>system\nYou are terse.<|im_end|>\n<|im_start|>user\nWhat is 2+2?<|im_end|>\n"
        "<|im_start|>assistant\n"
    )
    no_think = tok.apply_chat_template(
        CHAT, add_generation_prompt=True, tokenize=False, enable_thinking=False
    )
    assert no_think == prompt + "<think>\n\n</think>\n\n"
    # The real template's reasoning rule: an answer after the last query keeps its think block.
    turns = [*CHAT, {"role": "assistant", "content": "<think>\nadd\n</think>\n\n4"}]
    rendered = tok.apply_chat_template(turns, tokenize=False)
    assert rendered.endswith("<|im_start|>assistant\n<think>\nadd\n</think>\n\n4<|im_end|>\n")
    tools = [{"type": "function", "function": {"name": "add", "parameters": {}}}]
    with_tools = tok.apply_chat_template(CHAT, tools=tools, tokenize=False)
    assert "# Tools" in with_tools and "<tool_call>" in with_tools


def test_llama_tokens_template_and_bos(built: dict[str, Path]) -> None:
    _, tok = mlx_lm.load(str(built["llama"]))
    config = json.loads((built["llama"] / "config.json").read_text())
    names = ("<|begin_of_text|>", "<|end_of_text|>", "<|eom_id|>", "<|eot_id|>")
    assert [tok.convert_tokens_to_ids(t) for t in names] == [2037, 2038, 2045, 2046]
    assert config["eos_token_id"] == [2038, 2045, 2046] and tok.eos_token_ids == {2038, 2045, 2046}
    assert config["rope_scaling"]["rope_type"] == "llama3" and not config["tie_word_embeddings"]
    assert tok.pad_token is None  # as upstream: no pad token
    assert tok.encode("hi")[0] == 2037 and tok.encode("hi", add_special_tokens=False)[0] != 2037
    prompt = tok.apply_chat_template(CHAT, add_generation_prompt=True, tokenize=False)
    assert prompt == (
        "<|begin_of_text|><|start_header_id|>system<|end_header_id|>\n\n"
        "Cutting Knowledge Date: December 2023\nToday Date: 26 Jul 2024\n\n"
        "You are terse.<|eot_id|><|start_header_id|>user<|end_header_id|>\n\n"
        "What is 2+2?<|eot_id|><|start_header_id|>assistant<|end_header_id|>\n\n"
    )
    # mlx-lm tokenizes the template without adding a second BOS.
    ids = tok.apply_chat_template(CHAT, add_generation_prompt=True)
    assert ids[0] == 2037 and ids[1] != 2037


@pytest.mark.parametrize("arch", TEXT_ARCHS)
def test_mlx_lm_greedy_generate_runs_offline(built: dict[str, Path], arch: str) -> None:
    model, tok = mlx_lm.load(str(built[arch]))
    prompt = tok.apply_chat_template(CHAT, add_generation_prompt=True)
    steps = list(
        mlx_lm.stream_generate(model, tok, prompt, max_tokens=8, sampler=make_sampler(0.0))
    )
    assert len(steps) == 8 and steps[-1].finish_reason == "length"
    for step in steps:  # greedy: each token is the argmax of its own distribution
        assert step.token == int(mx.argmax(step.logprobs).item())
    assert all(0 <= s.token < model.args.vocab_size for s in steps)
