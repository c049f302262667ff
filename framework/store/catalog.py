"""The run catalog: one SQLite file per run that is the single source of truth for what ran.

Tables: `meta` (run settings), `configs` (id, config, status, epochs, parent, error), `units` (the schedule log: one
row per finished or failed unit attempt, with its worker, times and metrics), `epochs` (aggregated metrics per config
and epoch), `checkpoints` (the weights files of every config with their checksums), `events` (worker failures,
joins, ...), `rounds` (the committed decisions with the procedure's signed state). Everything users read (`Result`,
CSV/Parquet files, replay, resume) is derived from it.

**Every row is verified before it is trusted.** A writer signs each row it writes with this machine's key
(`framework.store.signing`): a MAC over the run's own id (`meta["run_id"]`), the table and every column of the row,
so an edited value, a row moved to another key and a row copied from another run all fail. Rows that are deleted,
added, or put back as they were at an earlier point also fail: each table has a signed digest in `digests`, its row
count and the sum of its rows' MACs (mod 2**256), updated in the same transaction as the rows. `verify()` lists every
row and table that fails. A writer never re-signs what it cannot verify: an update of a row whose MAC fails leaves the
row unsigned, and a table whose digest failed keeps an unsigned digest, so accepting an unverified run (resume's
`trust_unverified=True`) never launders it. Paths stored in the catalog are relative to the run directory and are
refused (`UnsafePathError`, naming the row) when they resolve outside it.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import hmac
import json
import os
import re
import secrets
import sqlite3
import threading
import time
import urllib.parse
import warnings
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from framework.store.signing import KEY_ENV, SigningKeyError, key_path, load_key, mac

if TYPE_CHECKING:  # pandas is imported by the methods that return DataFrames: `modelhopper list` and `status` read
    import pandas as pd  # a run through the plain rows (`config_rows`, ...) and start without it (a second or so)

#: a run directory's catalog file
CATALOG_FILE = "run.db"
#: what a config's `status` says in a Result (`config_outcome`): it trained its budget, a procedure stopped it early
#: for its results, a person stopped it (a command), its user code failed, or it was still training when the run
#: ended (a crashed run)
OUTCOMES = ("completed", "pruned", "stopped", "failed", "active")


class CatalogError(RuntimeError):
    """A run catalog that is missing, truncated, not a catalog at all, or that does not verify and cannot be read."""


class UnverifiedRunError(CatalogError):
    """A run whose catalog does not verify, refused by resume or replay (`trust_unverified=True` accepts it)."""


class UnverifiedRunWarning(UserWarning):
    """A run was read whose catalog does not verify (`Result.unverified` names what)."""


class UnsafePathError(CatalogError):
    """A path stored in a run directory leads outside it (an absolute path, `..`, or a symbolic link)."""


@dataclass(frozen=True)
class _Table:
    """A catalog table: its columns (name, SQLite type) without the MAC, its key, and how a row is named."""

    name: str
    columns: tuple[tuple[str, str], ...]
    key: tuple[str, ...]
    label: str  # str.format template over the row's columns, for messages
    seq: bool = False  # the key is a sequence number the writer assigns (the log's order is part of what is signed)

    @functools.cached_property
    def names(self) -> tuple[str, ...]:
        return tuple(c for c, _ in self.columns)

    @functools.cached_property
    def types(self) -> tuple[str, ...]:
        return tuple(t for _, t in self.columns)


_TABLES = {t.name: t for t in (
    _Table("meta", (("key", "TEXT"), ("value", "TEXT")), ("key",), "meta {key!r}"),
    _Table("configs", (("id", "INTEGER"), ("config", "TEXT"), ("status", "TEXT"), ("epochs", "INTEGER"),
                       ("parent", "INTEGER"), ("error", "TEXT"), ("first_round", "INTEGER"), ("outcome", "TEXT")),
           ("id",), "config {id}"),
    _Table("units", (("seq", "INTEGER"), ("round", "INTEGER"), ("config_id", "INTEGER"), ("epoch", "INTEGER"),
                     ("partition", "INTEGER"), ("kind", "TEXT"), ("worker", "INTEGER"), ("start", "REAL"),
                     ("end", "REAL"), ("status", "TEXT"), ("num_examples", "INTEGER"), ("state_bytes", "INTEGER"),
                     ("metrics", "TEXT"), ("error", "TEXT"), ("grp", "INTEGER")),
           ("seq",), "units row {seq} (config {config_id}, epoch {epoch}, partition {partition})", seq=True),
    _Table("epochs", (("config_id", "INTEGER"), ("epoch", "INTEGER"), ("round", "INTEGER"), ("metrics", "TEXT")),
           ("config_id", "epoch"), "epochs (config {config_id}, epoch {epoch})"),
    _Table("checkpoints", (("config_id", "INTEGER"), ("epoch", "INTEGER"), ("units", "INTEGER"), ("path", "TEXT"),
                           ("sha256", "TEXT"), ("bytes", "INTEGER"), ("written", "REAL")),
           ("config_id", "units"), "checkpoints (config {config_id}, units {units})"),
    _Table("events", (("seq", "INTEGER"), ("time", "REAL"), ("kind", "TEXT"), ("detail", "TEXT")), ("seq",),
           "events row {seq} ({kind})", seq=True),
    _Table("rounds", (("round", "INTEGER"), ("committed", "REAL"), ("procedure", "BLOB"), ("signature", "TEXT")),
           ("round",), "round {round}"),
)}
_DIGESTS = _Table("digests", (("tbl", "TEXT"), ("rows", "INTEGER"), ("total", "TEXT")), ("tbl",), "digest of {tbl}")
_MOD = 1 << 256
CHECKPOINT_DIR = "checkpoints"  # where a run's checkpoint files live, inside its directory
HEAD = "*"  # the digests row that binds every table's digest (a table cannot be rolled back on its own)
_SCHEMA = "".join(
    f"CREATE TABLE IF NOT EXISTS {t.name} ({', '.join(f'{c} {ty}' for c, ty in t.columns)}, mac TEXT, "
    f"PRIMARY KEY ({', '.join(t.key)}));\n" for t in (*_TABLES.values(), _DIGESTS))


@functools.cache
def _schema_objects() -> frozenset[tuple]:
    """`sqlite_master` of a catalog as a writer creates it: anything else in a run.db (a trigger, a view, an index,
    a table without its primary key or with a collation) was put there by someone else."""
    db = sqlite3.connect(":memory:")
    try:
        db.executescript(_SCHEMA)
        return frozenset(db.execute("SELECT type, name, tbl_name, sql FROM sqlite_master").fetchall())
    finally:
        db.close()


def _head_total(digests: dict[str, tuple[Any, Any]]) -> str:
    """What the head digest signs: every table's (row count, MAC sum) as stored."""
    text = _ENCODER.encode(sorted(([n, r, t] for n, (r, t) in digests.items()), key=repr))
    return hashlib.sha256(text.encode()).hexdigest()


