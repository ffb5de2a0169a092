"""`serve`'s flags, generated from the config dataclasses' field metadata (`gateway.config.Flag`):
each flag is declared once, beside its field, with its help text; its type and default are the
field's. Used by `serve`, `cluster` (every replica gets them) and the bench.

`add_serve_flags(parser)` adds them to an argparse parser; `configs_from_args(ns)` turns the
parsed values into the frozen configs (the one place they do), so no Namespace travels below
the command line.
"""

from __future__ import annotations

import argparse
import dataclasses
import math
import os
import types
import typing
from pathlib import Path
from typing import Any, NoReturn

from gateway.config import (
    CacheConfig,
    ConfigError,
    EngineConfig,
    Flag,
    MediaConfig,
    ResponsesConfig,
    ServerConfig,
)
from gateway.pool_config import PoolConfig, specs_from
from gateway.server import default_disk_cache_dir

# The served model name of the embedded tiny model (no --model).
EMBEDDED_MODEL_NAME = "vision-gateway-tiny"
# Help sections of `serve --help`, in order: (config class, title).
SECTIONS: tuple[tuple[type, str], ...] = (
    (PoolConfig, "models"),
    (EngineConfig, "model and engine"),
    (CacheConfig, "caches"),
    (ServerConfig, "HTTP server"),
    (ResponsesConfig, "Responses API"),
    (MediaConfig, "images and video"),
)


class DefaultsFormatter(argparse.HelpFormatter):
    """Appends "(default: X)" where there is a default to show and the help does not already
    say it (argparse's own formatter also prints "(default: None)" and repeats defaults that
    the help text spells out). 0 is a default to show; None, False and [] are not."""

    def _get_help_string(self, action: argparse.Action) -> str:
        text = action.help or ""
        default = action.default
        if "default" in text or default is None or default is False:
            return text
        if default == [] or default is argparse.SUPPRESS:
            return text
        if action.option_strings or action.nargs in (argparse.OPTIONAL, argparse.ZERO_OR_MORE):
            return f"{text} (default: %(default)s)"
        return text


def flagged_fields(config: type) -> list[tuple[dataclasses.Field, Flag]]:
    """The fields of a config dataclass that have a command-line flag, in declaration order."""
    return [(f, f.metadata["flag"]) for f in dataclasses.fields(config) if "flag" in f.metadata]


def add_serve_flags(parser: argparse.ArgumentParser) -> None:
    """Add every `serve` flag to `parser`, one argument group per config dataclass."""
    for config, title in SECTIONS:
        add_config_flags(parser, config, title)


def add_config_flags(parser: argparse.ArgumentParser, config: type, title: str) -> None:
    """Add the flags of `config`'s fields to `parser`, as the argument group `title`."""
    group = parser.add_argument_group(title)
    hints = typing.get_type_hints(config)
    for f, spec in flagged_fields(config):
        _add_flag(group, spec, f, hints[f.name])


def _default(f: dataclasses.Field) -> Any:
    """The field's default (None when it has none)."""
    if f.default_factory is not dataclasses.MISSING:
        return f.default_factory()
    return None if f.default is dataclasses.MISSING else f.default


def _add_flag(group: Any, spec: Flag, f: dataclasses.Field, hint: Any) -> None:
    options: dict[str, Any] = {"help": spec.help}
    if spec.kind in ("on", "off"):
        group.add_argument(spec.name, action="store_true", **options)
        return
    if spec.kind == "both":
        group.add_argument(
            spec.name, action=argparse.BooleanOptionalAction, default=f.default, **options
        )
        return
    if spec.metavar:
        options["metavar"] = spec.metavar
    if spec.choices:
        options["choices"] = list(spec.choices)
    if spec.kind == "list":
        element = _parse_type(typing.get_args(hint)[0])
        if _default(f):
            options["help"] = spec.help.format(default=" and ".join(map(str, _default(f))))
        group.add_argument(spec.name, action="append", type=element, **options)
    else:
        group.add_argument(spec.name, type=_parse_type(hint), default=_default(f), **options)
    if spec.off:
        group.add_argument(spec.off, action="store_true", help=spec.off_help)


def _parse_type(hint: Any) -> Any:
    """argparse's `type` for a field's annotation: the non-None member of an optional, and
    None (argparse's str) for str."""
    if isinstance(hint, types.UnionType) or typing.get_origin(hint) is typing.Union:
        hint = next(a for a in typing.get_args(hint) if a is not type(None))
    if hint is float:
        return finite_float
    if hint is Path:
        return nonempty_path
    return None if hint is str else hint


