"""One committing writer per store: an exclusive ``flock`` on a lock file.

For a local store the lock file sits in the store folder; for an object-store URL it sits in the
user's cache folder, keyed by the URL, so it protects against concurrent writers on this machine
only (object stores have no portable lock; run one committing flow per dataset at a time).
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import socket
import time
from pathlib import Path
from typing import Any

from fairpipe.errors import FairpipeInputError

BUSY = (
    "Store {url} is being written by another process ({holder}); one committing writer per store "
    "at a time. Wait for it to finish, or pass a lock timeout to wait."
)


class StoreBusyError(FairpipeInputError):
    """Another writer holds the store's lock."""


def lock_path_for(url: str, local_dir: Path | None) -> Path:
    if local_dir is not None:
        return local_dir / ".fairpipe.lock"
    cache = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "fairpipe" / "locks"
    cache.mkdir(parents=True, exist_ok=True)
    return cache / (hashlib.sha256(url.encode()).hexdigest()[:24] + ".lock")


class WriterLock:
    def __init__(self, path: Path, url: str, timeout: float = 0.0):
        self.path, self.url, self.timeout = path, url, timeout
        self._fh: Any = None

    def __enter__(self) -> WriterLock:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        fh = open(self.path, "a+")
        deadline = time.monotonic() + self.timeout
        while True:
            try:
                fcntl.flock(fh.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() >= deadline:
                    fh.seek(0)
                    holder = fh.read().strip() or "unknown process"
                    fh.close()
                    raise StoreBusyError(BUSY.format(url=self.url, holder=holder)) from None
                time.sleep(0.1)
        fh.seek(0)
        fh.truncate()
        fh.write(
            json.dumps(
                {
                    "pid": os.getpid(),
                    "host": socket.gethostname(),
                    "since": time.strftime("%Y-%m-%dT%H:%M:%S"),
                }
            )
        )
        fh.flush()
        self._fh = fh
        return self

    def __exit__(self, *exc) -> None:
        if self._fh is not None:
            self._fh.truncate(0)
            fcntl.flock(self._fh.fileno(), fcntl.LOCK_UN)
            self._fh.close()
            self._fh = None
