"""Invariants of the disk tier's privacy (caches/private_dir.py through caches.disk): folders
0700 and files 0600 whatever the umask (2770 / 0660 when a group shares the folder), a
folder other users can write to refused, modes an older version left open tightened."""

from __future__ import annotations

import os
import stat
from collections.abc import Iterator
from pathlib import Path

import pytest

from caches.disk import FORMAT_DIR, DiskStore
from caches.disk_format import RawTensor
from caches.private_dir import FolderModes, LooseFolder, check_folder

NS = "ns1"


@pytest.fixture
def umask() -> Iterator[None]:
    old = os.umask(0)
    yield
    os.umask(old)


def _fill(root: Path, modes: FolderModes | None = None) -> DiskStore:
    store = DiskStore(root, NS, 10**6, modes=modes or FolderModes.private())
    data = RawTensor("F32", (4,), bytes(16))
    for i in range(3):
        assert store.put("vision", f"{i:02d}" + "ab" * 15, {"x": data}, {"m": "1"})
    store.enforce_budget(force=True)  # a scan too (it creates nothing, tightens nothing here)
    return store


def _modes(root: Path) -> dict[str, set[int]]:
    out: dict[str, set[int]] = {"dirs": set(), "files": set()}
    for folder, _, names in os.walk(root):
        out["dirs"].add(stat.S_IMODE(os.stat(folder).st_mode))
        out["files"] |= {stat.S_IMODE(os.stat(Path(folder) / n).st_mode) for n in names}
    return out


@pytest.mark.parametrize("mask", [0o022, 0o000])
def test_folders_are_0700_and_files_0600_whatever_the_umask(
    tmp_path: Path, mask: int, umask: None
) -> None:
    """Invariant: under umask 022 and 000 every folder the store creates is 0700 and every
    file (entries, the lock file) 0600."""
    os.umask(mask)
    root = tmp_path / "cache"
    _fill(root)
    assert _modes(root) == {"dirs": {0o700}, "files": {0o600}}
    assert (root / FORMAT_DIR / ".lock").exists()


def test_a_group_shared_folder_is_2770_and_0660(tmp_path: Path, umask: None) -> None:
    """Invariant: with group sharing, folders are 2770 (new ones keep the group) and files
    0660, under umask 000."""
    root = tmp_path / "cache"
    _fill(root, FolderModes.group_shared())
    assert _modes(root) == {"dirs": {0o2770}, "files": {0o660}}


@pytest.mark.parametrize("mode", [0o777, 0o1777, 0o770, 0o775])
def test_a_folder_others_can_write_to_is_refused(tmp_path: Path, mode: int) -> None:
    """Invariant: a world-writable folder is refused always, a group-writable one unless the
    group shares it; the message says what to change."""
    root = tmp_path / "cache"
    root.mkdir()
    os.chmod(root, mode)
    with pytest.raises(LooseFolder, match="chmod"):
        DiskStore(root, NS, 10**6)
    if mode & stat.S_IWOTH:
        with pytest.raises(LooseFolder, match="o-w"):
            check_folder(root, FolderModes.group_shared())
    else:
        DiskStore(root, NS, 10**6, modes=FolderModes.group_shared())


def test_files_an_older_version_left_open_are_tightened(tmp_path: Path) -> None:
    """Invariant: entries and folders written world-readable (0644 / 0755, as before this
    change) are 0600 / 0700 once a store opens the folder."""
    root = tmp_path / "cache"
    _fill(root)
    for folder, _, names in os.walk(root):
        os.chmod(folder, 0o755)
        for name in names:
            os.chmod(Path(folder) / name, 0o644)
    DiskStore(root, NS, 10**6)  # opening scans the folder
    assert _modes(root) == {"dirs": {0o700}, "files": {0o600}}
