"""Where runs live: a default root outside the working directory, and remote storage mirrored from a local copy.

A run directory is always local while the run goes on (SQLite needs a real file system). With a URI
(`storage_path="s3://bucket/runs/x"`, `"gs://..."`, `"hdfs://..."`, `"file:///shared/runs/x"`: anything
`pyarrow.fs.FileSystem.from_uri` opens), the run works in a local copy under `<root>/.working/` and is mirrored to the
URI: the catalog as a consistent SQLite snapshot, checkpoints, data and result files, after each committed decision
(at most every `sync_every_s`) and at the end. `Result.open(uri)` and `ModelSelection.resume(uri, ...)` fetch the
mirror first.

The default root is `~/modelhopper_runs`, or `$MODELHOPPER_STORAGE` when set: under `ray job submit`, the working
directory is Ray's temporary copy of the uploaded code, which Ray may delete while the job runs.
"""

from __future__ import annotations

import datetime as _dt
import hashlib
import os
import re
import shutil
import sqlite3
import subprocess
import tempfile
import time

from framework.store.catalog import confine
from framework.text import printable

STORAGE_ENV = "MODELHOPPER_STORAGE"
#: the prefix of the temporary folders that hold a copy of a mirrored run while it is read (`RunStorage.fetch`)
READ_PREFIX = "modelhopper-read-"
#: files under these folders are written once (a checkpoint's name carries its unit count): uploaded when missing
IMMUTABLE = ("checkpoints/", "data/")
_SKIP = re.compile(r"(^|/)run\.db(-wal|-shm|-journal)?$|\.tmp\.|(^|/)\.")


def default_root() -> str:
    """`$MODELHOPPER_STORAGE`, else `~/modelhopper_runs`."""
    return os.path.abspath(os.path.expanduser(os.environ.get(STORAGE_ENV) or os.path.join("~", "modelhopper_runs")))


def run_name(prefix: str) -> str:
    """`<prefix>-<timestamp>`: a new run's folder name (microseconds keep two runs started together apart)."""
    return f"{prefix}-{_dt.datetime.now().strftime('%Y%m%d-%H%M%S-%f')}"


def git_revision() -> str | None:
    """HEAD of the working directory's repository; `$MODELHOPPER_GIT_REVISION` where the code came without its
    `.git` (e.g. uploaded by `ray job submit`); else None. What a run (or an experiment's results) records."""
    try:
        out = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True, timeout=5, check=True)
        return out.stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return os.environ.get("MODELHOPPER_GIT_REVISION")


def is_uri(path: str) -> bool:
    return isinstance(path, str) and re.match(r"^[A-Za-z][A-Za-z0-9+.-]*://", path) is not None


#: the longest folder name, in UTF-8 bytes, that Linux, macOS and Windows file systems all take
NAME_MAX = 255


def check_folder_name(param: str, name: str) -> None:
    """A ValueError naming `param` unless `name` is one folder's name: a non-empty str, not '.' or '..', no separator,
    of printable text (no control characters, and no lone surrogates: those stand for bytes that are not UTF-8, which
    no run's catalog can be opened under, and a listing could not print), at most `NAME_MAX` bytes."""
    rule = ("a folder name of printable UTF-8 text (no control characters or lone surrogates), not empty, '.' or "
            f"'..', without '/', at most {NAME_MAX} bytes")
    if not isinstance(name, str) or name in ("", ".", "..") or os.sep in name or "/" in name:
        raise ValueError(f"`{param}` is {name!r}, but must be {rule}")
    if not name.isprintable():
        bad = next(c for c in name if not c.isprintable())
        raise ValueError(f"`{param}` is {name!r}, but must be {rule}; it holds {bad!r}")
    if len(name.encode()) > NAME_MAX:
        raise ValueError(f"`{param}` is {name[:40]!r}... ({len(name.encode())} bytes), but must be {rule}")


def not_utf8(path: str) -> str | None:
    """Why `path` cannot hold a run, or None when it can: it holds a byte that is not UTF-8 (a folder made with a bytes
    name, or from a str with a lone surrogate such as `"\\udcff"`). SQLite opens a run's catalog read-only by a
    UTF-8 `file:` URI, so no run under such a path can be read (`status`, `show`, `Result.open`)."""
    if not isinstance(path, str):
        return None
    try:
        path.encode()
    except UnicodeEncodeError as e:
        return (f"it holds {printable(e.object[e.start:e.end])}, which is not UTF-8 text (a byte of a name made "
                "outside Python, or a lone surrogate), so SQLite cannot open a run's catalog there")
    return None


