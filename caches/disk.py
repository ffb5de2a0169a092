"""The disk tier under both caches: one directory of safetensors files, shared by every
process that serves from it, with a byte budget kept by least-recent use.

Layout: `<root>/v1/<namespace>/<kind>/<key[:2]>/<key>.safetensors`. The namespace is the
fingerprint of everything that makes a file usable (model config and weights, dtypes,
processor settings, KV block size; gateway/engine/disk/tier.py builds it), so another model
or dtype looks in another folder and never reads these files; each file also names its
namespace, kind and key in its metadata, and a file that disagrees is treated as foreign.

Concurrency (threads and processes): a file appears whole or not at all (written to a
temporary name in the same folder, then `os.replace`d). Readers take no lock: a file unlinked
while being opened is a miss. Last use is the file's mtime (`os.utime` on every hit), so LRU
order is shared by all processes and survives restarts. Budget enforcement (a scan of the
tree, then unlinking the least recently used files) runs under an exclusive `flock` on
`<root>/v1/.lock` so two processes never evict against each other's stale view. A process
rescans when its own estimate (the last scan plus what it wrote since) passes the budget, or
when its last scan is older than `rescan_s`: the budget can be exceeded by what *other*
processes wrote in that window, never by one process's own writes.

Privacy (caches/private_dir.py): folders are created 0700 and files 0600 whatever the umask
(2770 / 0660 with `FolderModes.group_shared()`), a folder other users can write to is refused
(`LooseFolder`), and files or folders an older version left readable by others are tightened
when the folder is scanned.

Failure policy: an unreadable, truncated, corrupt or foreign file is logged, removed and
counted (`corrupt`), and the lookup is a miss; a failed write is logged and counted. No
method raises for an I/O problem. No MLX; thread-safe (one lock for the counters).
"""

from __future__ import annotations

import contextlib
import fcntl
import logging
import os
import threading
import time
import uuid
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path

from caches.disk_format import CorruptFile, RawTensor, decode, layout
from caches.private_dir import FolderModes, check_folder, make_dirs, open_new, tighten

log = logging.getLogger(__name__)

FORMAT_DIR = "v1"  # bump when the layout or the metadata contract changes
SUFFIX = ".safetensors"
TMP_PREFIX = ".tmp-"
STALE_TMP_S = 3600.0  # a temporary file this old belongs to a writer that died
PRIVATE = FolderModes.private()


@dataclass(frozen=True)
class DiskEntry:
    """A file read back: its tensors (views into one bytes object) and metadata."""

    tensors: dict[str, RawTensor]
    metadata: dict[str, str]
    nbytes: int  # the file's size


@dataclass(frozen=True)
class DiskKindStats:
    """Counters of one kind of entry, in this process since it started."""

    hits: int
    misses: int
    writes: int
    write_bytes: int
    write_errors: int
    corrupt: int  # files found damaged or foreign, removed


@dataclass(frozen=True)
class DiskStats:
    """bytes/entries: the whole directory (all namespaces) as of the last scan plus this
    process's writes since; evictions: files this process removed for the budget."""

    capacity_bytes: int
    bytes: int
    entries: int
    evictions: int
    kinds: dict[str, DiskKindStats]


class _Counts:
    __slots__ = ("hits", "misses", "writes", "write_bytes", "write_errors", "corrupt")

    def __init__(self) -> None:
        self.hits = self.misses = self.writes = self.write_bytes = 0
        self.write_errors = self.corrupt = 0


