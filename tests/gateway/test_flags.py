"""`serve`'s flags are generated from the config fields' metadata: every flag is declared on
exactly one field, and each one's parsed value reaches that field (derived ones included)."""

from __future__ import annotations

import argparse
import dataclasses
import typing
from typing import Any

import pytest

from gateway.config import CacheConfig, EngineConfig, Flag, MediaConfig, ServerConfig
from gateway.flags import (
    SECTIONS,
    add_serve_flags,
    configs_from_args,
    flagged_fields,
    pool_from_args,
)
from gateway.pool_config import PoolConfig


def _namespace(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    add_serve_flags(parser)
    return parser.parse_args(list(argv))


def _parse(*argv: str) -> tuple[ServerConfig, EngineConfig, MediaConfig]:
    return configs_from_args(_namespace(*argv))


def _config_of(config: type, ns: argparse.Namespace) -> Any:
    server, engine, media = configs_from_args(ns)
    by_type = {
        ServerConfig: server,
        type(server.responses): server.responses,
        EngineConfig: engine,
        CacheConfig: engine.cache,
        MediaConfig: media,
        PoolConfig: pool_from_args(ns),
    }
    return by_type[config]


def _all_flags() -> list[tuple[type, dataclasses.Field, Flag]]:
    return [(config, f, spec) for config, _ in SECTIONS for f, spec in flagged_fields(config)]


def test_every_serve_flag_is_declared_on_one_field() -> None:
    parser = argparse.ArgumentParser()
    add_serve_flags(parser)
    options = {o for a in parser._actions for o in a.option_strings} - {"-h", "--help"}
    declared = [spec.name for _, _, spec in _all_flags()]
    declared += [spec.off for _, _, spec in _all_flags() if spec.off]
    # the "both" kind's negative forms (argparse's BooleanOptionalAction)
    declared += ["--no-" + spec.name[2:] for _, _, spec in _all_flags() if spec.kind == "both"]
    assert len(declared) == len(set(declared))
    assert options == set(declared)


def _numeric(config: type, f: dataclasses.Field) -> type | None:
    """int or float for a numeric field (optional or not), else None."""
    hint = typing.get_type_hints(config)[f.name]
    kinds = [a for a in typing.get_args(hint) or (hint,) if a in (int, float)]
    return kinds[0] if kinds else None


NUMERIC = [(c, f, s) for c, f, s in _all_flags() if s.kind == "value" and _numeric(c, f)]


@pytest.mark.parametrize("config,f,spec", NUMERIC, ids=[s.name for _, _, s in NUMERIC])
def test_a_numeric_flag_sets_its_field(config: type, f: dataclasses.Field, spec: Flag) -> None:
    """Each numeric flag, given a value other than its default, puts it in its own field."""
    kind = _numeric(config, f)
    assert kind is not None
    value = kind((f.default or 0) * 2 or 16)  # (0 / None defaults: a value every such flag takes)
    if spec.choices:  # (--kv-bits: one of its values)
        value = next(c for c in reversed(spec.choices) if c != f.default)
    built = _config_of(config, _namespace(spec.name, str(value)))
    assert getattr(built, f.name) == value, spec.name


def test_switches_lists_and_derived_values(monkeypatch: pytest.MonkeyPatch, tmp_path) -> None:
    monkeypatch.delenv("VISION_GATEWAY_API_KEY", raising=False)
    server, engine, media = _parse(
        "--in-process-engine",
        "--no-warmup",
        "--no-vision-cache",
        "--no-exact-cache",
        "--cudnn-attention",
        "--allow-private-urls",
        "--warmup-image-size",
        "32",
        "--warmup-image-size",
        "64",
        "--allowed-url-host",
        "Example.COM.",
        "--model",
        str(tmp_path / "my-model"),
        "--host",
        "::1",
        "--loop",
        "asyncio",
    )
    assert not server.engine_process and not engine.warmup and not engine.cache.vision_enabled
    assert engine.cache.prefix_enabled and not engine.cache.exact_reuse
    assert engine.cudnn_attention and media.allow_private_urls
    assert engine.warmup_image_sizes == (32, 64) and media.allowed_url_hosts == ("example.com",)
    assert engine.served_model_name == "my-model" and server.host == "::1"
    assert server.loop == "asyncio" and server.api_key is None


def test_keys_come_from_the_environment_unless_given(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("VISION_GATEWAY_API_KEY", "from-env")
    monkeypatch.setenv("VISION_GATEWAY_METRICS_API_KEY", "metrics-env")
    server, _, _ = _parse()
    assert (server.api_key, server.metrics_api_key) == ("from-env", "metrics-env")
    server, _, _ = _parse("--api-key", "flag")
    assert server.api_key == "flag"


def test_max_context_defaults_to_the_checkpoints_own() -> None:
    """Invariant: no --max-context is 0 (the checkpoint's own context, decided at load: see
    tests/gateway/frontend/test_context.py); a value is taken as given from 16 up."""
    assert _parse()[1].max_context_tokens == 0
    assert _parse("--max-context", "16")[1].max_context_tokens == 16
    with pytest.raises(ValueError, match="--max-context"):
        _parse("--max-context", "8")


def test_kv_bits_takes_8_or_4_and_a_group_size() -> None:
    """Invariant: --kv-bits is 0 (off), 8 or 4 and --kv-group-size 32, 64 or 128; other
    values are usage errors, and a config built by hand is checked the same way."""
    cache = _parse("--kv-bits", "4", "--kv-group-size", "32")[1].cache
    assert (cache.kv_bits, cache.kv_group_size) == (4, 32)
    assert (_parse()[1].cache.kv_bits, _parse()[1].cache.kv_group_size) == (0, 64)
    for argv in (["--kv-bits", "3"], ["--kv-group-size", "16"]):
        with pytest.raises(SystemExit):
            _parse(*argv)
    with pytest.raises(ValueError, match="--kv-bits"):
        CacheConfig(kv_bits=2)


def test_bad_values_are_refused_naming_the_flag() -> None:
    with pytest.raises(ValueError, match="--max-video-frames"):
        _parse("--max-video-frames", "0")
    with pytest.raises(SystemExit):  # argparse: not a number
        _parse("--max-batch", "many")
