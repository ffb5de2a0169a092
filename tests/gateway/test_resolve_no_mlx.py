"""Start-up before the engine imports no MLX in the HTTP process: `resolve_model` (the
--model check, or the embedded model, built in a child process when missing) and
`check_checkpoint` on good and bad folders give their answers, and neither `mlx`, `mlx_lm`
nor `mlx_vlm` was ever imported in their process.

Run in a subprocess: other tests import MLX into the pytest process.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

from support import tiny_model

SCRIPT = textwrap.dedent(
    """
    import json, logging, sys
    from gateway.config import ConfigError, EngineConfig
    from gateway.processors.checkpoint import check_checkpoint
    from gateway.server import resolve_model

    cases = json.loads(sys.argv[1])
    lines = []

    class Lines(logging.Handler):
        def emit(self, record):
            lines.append(record.getMessage())

    logging.getLogger("gateway.server").addHandler(Lines())
    logging.getLogger("gateway.server").setLevel(logging.INFO)
    out = {"embedded": []}
    for _ in range(2):  # missing: built in a child process; then already built
        before = len(lines)
        engine, notice = resolve_model(EngineConfig(model="", served_model_name="m"))
        out["embedded"].append([engine.model, notice is not None, lines[before:]])
    engine, notice = resolve_model(EngineConfig(model=cases["tiny"], served_model_name="m"))
    out["tiny"] = [engine.model, notice]
    out["checks"] = {}
    for name, (model, bits) in cases["checks"].items():
        try:
            check_checkpoint(model, bits)
            out["checks"][name] = "ok"
        except ValueError as exc:
            out["checks"][name] = f"{type(exc).__name__}: {exc}"
    try:
        resolve_model(EngineConfig(model=cases["checks"]["bert"][0], served_model_name="m"))
    except ConfigError as exc:
        out["refused"] = str(exc)
    out["mlx"] = sorted(m for m in sys.modules if m.split(".")[0] in ("mlx", "mlx_lm", "mlx_vlm"))
    print(json.dumps(out))
    """
)


def _folder(root: Path, name: str, config: str | None, weights: bool = False) -> str:
    folder = root / name
    folder.mkdir()
    if config is not None:
        (folder / "config.json").write_text(config)
    if weights:
        (folder / "model.safetensors").write_bytes(b"")
    return str(folder)


def test_resolving_and_checking_a_model_imports_no_mlx(tmp_path: Path) -> None:
    """Invariant: in a process that resolves the embedded model (missing, then built) and a
    real checkpoint, and checks good and bad checkpoints (a vision family, a text model
    through mlx-lm's files, a family refused under --kv-bits, the folder mistakes), every
    answer is the one the checks give and no MLX module is loaded."""
    text = (tiny_model("qwen3") / "config.json").read_text()
    checks = {
        "qwen2_vl": [str(tiny_model("qwen2_vl")), 0],
        "qwen3 (text, kv-bits 4)": [str(tiny_model("qwen3")), 4],
        "qwen3_5": [str(tiny_model("qwen3_5")), 0],
        "qwen3_5 kv-bits 8": [str(tiny_model("qwen3_5")), 8],
        "empty": [_folder(tmp_path, "empty", None), 0],
        "not json": [_folder(tmp_path, "bad", "{bad"), 0],
        "bert": [_folder(tmp_path, "bert", '{"model_type": "bert"}', weights=True), 0],
        "vision keys": [_folder(tmp_path, "vl", '{"model_type": "llama", "vision_config": {}}'), 0],
        "no weights": [_folder(tmp_path, "noweights", text), 0],
        "bad hub id": ["bad repo!!", 0],
    }
    cases = {"tiny": str(tiny_model("qwen2_vl")), "checks": checks}
    env = {
        **os.environ,
        "PYTHONPATH": str(Path(__file__).resolve().parents[2]),
        "VISION_GATEWAY_CACHE": str(tmp_path / "cache"),  # the embedded model: not built yet
    }
    done = subprocess.run(
        [sys.executable, "-c", SCRIPT, json.dumps(cases)],
        capture_output=True,
        text=True,
        timeout=600,
        env=env,
    )
    assert done.returncode == 0, done.stderr[-4000:]
    out = json.loads(done.stdout.strip().splitlines()[-1])

    (built, noticed, progress), (again, noticed_again, quiet) = out["embedded"]
    assert built == again and Path(built).parent == tmp_path / "cache" / "models"
    assert (Path(built) / "config.json").is_file() and noticed and noticed_again
    assert (
        progress[0] == "embedded model: training tokenizer" and "embedded model: done" in progress
    )
    assert not any(line.startswith("embedded model:") for line in quiet)  # nothing built
    assert out["tiny"] == [cases["tiny"], None]

    got = out["checks"]
    assert got["qwen2_vl"] == got["qwen3 (text, kv-bits 4)"] == got["qwen3_5"] == "ok"
    assert got["qwen3_5 kv-bits 8"].startswith(
        "ValueError: --kv-bits 8: qwen3_5 keeps recurrent-state layers (a hybrid model)"
    )
    assert got["empty"].endswith("holds no config.json: not a model checkpoint folder")
    assert "config.json is not valid JSON" in got["not json"]
    assert got["bert"].startswith("UnsupportedModel: unsupported model type 'bert'")
    assert got["vision keys"].startswith("UnsupportedModel: unsupported model type 'llama'")
    assert got["no weights"].endswith("holds no *.safetensors weights")
    assert got["bad hub id"].startswith("ValueError: not a local folder, nor a hub id")
    assert out["refused"].startswith(f"--model {checks['bert'][0]}: unsupported model type")
    assert out["mlx"] == []
