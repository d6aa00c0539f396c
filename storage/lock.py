"""One committing writer per store: an exclusive ``flock``.

For a local store the lock is taken on the store's folder itself, so a new store's folder can be
locked before the repository is made in it (Icechunk creates repositories only in clean
folders); the holder (pid, host, time) is noted in ``.fairpipe.lock`` there once a repository
exists. For an object-store URL it is a lock file in the user's cache folder, keyed by the URL,
so it protects against concurrent writers on this machine only (object stores have no portable
lock; run one committing flow per dataset at a time).

A locked folder may be removed by the command that made it (a failed first ingest leaves
nothing behind): a waiter that then gets the lock of the removed folder notices (the path no
longer names what it locked) and locks the path again.
"""

from __future__ import annotations

import errno
import fcntl
import hashlib
import json
import os
import shutil
import socket
import time
from pathlib import Path

from fairpipe.errors import FairpipeInputError
from fairpipe.jsontext import parse_json

LOCK_NAME = ".fairpipe.lock"
# Less free space than this, and a writing command refuses at its start rather than fail midway:
# a commit writes a snapshot, its manifests and every chunk it changes (a chunk of points holds
# up to 16 MB).
MIN_FREE_BYTES = 1 << 20
BUSY = (
    "Store {url} is being written by another process ({holder}); one committing writer per store "
    "at a time. Wait for it to finish, or pass a lock timeout to wait."
)


class StoreBusyError(FairpipeInputError):
    """Another writer holds the store's lock."""


def lock_path_for(url: str, local_dir: Path | None) -> Path:
    """What a store's writer locks: its folder (a local store), or a lock file in the cache."""
    if local_dir is not None:
        return local_dir
    cache = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "fairpipe" / "locks"
    cache.mkdir(parents=True, exist_ok=True)
    return cache / (hashlib.sha256(url.encode()).hexdigest()[:24] + ".lock")


def nearest_existing(path: Path) -> Path:
    """``path``, or its nearest ancestor that exists (where a new store would be made)."""
    while not path.exists() and path != path.parent:
        path = path.parent
    return path


def check_lock(path: Path, url: str, wait: bool = False) -> None:
    """What a command asks before it starts its work on the local store at ``path`` (its
    folder; a new store: its nearest existing folder), writing nothing: that another writer does
    not hold its lock (StoreBusyError, unless the command will ``wait`` for it), and that it can
    be written (an OSError as the filesystem would raise it: read-only, not permitted, or less
    than MIN_FREE_BYTES free)."""
    if path.is_dir() and (path / LOCK_NAME).exists():  # a store (its first writer notes itself)
        try:
            with WriterLock(path, url, timeout=0.0, note_holder=False):
                pass
        except StoreBusyError:
            if not wait:
                raise
    where = nearest_existing(path)
    if not os.access(where, os.W_OK):
        code = errno.EROFS if os.statvfs(where).f_flag & os.ST_RDONLY else errno.EACCES
        raise OSError(code, os.strerror(code), str(path))
    if shutil.disk_usage(where).free < MIN_FREE_BYTES:
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(path))


def _same_file(fd: int, path: Path) -> bool:
    """Whether ``path`` still names the file or folder open as ``fd`` (it may have been
    removed, or replaced, while this process waited for its lock)."""
    try:
        st = path.stat()
    except FileNotFoundError:
        return False
    mine = os.fstat(fd)
    return (st.st_dev, st.st_ino) == (mine.st_dev, mine.st_ino)


class WriterLock:
    """The store's writer lock (a context manager) on ``path``: a store's folder, which must
    exist (taking a lock never makes a store's folder), or a lock file. ``note_holder``: write
    who holds it into the folder's ``.fairpipe.lock`` (a creator first needs the folder clean,
    and calls :meth:`note_holder` once the repository is made)."""

    def __init__(self, path: Path, url: str, timeout: float = 0.0, note_holder: bool = True,
                 folder: bool | None = None):  # fmt: skip
        """``folder``: whether ``path`` is a store's folder (default: whether it is a folder
        now)."""
        self.path, self.url, self.timeout = Path(path), url, timeout
        self._note = note_holder
        self._folder = self.path.is_dir() if folder is None else folder
        self._fd: int | None = None
        self._noted = False

    @property
    def held(self) -> bool:
        return self._fd is not None

    @property
    def _holder_file(self) -> Path:
        return self.path / LOCK_NAME if self._folder else self.path

    def _open(self) -> int:
        if self._folder:  # FileNotFoundError if the folder is gone: never made here
            return os.open(self.path, os.O_RDONLY | os.O_DIRECTORY)
        return os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)

    def _holder(self) -> str:
        """Who holds the lock, as noted (``pid 8891 on vm since 2026-11-27T07:21:57``)."""
        try:
            note = parse_json(self._holder_file.read_bytes(), max_bytes=64 * 1024)
            return f"pid {int(note['pid'])} on {note['host']} since {note['since']}"
        except FileNotFoundError:
            return "a command creating the store" if self._folder else "not noted"
        except (OSError, ValueError, KeyError, TypeError):
            return "not noted"

    def __enter__(self) -> WriterLock:
        deadline = time.monotonic() + self.timeout
        while True:
            fd = self._open()
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                os.close(fd)
                if time.monotonic() >= deadline:
                    raise StoreBusyError(BUSY.format(url=self.url, holder=self._holder())) from None
                time.sleep(0.1)
                continue
            if _same_file(fd, self.path):
                break
            os.close(fd)  # locked what its maker removed meanwhile: lock the path again
        self._fd = fd
        if self._note:
            try:
                self.note_holder()
            except BaseException:  # a read-only or full filesystem: no writer can work there
                self.__exit__()
                raise
        return self

    def note_holder(self) -> None:
        """Write this process as the holder (pid, host, since) for a waiter's message."""
        note = json.dumps({"pid": os.getpid(), "host": socket.gethostname(),
                           "since": time.strftime("%Y-%m-%dT%H:%M:%S")})  # fmt: skip
        # Never through a link: the note is the store's own file, not one a link leads to.
        fd = os.open(self._holder_file, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW,
                     0o644)  # fmt: skip
        with open(fd, "w") as fh:
            fh.write(note)
        self._noted = True

    def __exit__(self, *exc) -> None:
        if self._fd is None:
            return
        if self._noted:
            try:
                fd = os.open(self._holder_file, os.O_WRONLY | os.O_NOFOLLOW)
                try:
                    os.ftruncate(fd, 0)
                finally:
                    os.close(fd)
            except OSError:  # removed with its folder by a failed creation
                pass
            self._noted = False
        fcntl.flock(self._fd, fcntl.LOCK_UN)
        os.close(self._fd)
        self._fd = None
