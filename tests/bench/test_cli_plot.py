"""The bench's --plot check (moved with the bench out of the product CLI, `gateway/cli.py`)."""

from __future__ import annotations

import argparse
import importlib.util

import pytest

from bench.cli import add_bench_parser, require_plotting


def _bench_args(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    add_bench_parser(parser.add_subparsers(dest="command"))
    return parser.parse_args(["bench", *argv])


def test_a_plot_without_matplotlib_fails_before_the_bench_runs(
    monkeypatch: pytest.MonkeyPatch, tmp_path
) -> None:
    """Invariant: `bench ... --plot FILE` without matplotlib exits with a message naming the
    missing package, before any server starts (it used to write nothing and say nothing);
    without --plot the check lets the bench run."""
    real_find_spec = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util,
        "find_spec",
        lambda name, *a: None if name == "matplotlib" else real_find_spec(name, *a),
    )
    with pytest.raises(SystemExit) as exit_info:
        require_plotting(_bench_args("load", "--seconds", "1", "--plot", str(tmp_path / "a.png")))
    assert "matplotlib" in str(exit_info.value)
    require_plotting(_bench_args("load", "--seconds", "1"))
