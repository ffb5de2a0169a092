"""The command-line flag of a config field (`Flag`, declared with `flag`) and the config
errors: the base that gateway/config.py and gateway/media_config.py build on.
"""

from __future__ import annotations

from dataclasses import MISSING, dataclass, field
from typing import Any

MIB = 1024 * 1024


class ConfigError(ValueError):
    """A configuration value is out of range; the message names the setting."""


def require(ok: bool, message: str) -> None:
    if not ok:
        raise ConfigError(message)


@dataclass(frozen=True)
class Flag:
    """The command-line flag of one config field: `gateway.flags` builds `serve`'s parser and
    reads the parsed values back from these, so a flag is declared once, beside its field.

    kind: "value" (`NAME VALUE`, parsed as the field's type; absent: the field's default),
    "list" (repeatable, a tuple of the field's element type; absent: the field's default,
    which `help` may show as "{default}"), "on" / "off" (a switch that sets the field True /
    False), "both" (`NAME` and its `--no-` form). `env`: an environment variable read when the
    flag is absent or empty (secrets stay out of `ps` and shell history). `off`: a second
    switch (with `off_help`) that sets the field to None (a part turned off).
    """

    name: str
    help: str
    kind: str = "value"
    metavar: str | None = None
    choices: tuple[str, ...] | None = None
    env: str | None = None
    off: str | None = None
    off_help: str = ""


def flag(
    name: str, help: str, default: Any = MISSING, *, factory: Any = MISSING, **options: Any
) -> Any:
    """A dataclass field with `default` (or `factory`, as `default_factory`) whose
    command-line flag is `Flag(name, help, **options)`."""
    metadata = {"flag": Flag(name, help, **options)}
    return field(default=default, default_factory=factory, metadata=metadata)
