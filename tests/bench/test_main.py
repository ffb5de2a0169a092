"""`python -m bench`: its own entry point, outside the product package.

Pinned: run from the repository root it offers every bench the product CLI's `bench` subcommand had;
`--plot` without matplotlib stops before any server starts; a `--server-arg` that `serve`
would reject stops with serve's message; the bench modules import one another without a
cycle (shared helpers live in modules both sides import).
"""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

from bench import cli as bench_cli

ROOT = Path(__file__).resolve().parents[2]
BENCHES = (
    "repeat-image", "stall", "load", "engine", "hotpath", "resolution", "text-prefix",
    "concurrency", "agent-loop", "multi-turn", "embeddings",
)  # fmt: skip


def test_python_m_bench_lists_every_bench() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "bench", "--help"],
        cwd=ROOT, capture_output=True, text=True, timeout=120, check=True,
    )  # fmt: skip
    assert "python -m bench" in done.stdout
    for name in BENCHES:
        assert name in done.stdout, name


def test_plot_without_matplotlib_exits_before_running(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    import importlib.util

    real_find_spec = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util,
        "find_spec",
        lambda name, *a: None if name == "matplotlib" else real_find_spec(name, *a),
    )
    ran = []
    monkeypatch.setattr(bench_cli, "_load", lambda args: ran.append(args))
    with pytest.raises(SystemExit) as exit_info:
        bench_cli.main(["load", "--seconds", "1", "--plot", str(tmp_path / "rss.png")])
    assert "matplotlib" in str(exit_info.value) and not ran


def test_server_args_parse_as_serve_flags() -> None:
    """`bench engine --server-arg` reads serve's own flags into serve's own config."""
    cache = bench_cli._engine_cache_config("m", ["--kv-block-tokens=32", "--no-exact-cache"])
    assert cache.kv_block_tokens == 32 and not cache.exact_reuse
    with pytest.raises(SystemExit):  # argparse: not a serve flag
        bench_cli._engine_cache_config("m", ["--no-such-flag"])


def _bench_imports(path: Path) -> set[str]:
    """The bench modules `path` imports, at top level or inside functions."""
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module:
            if node.module == "bench":
                names.update(a.name for a in node.names)
            elif node.module.startswith("bench."):
                names.add(node.module.split(".")[1])
        elif isinstance(node, ast.Import):
            names.update(a.name.split(".")[1] for a in node.names if a.name.startswith("bench."))
    return names


def test_bench_modules_import_without_cycles() -> None:
    modules = {p.stem: p for p in (ROOT / "bench").glob("*.py")}
    graph = {name: _bench_imports(path) & modules.keys() for name, path in modules.items()}
    state: dict[str, str] = {}

    def visit(name: str, trail: list[str]) -> None:
        state[name] = "open"
        for dep in sorted(graph[name]):
            if state.get(dep) == "open":
                pytest.fail("import cycle: " + " -> ".join([*trail, name, dep]))
            if dep not in state:
                visit(dep, [*trail, name])
        state[name] = "done"

    for name in sorted(graph):
        if name not in state:
            visit(name, [])
    assert all(len(p.read_text().splitlines()) <= 400 for p in modules.values())
