"""The run's inbox: how commands from other processes reach a running driver.

A process that steers a run (`framework.connect`, the CLI's `workers`) appends a *request* to `inbox.db`, a small
SQLite file in the run directory (WAL mode, one short transaction per request, so a writer never holds the driver
up). The driver reads new requests between events (`InboxCommands`, a `CommandSource`) and applies them with the
same rules as every other command; what it did with each (applied, or rejected and why) is a `command` event in
`run.db`, the run's signed record, which the sender reads back as the request's acknowledgement. The inbox is only
the transport: what the run did is what `run.db` says.

Requests are signed with this machine's key (`framework.engine.signing`) over the run's id, a random nonce and
every field, so someone who can write into the run directory but does not hold the key cannot steer the run (an
unsigned or edited request is rejected and logged), and a copied request is applied once (its nonce is).
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import sqlite3
import time
from collections.abc import Iterator
from typing import Any

from framework.engine.catalog import confine
from framework.engine.signing import SigningKeyError, load_key, mac

INBOX_FILE = "inbox.db"
_SCHEMA = ("CREATE TABLE IF NOT EXISTS requests (id INTEGER PRIMARY KEY AUTOINCREMENT, time REAL, nonce TEXT, "
           "name TEXT, args TEXT, source TEXT, mac TEXT)")


def _signed_fields(run_id: str, nonce: str, name: str, args: str, source: str) -> bytes:
    return json.dumps([run_id, "inbox", nonce, name, args, source]).encode()


@contextlib.contextmanager
def _connect(run_dir: str, create: bool) -> Iterator[sqlite3.Connection]:
    path = os.path.join(run_dir, INBOX_FILE)
    confine(run_dir, INBOX_FILE, "the inbox")  # an inbox.db that links out of the run is never opened
    if not create and not os.path.isfile(path):
        raise FileNotFoundError(path)
    db = sqlite3.connect(path, timeout=10.0, isolation_level=None)
    try:
        db.execute("PRAGMA trusted_schema = OFF")
        if create:
            db.execute("PRAGMA journal_mode=WAL")
            db.execute(_SCHEMA)
        yield db
    finally:
        db.close()


def send_request(run_dir: str, run_id: str, name: str, args: dict[str, Any], source: str = "connect") -> str:
    """Append a signed request to the run's inbox; returns its nonce (the `request` of its `command` event)."""
    key = load_key()  # a request is signed with an existing key only: a sender never makes one
    nonce = secrets.token_hex(8)
    text = json.dumps(args, sort_keys=True)
    stamp = mac(key, _signed_fields(run_id, nonce, name, text, source))
    with _connect(run_dir, create=True) as db:
        db.execute("INSERT INTO requests (time, nonce, name, args, source, mac) VALUES (?, ?, ?, ?, ?, ?)",
                   (time.time(), nonce, name, text, source, stamp))
    return nonce


class Request:
    """One request read from the inbox: `name`, `args`, `source`, `nonce`, and `problem` (None, or why it cannot be
    trusted: unsigned, edited, or not for this run)."""

    __slots__ = ("id", "nonce", "name", "args", "source", "problem")

    def __init__(self, id: int, nonce: Any, name: Any, args: Any, source: Any, problem: str | None) -> None:
        self.id, self.nonce, self.name, self.args, self.source, self.problem = id, nonce, name, args, source, problem


def read_requests(run_dir: str, run_id: str, after: int = 0) -> list[Request]:
    """The inbox's requests with an id above `after`, in order, each checked against its MAC. No inbox: none."""
    try:
        key: bytes | None = load_key()
    except SigningKeyError:
        key = None
    try:
        with _connect(run_dir, create=False) as db:
            rows = db.execute("SELECT id, nonce, name, args, source, mac FROM requests WHERE id > ? ORDER BY id",
                              (after,)).fetchall()
    except (FileNotFoundError, sqlite3.OperationalError):  # none yet, or being created this instant
        return []
    out = []
    for rid, nonce, name, args, source, stamp in rows:
        fields = (nonce, name, args, source)
        problem = None
        if key is None or not all(isinstance(v, str) for v in (*fields, stamp)):
            problem = "it is not signed"
        elif stamp != mac(key, _signed_fields(run_id, *fields)):
            problem = "its signature does not verify under this machine's key (edited, or not sent to this run)"
        try:
            parsed = json.loads(args) if problem is None else {}
        except (TypeError, ValueError):
            parsed, problem = {}, "its arguments are not JSON"
        if problem is None and not isinstance(parsed, dict):
            parsed, problem = {}, "its arguments are not a JSON object"
        out.append(Request(int(rid), nonce, name, parsed, source, problem))
    return out
