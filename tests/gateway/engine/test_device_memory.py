"""The memory the engine reports of its device (gateway/engine/device_memory.py), which the
HTTP side bounds the context by without asking MLX itself.

Pinned: on the CPU it is the machine's RAM; on a GPU, Metal's recommended working set before
the device's total, and None when MLX reports neither; the in-process engine says None
before its model is loaded.
"""

from __future__ import annotations

import os

import mlx.core as mx
import pytest

from gateway.config import EngineConfig
from gateway.engine.core import Engine
from gateway.engine.device_memory import device_memory
from gateway.metrics import Metrics


def test_on_the_cpu_it_is_the_machines_ram() -> None:
    ram = os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    assert device_memory(False) == ram > 0


@pytest.mark.parametrize(
    ("info", "want"),
    [
        ({"max_recommended_working_set_size": 48 << 30, "memory_size": 64 << 30}, 48 << 30),
        ({"total_memory": 141 << 30, "architecture": "sm_90"}, 141 << 30),
        ({"architecture": "x86_64", "total_memory": 0}, None),
    ],
)
def test_on_a_gpu_it_is_what_mlx_reports(
    info: dict, want: int | None, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Invariant: the working set a Metal GPU recommends comes before the device's size; a
    device reporting no size (or 0) gives None: no memory bound, never a wrong one."""
    monkeypatch.setattr(mx, "device_info", lambda: info)
    assert device_memory(True) == want


def test_an_engine_not_loaded_reports_none() -> None:
    engine = Engine(EngineConfig("m", "m"), Metrics())
    assert engine.device_memory is None
