"""A reasoning item's `encrypted_content`: the model's thinking, sealed so that a client
that keeps no server state (`store: false`, Codex) can hand it back on the next turn and the
server can trust it as the model's own thinking again.

    blob = base64( VERSION || HMAC-SHA256(key, VERSION || text) || text as UTF-8 )

Integrity, not secrecy: the same item already carries the thinking in plain text
(`content`, and `summary` when asked), so there is nothing to hide from the client that
holds the blob. What the MAC buys is that a blob is taken back only if this server (or one
sharing its key) made it: one from another server or from OpenAI (real encrypted
reasoning), or one altered on the way, is a 400 naming the field instead of noise in the
prompt or thinking silently lost. The stdlib's hmac does it; no cipher is needed.

The key: 32 random bytes in `responses-reasoning.key` at the top of the disk cache's folder
(`--cache-dir`; mode 0600, 0660 with `--cache-dir-group`), made once (a fully written
temporary file linked into place, so servers starting together agree on one key) and read
by every server that shares the folder, so blobs survive restarts and work on any server of
the host. Without a disk cache (`--no-disk-cache`) each process draws its own key: a blob
made before a restart is then foreign (400). Pure apart from reading or making the key file.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import logging
import os
import secrets
from pathlib import Path
from typing import Any

from caches.private_dir import FolderModes, make_dirs, open_new
from gateway.errors import invalid

log = logging.getLogger(__name__)

KEY_FILE = "responses-reasoning.key"
KEY_BYTES = 32
_VERSION = b"\x01"
_MAC_BYTES = hashlib.sha256().digest_size


class ReasoningSeal:
    """Seals thinking into `encrypted_content` blobs and opens them again. Thread-safe
    (immutable)."""

    def __init__(self, key: bytes) -> None:
        if len(key) != KEY_BYTES:
            raise ValueError(f"a reasoning key is {KEY_BYTES} bytes, got {len(key)}")
        self._key = key

    @classmethod
    def random(cls) -> ReasoningSeal:
        """A key of this process only."""
        return cls(secrets.token_bytes(KEY_BYTES))

    @classmethod
    def for_folder(cls, folder: Path | None, group: bool = False) -> ReasoningSeal:
        """The key kept in `folder` (made there if missing); a process key when `folder` is
        None, or (logged) when the file cannot be made or read."""
        if folder is None:
            return cls.random()
        try:
            return cls(shared_key(Path(folder), group))
        except (OSError, ValueError) as exc:
            log.warning(
                "reasoning key in %s unusable (%s): encrypted_content blobs will not survive "
                "a restart",
                folder,
                exc,
            )
            return cls.random()

    def seal(self, text: str) -> str:
        data = text.encode("utf-8")
        return base64.b64encode(_VERSION + self._mac(data) + data).decode("ascii")

    def open(self, blob: Any, where: str) -> str:
        """The thinking sealed in `blob`, or a 400 naming `where` (the item's
        `encrypted_content`) for anything this server's key did not seal."""
        if not isinstance(blob, str):
            raise invalid(f"`{where}` must be a string", where)
        try:
            raw = base64.b64decode(blob, validate=True)
        except (binascii.Error, ValueError):
            raw = b""
        mac, data = raw[1 : 1 + _MAC_BYTES], raw[1 + _MAC_BYTES :]
        if raw[:1] != _VERSION or not hmac.compare_digest(mac, self._mac(data)):
            raise invalid(
                f"`{where}` was not made by this server (or was altered): send back the "
                "reasoning item exactly as a response of this server returned it, or leave it "
                "out",
                where,
            )
        try:
            return data.decode("utf-8")
        except UnicodeDecodeError:  # only a key holder could have sealed it
            raise invalid(f"`{where}` does not hold text", where) from None

    def _mac(self, data: bytes) -> bytes:
        return hmac.new(self._key, _VERSION + data, hashlib.sha256).digest()


def shared_key(folder: Path, group: bool) -> bytes:
    """The key in `folder`/KEY_FILE, made first if missing. Several servers may race: each
    writes its own temporary file and links it into place; the first link wins and every
    server reads the winner."""
    modes = FolderModes.group_shared() if group else FolderModes.private()
    path = folder / KEY_FILE
    if not path.exists():
        make_dirs(folder, modes)
        scratch = folder / f".{KEY_FILE}.{os.getpid()}.{secrets.token_hex(4)}"
        fd = open_new(scratch, modes)
        try:
            os.write(fd, secrets.token_bytes(KEY_BYTES))
            os.fsync(fd)
        finally:
            os.close(fd)
        try:
            os.link(scratch, path)
        except FileExistsError:
            pass  # another server made it first: use theirs
        finally:
            scratch.unlink()
    key = path.read_bytes()
    if len(key) != KEY_BYTES:
        raise ValueError(f"{path} holds {len(key)} bytes, not {KEY_BYTES}")
    return key