class DiskStore:
    """Files of `namespace` under `root` (created if missing), `capacity_bytes` for the whole
    root. `kinds` are the entry kinds counted in stats; `clock` is wall time (seconds), used
    only to age temporary files; `modes`: who may read (private by default). Raises
    LooseFolder (a PermissionError) when `root` is writable by others (see private_dir)."""

    def __init__(
        self,
        root: Path,
        namespace: str,
        capacity_bytes: int,
        kinds: tuple[str, ...] = ("vision", "prefix"),
        rescan_s: float = 10.0,
        clock: Callable[[], float] = time.time,
        modes: FolderModes = PRIVATE,
    ) -> None:
        if capacity_bytes <= 0:
            raise ValueError("capacity_bytes must be > 0 (turn the disk tier off instead)")
        if not namespace or not namespace.isalnum():
            raise ValueError(f"namespace must be a non-empty alphanumeric str: {namespace!r}")
        self.base = Path(root) / FORMAT_DIR
        self.namespace = namespace
        self.capacity_bytes = capacity_bytes
        self.rescan_s = rescan_s
        self._clock = clock
        self._lock = threading.Lock()
        self._counts = {kind: _Counts() for kind in kinds}
        self._bytes = self._entries = self._evictions = 0
        self._scanned_at = float("-inf")
        self.modes = modes
        for folder in (Path(root), self.base):
            check_folder(folder, modes)
        make_dirs(self.base / namespace, modes)
        for folder in (Path(root), self.base, self.base / namespace):
            tighten(folder, folder.stat().st_mode, modes)
        self._lock_path = self.base / ".lock"
        self.enforce_budget(force=True)

    # ----- paths --------------------------------------------------------------------------

    def path(self, kind: str, key: str) -> Path:
        """Where the entry `key` (a hex digest) of `kind` lives."""
        if kind not in self._counts or not key.isalnum() or len(key) < 8:
            raise ValueError(f"bad kind/key: {kind!r}/{key!r}")
        return self.base / self.namespace / kind / key[:2] / (key + SUFFIX)

    def contains(self, kind: str, key: str) -> bool:
        """Whether a file is there now (advisory: it may be evicted or be damaged)."""
        return self.path(kind, key).is_file()

    def probe(self, kind: str, key: str) -> bool:
        """`contains` for a lookup: no file counts a miss (as `get` would), so a lookup
        answered by a stat alone is counted like one that read."""
        if self.contains(kind, key):
            return True
        self._count(kind, hit=False)
        return False

    # ----- reading ------------------------------------------------------------------------

    def get(self, kind: str, key: str) -> DiskEntry | None:
        """The verified entry, or None (a miss). A damaged or foreign file is removed. A hit
        marks the file used now (its mtime), for every process's LRU."""
        path = self.path(kind, key)
        try:
            blob = path.read_bytes()
        except FileNotFoundError:
            return self._count(kind, hit=False)
        except OSError as exc:
            log.warning("disk cache: cannot read %s (%s); a miss", path, exc)
            return self._count(kind, hit=False)
        try:
            tensors, meta = decode(blob)
            for field, want in (("namespace", self.namespace), ("kind", kind), ("key", key)):
                if meta.get(field) != want:
                    raise CorruptFile(f"{field} is {meta.get(field)!r}, expected {want!r}")
        except CorruptFile as exc:
            self.discard(kind, key, f"{exc}")
            return self._count(kind, hit=False)
        except Exception as exc:  # noqa: BLE001 - whatever a hostile file provokes: a miss
            self.discard(kind, key, f"unreadable ({type(exc).__name__}: {exc})"[:300])
            return self._count(kind, hit=False)
        with contextlib.suppress(OSError):
            os.utime(path)
        self._count(kind, hit=True)
        return DiskEntry(tensors, meta, len(blob))

    def touch(self, kind: str, key: str) -> None:
        """Mark an entry used now (its mtime), e.g. when the memory tier served it; nothing if
        it is not on disk."""
        with contextlib.suppress(OSError):
            os.utime(self.path(kind, key))

    def discard(self, kind: str, key: str, reason: str) -> None:
        """Remove an entry found unusable (also by the caller's own checks), log and count
        it; the lookup that found it should count as a miss."""
        path = self.path(kind, key)
        log.warning("disk cache: removing %s: %s", path, reason)
        with contextlib.suppress(OSError):
            path.unlink()
        with self._lock:
            self._counts[kind].corrupt += 1

    def _count(self, kind: str, hit: bool) -> None:
        with self._lock:
            if hit:
                self._counts[kind].hits += 1
            else:
                self._counts[kind].misses += 1

    # ----- writing ------------------------------------------------------------------------

    def put(self, kind: str, key: str, tensors: Mapping[str, RawTensor], meta: Mapping[str, str]):
        """Write an entry atomically (replacing any), then keep the budget. Returns True when
        written. An entry already on disk is only marked used (same key, same content).
        Blocking I/O: call from a background thread."""
        path = self.path(kind, key)
        if path.is_file():
            with contextlib.suppress(OSError):
                os.utime(path)
                return True
        meta = {**meta, "namespace": self.namespace, "kind": kind, "key": key}
        tmp = path.parent / f"{TMP_PREFIX}{os.getpid()}-{uuid.uuid4().hex}{SUFFIX}"
        try:
            head, views = layout(tensors, meta)
            size = len(head) + sum(len(v) for v in views)
            if size > self.capacity_bytes:
                log.info("disk cache: %s/%s (%d bytes) exceeds the budget", kind, key, size)
                return False
            make_dirs(path.parent, self.modes)
            with os.fdopen(open_new(tmp, self.modes), "wb") as f:
                f.write(head)
                for view in views:
                    f.write(view)
            # No fsync: after a power loss a renamed file may be short or zeroed, which the
            # checksum refuses (a logged miss), so durability is not worth a sync per entry.
            os.replace(tmp, path)
        except Exception as exc:  # noqa: BLE001 - a failed write is a later miss
            log.warning("disk cache: writing %s failed: %s", path, exc)
            with contextlib.suppress(OSError):
                tmp.unlink()
            with self._lock:
                self._counts[kind].write_errors += 1
            return False
        with self._lock:
            self._counts[kind].writes += 1
            self._counts[kind].write_bytes += size
            self._bytes += size
            self._entries += 1
        self.enforce_budget()
        return True

    # ----- the budget ---------------------------------------------------------------------

    def enforce_budget(self, force: bool = False) -> None:
        """Rescan and evict least recently used files until the whole root fits the budget,
        if this process's estimate is over it, the last scan is stale, or `force`."""
        with self._lock:
            due = self._clock() - self._scanned_at >= self.rescan_s
            if not (force or due or self._bytes > self.capacity_bytes):
                return
        try:
            with self._folder_lock():
                files = sorted(self._scan(), key=lambda f: f[0])  # oldest use first
                total = sum(size for _, size, _ in files)
                evicted = 0
                for _, size, path in files:
                    if total <= self.capacity_bytes:
                        break
                    with contextlib.suppress(FileNotFoundError):
                        path.unlink()
                    total -= size
                    evicted += 1
        except OSError as exc:
            log.warning("disk cache: budget scan of %s failed: %s", self.base, exc)
            return
        if evicted:
            log.info(
                "disk cache: evicted %d files to stay within %d bytes", evicted, self.capacity_bytes
            )
        with self._lock:
            self._bytes, self._entries = total, len(files) - evicted
            self._evictions += evicted
            self._scanned_at = self._clock()

    def clear(self) -> int:
        """Remove every entry of this namespace (other namespaces, i.e. other models sharing
        the folder, keep theirs); returns how many files went. A write racing the clear may
        land after it (the caller flushes its writer first)."""
        removed = 0
        try:
            with self._folder_lock():
                for folder, _, names in os.walk(self.base / self.namespace):
                    for name in names:
                        if name.endswith(SUFFIX):
                            with contextlib.suppress(FileNotFoundError):
                                (Path(folder) / name).unlink()
                                removed += 1
        except OSError as exc:
            log.warning("disk cache: clearing %s failed: %s", self.base / self.namespace, exc)
        self.enforce_budget(force=True)  # recount what the whole folder holds now
        return removed

    @contextlib.contextmanager
    def _folder_lock(self) -> Iterator[None]:
        """The whole folder's exclusive lock, across processes (scans and mass deletes run
        under it); raises OSError if the lock file cannot be opened."""
        fd = os.open(self._lock_path, os.O_RDWR | os.O_CREAT, self.modes.file)
        with os.fdopen(fd, "r+b") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)  # released when closed
            yield

    def _scan(self) -> Iterator[tuple[float, int, Path]]:
        """(mtime, size, path) of every entry of every namespace; stale temporary files of
        dead writers are removed on the way, and modes too open are tightened."""
        now = self._clock()
        for folder, _, names in os.walk(self.base):
            with contextlib.suppress(OSError):
                tighten(Path(folder), os.stat(folder).st_mode, self.modes)
            for name in names:
                path = Path(folder) / name
                try:
                    st = path.stat()
                except FileNotFoundError:
                    continue
                tighten(path, st.st_mode, self.modes)
                if name.startswith(TMP_PREFIX):
                    if now - st.st_mtime > STALE_TMP_S:
                        with contextlib.suppress(OSError):
                            path.unlink()
                elif name.endswith(SUFFIX):
                    yield st.st_mtime, st.st_size, path

    def stats(self) -> DiskStats:
        with self._lock:
            return DiskStats(
                self.capacity_bytes,
                self._bytes,
                self._entries,
                self._evictions,
                {
                    kind: DiskKindStats(
                        c.hits, c.misses, c.writes, c.write_bytes, c.write_errors, c.corrupt
                    )
                    for kind, c in self._counts.items()
                },
            )
