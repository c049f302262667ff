"""Every row of a run catalog is signed and every table has a signed digest: edits, deletions, rows from elsewhere
and old rows put back are all found, a writer never re-signs what it cannot verify, and stored paths stay inside."""

from __future__ import annotations

import os
import shutil
import sqlite3
from types import SimpleNamespace

import pytest

from framework.store.catalog import CatalogError, SQLiteCatalog, UnsafePathError, confine
from framework.store.signing import MIN_KEY_BYTES, SigningKeyError, load_key

KEY_A, KEY_B = "a" * MIN_KEY_BYTES, "b" * MIN_KEY_BYTES


def _report(config_id: int, partition: int, accuracy: float) -> SimpleNamespace:
    unit = SimpleNamespace(config_id=config_id, epoch=0, partition=partition, kind="train")
    return SimpleNamespace(unit=unit, worker=partition, start=1.5, end=2, num_examples=10, state_bytes=None, group=None,
                           metrics={"accuracy": accuracy}, error=None)


@pytest.fixture
def db(tmp_path, monkeypatch):
    """A catalog with a row in every table, written as a run writes them."""
    monkeypatch.setenv("MODELHOPPER_SECRET", KEY_A)
    path = str(tmp_path / "run.db")
    catalog = SQLiteCatalog(path)
    catalog.set_meta(functions={"model_fn": "pkg:model_fn"}, seed=0)
    catalog.add_config(0, {"lr": 0.1}, "active")
    catalog.add_unit(0, _report(0, 0, 0.5), "done")
    catalog.add_unit(0, _report(0, 1, 0.7), "done")
    catalog.commit_round(0, [(0, 0, {"valid_accuracy": 0.6})], [(0, "active", 1, None)],
                         [(1, {"lr": 0.2}, 0, 1)], (b"state", "sig"))  # a config the procedure added at a commit
    os.makedirs(tmp_path / "checkpoints")
    catalog.add_checkpoint(0, 0, 2, str(tmp_path / "checkpoints" / "config_0_u2.pt"), "ab" * 32, 10)
    catalog.add_event("workers_started", count=2)
    catalog.close()
    return path


def _sql(path: str, statement: str, args: tuple = ()) -> None:
    conn = sqlite3.connect(path, isolation_level=None)
    conn.execute(statement, args)
    conn.close()


def _verify(path: str) -> list[str]:
    catalog = SQLiteCatalog(path, readonly=True)
    try:
        return catalog.verify()
    finally:
        catalog.close()


def test_rows_written_through_the_catalog_verify(db):
    assert _verify(db) == []


@pytest.mark.parametrize("statement, named", [
    ("UPDATE meta SET value = '\"os:system\"' WHERE key = 'functions'", "meta 'functions'"),
    ("UPDATE configs SET config = '{\"lr\": 9}' WHERE id = 1", "config 1"),
    ("UPDATE configs SET status = 'completed' WHERE id = 0", "config 0"),
    ("UPDATE units SET metrics = '{\"accuracy\": 0.99}' WHERE seq = 2", "units row 2 (config 0, epoch 0, partition 1)"),
    ("UPDATE units SET seq = 3 WHERE seq = 1", "units row 3"),
    ("UPDATE epochs SET metrics = '{\"valid_accuracy\": 0.99}'", "epochs (config 0, epoch 0)"),
    ("UPDATE checkpoints SET path = '/tmp/victim.txt'", "checkpoints (config 0, units 2)"),
    ("UPDATE events SET detail = '{}'", "events row 1 (workers_started)"),
    ("UPDATE rounds SET procedure = x'00'", "round 0"),
])
def test_an_edited_row_of_any_table_is_named(db, statement, named):
    _sql(db, statement)
    problems = _verify(db)
    assert len(problems) == 1 and problems[0].startswith(named), problems


def test_another_machines_key_verifies_nothing(db, monkeypatch):
    monkeypatch.setenv("MODELHOPPER_SECRET", KEY_B)
    problems = _verify(db)
    assert "meta 'run_id' does not verify (edited, or not written by this run)" in problems
    assert len(problems) == 19  # 3 meta, 2 configs, 2 units, 1 epoch, 1 checkpoint, 1 event, 1 round, 7 digests, head


