"""The run catalog: one SQLite file per run that is the single source of truth for what ran.

Tables: `meta` (run settings), `configs` (id, config, status, epochs, parent, error), `units` (the schedule log: one
row per finished or failed unit attempt, with its worker, times and metrics), `epochs` (aggregated metrics per config
and epoch), `checkpoints` (latest weights file per config with its checksum), `events` (worker failures, joins, ...).
Everything users read (`Result`, CSV/Parquet files, replay, resume) is derived from it.

Every `meta` and `configs` row is signed with this machine's key (`framework.engine.signing`) as it is written, over
the run's own id (`meta["run_id"]`), so replay can tell a run this machine wrote from a `run.db` edited by hand,
brought from elsewhere, or patched with rows of another run (`unsigned()`).
"""

from __future__ import annotations

import json
import os
import secrets
import sqlite3
import threading
import time
import urllib.parse
from collections.abc import Iterable
from typing import Any

import pandas as pd

from framework.engine.signing import sign_text, verify_text

_SCHEMA = """
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL, signature TEXT);
CREATE TABLE IF NOT EXISTS configs (
    id INTEGER PRIMARY KEY, config TEXT NOT NULL, status TEXT NOT NULL, epochs INTEGER NOT NULL DEFAULT 0,
    parent INTEGER, error TEXT, first_round INTEGER NOT NULL DEFAULT 0, outcome TEXT, signature TEXT);
CREATE TABLE IF NOT EXISTS units (
    seq INTEGER PRIMARY KEY AUTOINCREMENT, round INTEGER NOT NULL, config_id INTEGER NOT NULL, epoch INTEGER NOT NULL,
    partition INTEGER NOT NULL, kind TEXT NOT NULL, worker INTEGER NOT NULL, start REAL NOT NULL, end REAL NOT NULL,
    status TEXT NOT NULL, num_examples INTEGER, state_bytes INTEGER, metrics TEXT, error TEXT);
CREATE TABLE IF NOT EXISTS epochs (
    config_id INTEGER NOT NULL, epoch INTEGER NOT NULL, round INTEGER NOT NULL, metrics TEXT NOT NULL,
    PRIMARY KEY (config_id, epoch));
CREATE TABLE IF NOT EXISTS checkpoints (
    config_id INTEGER NOT NULL, epoch INTEGER NOT NULL, units INTEGER NOT NULL, path TEXT NOT NULL,
    sha256 TEXT NOT NULL, bytes INTEGER NOT NULL, written REAL NOT NULL, PRIMARY KEY (config_id, units));
CREATE TABLE IF NOT EXISTS events (time REAL NOT NULL, kind TEXT NOT NULL, detail TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS rounds (
    round INTEGER PRIMARY KEY, committed REAL NOT NULL, procedure BLOB, signature TEXT);
"""


class CatalogError(RuntimeError):
    """A run catalog that is missing, truncated or not a catalog at all."""


