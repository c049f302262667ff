"""The run's inbox: how commands from other processes reach a running driver.

A process that steers a run (`framework.connect`, the CLI's `workers`) appends a *request* to `inbox.db`, a small
SQLite file in the run directory (WAL mode, one short transaction per request, so a writer never holds the driver
up). The driver reads new requests between events (`InboxCommands`, a `CommandSource`) and applies them with the
same rules as every other command; what it did with each (applied, or rejected and why) is a `command` event in
`run.db`, the run's signed record, which the sender reads back as the request's acknowledgement. The inbox is only
the transport: what the run did is what `run.db` says.

Threat model: the inbox is untrusted input. Anyone who can write the run directory can write `inbox.db` without
this machine's key: append and edit rows, plant any id up to 2**63 - 1, put values of any type and size in any
column, replace the file with other bytes, another database (another `requests` table: TEXT ids, other columns,
triggers), a symbolic link (out of the run, or to `run.db`), a FIFO, or remove it. Against such a writer:

- Nobody steers the run without the key. A request is signed with this machine's key (`framework.store.signing`)
  over the run's id, a random nonce and every field; an unsigned or edited request is rejected, and a copied one is
  applied once (its nonce is).
- Nothing the writer puts there crashes or stalls the driver. `read_requests` never opens a link or anything but a
  regular file (`inbox.db`, nor its `-wal`, `-shm` and `-journal`, which SQLite would open, and write, too), never
  reads a file over `MAX_INBOX_BYTES` (so no value in it is larger), reads at most `READ_LIMIT` rows per call, checks
  each field's type and length in SQL (a value over `MAX_NAME`, `MAX_ARGS`, `MAX_SOURCE` never reaches Python: the
  request is malformed), accepts only the table senders create, and reads any integer id (a cursor past the file's
  last id means the file was replaced: reading starts over, and nonces applied stay applied). An inbox it cannot
  use raises `InboxError`, whose `kind` the driver reports once (one `inbox` event, one console line) before reading
  it as empty: the run goes on, and a resume too. Rejections of untrusted requests are reported a few at a time and
  then counted (`InboxCommands`), so a flood of rows is a few events, not one per row.
- Senders (`send_request`) check the same and refuse a broken inbox with one `InboxError` that says what is wrong
  and how to go on (move the files aside: the next request makes a new inbox, which the run reads from its start).
  A sender never repairs, renames or deletes anything: a broken inbox is evidence that someone wrote the run
  directory, and a sender that moved files could race another sender creating a new inbox.

Out of scope: such a writer can still deny steering (remove the inbox, hold its lock, fill it with rows ahead of a
real request) and break the run in other ways (it can write `run.db` and the checkpoints too: `run.db` is signed,
so that is detected, not prevented); and the checks before SQLite opens the file cannot close the race against a
writer that swaps in a link or a FIFO between them and the open.
"""

from __future__ import annotations

import contextlib
import json
import os
import pathlib
import secrets
import sqlite3
import stat
import time
from collections.abc import Iterator
from typing import Any

from framework.store.catalog import CatalogError, UnsafePathError
from framework.store.signing import SigningKeyError, load_key, mac

INBOX_FILE = "inbox.db"
_SCHEMA = ("CREATE TABLE IF NOT EXISTS requests (id INTEGER PRIMARY KEY AUTOINCREMENT, time REAL, nonce TEXT, "
           "name TEXT, args TEXT, source TEXT, mac TEXT)")
#: what `sqlite_master` holds in an inbox senders made, and nothing else
_MASTER = {("table", "requests", _SCHEMA.replace(" IF NOT EXISTS", "")),
           ("table", "sqlite_sequence", "CREATE TABLE sqlite_sequence(name,seq)")}
_FILES = ("", "-wal", "-shm", "-journal")  # the inbox and the files SQLite opens beside it
MAX_NAME = 64  # characters of a request's command name
MAX_SOURCE = 64  # characters of its source (`connect(run, source=...)`)
MAX_ARGS = 65536  # characters of its arguments' JSON text
MAX_INBOX_BYTES = 64 * 2**20  # inbox.db and its -wal together: far above what people send (a request is ~300 bytes)
READ_LIMIT = 1000  # requests read per call
MAX_ID = 2**63 - 1  # SQLite's largest row id: past it, AUTOINCREMENT cannot insert
_FIELDS = (("nonce", 64), ("name", MAX_NAME), ("args", MAX_ARGS), ("source", MAX_SOURCE), ("mac", 128))
# each field: its type, and its value when it is text within its length (else NULL: the value never leaves SQLite)
_SELECT = ("SELECT id, " + ", ".join(f"typeof({c}), CASE WHEN typeof({c}) = 'text' AND length({c}) <= {n} THEN {c} END"
                                     for c, n in _FIELDS)
           + " FROM requests WHERE id > ? ORDER BY id LIMIT ?")
_READ_TIMEOUT_S = 0.1  # a reader waits no longer for a lock: the driver loop reads again at its next poll