_ENCODER = json.JSONEncoder(separators=(",", ":"), default=str)  # one encoder: json.dumps with options makes one a call


def _q(name: str) -> str:
    return f'"{name}"'


def _canon(value: Any, sqltype: str) -> Any:
    """A value as SQLite stores and returns it in a column of `sqltype` (so a MAC made at write time verifies on read)."""
    if value is None or type(value) is str:
        return value
    if isinstance(value, bool):
        value = int(value)
    if isinstance(value, bytes):
        return {"blob": value.hex()}  # never equal to a TEXT value: a column cannot swap one for the other
    if isinstance(value, float):
        if value != value:
            return None  # SQLite stores NaN as NULL
        if sqltype == "INTEGER" and value.is_integer() and abs(value) < 2**63:
            return int(value)
    if sqltype == "REAL" and isinstance(value, int):
        return float(value)
    return value


def _as_int(stored: Any) -> int:
    """A stored MAC as a number for the table digest (0 for an unsigned or mangled one)."""
    try:
        return int(stored, 16) if isinstance(stored, str) and len(stored) == 64 else 0
    except ValueError:
        return 0


def confine(root: str, stored: Any, what: str, under: str = "") -> str:
    """The absolute path of `stored` (a path kept in the run directory `root`), which must resolve, symbolic links
    followed, to a place inside `root/under`; otherwise `UnsafePathError` naming `what` (the row it came from)."""
    real = os.path.realpath(root)
    base = os.path.realpath(os.path.join(real, under))
    if not isinstance(stored, str) or not stored or "\0" in stored:
        raise UnsafePathError(f"{what} names the path {stored!r}, which is not a path inside the run directory {root}")
    path = os.path.realpath(os.path.join(real, stored))
    inside = os.path.commonpath([real, base]) == real and os.path.commonpath([base, path]) == base and path != base
    if os.path.isabs(stored) or not inside:
        raise UnsafePathError(f"{what} names {stored!r}, which leads outside {os.path.join(root, under)}: refused "
                              "(nothing is read, written or deleted there)")
    return path


def readonly_uri(path: str) -> str:
    """SQLite's URI that opens the file `path` read-only (never created or written), for any bytes of the path."""
    return f"file:{urllib.parse.quote(os.fsencode(os.path.abspath(path)))}?mode=ro"


def records_start(path: str) -> bool:
    """Whether the catalog file `path` records its run's start yet (the meta's `start_time`, which a new run writes
    once it has saved its data). Read-only, without waiting: False while its tables or meta are not written yet, or
    while the writer holds the file a moment."""
    try:
        conn = sqlite3.connect(readonly_uri(path), uri=True)
        try:
            return conn.execute("SELECT 1 FROM meta WHERE key = 'start_time'").fetchone() is not None
        finally:
            conn.close()
    except sqlite3.Error:
        return False


