"""One writer per output: an exclusive advisory lock that turns a second run on the same files into a clear error.

Two `dflash-train features` runs on one work dir would append to the same shard files and index, each cutting off
what it takes for the other's uncommitted rows: a silently wrong feature cache. Two `responses` runs would answer the
same prompts twice, two `train` runs would write each other's checkpoints. Every writer therefore holds an
`fcntl.flock` on its folder or file for as long as it writes. The lock belongs to the open descriptor, so a killed run
leaves none behind (no stale lock files to delete). Where `fcntl` is missing (Windows) no lock is taken.
"""

from __future__ import annotations

import os
from pathlib import Path
from types import TracebackType

try:
    import fcntl
except ImportError:  # Windows
    fcntl = None


class WriterLock:
    """An exclusive lock on the existing file or folder `path`, held until `release()` or the end of a `with`."""

    def __init__(self, path: str | Path, what: str) -> None:
        """Takes the lock or raises `RuntimeError` saying that another process writes `what` at `path`."""
        self.path = Path(path)
        self._fd: int | None = None
        if fcntl is None:
            return
        fd = os.open(self.path, os.O_RDONLY)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            raise RuntimeError(
                f"Another process is writing {what} at {self.path}. Wait for it to finish (or stop it), or give this "
                "run its own --work-dir."
            ) from None
        self._fd = fd

    def release(self) -> None:
        """Releases the lock (idempotent)."""
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None

    def __enter__(self) -> WriterLock:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.release()
