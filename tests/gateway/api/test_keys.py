"""Invariants of gateway.api.keys: who a key is (tenant, admin), what each role may do, the
cache scope a request gets, and a keys file that is read, refused or reloaded."""

from __future__ import annotations

from pathlib import Path

import pytest
from starlette.requests import Request

from caches.scope import scope_tag
from gateway.api.keys import Keyring, load_keys
from gateway.config import ConfigError, ServerConfig
from gateway.errors import APIError


def _request(key: str | None, header: str = "authorization") -> Request:
    headers = []
    if key is not None:
        value = f"Bearer {key}" if header == "authorization" else key
        headers.append((header.encode(), value.encode("latin-1")))
    return Request({"type": "http", "method": "GET", "path": "/", "headers": headers})


def _keyring(tmp_path: Path, lines: str, **server: object) -> Keyring:
    path = tmp_path / "keys"
    path.write_text(lines)
    path.chmod(0o600)
    return Keyring(ServerConfig(api_keys_file=path, **server))  # type: ignore[arg-type]


def _status(keys: Keyring, key: str | None, role: str, header: str = "authorization") -> int:
    try:
        keys.authorize(_request(key, header), role)  # type: ignore[arg-type]
    except APIError as error:
        return error.status
    return 200


def test_tenant_keys_chat_the_admin_key_administers(tmp_path: Path) -> None:
    """Invariant: a tenant key may chat and read, gets 403 on admin routes; the admin key may
    read and administer but is nobody's chat key (401); unknown keys get 401 everywhere."""
    keys = _keyring(tmp_path, "alice ka-123\nbob kb-456\n", admin_api_key="adm-789")
    roles = ("chat", "read", "admin")
    assert [_status(keys, "ka-123", r) for r in roles] == [200, 200, 403]
    assert [_status(keys, "kb-456", r, "x-api-key") for r in roles] == [200, 200, 403]
    assert [_status(keys, "adm-789", r) for r in roles] == [401, 200, 200]
    assert [_status(keys, k, r) for k in ("nope", None) for r in roles] == [401] * 6
    alice = keys.authorize(_request("ka-123"), "chat")
    assert (alice.tenant, alice.admin) == ("alice", False) and len(alice.owner) == 32
    with pytest.raises(APIError) as refused:
        keys.authorize(_request("nope"), "chat")
    assert refused.value.headers == {"WWW-Authenticate": "Bearer"}  # RFC 6750


def test_a_single_key_server_keeps_its_old_rights(tmp_path: Path) -> None:
    """Invariant: with one key and no admin key that key may do everything (as --api-key
    always could); with no key at all everything is open; --metrics-api-key is the admin."""
    one = Keyring(ServerConfig(api_key="only"))
    assert [_status(one, "only", r) for r in ("chat", "read", "admin")] == [200] * 3
    assert one.authorize(_request("only"), "chat").tenant == "default"
    open_ = Keyring(ServerConfig())
    assert [_status(open_, None, r) for r in ("chat", "read", "admin")] == [200] * 3
    old = Keyring(ServerConfig(api_key="k", metrics_api_key="m"))
    assert [_status(old, "m", r) for r in ("chat", "admin")] == [401, 200]
    assert _status(old, "k", "admin") == 403
    many = _keyring(tmp_path, "a ka\nb kb\n")  # several tenants, no admin key: nobody is
    assert _status(many, "ka", "admin") == 403


def test_the_cache_scope_follows_the_mode_and_the_salt(tmp_path: Path) -> None:
    """Invariant: auto scopes by tenant only with more than one tenant key; tenant always;
    shared never; a salt scopes further in every mode."""
    for mode, want_tenant in (("auto", True), ("tenant", True), ("shared", False)):
        keys = _keyring(tmp_path, "alice ka\nbob kb\n", cache_scope=mode)
        alice = keys.authorize(_request("ka"), "chat")
        assert keys.scope(alice, "") == ("alice" if want_tenant else "")
        assert keys.scope(alice, "s") == scope_tag("alice" if want_tenant else "", "s")
    single = Keyring(ServerConfig(api_key="k"))
    caller = single.authorize(_request("k"), "chat")
    assert single.scope(caller, "") == ""  # one key: the caches stay as they were
    assert Keyring(ServerConfig(api_key="k", cache_scope="tenant")).scope(caller, "") == "default"


@pytest.mark.parametrize(
    "lines, message",
    [
        ("alice\n", "line 1: expected `NAME KEY`"),
        ("# team\n\nal ice k1\n", "line 3"),
        ("a+b k1\n", "tenant name"),
        ("alice k1\nalice k2\n", "named twice"),
        ("alice k1\nbob k1\n", "a key is given twice, to tenant 'alice' and tenant 'bob'"),
        ("alice k0\n", "to tenant 'default' and tenant 'alice'"),
        ("alice k1\nbob k1 \n", "to tenant 'alice' and tenant 'bob'"),  # one key once stripped
        ("default k2\n", "'default'"),
        ("# only a comment\n\n", "holds no `NAME KEY` line"),  # was: authentication off
    ],
)
def test_a_bad_keys_file_is_refused_naming_the_line(
    tmp_path: Path, lines: str, message: str
) -> None:
    """Invariant: a malformed line, a bad or repeated name, or a repeated key is a
    ConfigError that says where and what."""
    path = tmp_path / "keys"
    path.write_text(lines)
    with pytest.raises(ConfigError, match=message):
        load_keys(ServerConfig(api_keys_file=path, api_key="k0"))  # type: ignore[arg-type]


def test_a_reload_swaps_the_keys_and_a_bad_file_keeps_the_old_ones(tmp_path: Path) -> None:
    """Invariant: `reload` makes new keys valid and removed ones invalid at once; a file
    with a mistake changes nothing."""
    keys = _keyring(tmp_path, "alice ka\nbob kb\n")
    (tmp_path / "keys").write_text("alice ka\ncarol kc\n")
    assert keys.reload()
    assert (_status(keys, "kc", "chat"), _status(keys, "kb", "chat")) == (200, 401)
    (tmp_path / "keys").write_text("alice\n")
    assert not keys.reload()
    assert _status(keys, "kc", "chat") == 200


@pytest.mark.parametrize("flag", ["api_key", "admin_api_key", "metrics_api_key"])
def test_an_empty_key_is_refused(flag: str) -> None:
    """Invariant: `--api-key "$KEY"` with KEY unset is a start-up error, not a server that
    silently serves everyone without a key."""
    with pytest.raises(ConfigError, match="is empty"):
        ServerConfig(**{flag: " "})  # type: ignore[arg-type]


def test_start_up_says_whether_requests_need_a_key(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Invariant: one start-up line says whether authentication is on; without keys on a
    non-loopback address it is a warning, and several tenants without an admin key warn that
    nobody can read /metrics."""
    caplog.set_level("INFO", logger="gateway.api.keys")
    Keyring(ServerConfig())
    Keyring(ServerConfig(host="0.0.0.0"))
    _keyring(tmp_path, "alice k1\nbob k2\n")
    lines = [(r.levelname, r.getMessage()) for r in caplog.records]
    assert lines[0][0] == "INFO" and "authentication off" in lines[0][1]
    assert lines[1][0] == "WARNING" and "0.0.0.0: give --api-key" in lines[1][1]
    assert "authentication on: 2 tenant key(s)" in lines[2][1]
    assert lines[3][0] == "WARNING" and "nobody may read /metrics" in lines[3][1]