def check_utf8(param: str, path: str) -> None:
    """A ValueError naming `param` and its value (`printable`) when `path` is not UTF-8 text (see `not_utf8`)."""
    if (why := not_utf8(path)) is not None:
        raise ValueError(f"`{param}` is '{printable(path)}', but {why}")


def enclosing_run(path: str, catalog_file: str) -> str | None:
    """The run directory (a folder holding `catalog_file`) that `path` is or lies in, or None."""
    folder = os.path.abspath(path)
    while True:
        if os.path.isfile(os.path.join(folder, catalog_file)):
            return folder
        parent = os.path.dirname(folder)
        if parent == folder:
            return None
        folder = parent


class StorageUnreachableError(OSError, ValueError):
    """A URI `storage_path` that cannot be listed or read (no network, no credentials, no such bucket). An `OSError`
    like the pyarrow error it wraps, and a `ValueError` like any other unusable `storage_path`."""


def unusable_dir(path: str) -> str | None:
    """Why no run directory can be made at `path`, or None when one can: `path` (or the nearest of its parents that
    exists) is a file, or a folder this process may not write into, or `path` is not UTF-8 text (`not_utf8`)."""
    if (why := not_utf8(path)) is not None:
        return why
    path = existing = os.path.abspath(path)
    while not os.path.exists(existing) and os.path.dirname(existing) != existing:
        existing = os.path.dirname(existing)
    what = "it" if existing == path else f"its parent {existing!r}"
    if not os.path.isdir(existing):
        return f"{what} is a file"
    if existing != path and not os.access(existing, os.W_OK | os.X_OK):
        return f"{what} is not writable"
    return None


