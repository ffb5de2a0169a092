"""The command line: flags take their defaults from the config dataclasses (one source), the
help shows each default once and every flag has help, --version answers, and `bench` (no
longer a subcommand) says where it went."""

from __future__ import annotations

import re

import pytest

from gateway.cli import build_parser, main
from gateway.config import CacheConfig, ConfigError, EngineConfig, MediaConfig, ServerConfig
from gateway.flags import configs_from_args
from gateway.server import default_disk_cache_dir


def test_no_flags_give_the_config_dataclasses_defaults() -> None:
    """Invariant: `serve` with no flags builds exactly the dataclasses' default configs, but
    for the disk tier's folder: the dataclass has none (off: what tests and library callers
    build), the command line puts it in the user cache dir."""
    server, engine, media = configs_from_args(build_parser().parse_args(["serve"]))
    assert server == ServerConfig()
    assert media == MediaConfig()
    cache = CacheConfig(cache_dir=default_disk_cache_dir())
    assert engine == EngineConfig(model="", served_model_name="vision-gateway-tiny", cache=cache)


def test_disk_cache_flags(monkeypatch: pytest.MonkeyPatch, tmp_path) -> None:  # noqa: ANN001
    """Invariant: the disk tier defaults to disk-cache/ under $VISION_GATEWAY_CACHE (the user
    cache dir), --cache-dir moves it, --no-disk-cache turns it off, --disk-cache-gb sizes it
    (GiB), and a negative budget is refused naming the flag."""
    monkeypatch.setenv("VISION_GATEWAY_CACHE", str(tmp_path))

    def cache(*argv: str) -> CacheConfig:
        return configs_from_args(build_parser().parse_args(["serve", *argv]))[1].cache

    assert cache().cache_dir == tmp_path / "disk-cache"
    assert cache().disk_capacity_bytes == 10 * 2**30
    assert cache("--cache-dir", str(tmp_path / "x")).cache_dir == tmp_path / "x"
    assert cache("--no-disk-cache").cache_dir is None
    assert cache("--no-disk-cache").disk_capacity_bytes == 0
    assert cache("--disk-cache-gb", "0.5").disk_capacity_bytes == 2**29
    with pytest.raises(ValueError, match="--disk-cache-gb"):
        cache("--disk-cache-gb", "-1")


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
    for name in ("serve", "cluster", "make-model"):
        command = sub.choices[name]  # type: ignore[union-attr]
        for action in command._actions:
            assert action.help, f"{name} {action.option_strings or action.dest} has no help"


def test_version(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as info:
        build_parser().parse_args(["--version"])
    assert info.value.code == 0
    assert re.fullmatch(r"vision-gateway \S+\n", capsys.readouterr().out)


def test_make_model_help_shows_the_seed_default(capsys: pytest.CaptureFixture[str]) -> None:
    """A default of 0 is shown like any other (it used to be hidden as if it were None)."""
    with pytest.raises(SystemExit):
        build_parser().parse_args(["make-model", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert "--seed SEED weights seed (default: 0)" in text


def test_serve_help_names_the_three_apis(capsys: pytest.CaptureFixture[str]) -> None:
    text = " ".join(_serve_help(capsys).split())
    assert "OpenAI Chat Completions, Responses and Anthropic Messages APIs" in text


def test_bench_is_not_a_product_command(capsys: pytest.CaptureFixture[str]) -> None:
    """Invariant: `vision-gateway bench ...` (the bench left the wheel) exits with a usage error
    that says to run `python -m bench` from a source checkout, and runs nothing."""
    with pytest.raises(SystemExit) as exit_info:
        main(["bench", "load", "--seconds", "1"])
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert "python -m bench" in err and "source checkout" in err, err
    assert "invalid choice" not in err


@pytest.mark.parametrize(
    ("flags", "says"),
    [
        (["--kv-cache-mb", "inf"], "'inf': give a finite number"),
        (["--vision-cache-mb", "nan"], "'nan': give a finite number"),
        (["--vision-cache-mb", "abc"], "'abc' is not a number"),
        (["--bogus"], "unrecognized arguments: --bogus (see vision-gateway serve --help)"),
        (["--modle", "x"], "--modle x; did you mean --model (for --modle)?"),
    ],
)
def test_a_bad_flag_is_one_line_naming_it(
    flags: list[str], says: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """Invariant: a flag value argparse refuses (inf and nan included: budgets become byte
    counts, where inf crashed with an OverflowError) is one line naming it, status 2, without
    the fifty lines of usage argparse prints first; a flag serve does not have points to
    serve's --help and names the closest flag it has."""
    with pytest.raises(SystemExit) as exit_info:
        main(["serve", *flags])
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and says in err and "--help" in err, err


@pytest.mark.parametrize(
    ("flags", "says"),
    [
        (["--mlx-cache-limit-mb", "-1"], "--mlx-cache-limit-mb must be in 0..2^30"),
        (["--disk-cache-gb", "1e308"], "--disk-cache-gb must be in 0..2^30"),  # finite, no int
        (["--step-trace", "/tmp"], "--step-trace /tmp: is a folder"),
    ],
)
def test_a_bad_engine_flag_is_a_config_error(flags: list[str], says: str) -> None:
    """Invariant: values that crashed the engine at start-up with two tracebacks and status 3
    (a TypeError from MLX, an IsADirectoryError) are refused with the config."""
    with pytest.raises(ConfigError, match=re.escape(says)):
        _configs(*flags)


def _configs(*flags: str) -> object:
    """serve's configs from these flags (never starts a server, whatever they hold)."""
    return configs_from_args(build_parser().parse_args(["serve", *flags]))


@pytest.mark.parametrize(
    "flags",
    [
        ["--no-disk-cache", "--cache-dir", "/tmp/somewhere"],
        ["--no-disk-cache", "--disk-cache-gb", "5"],
        ["--no-vision-cache", "--vision-cache-mb", "100"],
        ["--no-prefix-cache", "--kv-cache-mb", "100"],
    ],
)
def test_a_feature_switched_off_and_tuned_is_refused(flags: list[str]) -> None:
    """Invariant: turning a cache off and sizing it in one command line is an error naming
    both flags (was: the sizing silently dropped)."""
    with pytest.raises(ConfigError) as refused:
        _configs(*flags)
    message = str(refused.value)
    assert "contradict" in message and flags[0] in message and flags[1] in message


def test_a_missing_allowed_media_dir_is_refused(tmp_path) -> None:  # noqa: ANN001
    """Invariant: `--allowed-media-dir` naming no folder (a typo) is a start-up error, not a
    server refusing every local path; an empty one (an unset variable) is a usage error, not
    the working directory (at `/`: the whole file system)."""
    with pytest.raises(ConfigError, match="--allowed-media-dir .*: not a folder"):
        _configs("--allowed-media-dir", str(tmp_path / "nope"))

    for flag in ("--allowed-media-dir", "--cache-dir", "--api-keys-file"):
        with pytest.raises(SystemExit) as exit_info:
            build_parser().parse_args(["serve", flag, ""])
        assert exit_info.value.code == 2, flag
    with pytest.raises(ConfigError, match="--served-model-name is empty"):
        _configs("--served-model-name", " ")
