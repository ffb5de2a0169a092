"""`vision-gateway make-model`: every family the builder knows is a `--arch` choice, `--help`
names them all, and the command builds each one (quantized through the family's runtime)."""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

import pytest  # noqa: E402

from gateway import cli  # noqa: E402
from gateway import offline_model as om  # noqa: E402

NEW_ARCHS = ("gemma3", "smolvlm", "mistral3", "gemma4", "qwen3", "qwen3_5", "llama")


def test_arch_choices_are_the_builders_families() -> None:
    # The CLI spells the list out (parsing argv must not import the builder): kept equal.
    assert cli.MAKE_MODEL_ARCHS == om.ARCHS
    assert set(cli.TEXT_ARCHS) == {a for a, f in om.FAMILIES.items() if f.runtime == "mlx-lm"}
    assert set(NEW_ARCHS) < set(om.ARCHS)
    sizes = {s for f in om.FAMILIES.values() for s in f.sizes}
    assert set(cli.MAKE_MODEL_SIZES) == sizes


def test_help_lists_every_arch(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as done:
        cli.main(["make-model", "--help"])
    assert done.value.code == 0
    help_text = " ".join(capsys.readouterr().out.split())  # argparse wraps lines
    assert "{" + ",".join(om.ARCHS) + "}" in help_text  # the choices
    for arch in om.ARCHS:  # and the description, by name
        assert len(re.findall(rf"\b{arch}\b", help_text)) >= 2, arch


def test_unknown_arch_is_refused_by_name(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        cli.main(["make-model", "/nonexistent/x", "--arch", "llava"])
    err = capsys.readouterr().err
    assert "llava" in err and "gemma4" in err


@pytest.mark.parametrize("arch", NEW_ARCHS)
def test_make_model_builds_the_family(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], arch: str
) -> None:
    out = tmp_path / arch
    cli.main(["make-model", str(out), "--arch", arch, "--seed", "3"])
    assert f"wrote {out}" in capsys.readouterr().out
    config = json.loads((out / "config.json").read_text())
    info = json.loads((out / om.MARKER).read_text())
    assert config["model_type"] == arch
    assert (info["arch"], info["seed"], info["dtype"]) == (arch, 3, "float32")
    assert (out / "model.safetensors").stat().st_size > 0


@pytest.mark.parametrize("arch", ["qwen3", "gemma3"])
def test_quantized_build_loads_with_the_familys_runtime(tmp_path: Path, arch: str) -> None:
    """qwen3 goes through mlx-lm's converter, gemma3 through mlx-vlm's: either way the
    language model's linear layers load as 4-bit QuantizedLinear."""
    import mlx.nn as nn

    out = om.build_model(tmp_path / arch, arch, "tiny", quantize=4, group_size=32)
    info = json.loads((out / om.MARKER).read_text())
    assert info["quantization"] == {"bits": 4, "group_size": 32}
    if arch == "qwen3":
        import mlx_lm

        model, _ = mlx_lm.load(str(out))
        layer = model.model.layers[0].self_attn.q_proj
    else:
        import mlx_vlm

        model, _ = mlx_vlm.load(str(out))
        layer = model.language_model.model.layers[0].self_attn.q_proj
    assert isinstance(layer, nn.QuantizedLinear) and layer.bits == 4


def test_a_size_the_arch_lacks_is_a_clear_error(tmp_path) -> None:  # noqa: ANN001
    """Invariant: `--size` lists every family's sizes; one this arch lacks is refused with
    the arch's own sizes named, before anything is built, not with a traceback."""
    with pytest.raises(SystemExit) as done:
        cli.main(["make-model", str(tmp_path / "m"), "--arch", "qwen3", "--size", "small"])
    assert "unknown size 'small' for qwen3; expected one of tiny" in str(done.value.code)
    assert not (tmp_path / "m").exists()


def test_thinking_is_a_qwen3_template(tmp_path: Path) -> None:
    """`--thinking` writes Qwen3's Thinking template (the prompt opens `<think>`) into a tiny
    qwen3 checkpoint, and is refused for any other arch."""
    from gateway.offline_model.chat_templates.qwen3 import THINKING_TEMPLATE

    with pytest.raises(SystemExit) as refused:
        cli.main(["make-model", str(tmp_path / "x"), "--arch", "llama", "--thinking"])
    assert "qwen3" in str(refused.value.code)
    out = tmp_path / "thinking"
    cli.main(["make-model", str(out), "--arch", "qwen3", "--thinking"])
    config = json.loads((out / "tokenizer_config.json").read_text())
    assert config["chat_template"] == THINKING_TEMPLATE
    assert (out / "chat_template.jinja").read_text() == THINKING_TEMPLATE
    assert THINKING_TEMPLATE.rstrip().endswith("{%- endif %}")
    assert "'<|im_start|>assistant\\n<think>\\n'" in THINKING_TEMPLATE
