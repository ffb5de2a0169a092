"""A checkpoint's `config.json`, read without loading anything else (no MLX)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any


def read_config(path: str) -> dict[str, Any]:
    """The checkpoint's config.json: from the directory, else from the Hugging Face cache or
    hub (the loaders fetch the rest)."""
    local = Path(path).expanduser() / "config.json"
    if local.is_file():
        return json.loads(local.read_text())
    from huggingface_hub import hf_hub_download  # slow import: hub ids only

    return json.loads(Path(hf_hub_download(path, "config.json")).read_text())
