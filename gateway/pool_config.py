"""Several models behind one endpoint: which models a server offers (`ModelSpec`, one per
model) and how many may be loaded at once (`PoolConfig`), built once at the edge like every
config.

Where the models come from: `--model NAME=PATH` repeated (a bare `--model PATH` keeps the
single-model behaviour and name), or `--models FILE`, a TOML file:

    [models.qwen]                # the served name (what clients send as `model`)
    path = "mlx-community/Qwen2.5-VL-7B-Instruct-4bit"
    aliases = ["vision", "gpt-4o"]
    keep_alive = 600             # seconds idle before it unloads; -1 never; 0 after each use
    pinned = true                # never evicted, never unloaded for being idle
    kv_cache_mb = 1024           # any engine or cache setting of `serve` (its flag's name,
    max_batch = 8                # dashes as underscores), for this model only

The disk tier (`--cache-dir`, `--disk-cache-gb`) is one for all models: its keys carry the
checkpoint's fingerprint, so models never share entries, and a model unloaded and loaded
again finds its own.
"""

from __future__ import annotations

import dataclasses
import tomllib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gateway.config_fields import ConfigError, flag
from gateway.config_fields import require as _require

# Settings one model may not set for itself: the model's identity (the file's own keys) and
# the disk tier, which is the server's.
_SHARED = frozenset({"model", "served_model_name", "cache", "cache_dir", "cache_dir_group"})
_SHARED |= {"disk_cache_gb"}
_SPEC_KEYS = frozenset({"path", "aliases", "keep_alive", "pinned"})


@dataclass(frozen=True)
class ModelSpec:
    """One model the server offers. `keep_alive_s`: seconds it stays loaded once idle
    (negative: until evicted; 0: unloaded once its requests are done; None: the server's
    `--keep-alive`); `pinned`: loaded at start-up, never evicted nor unloaded for idleness;
    `settings`: engine and cache settings of its own, as (field name, value) pairs of
    `EngineConfig` / `CacheConfig`."""

    name: str
    path: str
    aliases: tuple[str, ...] = ()
    keep_alive_s: float | None = None
    pinned: bool = False
    settings: tuple[tuple[str, Any], ...] = ()

    def __post_init__(self) -> None:
        _require(bool(self.name.strip()), f"model {self.path!r}: an empty served name")
        _require(bool(self.path.strip()), f"model {self.name!r}: no path")


@dataclass(frozen=True)
class PoolConfig:
    """How the served models share the machine. A limit of 0 is no limit."""

    model_args: tuple[str, ...] = flag(
        "--model",
        "model to serve: a local dir or hub id, or NAME=PATH (repeatable: several models, "
        "loaded on demand); default: the embedded tiny offline model",
        (),
        kind="list",
        metavar="[NAME=]PATH",
    )
    models_file: Path | None = flag(
        "--models",
        "TOML file of the models to serve (served name, path, aliases, keep_alive, pinned, "
        "per-model settings; docs/operations.md, 'Several models')",
        None,
        metavar="FILE",
    )
    max_loaded: int = flag(
        "--max-loaded-models",
        "models loaded at once; loading one more evicts the least recently used idle one (0: any)",
        0,
    )
    memory_gb: float = flag(
        "--models-memory-gb",
        "GiB the loaded models may take together: each its weights plus its cache budgets; "
        "loading past it evicts the least recently used idle ones (0: no limit)",
        0.0,
    )
    keep_alive_s: float = flag(
        "--keep-alive",
        "seconds a model stays loaded once idle (a model's or request's keep_alive overrides "
        "it); negative (-1): until evicted",
        -1.0,
        metavar="S",
    )
    load_timeout_s: float = flag(
        "--model-load-timeout",
        "seconds a request waits for its model to load (or for room to load it) before a 503",
        600.0,
        metavar="S",
    )
    spare_engine: bool = flag(
        "--no-spare-engine",
        "with several models, keep no spare engine process (imports done, no model) for the "
        "next load; each load then starts a process and pays its imports (~1-2 s)",
        True,
        kind="off",
    )
    specs: tuple[ModelSpec, ...] = ()  # from model_args and models_file (`pool_from_args`)

    def __post_init__(self) -> None:
        _require(self.max_loaded >= 0, "--max-loaded-models must be >= 0")
        _require(self.memory_gb >= 0, "--models-memory-gb must be >= 0")
        _require(self.load_timeout_s > 0, "--model-load-timeout must be > 0")
        names: set[str] = set()
        for spec in self.specs:
            for name in (spec.name, *spec.aliases):
                _require(name not in names, f"the model name {name!r} is given twice")
                names.add(name)

    @property
    def memory_bytes(self) -> int:
        return int(self.memory_gb * 2**30)

    @property
    def several(self) -> bool:
        """More than one model, or a model named in a file or as NAME=PATH."""
        return len(self.specs) > 1 or self.models_file is not None or _named(self.model_args)

    def keep_alive_of(self, spec: ModelSpec) -> float:
        return self.keep_alive_s if spec.keep_alive_s is None else spec.keep_alive_s