def _create(path: str) -> None:
    """Make a new catalog file at `path` with its tables, atomically: a reader that finds run.db (`connect`, the
    dashboard, `Result.open` while the run starts) never sees it without them. A file another writer made first is
    kept."""
    tmp = f"{path}.new-{os.getpid()}-{secrets.token_hex(4)}"
    try:
        db = sqlite3.connect(tmp, isolation_level=None)
        try:
            db.execute("PRAGMA journal_mode=WAL")
            db.executescript(_SCHEMA)
        finally:
            db.close()
        try:
            os.link(tmp, path)
        except FileExistsError:
            pass
        except OSError:  # a file system without hard links: a rename, unless a writer made the file meanwhile
            if not os.path.lexists(path):
                os.replace(tmp, path)
    finally:
        for leftover in (tmp, tmp + "-wal", tmp + "-shm"):
            with contextlib.suppress(FileNotFoundError):
                os.unlink(leftover)


class SQLiteCatalog:
    """Thread-safe access to a run's SQLite file (the driver loop and the checkpoint writers share it).

    `readonly=True` opens an existing file for reading only (what `Result`, `show`, resume's checks and replay's
    source use): a file that is missing or not a run catalog raises `CatalogError`, nothing is ever written into it,
    and no key is needed until `verify()`. A writer signs every row (`sign=False`: leaves every row unsigned, for a
    replay of a run that did not verify). Checkpoint paths are stored relative to the catalog's directory and returned
    absolute, so a run directory can be moved or copied.
    """

    def __init__(self, path: str, readonly: bool = False, sign: bool = True) -> None:
        self.path, self.readonly, self.sign = path, readonly, sign and not readonly
        self.root = os.path.dirname(os.path.abspath(path))
        confine(self.root, os.path.basename(path), "the catalog")  # a run.db that links out of its run is not opened
        self._lock = threading.Lock()
        self._key: bytes | None = None
        if readonly:
            if not os.path.isfile(path):
                raise CatalogError(f"{path} does not exist: not a run directory's catalog")
            self._db = sqlite3.connect(readonly_uri(path), uri=True, check_same_thread=False, isolation_level=None)
        else:
            if not os.path.lexists(path):
                _create(path)
            self._db = sqlite3.connect(path, check_same_thread=False, isolation_level=None)
        try:
            self._db.execute("PRAGMA trusted_schema = OFF")  # a planted view or trigger calls no function
            tables = self._tables()
            if readonly and not {"meta", "configs", "units"} <= tables:
                raise CatalogError(f"{path} is not a run catalog (it has tables {sorted(tables) or 'none'})")
            row = self._db.execute("SELECT value FROM meta WHERE key = 'run_id'").fetchone() if "meta" in tables \
                else None
            self._run_id = _loads(row[0], "meta 'run_id'") if row else None  # None: a new run (a writer makes it)
            if not readonly:
                self._open_writer(tables)
            self._columns = {row[1] for row in self._db.execute("PRAGMA table_info(configs)")}
        except sqlite3.DatabaseError as e:
            self._db.close()
            raise CatalogError(f"{path} is not a readable run catalog: {e}") from e
        except BaseException:
            self._db.close()
            raise

    def _tables(self) -> set[str]:
        return {r[0] for r in self._db.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}

    def _open_writer(self, tables: set[str]) -> None:
        if "units" in tables and "mac" not in {r[1] for r in self._db.execute("PRAGMA table_info(units)")}:
            raise CatalogError(f"{self.path} was written by an older modelhopper, before every row was signed: it "
                               "can be read (unverified) but not continued")
        fresh = self._run_id is None
        if self.sign:
            try:  # a key is made only for a new run; continuing a run (trusted unverified) without one signs nothing
                self._key = load_key(create=fresh)
            except SigningKeyError:
                if fresh or os.environ.get(KEY_ENV) is not None or os.path.exists(key_path()):
                    raise  # an empty or short key is never used
                self.sign = False
        self._db.execute("PRAGMA journal_mode=WAL")
        self._db.execute("PRAGMA synchronous=NORMAL")
        self._db.executescript(_SCHEMA)
        # what a writer carries on from: each table's digest (a digest that does not verify stays unsigned) and the
        # next sequence number of the tables whose order is signed
        self._digest: dict[str, tuple[int, int]] = {}
        self._tainted: set[str] = set()
        self._next_seq = {t.name: 1 + (self._db.execute(f"SELECT MAX(seq) FROM {t.name}").fetchone()[0] or 0)
                          for t in _TABLES.values() if t.seq}
        if fresh:
            self._run_id = secrets.token_hex(8)
        stored = {r[0]: r for r in self._db.execute("SELECT tbl, rows, total, mac FROM digests")}
        head = stored.get(HEAD)
        self._commits = int(head[1]) if head is not None and isinstance(head[1], int) else 0
        if not fresh and not self._head_verifies(stored):
            self._tainted.add(HEAD)
        for name in _TABLES:
            if name in stored:
                _, rows, total, m = stored[name]
                self._digest[name] = (int(rows), _as_int(total) if isinstance(total, str) else 0)
                if not self._verifies(_DIGESTS, (name, rows, total), m):
                    self._tainted.add(name)
            else:
                self._digest[name] = (0, 0)
                if not fresh:
                    self._tainted.add(name)  # its digest was deleted: what the table held can no longer be vouched for
        if fresh:  # the run's own id, inside every MAC: a signed row copied from another run does not verify
            with self._tx():
                self._insert("meta", {"key": "run_id", "value": json.dumps(self._run_id)})
                self._changed.update(_TABLES)  # every table gets a signed digest from the start

    def close(self) -> None:
        """Close; a writer leaves one self-contained file behind (no `-wal`/`-shm`), so a reader of the finished
        run (`Result`, `show`) creates no file next to it."""
        with self._lock:
            if not self.readonly:
                try:
                    self._db.execute("PRAGMA journal_mode=DELETE")
                except sqlite3.OperationalError:
                    pass  # another connection still has it open: it stays in WAL mode until that one closes
            self._db.close()

    # ---- signed writes ------------------------------------------------------------------------------------------
    @contextlib.contextmanager
    def _tx(self) -> Iterator[None]:
        """One transaction of signed writes (`_insert`, `_update`), ending with the changed tables' digests."""
        with self._lock:
            saved = dict(self._digest), dict(self._next_seq), self._commits
            self._changed: set[str] = set()
            self._db.execute("BEGIN IMMEDIATE")
            try:
                yield
                for name in sorted(self._changed):
                    rows, total = self._digest[name]
                    self._put_digest(name, rows, f"{total:064x}", name not in self._tainted)
                self._commits += 1
                self._put_digest(HEAD, self._commits, _head_total({n: (r, f"{t:064x}") for n, (r, t) in
                                                                   self._digest.items()}), HEAD not in self._tainted)
                self._db.execute("COMMIT")
            except BaseException:
                if self._db.in_transaction:
                    self._db.execute("ROLLBACK")
                self._digest, self._next_seq, self._commits = saved
                raise

    def _put_digest(self, name: str, rows: int, total: str, signed: bool) -> None:
        values = (name, rows, total)
        self._db.execute("INSERT OR REPLACE INTO digests VALUES (?, ?, ?, ?)",
                         (*values, self._mac(_DIGESTS, values) if signed and self.sign else None))

    def _head_verifies(self, digests: dict[str, tuple]) -> bool:
        """Whether the head digest verifies and binds the per-table digests as stored."""
        head = digests.get(HEAD)
        tables = {n: (r[1], r[2]) for n, r in digests.items() if n != HEAD}
        return head is not None and self._verifies(_DIGESTS, head[:3], head[3]) and head[2] == _head_total(tables)

    def _mac(self, table: _Table, values: Iterable[Any]) -> str:
        canon = [_canon(v, ty) for v, ty in zip(values, table.types)]
        return mac(self._key, _ENCODER.encode([self._run_id, table.name, *canon]).encode())

    def _verifies(self, table: _Table, values: Iterable[Any], stored: Any) -> bool:
        return (self._key is not None and isinstance(stored, str) and stored.isascii()
                and hmac.compare_digest(self._mac(table, values), stored))

    def _count(self, name: str, stored: Any, sign: int) -> None:
        rows, total = self._digest[name]
        self._digest[name] = (rows + sign, (total + sign * _as_int(stored)) % _MOD)
        self._changed.add(name)

    def _insert(self, name: str, row: dict[str, Any], replace: bool = False) -> None:
        """Insert (or, with `replace`, insert or replace by key) one signed row; inside `_tx`."""
        table = _TABLES[name]
        if table.seq and row.get("seq") is None:
            row["seq"] = self._next_seq[name]
            self._next_seq[name] += 1
        values = tuple(row[c] for c in table.names)
        signed = self.sign
        if replace:
            where = " AND ".join(f"{_q(k)} = ?" for k in table.key)
            old = self._db.execute(f"SELECT {', '.join(map(_q, table.names))}, mac FROM {name} WHERE {where}",
                                   tuple(row[k] for k in table.key)).fetchone()
            if old is not None:
                signed = self._retire(table, old[:-1], old[-1]) and signed
        stored = self._mac(table, values) if signed else None
        verb = "INSERT OR REPLACE" if replace else "INSERT"
        self._db.execute(f"{verb} INTO {name} ({', '.join(map(_q, table.names))}, mac) "
                         f"VALUES ({', '.join('?' * (len(values) + 1))})", (*values, stored))
        self._count(name, stored, +1)

    def _update(self, name: str, where: dict[str, Any], sets: dict[str, Any]) -> None:
        """Change columns of the rows matching `where`, re-signing each only if it verified; inside `_tx`."""
        table = _TABLES[name]
        cond = " AND ".join(f"{_q(k)} = ?" for k in where)
        rows = self._db.execute(f"SELECT rowid, {', '.join(map(_q, table.names))}, mac FROM {name} WHERE {cond}",
                                tuple(where.values())).fetchall()
        for rowid, *old, stored in rows:
            signed = self._retire(table, old, stored) and self.sign
            values = tuple(sets.get(c, v) for c, v in zip(table.names, old))
            new = self._mac(table, values) if signed else None
            self._db.execute(f"UPDATE {name} SET {', '.join(f'{_q(c)} = ?' for c in table.names)}, mac = ? "
                             "WHERE rowid = ?", (*values, new, rowid))
            self._count(name, new, +1)

    def _retire(self, table: _Table, values: Iterable[Any], stored: Any) -> bool:
        """Take a row about to be replaced out of its table's digest; whether it verified."""
        self._count(table.name, stored, -1)
        return self._verifies(table, values, stored)

    def _read(self, sql: str, args: tuple = ()) -> list[tuple]:
        with self._lock:
            try:
                return self._db.execute(sql, args).fetchall()
            except sqlite3.DatabaseError as e:  # a truncated or mangled file: a catalog error, not a traceback
                raise CatalogError(f"{self.path} cannot be read: {e}") from e

    # ---- verification -------------------------------------------------------------------------------------------
    def verify(self) -> list[str]:
        """What in the catalog does not verify under this machine's key, one line each (e.g. `"meta 'seed' was
        edited"`, `"units: rows were deleted, added or restored ..."`); empty when every row and every table's digest
        verifies. A missing key is one line naming the key file."""
        try:
            self._key = self._key or load_key()
        except SigningKeyError as e:
            return [str(e)]
        try:
            return self._verify()
        except sqlite3.DatabaseError as e:
            return [f"{self.path} cannot be read: {e}"]

    def _verify(self) -> list[str]:
        with self._lock, self._snapshot():
            objects = set(self._db.execute("SELECT type, name, tbl_name, sql FROM sqlite_master").fetchall())
            tables = {o[1] for o in objects if o[0] == "table"}
            if "digests" not in tables:
                return ["run.db was written by an older modelhopper or edited: it has no signed digests, so nothing "
                        "in it can be verified"]
            problems = [f"run.db holds a {t} {n!r} ({sql or 'automatic'}) that no run writes"
                        for t, n, _, sql in sorted(objects - _schema_objects(), key=str)]
            problems += [f"table {n!r} of run.db is not as a run creates it" for t, n, _, _ in
                         sorted(_schema_objects() - objects, key=str) if t == "table" and n in tables]
            if self._run_id is None:
                problems.append("meta 'run_id' is missing")
            digests = {r[0]: r for r in self._db.execute("SELECT tbl, rows, total, mac FROM digests")}
            if not self._head_verifies(digests):
                problems.append("the head digest is missing or does not verify (tables were put back as they were "
                                "earlier, or run.db was edited)")
            for table in _TABLES.values():
                if table.name not in tables:
                    problems.append(f"table {table.name} is missing")
                    continue
                try:
                    cursor = self._db.execute(f"SELECT {', '.join(map(_q, table.names))}, mac FROM {table.name} "
                                              f"ORDER BY {', '.join(map(_q, table.key))}")
                except sqlite3.DatabaseError as e:
                    problems.append(f"table {table.name} cannot be read: {e}")
                    continue
                count, total, bad = 0, 0, []
                for *values, stored in cursor:
                    count, total = count + 1, (total + _as_int(stored)) % _MOD
                    if not self._verifies(table, values, stored):
                        bad.append(_label(table, values))
                problems += [f"{b} does not verify (edited, or not written by this run)" for b in bad]
                d = digests.get(table.name)
                if d is None or not self._verifies(_DIGESTS, d[:3], d[3]):
                    problems.append(f"the digest of table {table.name} is missing or does not verify")
                elif (count, total) != (d[1], _as_int(d[2])):
                    problems.append(f"{table.name}: rows were deleted, added or put back as they were earlier (the run "
                                    f"wrote {d[1]} rows, run.db holds {count})")
        return problems

    @contextlib.contextmanager
    def _snapshot(self) -> Iterator[None]:
        """One read transaction (a consistent view, also while a writer goes on); the caller holds the lock."""
        if self._db.in_transaction:
            yield
            return
        self._db.execute("BEGIN")
        try:
            yield
        finally:
            self._db.execute("COMMIT")

    @contextlib.contextmanager
    def snapshot(self) -> Iterator[None]:
        """Reads inside see one consistent state of the catalog (what `verify()` verified is what they read)."""
        with self._lock:
            if self._db.in_transaction:
                raise RuntimeError("snapshot() inside a transaction")
            self._db.execute("BEGIN")
        try:
            yield
        finally:
            with self._lock:
                self._db.execute("COMMIT")

    # ---- meta ---------------------------------------------------------------------------------------------------
    def set_meta(self, **values: Any) -> None:
        if "run_id" in values:
            raise ValueError("`run_id` is the catalog's own (each run.db makes one): it cannot be set")
        with self._tx():
            for k, v in values.items():
                self._insert("meta", {"key": k, "value": json.dumps(v)}, replace=True)

    def meta(self) -> dict[str, Any]:
        return {k: _loads(v, f"meta {k!r}") for k, v in self._read("SELECT key, value FROM meta")}

    # ---- configs ------------------------------------------------------------------------------------------------
    def add_config(
        self, config_id: int, config: dict[str, Any], status: str, parent: int | None = None, first_round: int = 0
    ) -> None:
        """Record a new config; `first_round` is the round it first trains in (a clone starts from its parent's
        state at the end of the round before)."""
        with self._tx():
            self._insert("configs", _config_row(config_id, config, status, parent, first_round))

    def update_config(self, config_id: int, *, status: str | None = None, epochs: int | None = None, error: str | None = None) -> None:
        sets = {k: v for k, v in (("status", status), ("epochs", epochs), ("error", error)) if v is not None}
        if sets:
            with self._tx():
                self._update("configs", {"id": config_id}, sets)

    def config_rows(self) -> list[tuple]:
        """The configs table by id, as plain rows: (config_id, config as its JSON text, status, epochs, parent, error,
        first_round, outcome); `configs()` as a DataFrame. Nothing here is verified: see `verify()`."""
        outcome = "outcome" if "outcome" in self._columns else "NULL"
        return self._read(f"SELECT id, config, status, epochs, parent, error, first_round, {outcome} FROM configs "
                          "ORDER BY id")

    def configs(self) -> pd.DataFrame:
        import pandas as pd

        rows = self.config_rows()
        df = pd.DataFrame(rows, columns=["config_id", "config", "status", "epochs", "parent", "error", "first_round",
                                         "outcome"])
        df["config"] = [_loads(text, f"config {cid}") for cid, text in zip(df.config_id, df.config)]
        return df

    # ---- units (the schedule log) -------------------------------------------------------------------------------
    def add_unit(self, round_: int, report: Any, status: str) -> None:
        u = report.unit
        with self._tx():
            self._insert("units", {
                "round": round_, "config_id": u.config_id, "epoch": u.epoch, "partition": u.partition, "kind": u.kind,
                "worker": report.worker, "start": report.start, "end": report.end, "status": status,
                "num_examples": report.num_examples, "state_bytes": report.state_bytes,
                "metrics": json.dumps(report.metrics), "error": report.error, "grp": report.group})

    def unit_kinds(self, status: str = "done") -> list[tuple]:
        """Per `kind` of the units with `status`: (kind, how many, their latest `end`, how many of them hold a value
        of another type than a unit has: a `kind` that is not text, a `start` or `end` that is not a number, a group
        that is not an int). What `units()` says of the schedule, summed up in SQLite, without pandas."""
        return self._read(
            "SELECT kind, COUNT(*), MAX(end), SUM(typeof(kind) != 'text' OR typeof(start) NOT IN ('integer', 'real') "
            "OR typeof(end) NOT IN ('integer', 'real') OR typeof(grp) NOT IN ('integer', 'null')) FROM units "
            "WHERE status = ? GROUP BY kind ORDER BY kind", (status,))

    def units(self, status: str | None = "done") -> pd.DataFrame:
        import pandas as pd

        where, args = ("WHERE status = ?", (status,)) if status else ("", ())
        rows = self._read(
            "SELECT seq, round, config_id, epoch, partition, kind, worker, start, end, status, num_examples, "
            f"state_bytes, metrics, error, grp FROM units {where} ORDER BY seq",
            args,
        )
        cols = ["seq", "round", "config_id", "epoch", "partition", "kind", "worker", "start", "end", "status",
                "num_examples", "state_bytes", "metrics", "error", "group"]
        df = pd.DataFrame(rows, columns=cols)
        df["group"] = df["group"].astype("Int64")  # a gang's id (its rows share it); <NA>: a unit of its own
        return df

    # ---- epochs -------------------------------------------------------------------------------------------------
    def add_epoch(self, config_id: int, epoch: int, round_: int, metrics: dict[str, float]) -> None:
        with self._tx():
            self._insert("epochs", _epoch_row(config_id, epoch, round_, metrics), replace=True)

    def epoch_rows(self) -> list[tuple]:
        """The epochs table by config and epoch, as plain rows: (config_id, epoch, round, metrics as JSON text);
        `epochs()` as a DataFrame."""
        return self._read("SELECT config_id, epoch, round, metrics FROM epochs ORDER BY config_id, epoch")

    def epochs(self) -> pd.DataFrame:
        import pandas as pd

        rows = self.epoch_rows()
        records = [{"config_id": c, "epoch": e, "round": r, **_loads(m, f"epochs (config {c}, epoch {e})", dict)}
                   for c, e, r, m in rows]
        return pd.DataFrame.from_records(records, columns=None if records else ["config_id", "epoch", "round"])

    # ---- rounds: the atomic commit point of resume ------------------------------------------------------------
    def commit_round(
        self,
        round_: int,
        epochs: list[tuple[int, int, dict[str, float]]],
        statuses: list[tuple[int, str, int, str | None]],
        new_configs: list[tuple[int, dict[str, Any], int | None, int]],
        procedure: tuple[bytes, str] | None,
    ) -> None:
        """Record the end of a round in one transaction: epoch metrics `(config, epoch, metrics)`, config updates
        `(config, status, epochs, outcome)`, configs the procedure added `(id, config, parent, first_round)`, and the
        procedure's signed state. Resume restarts from the last committed round."""
        blob, signature = procedure if procedure is not None else (None, None)
        with self._tx():
            for cid, epoch, metrics in epochs:
                self._insert("epochs", _epoch_row(cid, epoch, round_, metrics), replace=True)
            for cid, status, n, outcome in statuses:
                self._update("configs", {"id": cid}, {"status": status, "epochs": n, "outcome": outcome})
            for cid, config, parent, first in new_configs:
                self._insert("configs", _config_row(cid, config, "active", parent, first))
            self._insert("rounds", {"round": round_, "committed": time.time(), "procedure": blob,
                                    "signature": signature}, replace=True)

    def record_command(
        self,
        detail: dict[str, Any],
        statuses: list[tuple[int, str, int, str | None]] = (),
        new_configs: list[tuple[int, dict[str, Any], int | None, int]] = (),
        procedure: tuple[int, tuple[bytes, str]] | None = None,
    ) -> None:
        """Record an applied command with what it changed, in one transaction (a resume sees both or neither): its
        `command` event, config updates and new configs as in `commit_round`, and `procedure` `(round, signed
        state)`, which replaces that committed round's procedure (a budget a person extended)."""
        with self._tx():
            for cid, status, n, outcome in statuses:
                self._update("configs", {"id": cid}, {"status": status, "epochs": n, "outcome": outcome})
            for cid, config, parent, first in new_configs:
                self._insert("configs", _config_row(cid, config, "active", parent, first))
            if procedure is not None:
                round_, (blob, signature) = procedure
                self._insert("rounds", {"round": round_, "committed": time.time(), "procedure": blob,
                                        "signature": signature}, replace=True)
            self._insert("events", {"time": time.time(), "kind": "command", "detail": json.dumps(detail, default=str)})

    def last_round(self) -> tuple[int, bytes | None, str | None]:
        """(round, procedure blob, signature) of the last committed round; round -1 before the first commit."""
        rows = self._read("SELECT round, procedure, signature FROM rounds ORDER BY round DESC LIMIT 1")
        return rows[0] if rows else (-1, None, None)

    def unit_seqs(self, units: Iterable[Any], status: str = "done") -> list[int]:
        """Log rows (`seq`) with `status` of the given units (anything with config_id, epoch, partition, kind)."""
        seqs: list[int] = []
        for u in units:
            seqs += [row[0] for row in self._read(
                "SELECT seq FROM units WHERE config_id = ? AND epoch = ? AND partition = ? AND kind = ? AND status = ?",
                (u.config_id, u.epoch, u.partition, u.kind, status))]
        return seqs

    def mark_units(self, seqs: list[int], status: str) -> None:
        with self._tx():
            for s in seqs:
                self._update("units", {"seq": int(s)}, {"status": status})

    # ---- checkpoints and events ---------------------------------------------------------------------------------
    def add_checkpoint(self, config_id: int, epoch: int, units: int, path: str, sha256: str, nbytes: int) -> None:
        """Record a checkpoint file, which must lie inside the run directory (it is stored relative to it)."""
        rel = os.path.relpath(os.path.abspath(path), self.root)
        confine(self.root, rel, f"the checkpoint of config {config_id}", under=CHECKPOINT_DIR)
        with self._tx():
            self._insert("checkpoints", {"config_id": config_id, "epoch": epoch, "units": units, "path": rel,
                                         "sha256": sha256, "bytes": nbytes, "written": time.time()}, replace=True)

    def checkpoints(self, config_id: int, resolve: bool = True) -> list[tuple[int, int, str, str]]:
        """(epoch, units, absolute path, sha256) of a config's checkpoints, newest first. A stored path that leads
        outside the run directory raises `UnsafePathError` naming its row; `resolve=False` gives the stored paths
        as they are, for a caller that resolves each one (`resolve`) and treats a refused one as unusable."""
        rows = self._read(
            "SELECT epoch, units, path, sha256 FROM checkpoints WHERE config_id = ? ORDER BY units DESC", (config_id,)
        )
        return [(e, u, self.resolve(p, config_id, u) if resolve else p, d) for e, u, p, d in rows]

    def resolve(self, stored: Any, config_id: int, units: int) -> str:
        """The absolute path of a checkpoint row's stored path, confined to the run's `checkpoints` folder (a row
        cannot name run.db or a data file, which a rebuild would then replace)."""
        return confine(self.root, stored, f"checkpoints (config {config_id}, units {units})", under=CHECKPOINT_DIR)

    def checkpoint_units(self, config_id: int) -> list[int]:
        """How many training units each of a config's recorded checkpoints holds, newest first (no path is read)."""
        return [int(u) for (u,) in self._read(
            "SELECT units FROM checkpoints WHERE config_id = ? ORDER BY units DESC", (config_id,))]

    def add_event(self, kind: str, **detail: Any) -> None:
        with self._tx():
            self._insert("events", {"time": time.time(), "kind": kind, "detail": json.dumps(detail, default=str)})

    def event_rows(self, kind: str | None = None) -> list[tuple]:
        """The events in the order they were logged (only those of `kind` when given), as plain rows: (time, kind,
        detail as JSON text); `events()` as a DataFrame."""
        order = "seq" if "seq" in {r[1] for r in self._read("PRAGMA table_info(events)")} else "rowid"  # older runs
        where, args = ("WHERE kind = ?", (kind,)) if kind is not None else ("", ())
        return self._read(f"SELECT time, kind, detail FROM events {where} ORDER BY {order}", args)

    def events(self, kind: str | None = None, verified: bool = False) -> pd.DataFrame:
        """The events in the order they were logged; only those of `kind` when given; with `verified`, only rows
        whose signature verifies under this machine's key (what a sender trusts as its command's answer)."""
        import pandas as pd

        if verified:
            where, args = ("WHERE kind = ?", (kind,)) if kind is not None else ("", ())
            try:
                self._key = self._key or load_key()
            except SigningKeyError:
                return pd.DataFrame([], columns=["time", "kind", "detail"])  # without the key nothing verifies
            table = _TABLES["events"]
            rows = [(t, k, d) for q, t, k, d, m in self._read(
                f"SELECT seq, time, kind, detail, mac FROM events {where} ORDER BY seq", args)
                if self._verifies(table, (q, t, k, d), m)]
        else:
            rows = self.event_rows(kind)
        return pd.DataFrame(rows, columns=["time", "kind", "detail"])