def test_a_row_signed_in_another_run_does_not_verify_in_this_one(db, tmp_path):
    other = SQLiteCatalog(str(tmp_path / "other.db"))  # same machine, same key, another run
    other.set_meta(functions={"model_fn": "os:system"})
    other.close()
    conn = sqlite3.connect(str(tmp_path / "other.db"))
    value, mac = conn.execute("SELECT value, mac FROM meta WHERE key = 'functions'").fetchone()
    conn.close()
    _sql(db, "UPDATE meta SET value = ?, mac = ? WHERE key = 'functions'", (value, mac))
    assert _verify(db)[0].startswith("meta 'functions' does not verify")
    catalog = SQLiteCatalog(db)
    with pytest.raises(ValueError, match="`run_id` is the catalog's own"):
        catalog.set_meta(run_id="x")
    catalog.close()


def test_a_deleted_row_is_found_by_its_tables_digest(db):
    _sql(db, "DELETE FROM units WHERE seq = 2")
    assert _verify(db) == ["units: rows were deleted, added or put back as they were earlier (the run wrote 2 rows, "
                           "run.db holds 1)"]


def test_a_row_put_back_as_it_was_before_an_update_is_found(db):
    conn = sqlite3.connect(db)
    old = conn.execute("SELECT status, epochs, outcome, mac FROM configs WHERE id = 0").fetchone()
    conn.close()
    catalog = SQLiteCatalog(db)
    catalog.update_config(0, status="failed", error="boom")
    catalog.close()
    assert _verify(db) == []
    _sql(db, "UPDATE configs SET status = ?, epochs = ?, outcome = ?, error = NULL, mac = ? WHERE id = 0", old)
    assert _verify(db) == ["configs: rows were deleted, added or put back as they were earlier (the run wrote 2 rows, "
                           "run.db holds 2)"]


def test_a_planted_trigger_is_reported(db):
    _sql(db, "CREATE TRIGGER t AFTER INSERT ON events BEGIN DELETE FROM units; END")
    assert _verify(db) == ["run.db holds a trigger 't' (CREATE TRIGGER t AFTER INSERT ON events BEGIN DELETE FROM units; "
                           "END) that no run writes"]


def test_a_table_made_anew_without_its_key_is_reported(db):
    conn = sqlite3.connect(db, isolation_level=None)
    conn.executescript("CREATE TABLE c2 AS SELECT * FROM configs; DROP TABLE configs; ALTER TABLE c2 RENAME TO configs;")
    conn.close()
    assert "table 'configs' of run.db is not as a run creates it" in _verify(db)


def test_a_blob_cannot_pass_for_the_text_of_its_hex(db):
    """`x'3132'` is the bytes of "12": a BLOB whose hex is a signed TEXT value does not verify in its place."""
    conn = sqlite3.connect(db, isolation_level=None)
    conn.execute("INSERT INTO meta VALUES ('probe', '3132', NULL)")
    conn.close()
    catalog = SQLiteCatalog(db)
    catalog.set_meta(probe="3132")  # a signed TEXT value '"3132"'
    catalog.close()
    _sql(db, "UPDATE meta SET value = x'22333133322200' WHERE key = 'probe'")
    assert _verify(db)[0].startswith("meta 'probe' does not verify")


def test_one_table_put_back_with_its_own_digest_is_found_by_the_head(db, tmp_path):
    """Copying an older `meta` table and its digest row into the run verifies per table, but not as a whole."""
    old = str(tmp_path / "old.db")
    shutil.copy(db, old)
    catalog = SQLiteCatalog(db)
    catalog.set_meta(seed=7)
    catalog.close()
    conn = sqlite3.connect(db, isolation_level=None)
    conn.execute("ATTACH ? AS old", (old,))
    conn.executescript("DELETE FROM meta; INSERT INTO meta SELECT * FROM old.meta; "
                       "DELETE FROM digests WHERE tbl = 'meta'; INSERT INTO digests SELECT * FROM old.digests "
                       "WHERE tbl = 'meta';")
    conn.close()
    assert _verify(db) == ["the head digest is missing or does not verify (tables were put back as they were earlier, "
                           "or run.db was edited)"]


