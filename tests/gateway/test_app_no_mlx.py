"""The HTTP process imports no MLX: the app, built as `serve` builds it (the engine in its own
process, `RemoteEngine`), starts on the tiny Qwen2-VL checkpoint and answers a chat request
with an image, and neither `mlx`, `mlx_lm` nor `mlx_vlm` was ever imported in its process
(the prompt side came from the engine process as a `PromptProcessor`).

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
    import base64, io, json, sys
    from PIL import Image
    from starlette.testclient import TestClient
    from gateway.app import create_app
    from gateway.config import EngineConfig, MediaConfig, ServerConfig

    path = sys.argv[1]
    engine = EngineConfig(model=path, served_model_name="test", warmup=False)
    app = create_app(ServerConfig(), engine, MediaConfig())
    buf = io.BytesIO()
    Image.new("RGB", (56, 56), (200, 40, 40)).save(buf, format="PNG")
    uri = "data:image/png;base64," + base64.b64encode(buf.getvalue()).decode()
    content = [{"type": "image_url", "image_url": {"url": uri}}, "what is this?"]
    content[1] = {"type": "text", "text": content[1]}
    body = {"model": "test", "max_tokens": 4, "temperature": 0,
            "messages": [{"role": "user", "content": content}]}
    with TestClient(app) as client:
        answer = client.post("/v1/chat/completions", json=body)
        card = client.get("/v1/models").json()["data"][0]
    loaded = sorted(m for m in sys.modules if m.split(".")[0] in ("mlx", "mlx_lm", "mlx_vlm"))
    print(json.dumps({"status": answer.status_code, "usage": answer.json().get("usage"),
                      "family": card.get("family"), "mlx": loaded}))
    """
)


def _serve_once(model: Path) -> dict:
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2])}
    done = subprocess.run(
        [sys.executable, "-c", SCRIPT, str(model)],
        capture_output=True,
        text=True,
        timeout=600,
        env=env,
    )
    assert done.returncode == 0, done.stderr[-4000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_the_http_process_serves_a_chat_request_without_importing_mlx() -> None:
    """Invariant: with the engine in its own process, the HTTP process answers an image
    request (200, the image's tokens counted, the family's card shown) and has no `mlx`,
    `mlx_lm` or `mlx_vlm` module loaded."""
    result = _serve_once(tiny_model("qwen2_vl"))
    assert result["status"] == 200
    assert result["usage"]["prompt_tokens"] > 4  # the image's placeholder run is there
    assert result["family"] == "qwen_vl"
    assert result["mlx"] == []
