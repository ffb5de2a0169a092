"""The served models' configuration (gateway.pool_config, gateway.flags.pool_from_args): what
`--model NAME=PATH` and `--models FILE` give, and what they refuse.

Pinned: a bare `--model PATH` is the single-model server (no specs, its folder's name); NAME=PATH
names a model, a path holding `=` after a slash stays a path; the TOML file gives aliases,
keep_alive, pinned and per-model engine and cache settings (engine_config_for applies them,
the disk tier stays the server's); every mistake is a ConfigError naming the flag, the file and
the model: unreadable or invalid TOML, no tables, a missing path, a wrong type, an unknown or
shared setting, a name given twice, --served-model-name with several models, a model larger
than --models-memory-gb.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest

from gateway.config import ConfigError, EngineConfig
from gateway.flags import add_serve_flags, configs_from_args, pool_from_args
from gateway.pool.build import model_slots
from gateway.pool_config import ModelSpec, PoolConfig, engine_config_for, specs_from


def _parse(*argv: str) -> tuple[EngineConfig, PoolConfig]:
    parser = argparse.ArgumentParser()
    add_serve_flags(parser)
    ns = parser.parse_args(list(argv))
    return configs_from_args(ns)[1], pool_from_args(ns)


def test_a_bare_model_is_the_single_model_server(tmp_path: Path) -> None:
    engine, pool = _parse("--model", str(tmp_path / "my-model"))
    assert pool.specs == () and not pool.several
    assert engine.model == str(tmp_path / "my-model") and engine.served_model_name == "my-model"


def test_named_models_are_several(tmp_path: Path) -> None:
    engine, pool = _parse("--model", "a=/m/a", "--model", "/m/b", "--max-loaded-models", "1")
    assert [(s.name, s.path) for s in pool.specs] == [("a", "/m/a"), ("b", "/m/b")]
    assert (engine.model, engine.served_model_name) == ("/m/a", "a")
    assert pool.several and pool.max_loaded == 1
    assert specs_from(("/m/x=y",), None) == (ModelSpec("x=y", "/m/x=y"),)  # a path with '='


TOML = """
[models.qwen]
path = "/m/qwen"
aliases = ["vision", "gpt-4o"]
keep_alive = 600
pinned = true
kv_cache_mb = 1024
max_batch = 8

[models.text]
path = "/m/text"
"""


def test_the_models_file_gives_aliases_keep_alive_pins_and_settings(tmp_path: Path) -> None:
    file = tmp_path / "models.toml"
    file.write_text(TOML)
    engine, pool = _parse("--models", str(file), "--kv-cache-mb", "64")
    qwen, text = pool.specs
    assert (qwen.name, qwen.aliases, qwen.keep_alive_s, qwen.pinned) == (
        "qwen",
        ("vision", "gpt-4o"),
        600.0,
        True,
    )
    own = engine_config_for(qwen, engine)
    assert (own.model, own.served_model_name, own.max_batch) == ("/m/qwen", "qwen", 8)
    assert own.cache.kv_cache_mb == 1024 and own.cache.cache_dir == engine.cache.cache_dir
    assert engine_config_for(text, engine).cache.kv_cache_mb == 64  # the server's
    assert pool.keep_alive_of(text) == pool.keep_alive_s == -1


@pytest.mark.parametrize(
    ("text", "names"),
    [
        ("not toml [", "not valid TOML"),
        ("[other]\nx = 1", "no [models.NAME] tables"),
        ("[models.a]\npath = 3", "[models.a]: `path`"),
        ('[models.a]\npath = "/m"\naliases = "x"', "`aliases` must be a list"),
        ('[models.a]\npath = "/m"\nkeep_alive = "5m"', "`keep_alive` must be seconds"),
        ('[models.a]\npath = "/m"\npinned = 1', "`pinned` must be true or false"),
        ('[models.a]\npath = "/m"\nmax_batchh = 2', "'max_batchh' is not a per-model setting"),
        ('[models.a]\npath = "/m"\ncache_dir = "/x"', "'cache_dir' is not a per-model setting"),
        ('[models.a]\npath = "/m"\n[models.b]\npath = "/n"\naliases = ["a"]', "given twice"),
        ('[models.a]\npath = "/m"\n[zzz]\nq = 1', "unknown top-level keys ['zzz']"),
    ],
)
def test_a_bad_models_file_is_a_config_error_naming_it(
    tmp_path: Path, text: str, names: str
) -> None:
    file = tmp_path / "models.toml"
    file.write_text(text)
    with pytest.raises(ConfigError) as refused:
        _parse("--models", str(file))
    message = str(refused.value)
    assert names in message
    if "twice" not in names:  # (a name given twice is the whole server's mistake)
        assert str(file) in message


def test_mistakes_on_the_command_line_are_config_errors(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="cannot read it"):
        _parse("--models", str(tmp_path / "missing.toml"))
    with pytest.raises(ConfigError, match="no path after the name"):
        _parse("--model", "a=")
    with pytest.raises(ConfigError, match="--served-model-name names a single model"):
        _parse("--model", "a=/m/a", "--served-model-name", "x")
    with pytest.raises(ConfigError, match="given twice"):
        _parse("--model", "a=/m/a", "--model", "a=/m/b")
    file = tmp_path / "models.toml"
    file.write_text('[models.a]\npath = "/m"\nmax_batch = 0')
    engine, pool = _parse("--models", str(file))
    with pytest.raises(ConfigError, match="model 'a': --max-batch must be >= 1"):
        engine_config_for(pool.specs[0], engine)


def test_a_model_over_the_memory_budget_is_refused(tmp_path: Path) -> None:
    folder = tmp_path / "big"
    folder.mkdir()
    (folder / "model.safetensors").write_bytes(b"\0" * 4096)
    engine, pool = _parse("--model", f"big={folder}", "--model", "b=/m/b")
    budget = PoolConfig(memory_gb=1 / 2**30, specs=pool.specs)  # 1 byte
    with pytest.raises(ConfigError, match="model 'big' needs .* --models-memory-gb"):
        model_slots(budget, engine, lambda c: None)  # type: ignore[arg-type, return-value]
