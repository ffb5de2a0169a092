"""API keys: who is calling (a tenant, the admin, or anyone on a server without keys), and
the cache scope their requests get.

Keys come from `--api-key` (the tenant "default") and `--api-keys-file` (`NAME KEY` lines,
`#` comments; the name is the tenant), plus `--admin-api-key` (old name `--metrics-api-key`):
the operator's key, for clearing the caches, every cache entry, the dashboard's data and
`/metrics`; it is not a tenant's key. Without an admin key, a server with exactly one tenant
key (or none) treats that key's holder (or everyone) as the admin, as a single-key server
always did; with several tenant keys and no admin key, nobody is.

Keys are compared as SHA-256 digests with `hmac.compare_digest`, every stored key each time
(no early exit), so neither a key's length nor which key matched shows in the timing. The
file is reread on SIGHUP (`Keyring.reload`): the new set replaces the old one in one
assignment, so requests in flight are unaffected and the next request sees the new keys; a
file with a mistake is refused whole (logged) and the old keys stay.
"""

from __future__ import annotations

import hashlib
import hmac
import logging
import stat
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

from starlette.requests import Request

from caches.scope import check_tenant, scope_tag
from gateway.config import ConfigError, ServerConfig
from gateway.errors import APIError

log = logging.getLogger(__name__)
DEFAULT_TENANT = "default"  # the tenant of --api-key
Role = Literal["chat", "read", "admin"]


@dataclass(frozen=True)
class Caller:
    """An authorized caller: `tenant` ("" on a server without tenant keys, or the admin key),
    `admin` (may clear caches, see every entry, the dashboard's data, /metrics) and `owner`
    (what scopes stored Responses: a digest of the presented key, "" without keys)."""

    tenant: str
    admin: bool
    owner: str


@dataclass(frozen=True)
class KeySet:
    """One loaded set of keys (immutable: a reload builds a new one)."""

    tenants: tuple[tuple[bytes, str], ...]  # (SHA-256 of the key, tenant name)
    admin: bytes | None  # SHA-256 of --admin-api-key
    # One tenant's key in the clear, for the server's own warm-up request (None: no tenants).
    warm: str | None = field(default=None, repr=False)

    @property
    def keyed(self) -> bool:
        return bool(self.tenants) or self.admin is not None

    def identify(self, presented: list[str]) -> Caller | None:
        """The caller whose key is one of `presented` (the request's key headers), or None.
        Compares against every key whatever matches (constant time per stored key)."""
        found: Caller | None = None
        only_key = self.admin is None and len(self.tenants) == 1
        for given in presented:
            digest = _digest(given)
            owner = digest.hex()[:32]
            for stored, name in self.tenants:
                if hmac.compare_digest(digest, stored) and found is None:
                    found = Caller(name, only_key, owner)
            if self.admin is not None and hmac.compare_digest(digest, self.admin):
                found = found or Caller("", True, owner)
        return found


def _digest(key: str) -> bytes:
    # Headers are latin-1 on the wire; a key with other characters can never match.
    return hashlib.sha256(key.strip().encode("latin-1", errors="replace")).digest()


def load_keys(server: ServerConfig) -> KeySet:
    """The keys `server` names (reading --api-keys-file). ConfigError naming the file and line
    for a malformed line, a bad or repeated name, or a key given twice."""
    named: list[tuple[str, str]] = []
    if server.api_key:
        named.append((DEFAULT_TENANT, server.api_key))
    if server.api_keys_file is not None:
        named.extend(_read_file(server.api_keys_file))
    names = [n for n, _ in named]
    keys = [k for _, k in named]
    for name in names:
        if names.count(name) > 1:
            where = " (--api-key's tenant is 'default')" if name == DEFAULT_TENANT else ""
            raise ConfigError(f"--api-keys-file: tenant {name!r} is named twice{where}")
    # Compared as the digests authentication compares (`k1` and `k1 ` are one key there).
    owners = [f"tenant {n!r}" for n in names] + ["the admin (--admin-api-key)"]
    given = [_digest(k) for k in keys] + [
        _digest(server.admin_api_key) if server.admin_api_key else None
    ]
    for i, key in enumerate(given):
        twin = next((j for j in range(i) if key is not None and given[j] == key), None)
        if twin is not None:
            raise ConfigError(
                f"--api-keys-file / --api-key / --admin-api-key: a key is given twice, to "
                f"{owners[twin]} and {owners[i]}; every tenant and the admin need keys of "
                "their own"
            )
    admin = _digest(server.admin_api_key) if server.admin_api_key else None
    warm = keys[0] if keys else None
    return KeySet(tuple((_digest(k), n) for n, k in named), admin, warm)