def _named(args: tuple[str, ...]) -> bool:
    return any(_split_arg(a)[0] is not None for a in args)


def _split_arg(arg: str) -> tuple[str | None, str]:
    """`NAME=PATH` -> (NAME, PATH); a bare path (which may hold `=` after a slash) -> (None,
    path)."""
    name, sep, path = arg.partition("=")
    if not sep or "/" in name or not name:
        return None, arg
    return name, path


def specs_from(args: tuple[str, ...], file: Path | None) -> tuple[ModelSpec, ...]:
    """The models of `--model` arguments (NAME=PATH; a bare path is named by its folder)
    and of `--models FILE`, in that order. ConfigError names what is wrong."""
    specs = []
    for arg in args:
        name, path = _split_arg(arg)
        if not path.strip():
            raise ConfigError(f"--model {arg!r}: no path after the name")
        specs.append(ModelSpec(name or Path(path).name or path, path))
    if file is not None:
        specs.extend(read_models_file(file))
    return tuple(specs)


def read_models_file(file: Path) -> list[ModelSpec]:
    """The `[models.NAME]` tables of a TOML file (module doc). ConfigError naming the file
    and the model for a missing file, bad TOML, an unknown key or a wrong type."""
    try:
        data = tomllib.loads(Path(file).expanduser().read_text())
    except OSError as exc:
        raise ConfigError(f"--models {file}: cannot read it: {exc.strerror or exc}") from None
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"--models {file}: not valid TOML: {exc}") from None
    models = data.get("models")
    if not isinstance(models, dict) or not models:
        raise ConfigError(f"--models {file}: no [models.NAME] tables")
    unknown = set(data) - {"models"}
    if unknown:
        raise ConfigError(f"--models {file}: unknown top-level keys {sorted(unknown)}")
    return [_spec(file, name, table) for name, table in models.items()]


def _spec(file: Path, name: str, table: Any) -> ModelSpec:
    where = f"--models {file}: [models.{name}]"
    if not isinstance(table, dict):
        raise ConfigError(f"{where} is not a table")
    path = table.get("path")
    if not isinstance(path, str) or not path.strip():
        raise ConfigError(f"{where}: `path` (a local dir or hub id) is required")
    aliases = table.get("aliases", [])
    if not isinstance(aliases, list) or not all(isinstance(a, str) and a for a in aliases):
        raise ConfigError(f"{where}: `aliases` must be a list of names")
    keep = table.get("keep_alive")
    if keep is not None and (isinstance(keep, bool) or not isinstance(keep, (int, float))):
        raise ConfigError(f"{where}: `keep_alive` must be seconds (-1: forever)")
    pinned = table.get("pinned", False)
    if not isinstance(pinned, bool):
        raise ConfigError(f"{where}: `pinned` must be true or false")
    settings = tuple(sorted((k, v) for k, v in table.items() if k not in _SPEC_KEYS))
    for key, _ in settings:
        if key in _SHARED or not _settable(key):
            raise ConfigError(f"{where}: {key!r} is not a per-model setting")
    try:
        return ModelSpec(
            name,
            path,
            tuple(aliases),
            None if keep is None else float(keep),
            pinned,
            settings,
        )
    except ConfigError as exc:
        raise ConfigError(f"{where}: {exc}") from None


def _settable(key: str) -> bool:
    from gateway.config import CacheConfig, EngineConfig

    names = {f.name for f in dataclasses.fields(EngineConfig)}
    names |= {f.name for f in dataclasses.fields(CacheConfig)}
    return key in names


def engine_config_for(spec: ModelSpec, base: Any) -> Any:
    """`base` (the server's `EngineConfig`) for `spec`: its path, served name and own
    settings. ConfigError (naming the model) for a value the config refuses."""
    from gateway.config import CacheConfig

    cache_fields = {f.name for f in dataclasses.fields(CacheConfig)}
    cache = {k: v for k, v in spec.settings if k in cache_fields}
    engine = {k: v for k, v in spec.settings if k not in cache_fields}
    if "warmup_image_sizes" in engine:
        engine["warmup_image_sizes"] = tuple(engine["warmup_image_sizes"])
    try:
        return dataclasses.replace(
            base,
            model=spec.path,
            served_model_name=spec.name,
            cache=dataclasses.replace(base.cache, **cache),
            **engine,
        )
    except (ConfigError, TypeError) as exc:
        raise ConfigError(f"model {spec.name!r}: {exc}") from None
