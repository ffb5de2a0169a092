"""The command line: flags take their defaults from the config dataclasses (one source), the
help shows each default once and every flag has help, and --version answers."""

from __future__ import annotations

import re

import pytest

from gateway.cli import build_parser, configs_from_args, main
from gateway.config import CacheConfig, EngineConfig, MediaConfig, ServerConfig


def test_no_flags_give_the_config_dataclasses_defaults() -> None:
    """Invariant: `serve` with no flags builds exactly the dataclasses' default configs."""
    server, engine, media = configs_from_args(build_parser().parse_args(["serve"]))
    assert server == ServerConfig()
    assert media == MediaConfig()
    assert engine == EngineConfig(model="", served_model_name="vision-gateway-tiny")
    assert engine.cache == CacheConfig()


def _serve_help(capsys: pytest.CaptureFixture[str]) -> str:
    with pytest.raises(SystemExit):
        build_parser().parse_args(["serve", "--help"])
    return capsys.readouterr().out


def test_help_shows_each_default_once_and_never_none(capsys: pytest.CaptureFixture[str]) -> None:
    text = " ".join(_serve_help(capsys).split())
    assert "(default: None)" not in text
    options = re.split(r" (?=--[a-z])", text.split("options:", 1)[1])
    for option in options:
        assert option.count("default:") <= 1, option


def test_every_flag_has_help() -> None:
    parser = build_parser()
    sub = next(a for a in parser._actions if a.dest == "command")
    for name in ("serve", "make-model"):  # bench flags: gateway/bench/cli.py
        command = sub.choices[name]  # type: ignore[union-attr]
        for action in command._actions:
            assert action.help, f"{name} {action.option_strings or action.dest} has no help"


def test_version(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as info:
        build_parser().parse_args(["--version"])
    assert info.value.code == 0
    assert re.fullmatch(r"vision-gateway \S+\n", capsys.readouterr().out)


def test_a_plot_without_matplotlib_fails_before_the_bench_runs(
    monkeypatch: pytest.MonkeyPatch, tmp_path
) -> None:
    """Invariant: `bench ... --plot FILE` without matplotlib exits with a message naming the
    missing package, before any server starts (it used to write nothing and say nothing)."""
    import importlib.util

    real_find_spec = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util,
        "find_spec",
        lambda name, *a: None if name == "matplotlib" else real_find_spec(name, *a),
    )
    ran = []
    from gateway.bench import cli as bench_cli

    monkeypatch.setattr(bench_cli, "_load", lambda args: ran.append(args))
    with pytest.raises(SystemExit) as exit_info:
        main(["bench", "load", "--seconds", "1", "--plot", str(tmp_path / "rss.png")])
    assert "matplotlib" in str(exit_info.value) and not ran