def _config_row(config_id: int, config: dict[str, Any], status: str, parent: int | None, first: int) -> dict:
    """A configs row. The config is written as the JSON it reads back as, exactly (`automl.json_exact`: numpy
    numbers as the Python numbers they equal); one that holds anything JSON would lose (a set, bytes, nan, an object,
    10**400) raises `TypeError`/`ValueError` naming it, and the transaction writes nothing."""
    from automl._checks import json_exact  # (not at the top: reading a catalog needs no automl, nor optuna)

    exact = json_exact(f"configs[{config_id}]", config)
    return {"id": config_id, "config": json.dumps(exact, allow_nan=False), "status": status, "epochs": 0,
            "parent": parent, "error": None, "first_round": first, "outcome": None}


def _epoch_row(config_id: int, epoch: int, round_: int, metrics: dict[str, float]) -> dict:
    return {"config_id": config_id, "epoch": epoch, "round": round_, "metrics": json.dumps(metrics)}


def config_outcome(status: Any, outcome: Any) -> str:
    """A config's status as users read it (`OUTCOMES`), from the engine's status and the reason it stopped (a
    configs row's `status` and `outcome`)."""
    if status in ("failed", "active"):
        return status
    return outcome if isinstance(outcome, str) else "completed"  # a run from before outcomes were recorded


