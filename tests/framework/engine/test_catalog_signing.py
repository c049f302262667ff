"""Every meta and config row of a run catalog carries this machine's signature: edits by hand are found."""

from __future__ import annotations

import os
import sqlite3

import pytest

from framework.engine.catalog import SQLiteCatalog


@pytest.fixture
def db(tmp_path, monkeypatch):
    monkeypatch.setenv("MODELHOPPER_SECRET", "key-a")
    path = str(tmp_path / "run.db")
    catalog = SQLiteCatalog(path)
    catalog.set_meta(functions={"model_fn": "pkg:model_fn"}, seed=0)
    catalog.add_config(0, {"lr": 0.1}, "active")
    catalog.commit_round(0, [], [], [(1, {"lr": 0.2}, 0, 1)], None)  # a config the procedure added at a commit
    catalog.close()
    return path


def _sql(path: str, statement: str, args: tuple = ()) -> None:
    conn = sqlite3.connect(path, isolation_level=None)
    conn.execute(statement, args)
    conn.close()


def _unsigned(path: str) -> list[str]:
    catalog = SQLiteCatalog(path, readonly=True)
    try:
        return catalog.unsigned()
    finally:
        catalog.close()


def test_rows_written_through_the_catalog_verify(db):
    assert _unsigned(db) == []


def test_edited_rows_are_named(db):
    _sql(db, "UPDATE meta SET value = '\"os:system\"' WHERE key = 'functions'")
    _sql(db, "UPDATE configs SET config = '{\"lr\": 9}' WHERE id = 1")
    assert _unsigned(db) == ["meta 'functions'", "config 1"]


def test_a_row_moved_to_another_key_does_not_verify(db):
    """The signature covers the row's key, not just its text: a signed value cannot be copied under another name."""
    _sql(db, "UPDATE configs SET id = 7 WHERE id = 0")
    assert _unsigned(db) == ["config 7"]


def test_another_machines_key_verifies_nothing(db, monkeypatch):
    monkeypatch.setenv("MODELHOPPER_SECRET", "key-b")
    assert _unsigned(db) == ["meta 'functions'", "meta 'run_id'", "meta 'seed'", "config 0", "config 1"]


def test_a_row_signed_in_another_run_does_not_verify_in_this_one(db, tmp_path):
    other = SQLiteCatalog(str(tmp_path / "other.db"))  # same machine, same key, another run
    other.set_meta(functions={"model_fn": "os:system"})
    other.close()
    conn = sqlite3.connect(str(tmp_path / "other.db"))
    value, signature = conn.execute("SELECT value, signature FROM meta WHERE key = 'functions'").fetchone()
    conn.close()
    _sql(db, "UPDATE meta SET value = ?, signature = ? WHERE key = 'functions'", (value, signature))
    assert _unsigned(db) == ["meta 'functions'"]
    catalog = SQLiteCatalog(db)
    with pytest.raises(ValueError, match="`run_id` is the catalog's own"):
        catalog.set_meta(run_id="x")
    catalog.close()


def test_a_catalog_from_before_signatures_is_unsigned_and_migrated_on_write(tmp_path, monkeypatch):
    monkeypatch.setenv("MODELHOPPER_SECRET", "key-a")
    path = str(tmp_path / "run.db")
    conn = sqlite3.connect(path, isolation_level=None)
    conn.executescript(
        "CREATE TABLE meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);"
        "CREATE TABLE configs (id INTEGER PRIMARY KEY, config TEXT NOT NULL, status TEXT NOT NULL, "
        "epochs INTEGER NOT NULL DEFAULT 0, parent INTEGER, error TEXT, first_round INTEGER NOT NULL DEFAULT 0);"
        "CREATE TABLE units (seq INTEGER PRIMARY KEY);"
        "INSERT INTO meta VALUES ('seed', '0');"
        "INSERT INTO configs (id, config, status) VALUES (0, '{}', 'stopped');")
    conn.close()
    assert _unsigned(path) == ["meta 'seed'", "config 0"]  # read only: nothing migrated, nothing trusted
    catalog = SQLiteCatalog(path)  # a writer (resume) adds the columns; what it writes is signed
    catalog.set_meta(seed=1)
    catalog.add_config(1, {"lr": 0.1}, "active")
    catalog.close()
    assert _unsigned(path) == ["config 0"]


def test_the_key_is_created_once_whole_and_private(tmp_path, monkeypatch):
    from framework.engine.signing import sign_text

    monkeypatch.delenv("MODELHOPPER_SECRET", raising=False)
    monkeypatch.setenv("HOME", str(tmp_path))
    first = sign_text("x")
    assert sign_text("x") == first  # the key written the first time is the one read after
    folder = tmp_path / ".config" / "modelhopper"
    assert os.listdir(folder) == ["secret.key"]  # no temporary file left beside it
    assert (folder / "secret.key").stat().st_mode & 0o777 == 0o600 and len((folder / "secret.key").read_text()) == 64