def test_a_writer_never_re_signs_a_row_it_cannot_verify(db):
    _sql(db, "UPDATE configs SET config = '{\"lr\": 5.0}' WHERE id = 0")
    catalog = SQLiteCatalog(db)  # e.g. a resume that accepted the unverified run
    catalog.update_config(0, status="failed", error="x")
    catalog.set_meta(seed=7)  # a row that verified is replaced by a signed one
    catalog.close()
    assert [p.split(" does")[0] for p in _verify(db)] == ["config 0"]


def test_a_writer_never_re_signs_a_deleted_digest(db):
    _sql(db, "DELETE FROM units")
    _sql(db, "DELETE FROM digests WHERE tbl = 'units'")
    catalog = SQLiteCatalog(db)
    catalog.add_unit(1, _report(1, 0, 0.1), "done")
    catalog.close()
    assert _verify(db) == ["the head digest is missing or does not verify (tables were put back as they were earlier, "
                           "or run.db was edited)", "the digest of table units is missing or does not verify"]


def test_a_catalog_from_before_row_macs_cannot_be_verified_or_continued(tmp_path, monkeypatch):
    monkeypatch.setenv("MODELHOPPER_SECRET", KEY_A)
    path = str(tmp_path / "run.db")
    conn = sqlite3.connect(path, isolation_level=None)
    conn.executescript(
        "CREATE TABLE meta (key TEXT PRIMARY KEY, value TEXT NOT NULL, signature TEXT);"
        "CREATE TABLE configs (id INTEGER PRIMARY KEY, config TEXT NOT NULL, status TEXT NOT NULL, "
        "epochs INTEGER NOT NULL DEFAULT 0, parent INTEGER, error TEXT, first_round INTEGER NOT NULL DEFAULT 0);"
        "CREATE TABLE units (seq INTEGER PRIMARY KEY);"
        "INSERT INTO meta VALUES ('seed', '0', NULL);"
        "INSERT INTO configs (id, config, status) VALUES (0, '{}', 'stopped');")
    conn.close()
    assert _verify(path) == ["run.db was written by an older modelhopper or edited: it has no signed digests, so "
                             "nothing in it can be verified"]
    with pytest.raises(CatalogError, match="written by an older modelhopper"):
        SQLiteCatalog(path)


def test_unparsable_json_is_a_catalog_error_naming_the_row(db):
    _sql(db, "UPDATE meta SET value = '{not json' WHERE key = 'seed'")
    catalog = SQLiteCatalog(db, readonly=True)
    with pytest.raises(CatalogError, match="meta 'seed' is not valid JSON"):
        catalog.meta()
    catalog.close()


# ---- the key ------------------------------------------------------------------------------------------------------
def test_the_key_is_created_once_by_a_writer_whole_and_private(tmp_path, monkeypatch):
    monkeypatch.delenv("MODELHOPPER_SECRET", raising=False)
    monkeypatch.setenv("HOME", str(tmp_path))
    with pytest.raises(SigningKeyError, match="secret.key is missing"):
        load_key()  # a reader never makes a key
    first = load_key(create=True)
    assert load_key() == first  # the key written the first time is the one read after
    folder = tmp_path / ".config" / "modelhopper"
    assert os.listdir(folder) == ["secret.key"]  # no temporary file left beside it
    assert (folder / "secret.key").stat().st_mode & 0o777 == 0o600 and folder.stat().st_mode & 0o777 == 0o700
    assert len((folder / "secret.key").read_text()) == 64


def test_a_missing_key_is_named_with_the_way_out_and_never_recreated_by_a_reader(db, tmp_path, monkeypatch):
    monkeypatch.delenv("MODELHOPPER_SECRET", raising=False)
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    (problem,) = _verify(db)
    assert "secret.key is missing" in problem and "trust_unverified=True" in problem
    assert not (tmp_path / "home").exists()


