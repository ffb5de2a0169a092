"""How many bytes the model's device may use, asked of the device where the engine runs (the
engine process reports it to the HTTP process in `wire.Ready`, which bounds the served
context by it: `frontend/context.py`). MLX is asked only for a GPU."""

from __future__ import annotations

import os

# mx.device_info()'s keys for the memory a GPU may use, best first: Metal's recommended
# working set (what the OS lets one process keep resident), else the device's total.
GPU_KEYS = ("max_recommended_working_set_size", "total_memory", "memory_size")


def device_memory(on_gpu: bool) -> int | None:
    """Bytes the model's device may use: the GPU's (Metal's recommended working set, a CUDA
    device's total), else the machine's RAM; None when not reported."""
    if on_gpu:
        import mlx.core as mx

        info = mx.device_info()
        for key in GPU_KEYS:
            size = info.get(key)
            if isinstance(size, int) and size > 0:
                return size
        return None
    try:
        return os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (AttributeError, OSError, ValueError):  # not every platform has these names
        return None
