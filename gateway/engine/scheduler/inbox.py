"""What other threads send the engine thread (its inbox), and the MLX switches set before the
model first runs. Messages are applied on the engine thread in arrival order."""

from __future__ import annotations

import os
from dataclasses import dataclass

from gateway.engine.request import EngineRequest
from gateway.engine.scheduler.job import Sink


@dataclass(frozen=True)
class Submit:
    request: EngineRequest
    sink: Sink


@dataclass(frozen=True)
class Cancel:
    request_id: str


@dataclass(frozen=True)
class Stop:
    pass


@dataclass(frozen=True)
class ResetCaches:
    pass


Message = Submit | Cancel | Stop | ResetCaches


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