class InboxError(CatalogError):
    """The run's inbox cannot be used: `kind` says why (`link`: a link or not a regular file; `size`: over
    `MAX_INBOX_BYTES`; `unreadable`: not an SQLite database, damaged, or not readable; `schema`: not the table
    senders create; `ids`: its ids are used up, for a sender). The message names the file and the way out."""

    def __init__(self, kind: str, message: str) -> None:
        super().__init__(message)
        self.kind = kind


class UnsafeInboxError(InboxError, UnsafePathError):
    """The inbox, or a file SQLite would open beside it, is a symbolic link or not a regular file: never opened."""


def _way_out(path: str) -> str:
    return (f"someone or something that can write the run directory changed it. To steer the run again, move "
            f"{os.path.basename(path)} and any {os.path.basename(path)}-wal, -shm aside (keep them: they show what "
            "was written); the next command makes a new inbox, which the run reads from its start")


def _clip(value: Any, limit: int = 200) -> str:
    text = repr(value)  # escapes what is not printable
    return text if len(text) <= limit else text[:limit] + "..."


def _check_files(run_dir: str) -> bool:
    """Whether the inbox exists; `InboxError` when it, or a file SQLite opens beside it, is not a plain file of the
    run or is too large to read."""
    path = os.path.join(run_dir, INBOX_FILE)
    size, exists = 0, False
    for suffix in _FILES:
        try:
            st = os.lstat(path + suffix)
        except FileNotFoundError:
            continue
        except OSError as e:
            raise InboxError("unreadable", f"the run's inbox {path + suffix} cannot be read ({e.strerror}): "
                                           f"{_way_out(path)}") from None
        if not stat.S_ISREG(st.st_mode):
            what = "a symbolic link" if stat.S_ISLNK(st.st_mode) else "not a regular file"
            raise UnsafeInboxError("link", f"the run's inbox {path + suffix} is {what}: refused, never opened "
                                           f"(nothing is read or written through it); {_way_out(path)}")
        size += st.st_size if suffix in ("", "-wal") else 0
        exists = exists or suffix == ""
    if size > MAX_INBOX_BYTES:
        raise InboxError("size", f"the run's inbox {path} holds {size} bytes, more than the {MAX_INBOX_BYTES} an "
                                 f"inbox may: not read; {_way_out(path)}")
    return exists


def _has_table(db: sqlite3.Connection, path: str) -> bool:
    """Whether the inbox has its `requests` table (False: not made yet); `InboxError` when it holds anything else
    (another `requests`, a view, a trigger, an index)."""
    rows = db.execute("SELECT type, name, sql FROM sqlite_master LIMIT 3").fetchall()
    found = set(rows)
    if len(rows) > len(_MASTER) or not found <= _MASTER:
        other = sorted(found - _MASTER, key=repr)[0] if found - _MASTER else rows[-1]
        raise InboxError("schema", f"the run's inbox {path} holds {_clip(other)}, which is not the table senders "
                                   f"create: not read; {_way_out(path)}")
    return any(name == "requests" for _, name, _ in found)


def _transient(e: sqlite3.OperationalError) -> bool:
    return any(w in str(e) for w in ("locked", "busy"))


def send_request(run_dir: str, run_id: str, name: str, args: dict[str, Any], source: str = "connect") -> str:
    """Append a signed request to the run's inbox; returns its nonce (the `request` of its `command` event).
    `ValueError` when `name`, `source` or `args` is over its limit; `InboxError` when the inbox cannot take it (see
    the module docstring): nothing is sent then, and nothing is changed."""
    key = load_key()  # a request is signed with an existing key only: a sender never makes one
    text = json.dumps(args, sort_keys=True)
    for what, value, limit in (("name", name, MAX_NAME), ("source", source, MAX_SOURCE), ("args", text, MAX_ARGS)):
        if not isinstance(value, str) or len(value) > limit:
            shown = f"{len(value)} characters" if isinstance(value, str) else _clip(value)
            raise ValueError(f"`{what}` is {shown}, but must be text of at most {limit} characters"
                             + (" (as JSON)" if what == "args" else ""))
    nonce = secrets.token_hex(8)
    stamp = mac(key, _signed_fields(run_id, nonce, name, text, source))
    path = os.path.join(run_dir, INBOX_FILE)
    _check_files(run_dir)
    try:
        with contextlib.closing(sqlite3.connect(path, timeout=10.0, isolation_level=None)) as db:
            db.execute("PRAGMA trusted_schema = OFF")
            _has_table(db, path)  # before anything is written: a file that is not an inbox is left as it is
            db.execute("PRAGMA journal_mode=WAL")
            db.execute("BEGIN IMMEDIATE")
            try:
                if not _has_table(db, path):  # again, under the write lock
                    db.execute(_SCHEMA)
                _check_room(db, path)
                db.execute("INSERT INTO requests (time, nonce, name, args, source, mac) VALUES (?, ?, ?, ?, ?, ?)",
                           (time.time(), nonce, name, text, source, stamp))
                db.execute("COMMIT")
            finally:
                if db.in_transaction:
                    db.execute("ROLLBACK")
    except sqlite3.Error as e:
        raise InboxError("unreadable", f"command {name!r} not sent: the run's inbox {path} cannot be written "
                                       f"({e}); {_way_out(path)}") from None
    return nonce


