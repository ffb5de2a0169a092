"""Folders and files only their owner (or, opted in, their group) can read: what the disk
tier keeps is other people's images and prompts (KV blocks give back the prompt's text with
the model's weights).

`FolderModes.private()` is 0700 folders and 0600 files; `FolderModes.group_shared()` (the
`--cache-dir-group` opt-in, several servers of one group on one folder) 2770 and 0660, the
setgid bit so new folders keep the folder's group. Modes are set explicitly after creating
(`chmod`), so they hold whatever the process umask is, 000 included.

`check_folder` refuses, as ssh refuses a loose key file, a folder that other users could
write to (where one could plant or swap files that the server would then serve to its
users): world-writable always, group-writable unless group sharing was asked for, or owned by
another user and not group-shared. Pure functions over the file system; no MLX, no locks.
"""

from __future__ import annotations

import os
import stat
from dataclasses import dataclass
from pathlib import Path


class LooseFolder(PermissionError):
    """A cache folder other users can write to; the message says what to run or pass."""


@dataclass(frozen=True)
class FolderModes:
    """The permission bits of created folders and files, and whether group sharing is on."""

    folder: int
    file: int
    group: bool

    @classmethod
    def private(cls) -> FolderModes:
        return cls(0o700, 0o600, False)

    @classmethod
    def group_shared(cls) -> FolderModes:
        return cls(0o2770, 0o660, True)

    @property
    def too_open(self) -> int:
        """Permission bits a file or folder must not have (read bits included)."""
        return 0o007 if self.group else 0o077


def check_folder(path: Path, modes: FolderModes) -> None:
    """Raise LooseFolder if the existing folder `path` is writable by users it should not be
    (see the module docstring). A missing folder passes (it will be created private)."""
    try:
        st = path.stat()
    except FileNotFoundError:
        return
    if not stat.S_ISDIR(st.st_mode):
        raise LooseFolder(f"{path} is not a folder")
    how = f"(mode {stat.S_IMODE(st.st_mode):04o})"
    if st.st_mode & stat.S_IWOTH:
        raise LooseFolder(
            f"cache folder {path} is writable by every user {how}, so anyone could plant "
            f"entries the server would serve: run `chmod o-w {path}` or pick another --cache-dir"
        )
    if st.st_mode & stat.S_IWGRP and not modes.group:
        raise LooseFolder(
            f"cache folder {path} is writable by its group {how}: run `chmod g-w {path}`, "
            "or pass --cache-dir-group if several servers of that group share it"
        )
    if st.st_uid != os.getuid() and not modes.group:
        raise LooseFolder(
            f"cache folder {path} belongs to another user (uid {st.st_uid}): use a folder of "
            "your own, or pass --cache-dir-group for a folder shared by a group"
        )


def make_dirs(path: Path, modes: FolderModes) -> None:
    """Create `path` and any missing parents with `modes.folder` (exactly, whatever the
    umask); existing folders are left as they are (`tighten` fixes them)."""
    missing = []
    for folder in (path, *path.parents):
        if folder.is_dir():
            break
        missing.append(folder)
    for folder in reversed(missing):
        try:
            folder.mkdir(mode=modes.folder)
        except FileExistsError:
            continue  # another process made it meanwhile: it set its mode
        os.chmod(folder, modes.folder)


def tighten(path: Path, st_mode: int, modes: FolderModes) -> None:
    """Drop the bits `modes` does not allow from an existing file or folder (entries written
    by an older version, 0644 under a 0755 folder). Leaves what it cannot change."""
    extra = stat.S_IMODE(st_mode) & modes.too_open
    if extra:
        try:
            os.chmod(path, stat.S_IMODE(st_mode) & ~extra)
        except OSError:
            pass


def open_new(path: Path, modes: FolderModes) -> int:
    """A new file (it must not exist) opened for writing with `modes.file`, exactly."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, modes.file)
    os.fchmod(fd, modes.file)
    return fd