class SQLiteCatalog:
    """Thread-safe access to a run's SQLite file (the driver loop and the checkpoint writer share it).

    `readonly=True` opens an existing file for reading only (what `Result`, `show` and replay's source use): a file
    that is missing or not a run catalog raises `CatalogError`, and nothing is ever written into it. Checkpoint paths
    are stored relative to the catalog's directory and returned absolute, so a run directory can be moved or copied.
    """

    def __init__(self, path: str, readonly: bool = False) -> None:
        self.path, self.readonly = path, readonly
        self.root = os.path.dirname(os.path.abspath(path))
        self._lock = threading.Lock()
        if readonly:
            if not os.path.isfile(path):
                raise CatalogError(f"{path} does not exist: not a run directory's catalog")
            uri = f"file:{urllib.parse.quote(os.path.abspath(path))}?mode=ro"
            self._db = sqlite3.connect(uri, uri=True, check_same_thread=False, isolation_level=None)
        else:
            self._db = sqlite3.connect(path, check_same_thread=False, isolation_level=None)
        try:
            tables = {r[0] for r in self._db.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
            if readonly and not {"meta", "configs", "units"} <= tables:
                raise CatalogError(f"{path} is not a run catalog (it has tables {sorted(tables) or 'none'})")
            if not readonly:
                self._db.execute("PRAGMA journal_mode=WAL")
                self._db.execute("PRAGMA synchronous=NORMAL")
                self._db.executescript(_SCHEMA)
            self._columns = {row[1] for row in self._db.execute("PRAGMA table_info(configs)")}
            self._meta_columns = {row[1] for row in self._db.execute("PRAGMA table_info(meta)")}
            if not readonly:  # a run from before configs had an outcome, or rows a signature
                for table, columns, column in (("configs", self._columns, "outcome"),
                                               ("configs", self._columns, "signature"),
                                               ("meta", self._meta_columns, "signature")):
                    if column not in columns:
                        self._db.execute(f"ALTER TABLE {table} ADD COLUMN {column} TEXT")
                        columns.add(column)
                # the run's own id, inside every signature: a signed row copied from another run does not verify
                run_id = secrets.token_hex(8)
                text = json.dumps(run_id)
                self._db.execute("INSERT OR IGNORE INTO meta (key, value, signature) VALUES ('run_id', ?, ?)",
                                 (text, sign_text(_content(run_id, "meta", "run_id", text))))
            row = self._db.execute("SELECT value FROM meta WHERE key = 'run_id'").fetchone()
            self._run_id = json.loads(row[0]) if row else None
        except sqlite3.DatabaseError as e:
            self._db.close()
            raise CatalogError(f"{path} is not a readable run catalog: {e}") from e

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

    def _write(self, sql: str, rows: Iterable[tuple] | tuple = ()) -> None:
        with self._lock:
            if isinstance(rows, tuple):
                self._db.execute(sql, rows)
            else:
                self._db.executemany(sql, list(rows))

    def transaction(self, statements: list[tuple[str, tuple]]) -> None:
        """Run `(sql, args)` statements atomically: all of them or none (a round's commit)."""
        with self._lock:
            self._db.execute("BEGIN IMMEDIATE")
            try:
                for sql, args in statements:
                    self._db.execute(sql, args)
            except BaseException:
                self._db.execute("ROLLBACK")
                raise
            self._db.execute("COMMIT")

    def _read(self, sql: str, args: tuple = ()) -> list[tuple]:
        with self._lock:
            return self._db.execute(sql, args).fetchall()

    # ---- meta ---------------------------------------------------------------------------------------------------
    def set_meta(self, **values: Any) -> None:
        if "run_id" in values:
            raise ValueError("`run_id` is the catalog's own (each run.db makes one): it cannot be set")
        rows = [(k, text, self._sign("meta", k, text)) for k, text in ((k, json.dumps(v)) for k, v in values.items())]
        self._write("INSERT OR REPLACE INTO meta (key, value, signature) VALUES (?, ?, ?)", rows)

    def meta(self) -> dict[str, Any]:
        return {k: json.loads(v) for k, v in self._read("SELECT key, value FROM meta")}

    def _sign(self, table: str, key: Any, text: str) -> str:
        return sign_text(_content(self._run_id, table, key, text))

    def unsigned(self) -> list[str]:
        """The `meta` keys and configs whose row does not carry this machine's signature of its content (edited by
        hand, written by an older version, or signed with another machine's key), e.g. `["meta 'functions'",
        "config 3"]`; empty when every row verifies."""
        signed = "signature" if "signature" in self._meta_columns else "NULL"
        bad = [f"meta {k!r}" for k, text, sig in self._read(f"SELECT key, value, {signed} FROM meta ORDER BY key")
               if not verify_text(_content(self._run_id, "meta", k, text), sig)]
        signed = "signature" if "signature" in self._columns else "NULL"
        bad += [f"config {cid}" for cid, text, sig in self._read(f"SELECT id, config, {signed} FROM configs ORDER BY id")
                if not verify_text(_content(self._run_id, "config", cid, text), sig)]
        return bad

    # ---- configs ------------------------------------------------------------------------------------------------
    def add_config(
        self, config_id: int, config: dict[str, Any], status: str, parent: int | None = None, first_round: int = 0
    ) -> None:
        """Record a new config; `first_round` is the round it first trains in (a clone starts from its parent's
        state at the end of the round before)."""
        text = json.dumps(config, default=str)
        self._write(
            "INSERT INTO configs (id, config, status, epochs, parent, first_round, signature) VALUES (?, ?, ?, 0, ?, ?, ?)",
            (config_id, text, status, parent, first_round, self._sign("config", config_id, text)),
        )

    def update_config(self, config_id: int, *, status: str | None = None, epochs: int | None = None, error: str | None = None) -> None:
        sets, args = [], []
        for col, val in (("status", status), ("epochs", epochs), ("error", error)):
            if val is not None:
                sets.append(f"{col} = ?")
                args.append(val)
        if sets:
            self._write(f"UPDATE configs SET {', '.join(sets)} WHERE id = ?", (*args, config_id))

    def configs(self) -> pd.DataFrame:
        outcome = "outcome" if "outcome" in self._columns else "NULL"
        rows = self._read(f"SELECT id, config, status, epochs, parent, error, first_round, {outcome} FROM configs "
                          "ORDER BY id")
        df = pd.DataFrame(rows, columns=["config_id", "config", "status", "epochs", "parent", "error", "first_round",
                                         "outcome"])
        df["config"] = df["config"].map(json.loads)
        return df

    # ---- units (the schedule log) -------------------------------------------------------------------------------
    def add_unit(self, round_: int, report: Any, status: str) -> None:
        u = report.unit
        self._write(
            "INSERT INTO units (round, config_id, epoch, partition, kind, worker, start, end, status, num_examples, "
            "state_bytes, metrics, error) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
            (
                round_, u.config_id, u.epoch, u.partition, u.kind, report.worker, report.start, report.end, status,
                report.num_examples, report.state_bytes, json.dumps(report.metrics), report.error,
            ),
        )

    def units(self, status: str | None = "done") -> pd.DataFrame:
        where, args = ("WHERE status = ?", (status,)) if status else ("", ())
        rows = self._read(
            "SELECT seq, round, config_id, epoch, partition, kind, worker, start, end, status, num_examples, "
            f"state_bytes, metrics, error FROM units {where} ORDER BY seq",
            args,
        )
        cols = ["seq", "round", "config_id", "epoch", "partition", "kind", "worker", "start", "end", "status",
                "num_examples", "state_bytes", "metrics", "error"]
        return pd.DataFrame(rows, columns=cols)

    # ---- epochs -------------------------------------------------------------------------------------------------
    def add_epoch(self, config_id: int, epoch: int, round_: int, metrics: dict[str, float]) -> None:
        self._write("INSERT OR REPLACE INTO epochs VALUES (?, ?, ?, ?)", (config_id, epoch, round_, json.dumps(metrics)))

    def epochs(self) -> pd.DataFrame:
        rows = self._read("SELECT config_id, epoch, round, metrics FROM epochs ORDER BY config_id, epoch")
        records = [{"config_id": c, "epoch": e, "round": r, **json.loads(m)} for c, e, r, m in rows]
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
        stmts: list[tuple[str, tuple]] = []
        for cid, epoch, metrics in epochs:
            stmts.append(("INSERT OR REPLACE INTO epochs VALUES (?, ?, ?, ?)", (cid, epoch, round_, json.dumps(metrics))))
        for cid, status, n, outcome in statuses:
            stmts.append(("UPDATE configs SET status = ?, epochs = ?, outcome = ? WHERE id = ?", (status, n, outcome, cid)))
        for cid, config, parent, first in new_configs:
            text = json.dumps(config, default=str)
            stmts.append((
                "INSERT INTO configs (id, config, status, epochs, parent, first_round, signature) "
                "VALUES (?, ?, 'active', 0, ?, ?, ?)",
                (cid, text, parent, first, self._sign("config", cid, text)),
            ))
        blob, sig = procedure if procedure is not None else (None, None)
        stmts.append(("INSERT OR REPLACE INTO rounds VALUES (?, ?, ?, ?)", (round_, time.time(), blob, sig)))
        self.transaction(stmts)

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
        self._write("UPDATE units SET status = ? WHERE seq = ?", [(status, int(s)) for s in seqs])

    # ---- checkpoints and events ---------------------------------------------------------------------------------
    def add_checkpoint(self, config_id: int, epoch: int, units: int, path: str, sha256: str, nbytes: int) -> None:
        self._write(
            "INSERT OR REPLACE INTO checkpoints VALUES (?, ?, ?, ?, ?, ?, ?)",
            (config_id, epoch, units, self._relative(path), sha256, nbytes, time.time()),
        )

    def checkpoints(self, config_id: int) -> list[tuple[int, int, str, str]]:
        """(epoch, units, absolute path, sha256) of a config's checkpoints, newest first."""
        rows = self._read(
            "SELECT epoch, units, path, sha256 FROM checkpoints WHERE config_id = ? ORDER BY units DESC", (config_id,)
        )
        return [(e, u, os.path.join(self.root, p), d) for e, u, p, d in rows]  # an absolute p (older runs) stays

    def _relative(self, path: str) -> str:
        """`path` relative to the catalog's directory when it lies under it (it then moves with the run)."""
        rel = os.path.relpath(os.path.abspath(path), self.root)
        return path if rel.startswith(os.pardir) else rel

    def add_event(self, kind: str, **detail: Any) -> None:
        self._write("INSERT INTO events VALUES (?, ?, ?)", (time.time(), kind, json.dumps(detail, default=str)))

    def events(self) -> pd.DataFrame:
        rows = self._read("SELECT time, kind, detail FROM events ORDER BY rowid")
        return pd.DataFrame(rows, columns=["time", "kind", "detail"])


def _content(run_id: str | None, table: str, key: Any, text: str) -> str:
    """What a row's signature covers: the run's id, the table, the row's key and its JSON text as stored."""
    return f"{run_id}\0{table}\0{key}\0{text}"


def parent_id(value: Any) -> int | None:
    """A `configs()` row's parent as an int, or None for a config that is not a clone (pandas reads NULL as NaN)."""
    try:
        return None if value is None or value != value else int(value)
    except (TypeError, ValueError):
        return None
