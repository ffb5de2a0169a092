"""`python -m docs.investigations.snapshot_cost` (CPU): it runs and its byte accounting is the
shapes' arithmetic (24 recurrent layers of a 2 MiB float32 state and a 3 x 8192 bf16 window,
8 attention layers of 4 x 256 bf16 keys and values per token)."""

from __future__ import annotations

import json
import sys

import pytest

from docs.investigations import snapshot_cost


def test_snapshot_bytes_are_the_shapes_arithmetic(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(sys, "argv", ["snapshot_cost", "--block", "16", "--reps", "1"])
    snapshot_cost.main()
    out = json.loads(capsys.readouterr().out)
    snapshot = 24 * (32 * 128 * 128 * 4 + 3 * 8192 * 2)
    kv = 8 * 16 * 2 * 4 * 256 * 2
    assert out["snapshot_mib"] == round(snapshot / 2**20, 2)
    assert out["kv_mib"] == round(kv / 2**20, 2)
    assert set(out["ms"]) == {"mark", "store", "restore", "merge", "disk_write", "disk_read"}