def describe_problems(problems: list[str], shown: int = 3) -> str:
    """The first `shown` of `verify()`'s lines, and how many more."""
    more = f" and {len(problems) - shown} more" if len(problems) > shown else ""
    return "; ".join(problems[:shown]) + more


def configs_named(problems: list[str]) -> list[int]:
    """The config ids `verify()`'s lines name (a config's row, its units, epochs or checkpoints): the configs whose
    numbers a reader should not trust."""
    return sorted({int(m) for line in problems for m in re.findall(r"\bconfig (\d+)\b", line)})


def check_verified(catalog: SQLiteCatalog, what: str, trust_unverified: bool) -> list[str]:
    """Refuse (`UnverifiedRunError`) a run that does not verify unless the caller accepts it (then warn); returns
    what did not verify. `what` is the refusing action, e.g. "resume"."""
    problems = catalog.verify()
    if problems and not trust_unverified:
        raise UnverifiedRunError(
            f"{what} refuses the run in {catalog.root}: it is not verified ({describe_problems(problems)}). Runs "
            "made on this machine verify; a run from someone else, or one edited since, does not. If you trust its "
            f"source, pass trust_unverified=True (CLI: --trust-unverified) to {what} it anyway; nothing it holds is "
            "re-signed")
    if problems:
        warnings.warn(UnverifiedRunWarning(f"{what} of the unverified run in {catalog.root} "
                                           f"({describe_problems(problems)}), accepted by trust_unverified=True"),
                      stacklevel=3)
    return problems


def _label(table: _Table, values: Iterable[Any]) -> str:
    try:
        return table.label.format(**dict(zip(table.names, values)))
    except (KeyError, ValueError, TypeError):  # a value mangled past formatting
        return f"a row of table {table.name}"


def _loads(text: Any, what: str, kind: type | None = None) -> Any:
    """JSON from a catalog column, or `CatalogError` naming the row (a hand-edited run.db is not a traceback)."""
    try:
        value = json.loads(text)
    except (TypeError, ValueError) as e:
        raise CatalogError(f"run.db's {what} is not valid JSON ({str(text)[:60]!r}): the catalog was edited") from e
    if kind is not None and not isinstance(value, kind):
        raise CatalogError(f"run.db's {what} holds a {type(value).__name__}, not a {kind.__name__}")
    return value


def parent_id(value: Any) -> int | None:
    """A `configs()` row's parent as an int, or None for a config that is not a clone (pandas reads NULL as NaN)."""
    try:
        return None if value is None or value != value else int(value)
    except (TypeError, ValueError):
        return None