@pytest.mark.parametrize("content", ["", "short"])
def test_an_empty_or_short_key_is_refused(tmp_path, monkeypatch, content):
    monkeypatch.delenv("MODELHOPPER_SECRET", raising=False)
    monkeypatch.setenv("HOME", str(tmp_path))
    (tmp_path / ".config" / "modelhopper").mkdir(parents=True)
    (tmp_path / ".config" / "modelhopper" / "secret.key").write_text(content)
    with pytest.raises(SigningKeyError, match=f"holds {len(content)} bytes, but a key must have at least 32"):
        load_key(create=True)
    monkeypatch.setenv("MODELHOPPER_SECRET", content)
    with pytest.raises(SigningKeyError, match="`\\$MODELHOPPER_SECRET` is .* bytes long"):
        load_key(create=True)


# ---- confinement --------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("stored", ["/tmp/victim.txt", "../../victim2.txt", "checkpoints/../../x", "", "."])
def test_a_stored_path_outside_the_run_is_refused(tmp_path, stored):
    with pytest.raises(UnsafePathError, match="checkpoints \\(config 1, units 3\\)"):
        confine(str(tmp_path), stored, "checkpoints (config 1, units 3)")


def test_a_link_out_of_the_run_is_refused(tmp_path):
    outside = tmp_path / "outside"
    outside.mkdir()
    run = tmp_path / "run"
    run.mkdir()
    (run / "checkpoints").symlink_to(outside)
    (run / "c.pt").symlink_to(outside / "c.pt")
    for stored in ("checkpoints/config_0_u1.pt", "c.pt"):
        with pytest.raises(UnsafePathError):
            confine(str(run), stored, "a row")
    assert confine(str(run), "data/x.npy", "a row") == str(run / "data" / "x.npy")


def test_a_checkpoint_row_may_name_only_a_file_in_the_checkpoints_folder(db):
    catalog = SQLiteCatalog(db, readonly=True)
    assert catalog.resolve("checkpoints/config_0_u2.pt", 0, 2).endswith("checkpoints/config_0_u2.pt")
    for stored in ("run.db", "data/train_0_0.npy", "checkpoints"):
        with pytest.raises(UnsafePathError, match="checkpoints \\(config 0, units 2\\)"):
            catalog.resolve(stored, 0, 2)
    catalog.close()


def test_verified_events_leave_out_a_row_planted_without_the_key(db):
    """What a sender trusts as its command's answer: a `command` row written by someone who can write into run.db
    but does not hold the key is not returned with `verified=True`."""
    cat = SQLiteCatalog(db)
    cat.add_event("command", request="a", applied=True, outcome="started workers [2]")
    cat.close()
    raw = sqlite3.connect(db)
    raw.execute("INSERT INTO events (seq, time, kind, detail, mac) VALUES (99, 0, 'command', ?, '00')",
                ('{"request": "b", "applied": true, "outcome": "forged"}',))
    raw.commit()
    raw.close()
    reader = SQLiteCatalog(db, readonly=True)
    try:
        assert len(reader.events("command")) == 2
        assert [d for d in reader.events("command", verified=True).detail] == [
            '{"request": "a", "applied": true, "outcome": "started workers [2]"}']
    finally:
        reader.close()


def test_a_new_catalog_appears_with_its_tables_so_a_reader_never_sees_it_empty(tmp_path, monkeypatch):
    """A reader polling for run.db (`connect`, the dashboard, a `Result` of a run starting) opens a run catalog the
    moment the file exists: it is made under another name and linked into place with its tables."""
    import threading

    monkeypatch.setenv("MODELHOPPER_SECRET", KEY_A)
    paths = [str(tmp_path / f"run{i}" / "run.db") for i in range(20)]
    for p in paths:
        os.makedirs(os.path.dirname(p))
    seen: list[str] = []

    def read() -> None:
        for p in paths:
            while not os.path.exists(p):
                pass
            SQLiteCatalog(p, readonly=True).close()  # CatalogError "is not a run catalog" before the fix
            seen.append(p)

    reader = threading.Thread(target=read)
    reader.start()
    for p in paths:
        SQLiteCatalog(p).close()
    reader.join(timeout=60)
    assert seen == paths
    assert sorted(os.listdir(tmp_path / "run0")) == ["run.db"]  # nothing left of the file it was made as
    SQLiteCatalog(paths[0]).close()  # a second writer opens the same file
