"""The run directory's writer lock: one process on a host writes a run (a run, or a resume of it) at a time.

An exclusive `flock` on the run directory itself: nothing is written into it for the lock, and the lock goes with the
process, also when it is killed. `flock` is advisory and per host: on a network file system a writer on another host
is not seen; without `fcntl` (Windows) nothing is held.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator


@contextlib.contextmanager
def writer_lock(storage_path: str) -> Iterator[None]:
    """Hold the run's writer lock while the block runs: an exclusive `flock` on the run directory itself (nothing is
    written into it for the lock, and the lock goes with the process, also when it is killed). A second writer on
    this host (a resume of a run that is being written) is refused with a ValueError. `flock` is advisory and per
    host: on a network file system a writer on another host is not seen; without `fcntl` (Windows) nothing is held."""
    try:
        import fcntl
    except ImportError:
        yield
        return
    fd = os.open(storage_path, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise ValueError(f"`storage_path` {storage_path!r} is being written by another process on this host (a "
                             "run or a resume holds its lock): wait until it ends (`modelhopper status`)") from None
        yield
    finally:
        os.close(fd)  # releases the lock


def is_being_written(storage_path: str) -> bool:
    """Whether a process on this host holds the run's writer lock (`writer_lock`); reads only."""
    try:
        import fcntl
    except ImportError:
        return False
    try:
        fd = os.open(storage_path, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
    except OSError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        return False
    except BlockingIOError:
        return True
    finally:
        os.close(fd)