class RunStorage:
    """A run's local directory, and the URI it is mirrored to (None: local only).

    Args:
        storage_path: a local path, a URI, or None (a new folder `name` under `default_root()`).
        name: the folder name for a default or a URI's working copy.
        sync_every_s: the least time between two mirrors while the run goes on.
    """

    def __init__(self, storage_path: str | None, name: str, sync_every_s: float = 30.0) -> None:
        self.uri: str | None = None
        self.sync_every_s = sync_every_s
        self._last_push = 0.0
        check_utf8("storage_path", storage_path)  # a URI's too: it names the working copy's folder
        if storage_path is None:
            self.local = os.path.join(default_root(), name)
        elif storage_path == "":  # abspath("") is the working directory, which `ray job submit` replaces
            raise ValueError(f"`storage_path` is {storage_path!r}, but must be a non-empty path, a URI or None")
        elif is_uri(storage_path):
            import pyarrow.fs

            try:
                self._fs, self._root = pyarrow.fs.FileSystem.from_uri(storage_path)
            except Exception as e:  # noqa: BLE001 - pyarrow raises several types for an unusable URI
                raise ValueError(f"`storage_path` is {storage_path!r}, but pyarrow.fs cannot open it: {e}") from e
            self.uri = storage_path
            digest = hashlib.sha1(storage_path.encode()).hexdigest()[:10]
            base = os.path.basename(self._root.rstrip("/")) or "run"
            self.local = os.path.join(default_root(), ".working", f"{base}-{digest}")
        elif not isinstance(storage_path, (str, os.PathLike)):
            raise TypeError(f"`storage_path` is {storage_path!r}, but must be a path, a URI or None")
        else:
            self.local = os.path.abspath(os.fspath(storage_path))
        check_utf8("storage_path", self.local)

    def __repr__(self) -> str:
        return f"RunStorage(local={self.local!r}, uri={self.uri!r})"

    @property
    def where(self) -> str:
        """What users should be told: the URI when there is one, else the local directory."""
        return self.uri or self.local

    def describe(self) -> str:
        """One line for the logs: where the run's results are (and its working copy, for a URI)."""
        return self.local if self.uri is None else f"{self.uri} (working copy {self.local})"

    # ---- remote mirror ------------------------------------------------------------------------------------------
    def _remote_files(self) -> dict[str, int]:
        import pyarrow.fs

        try:
            info = self._fs.get_file_info(pyarrow.fs.FileSelector(self._root, recursive=True, allow_not_found=True))
        except OSError as e:  # no network, no credentials, no such bucket: pyarrow's (AWS's) own words follow
            raise StorageUnreachableError(f"`storage_path` is {self.uri!r}, but it cannot be listed: {e}") from e
        root = self._root.rstrip("/") + "/"
        return {i.path[len(root):]: i.size for i in info if i.type == pyarrow.fs.FileType.File}

    def remote_exists(self) -> bool:
        return self.uri is not None and "run.db" in self._remote_files()

    def pull(self, into: str | None = None) -> str:
        """Copy the mirror into `into` (default: the local working copy, replacing what is there); returns the
        folder. Reads (`Result.open`, replay) pass a fresh folder, so they never touch a working copy in use."""
        if self.uri is None:
            return self.local
        files = self._remote_files()
        if "run.db" not in files:
            raise FileNotFoundError(f"`storage_path` {self.uri!r} holds no run.db: not a run directory")
        into = into or self.local
        for stale in ("run.db-wal", "run.db-shm", "run.db-journal"):  # they belong to the copy being replaced
            if os.path.exists(os.path.join(into, stale)):
                os.remove(os.path.join(into, stale))
        for rel in files:
            dst = confine(into, rel, f"the mirror's file {rel!r}")  # a key with `..` is not a file of the run
            os.makedirs(os.path.dirname(dst), exist_ok=True)
            with self._fs.open_input_stream(f"{self._root.rstrip('/')}/{rel}") as src, open(dst + ".part", "wb") as f:
                while chunk := src.read(1 << 22):
                    f.write(chunk)
            os.replace(dst + ".part", dst)
        return into

    def fetch(self) -> str:
        """A local folder to read the run from: the run directory itself, or a fresh copy of the mirror in a new
        temporary folder `modelhopper-read-*`, which the caller owns and removes (`Result.open` does, on
        `Result.close()`)."""
        if self.uri is None:
            return self.local
        into = tempfile.mkdtemp(prefix=READ_PREFIX)
        try:
            return self.pull(into)
        except BaseException:
            shutil.rmtree(into, ignore_errors=True)
            raise

    def push(self, force: bool = False) -> bool:
        """Mirror the local copy to the URI (at most every `sync_every_s` unless `force`); True when it did."""
        if self.uri is None or not os.path.isdir(self.local):
            return False
        if not force and time.monotonic() - self._last_push < self.sync_every_s:
            return False
        remote = self._remote_files()
        local: dict[str, int] = {}
        for dirpath, _, names in os.walk(self.local):
            for n in names:
                rel = os.path.relpath(os.path.join(dirpath, n), self.local).replace(os.sep, "/")
                if not _SKIP.search(rel):
                    try:
                        local[rel] = os.path.getsize(os.path.join(dirpath, n))
                    except FileNotFoundError:
                        continue  # pruned while we walked
        root = self._root.rstrip("/")
        # the catalog's snapshot first: every file it names exists locally now and is uploaded below, before it
        with tempfile.TemporaryDirectory() as tmp:
            snap = os.path.join(tmp, "run.db")
            db = os.path.join(self.local, "run.db")
            if os.path.exists(db):  # a consistent snapshot, never the live file and its WAL
                src, dst = sqlite3.connect(db), sqlite3.connect(snap)
                try:
                    src.backup(dst)
                finally:
                    src.close()
                    dst.close()
            for rel, size in local.items():
                if rel.startswith(IMMUTABLE) and remote.get(rel) == size:
                    continue
                try:
                    self._upload(os.path.join(self.local, rel), f"{root}/{rel}")
                except FileNotFoundError:
                    continue  # a checkpoint superseded and pruned meanwhile
            if os.path.exists(snap):
                self._upload(snap, f"{root}/run.db")
        # only this run's own pruned checkpoints go: nothing else under the URI is ever deleted
        for rel in set(remote) - set(local):
            if rel.startswith("checkpoints/"):
                self._fs.delete_file(f"{root}/{rel}")
        self._last_push = time.monotonic()
        return True

    def _upload(self, src: str, dst: str) -> None:
        self._fs.create_dir(dst.rsplit("/", 1)[0], recursive=True)
        with open(src, "rb") as f, self._fs.open_output_stream(dst) as out:
            while chunk := f.read(1 << 22):
                out.write(chunk)