def finite_float(text: str) -> float:
    """argparse's type for float flags: a number, never inf or nan (budgets and times are
    multiplied into byte counts and deadlines, where either would crash or mean nothing)."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
    if not math.isfinite(value):
        raise argparse.ArgumentTypeError(f"{text!r}: give a finite number")
    return value


def nonempty_path(text: str) -> Path:
    """argparse's type for path flags: an empty value (`--allowed-media-dir "$DIR"` with DIR
    unset) is refused, not read as the working directory (at `/`, the whole file system)."""
    if not text.strip():
        raise argparse.ArgumentTypeError("empty: an unset variable?")
    return Path(text)


class BriefParser(argparse.ArgumentParser):
    """An argument parser whose usage errors are one line and a pointer to --help (argparse
    prints the whole usage first: for `serve`, fifty lines above the one that matters)."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


def _dest(name: str) -> str:
    return name.lstrip("-").replace("-", "_")


def _value(ns: argparse.Namespace, spec: Flag, f: dataclasses.Field) -> Any:
    """The field's value from the parsed flags."""
    given = getattr(ns, _dest(spec.name))
    if spec.kind == "on":
        return given
    if spec.kind == "off":
        return not given
    if spec.kind == "list":
        return tuple(given) if given else _default(f)
    if spec.off and getattr(ns, _dest(spec.off)):
        return None
    if spec.env:  # an empty value given is kept (and refused by the config), not replaced
        return given if given is not None else os.environ.get(spec.env)
    return given


def build_config(config: type, ns: argparse.Namespace, **derived: Any) -> Any:
    """`config` from the values of its flags (added by `add_config_flags`) in `ns`; `derived`
    gives the fields computed otherwise. Raises ConfigError on an out-of-range value."""
    values = {f.name: _value(ns, spec, f) for f, spec in flagged_fields(config)}
    return config(**{**values, **derived})


# (the switch that turns a feature off, flags that only mean something with it on)
_OFF_WITH = (
    ("no_disk_cache", "--no-disk-cache", ("cache_dir", "disk_cache_gb", "cache_dir_group")),
    ("no_vision_cache", "--no-vision-cache", ("vision_cache_mb",)),
    ("no_prefix_cache", "--no-prefix-cache", ("kv_cache_mb",)),
)


def check_contradictions(ns: argparse.Namespace) -> None:
    """ConfigError when a feature is switched off and a flag that only tunes it is given too
    (`--no-disk-cache --cache-dir X`): one of them is a mistake, and silently dropping the
    other hid it. A flag left at its default counts as not given."""
    defaults = CacheConfig()
    for switch, name, tuned in _OFF_WITH:
        if not getattr(ns, switch):
            continue
        for dest in tuned:
            if getattr(ns, dest) not in (None, getattr(defaults, dest)):
                flag = "--" + dest.replace("_", "-")
                raise ConfigError(f"{name} and {flag} contradict each other: give one of them")


def configs_from_args(ns: argparse.Namespace) -> tuple[ServerConfig, EngineConfig, MediaConfig]:
    """The configs `serve` runs with, from a namespace parsed with `add_serve_flags`' flags.
    Raises ConfigError on an out-of-range value (its message names the flag)."""
    server = build_config(ServerConfig, ns, responses=build_config(ResponsesConfig, ns))
    check_contradictions(ns)
    cache = build_config(CacheConfig, ns)
    # The command line puts the disk tier in the user cache dir unless told otherwise (the
    # dataclass default, None, is what tests and library callers get: off).
    if cache.cache_dir is None and not ns.no_disk_cache:
        cache = dataclasses.replace(cache, cache_dir=default_disk_cache_dir())
    pool = pool_from_args(ns)
    if ns.served_model_name is not None and not ns.served_model_name.strip():
        raise ConfigError("--served-model-name is empty: an unset variable?")
    if pool.several:  # each model is named by its NAME= or [models.NAME]
        if ns.served_model_name is not None:
            raise ConfigError(
                "--served-model-name names a single model: with several, give each its name "
                "as --model NAME=PATH or [models.NAME]"
            )
        first = pool.specs[0]
        model, name = first.path, first.name
    else:
        model = pool.model_args[0] if pool.model_args else ""
        name = ns.served_model_name or (Path(model).name if model else EMBEDDED_MODEL_NAME)
    engine = build_config(EngineConfig, ns, model=model, served_model_name=name, cache=cache)
    return server, engine, build_config(MediaConfig, ns)


def pool_from_args(ns: argparse.Namespace) -> PoolConfig:
    """The served models (`--model`, repeatable, and `--models FILE`) and the pool's limits.
    Without several models (one bare `--model PATH`, or none) `specs` is empty: the
    single-model server. Raises ConfigError naming the flag or the file's entry."""
    pool = build_config(PoolConfig, ns)
    specs = specs_from(pool.model_args, pool.models_file)
    if not pool.several and len(specs) <= 1:
        return pool
    return dataclasses.replace(pool, specs=specs)
