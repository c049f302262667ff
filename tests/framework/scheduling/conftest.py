"""`cpu_hog`: every core spinning in another process while a block runs, as on a busy CI runner or laptop."""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys

import pytest


@contextlib.contextmanager
def _hog(n: int | None = None):
    """`n` (default: one per core) Python processes in a busy loop for the duration of the block, killed after it."""
    procs = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(n or os.cpu_count() or 2)]
    try:
        yield
    finally:
        for p in procs:
            p.kill()
        for p in procs:
            p.wait()


@pytest.fixture
def cpu_hog():
    """`with cpu_hog(): ...` runs the block beside a process spinning on every core."""
    return _hog