def _check_room(db: sqlite3.Connection, path: str) -> None:
    """`InboxError` when the inbox has no id left for one more request (a row planted at SQLite's last id)."""
    top = db.execute("SELECT max(id) FROM requests").fetchone()[0]
    seq = db.execute("SELECT max(seq) FROM sqlite_sequence WHERE name = 'requests'").fetchone()[0]
    used = [v for v in (top, seq) if v is not None]
    if not all(isinstance(v, int) for v in used) or max(used, default=0) >= MAX_ID:
        raise InboxError("ids", f"the run's inbox {path} has no request id left (its last is {_clip(used)}; SQLite's "
                                f"last is 2**63 - 1): no sender wrote that; {_way_out(path)}")


def _signed_fields(run_id: str, nonce: str, name: str, args: str, source: str) -> bytes:
    return json.dumps([run_id, "inbox", nonce, name, args, source]).encode()


class Request:
    """One request read from the inbox: `name`, `args`, `source`, `nonce`, and `problem` (None, or why it cannot be
    trusted: malformed, unsigned, edited, or not for this run). A field that is not text within its limit is None."""

    __slots__ = ("id", "nonce", "name", "args", "source", "problem")

    def __init__(self, id: int, nonce: Any, name: Any, args: Any, source: Any, problem: str | None) -> None:
        self.id, self.nonce, self.name, self.args, self.source, self.problem = id, nonce, name, args, source, problem


@contextlib.contextmanager
def _reading(path: str) -> Iterator[sqlite3.Connection]:
    # read-only: a reader never creates, repairs or writes into the file
    uri = pathlib.Path(os.path.abspath(path)).as_uri() + "?mode=ro"
    db = sqlite3.connect(uri, uri=True, timeout=_READ_TIMEOUT_S, isolation_level=None)
    try:
        db.execute("PRAGMA trusted_schema = OFF")
        yield db
    finally:
        db.close()


def read_requests(run_dir: str, run_id: str, after: int = 0, limit: int = READ_LIMIT) -> list[Request]:
    """At most `limit` of the inbox's requests with an id above `after`, in id order, each checked (its fields' types
    and lengths, then its MAC). No inbox, one not made yet, or one locked this instant: none. An `after` past the
    inbox's last id means the inbox was replaced (moved aside, then made anew): its requests from the first.
    `InboxError` when the inbox cannot be read as one (see the module docstring)."""
    try:
        key: bytes | None = load_key()
    except SigningKeyError:
        key = None
    path = os.path.join(run_dir, INBOX_FILE)
    if not _check_files(run_dir):
        return []
    try:
        with _reading(path) as db:
            if not _has_table(db, path):
                return []  # being made this instant
            top = db.execute("SELECT max(id) FROM requests").fetchone()[0]
            if not isinstance(top, int):
                return []
            rows = db.execute(_SELECT, (after if after <= top else 0, limit)).fetchall()
    except sqlite3.OperationalError as e:
        if _transient(e):
            return []
        raise InboxError("unreadable", f"the run's inbox {path} cannot be read ({e}): {_way_out(path)}") from None
    except sqlite3.Error as e:
        raise InboxError("unreadable", f"the run's inbox {path} is not an inbox ({e}): {_way_out(path)}") from None
    return [_checked(row, key, run_id) for row in rows if isinstance(row[0], int)]


def _checked(row: tuple, key: bytes | None, run_id: str) -> Request:
    """The request of one row: why it cannot be trusted (the first reason), and its arguments when it can."""
    rid, kinds, values = row[0], row[1::2], row[2::2]
    nonce, name, args, source, stamp = values
    problem = None
    for (field, limit), kind, value in zip(_FIELDS[:4], kinds, values):
        if value is None:
            what = "missing" if kind == "null" else f"longer than {limit} characters" if kind == "text" else f"a {kind}, not text"
            problem = f"it is malformed: its `{field}` is {what}"
            break
    if problem is None and (key is None or stamp is None):
        problem = "it is not signed"
    elif problem is None and stamp != mac(key, _signed_fields(run_id, nonce, name, args, source)):
        problem = "its signature does not verify under this machine's key (edited, or not sent to this run)"
    parsed: Any = {}
    if problem is None:
        try:
            parsed = json.loads(args)
        except (ValueError, RecursionError):
            problem = "its arguments are not JSON"
        if problem is None and not isinstance(parsed, dict):
            parsed, problem = {}, "its arguments are not a JSON object"
    return Request(rid, nonce, name, parsed if problem is None else {}, source, problem)