def _read_file(path: Path) -> list[tuple[str, str]]:
    try:
        text = path.read_text(encoding="utf-8")
        mode = path.stat().st_mode
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"--api-keys-file {path}: cannot read it ({exc})") from None
    if mode & (stat.S_IROTH | stat.S_IWOTH | stat.S_IWGRP):
        log.warning("--api-keys-file %s is readable or writable by others: chmod 600 it", path)
    out = []
    for number, line in enumerate(text.splitlines(), 1):
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        parts = line.split()
        if len(parts) != 2:
            raise ConfigError(
                f"--api-keys-file {path}, line {number}: expected `NAME KEY` (two words)"
            )
        try:
            check_tenant(parts[0])
        except ValueError as exc:
            raise ConfigError(f"--api-keys-file {path}, line {number}: {exc}") from None
        out.append((parts[0], parts[1]))
    if not out:  # a server meant to need keys would otherwise serve everyone (or no one)
        raise ConfigError(f"--api-keys-file {path}: holds no `NAME KEY` line")
    return out


def presented_keys(request: Request) -> list[str]:
    """The keys a request presents: `Authorization: Bearer <key>` and `x-api-key: <key>`."""
    keys = []
    scheme, _, token = request.headers.get("authorization", "").partition(" ")
    if scheme.lower() == "bearer" and token.strip():
        keys.append(token.strip())
    api_key = request.headers.get("x-api-key")
    if api_key is not None and api_key.strip():
        keys.append(api_key.strip())
    return keys


class Keyring:
    """The server's current keys and cache-scope mode. Event loop only (a reload is one
    assignment, so any thread reading `keys` sees the old set or the new one)."""

    def __init__(self, server: ServerConfig) -> None:
        self._server = server
        self.keys = load_keys(server)
        self._log_start()

    def _log_start(self) -> None:
        """Say once at start-up whether requests need a key, and what nobody can reach."""
        server, keys = self._server, self.keys
        if not keys.keyed:
            exposed = server.host not in ("127.0.0.1", "localhost", "::1")
            (log.warning if exposed else log.info)(
                "authentication off: every request is served without a key%s",
                f" (listening on {server.host}: give --api-key)" if exposed else "",
            )
            if server.cache_scope == "tenant":
                log.warning("--cache-scope tenant without keys: every request is one tenant")
            return
        given = (("--api-key (or VISION_GATEWAY_API_KEY)", server.api_key),
                 (str(server.api_keys_file), server.api_keys_file))  # fmt: skip
        sources = [name for name, value in given if value]
        log.info(
            "authentication on: %d tenant key(s) from %s%s%s",
            len(keys.tenants),
            " and ".join(sources) or "no tenant source",
            ", an admin key (--admin-api-key)" if keys.admin is not None else "",
            "; SIGHUP rereads the keys file" if server.api_keys_file is not None else "",
        )
        if keys.admin is None and len(keys.tenants) > 1:
            log.warning(
                "several tenant keys and no --admin-api-key: nobody may read /metrics, the "
                "dashboard's data or clear the caches"
            )

    @property
    def warmup_key(self) -> str | None:
        """A tenant key for the server's own in-process warm-up request (None: no keys)."""
        return self.keys.warm

    def reload(self) -> bool:
        """Reread --api-keys-file (SIGHUP); on a mistake keep the old keys (logged)."""
        if self._server.api_keys_file is None:
            log.info("SIGHUP: no --api-keys-file to reread; the keys stay as they are")
            return False
        try:
            keys = load_keys(self._server)
        except ConfigError as exc:
            log.error("keeping the old API keys: %s", exc)
            return False
        self.keys = keys
        log.info("API keys reloaded: %d tenant key(s)", len(keys.tenants))
        return True

    def authorize(self, request: Request, role: Role) -> Caller:
        """The caller, or APIError: 401 for a missing or unknown key (and for the admin key on
        a chat route: it is nobody's tenant key), 403 for a tenant key on an admin route."""
        keys = self.keys
        if not keys.keyed:
            return Caller("", True, "")
        caller = keys.identify(presented_keys(request))
        if caller is None and not keys.tenants and role == "chat":
            return Caller("", False, "")  # only an admin key: chat stays open, as before
        if caller is None or (role == "chat" and not caller.tenant and keys.tenants):
            raise APIError(
                401,
                "missing or wrong API key: send `Authorization: Bearer <key>` or "
                "`x-api-key: <key>`",
                "authentication_error",
                code="invalid_api_key",
                headers={"WWW-Authenticate": "Bearer"},  # RFC 6750: how to authenticate
            )
        if role == "admin" and not caller.admin:
            raise APIError(
                403,
                "this endpoint needs the admin key (--admin-api-key); your key may only use "
                "the chat APIs and see its own cache entries",
                "permission_error",
                code="admin_key_required",
            )
        return caller

    def scope(self, caller: Caller, salt: str) -> str:
        """The cache scope tag of a request (caches/scope.py): the caller's tenant when the
        caches are scoped by tenant (--cache-scope tenant, or auto with more than one tenant
        key), and its `cache_salt`."""
        mode = self._server.cache_scope
        if mode == "auto":
            mode = "tenant" if len(self.keys.tenants) > 1 else "shared"
        return scope_tag(caller.tenant if mode == "tenant" else "", salt)
