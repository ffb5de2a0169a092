"""The MLX switch for cuDNN attention, set by the engine thread before the model first runs."""

from __future__ import annotations

import os


def disable_cudnn_attention() -> None:
    """Route MLX's CUDA attention to its own kernels instead of cuDNN (no effect elsewhere).

    MLX caches one cuDNN attention plan per (batch, heads, query length, key length) and
    builds a new one, tens of milliseconds, for every new pair. A server meets new pairs all
    the time (every prompt length, every turn's cached prefix, every image grid in the
    tower), so the build lands in time to first token. MLX reads the switch once, at the
    first attention call: set it before the model runs. (0.32 reads ..._SDPA; 0.30 read the
    misspelt ..._SPDA, set too so that a pin change cannot silently turn cuDNN back on.)
    """
    for name in ("MLX_CUDA_USE_CUDNN_SPDA", "MLX_CUDA_USE_CUDNN_SDPA"):
        os.environ.setdefault(name, "0")
