"""Fingerprints of the files a run reads: what a data source records at its first load, and what resume and replay
compare (`framework.sources.Source.fingerprint`, `framework.driver._state.RunState.sources_read`). Standard library
only: the driver imports it without torch.

    regular_file(param, path)        the absolute, resolved path of a regular file (a FIFO or a device is refused)
    file_print(path)                 its size, modification time and a sha256 of its bytes (sampled past 4 MiB)
    fingerprint_change(where, a, b)  what differs between two prints, as one line naming the file (None: the same)
"""

from __future__ import annotations

import hashlib
import os
import stat
from typing import Any

__all__ = ["DataChangedError", "file_print", "fingerprint_change", "regular_file", "schema_change"]


class DataChangedError(ValueError):
    """A source reads other data than the run recorded (`fingerprint_change` says what), or its files disagree."""


def regular_file(param: str, path: str, inside: str | None = None) -> str:
    """`path` as an absolute path with its links resolved, checked (by `os.stat`, without opening it) to be a
    regular file, and to lie in the folder `inside` when given; else an error naming `param` and the file."""
    real = os.path.realpath(path)
    try:
        mode = os.stat(real).st_mode
    except OSError:
        raise FileNotFoundError(f"`{param}` names {path!r}, but there is no such file") from None
    if not stat.S_ISREG(mode):
        what = "a FIFO" if stat.S_ISFIFO(mode) else "a socket" if stat.S_ISSOCK(mode) else "a device" if (
            stat.S_ISCHR(mode) or stat.S_ISBLK(mode)) else "a directory" if stat.S_ISDIR(mode) else "not a file"
        raise ValueError(f"`{param}` names {path!r}, which is {what}; only regular files are read")
    if inside is not None and os.path.commonpath([real, inside]) != inside:
        raise ValueError(f"`{param}` is {inside!r}, whose {path!r} links to {real!r}, outside it; only files inside "
                         "the folder are read")
    return real


#: files up to this size are hashed whole; larger ones by `_SAMPLES` blocks of `_BLOCK` bytes (head, tail, spread)
_WHOLE, _BLOCK, _SAMPLES = 4 << 20, 64 << 10, 32


def file_print(path: str) -> dict[str, Any]:
    """A file's fingerprint: its path, size, modification time and the sha256 of its bytes (whole up to 4 MiB, else
    of 32 blocks of 64 KiB: the head, the tail, where a footer is, and evenly between), read on the worker. Only a
    regular file is opened."""
    regular_file("the data", path)
    st = os.stat(path)
    h, size = hashlib.sha256(), st.st_size
    with open(path, "rb") as f:
        if size <= _WHOLE:
            for chunk in iter(lambda: f.read(1 << 20), b""):
                h.update(chunk)
        else:
            last = size - _BLOCK
            for offset in sorted({0, last, *(i * last // (_SAMPLES - 1) for i in range(1, _SAMPLES - 1))}):
                f.seek(offset)
                h.update(f.read(_BLOCK))
    return {"path": path, "size": size, "mtime_ns": st.st_mtime_ns, "sha256": h.hexdigest(), "sampled": size > _WHOLE}


def fingerprint_change(where: str, recorded: dict[str, Any], now: dict[str, Any]) -> str | None:
    """What differs between a source's fingerprint the run recorded and the one read now, as one line naming the
    file (None: the same data). A file's modification time alone is no change (a copy or a touch keeps the data)."""
    was = {f["path"]: f for f in recorded.get("files", [])}
    for f in now.get("files", []):
        old = was.pop(f["path"], None)
        if old is None:
            return f"{where} reads {f['path']}, which the run did not read"
        if old.get("size") != f.get("size"):
            return f"{f['path']} held {old.get('size')} bytes when the run read it, and holds {f.get('size')} now"
        if old.get("schema") is not None and f.get("schema") is not None and old["schema"] != f["schema"]:
            return f"{f['path']}: {schema_change(old['schema'], f['schema'])} since the run read it"
        if old.get("sha256") != f.get("sha256"):
            return f"{f['path']} has other content than when the run read it (same size; its bytes differ)"
    if was:
        return f"{where} no longer reads {sorted(was)[0]}, which the run read"
    for key in ("len", "type"):
        if key in recorded and recorded.get(key) != now.get(key):
            return f"{where}: its dataset's {key} is {now.get(key)!r}, and was {recorded.get(key)!r} when the run read it"
    return None


def schema_change(was: list, now: list) -> str:
    """One line saying how the table schema `now` ([[column, type], ...]) differs from `was`."""
    old, new = dict(map(tuple, was)), dict(map(tuple, now))
    gone, added = [c for c in old if c not in new], [c for c in new if c not in old]
    if gone or added:
        return f"column(s) {gone} are gone and {added} are new" if gone and added else (
            f"column(s) {gone} are gone" if gone else f"column(s) {added} are new")
    typed = next(c for c in old if old[c] != new[c]) if old != new else None
    if typed is not None:
        return f"column {typed!r} is of type {new[typed]}, not {old[typed]}"
    return f"its columns are in another order ({list(new)}, not {list(old)})"
