"""File-system primitives of the session store: private files and directories whatever the umask,
atomic replacement under a unique temporary name, fsyncs now or batched, and the store's advisory
lock (a server holds it shared; `sessions rm|gc` need it exclusive)."""

from __future__ import annotations

import fcntl
import itertools
import os
import threading
from collections.abc import Callable
from pathlib import Path
from typing import BinaryIO

FILE_MODE = 0o600
DIR_MODE = 0o700
LOCK_FILE = ".lock"

_counter = itertools.count()


def temp_name(path: Path) -> Path:
    """Unique per write, not just per process: two writes of one file can never share a temp file."""
    return path.with_name(f".{path.name}.{os.getpid()}.{next(_counter)}.tmp")


def fsync_path(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def make_private_dirs(path: Path) -> None:
    """mkdir -p with 0700 for every level created (chmod: the umask cannot widen or narrow it), and
    the parent fsynced so a crash cannot forget a directory whose files were already synced."""
    missing: list[Path] = []
    at = path
    while not at.exists():
        missing.append(at)
        at = at.parent
    for directory in reversed(missing):
        try:
            directory.mkdir(mode=DIR_MODE)
        except FileExistsError:
            continue  # created meanwhile (another thread or process): theirs to set up
        os.chmod(directory, DIR_MODE)
        fsync_path(directory.parent)


def write_atomic(path: Path, fill: Callable[[BinaryIO], object], sync: bool = True) -> None:
    """Write through `fill` to a new private temp file, then rename it over `path`. With `sync`,
    the file and then the directory are fsynced; without, the caller syncs later (a kill -9 cannot
    lose a renamed file, only a power cut could, until the sync)."""
    tmp = temp_name(path)
    try:
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, FILE_MODE)
        with os.fdopen(fd, "wb") as fh:
            fill(fh)
            fh.flush()
            if sync:
                os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)  # a half-written file on a full disk would keep it full
        raise
    if sync:
        fsync_path(path.parent)


class PendingSyncs:
    """Files written without fsync, synced together later (the `batched` record policy)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._paths: set[Path] = set()

    def add(self, path: Path) -> None:
        with self._lock:
            self._paths.add(path)

    def __len__(self) -> int:
        with self._lock:
            return len(self._paths)

    def sync(self) -> int:
        with self._lock:
            paths, self._paths = self._paths, set()
        for directory in {p.parent for p in paths}:
            for path in paths:
                if path.parent == directory and path.exists():
                    fsync_path(path)
            if directory.exists():
                fsync_path(directory)
        return len(paths)


class StoreLock:
    """`<store>/.lock`: a serving gateway holds it shared; tools that delete need it exclusive."""

    def __init__(self, root: Path) -> None:
        make_private_dirs(root)
        self.path = root / LOCK_FILE
        self._fd = os.open(self.path, os.O_RDWR | os.O_CREAT, FILE_MODE)

    def hold_shared(self) -> None:
        fcntl.flock(self._fd, fcntl.LOCK_SH)

    def try_exclusive(self) -> bool:
        try:
            fcntl.flock(self._fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return False
        return True

    def release(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)  # closing the descriptor drops the lock
            self._fd = -1
