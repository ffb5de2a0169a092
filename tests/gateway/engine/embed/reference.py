"""mlx-vlm's own embedding path, the reference the embedders are pinned against: the model
and processor loaded as mlx-vlm's server loads an embedding model
(`load_embedding_model`, `read_pooling_config`, `load_processor`) and its server's own
functions for a text (`_embed`) and an image (`_embed_image`)."""

from __future__ import annotations

import base64
import io
from pathlib import Path
from typing import Any

import numpy as np
from PIL import Image


class Reference:
    """One checkpoint loaded the reference way."""

    def __init__(self, path: Path) -> None:
        from mlx_vlm.embedding_loader import load_embedding_model
        from mlx_vlm.models.pooling import read_pooling_config
        from mlx_vlm.utils import load_processor

        self.model: Any = load_embedding_model(path)
        self.model.pooling_config = read_pooling_config(path)
        self.processor = load_processor(path, add_detokenizer=False)

    def _fresh(self) -> None:
        # Qwen3-VL's language model keeps the last call's positions and reuses them for a
        # shorter text-only input: each reference call starts from none, as a fresh load does.
        lm = getattr(self.model, "language_model", None)
        if lm is not None:
            lm._position_ids = None
            lm._rope_deltas = None

    def text(self, text: str) -> np.ndarray:
        from mlx_vlm.server.embeddings import _embed

        self._fresh()
        vectors, _ = _embed(self.model, self.processor, [text])
        return np.array(vectors[0], dtype=np.float32)

    def image(self, image: Image.Image) -> np.ndarray:
        from mlx_vlm.server.embeddings import _embed_image

        self._fresh()
        buffer = io.BytesIO()
        image.save(buffer, format="PNG")
        uri = "data:image/png;base64," + base64.b64encode(buffer.getvalue()).decode()
        vector, _ = _embed_image(self.model, self.processor, uri)
        return np.array(vector, dtype=np.float32)
