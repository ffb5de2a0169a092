"""Benchmark plots.

Pinned: a plot is a real PNG with one line per run; without matplotlib the benchmark still
works (the function says False instead of raising).
"""

from __future__ import annotations

import builtins
from pathlib import Path

import pytest

from bench.load import plot_rss
from bench.plots import line_plot


def test_rss_plot_writes_a_png(tmp_path: Path) -> None:
    """Invariant: --plot writes a PNG file."""
    pytest.importorskip("matplotlib")
    out = tmp_path / "rss.png"
    assert plot_rss({"a": [[0, 100.0], [1, 101.0]], "b": [[0, 99.0], [1, 99.5]]}, str(out))
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_missing_matplotlib_is_not_an_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Invariant: without matplotlib the plot is skipped (False), nothing raises."""
    real_import = builtins.__import__

    def no_matplotlib(name: str, *args: object, **kwargs: object) -> object:
        if name.startswith("matplotlib"):
            raise ImportError(name)
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", no_matplotlib)
    out = tmp_path / "x.png"
    assert not line_plot({"a": ([0], [1])}, str(out), xlabel="x", ylabel="y", title="t")
    assert not out.exists()
