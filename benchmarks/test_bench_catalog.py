"""What the verified catalog costs (pytest-benchmark): writing the schedule log signed (a MAC per row, the table's
signed digest per transaction) vs the same writes unsigned vs plain SQLite inserts (what a unit's log row cost before
rows were signed), and verifying a whole run's catalog. Run with `make bench`; `extra_info` holds microseconds per
row. Nothing here asserts a time."""

from __future__ import annotations

import json
import os
import sqlite3
from types import SimpleNamespace

import pytest

from framework.store.catalog import SQLiteCatalog

ROWS = 2000
os.environ.setdefault("MODELHOPPER_SECRET", "bench-" * 8)


def _report(i: int) -> SimpleNamespace:
    unit = SimpleNamespace(config_id=i % 32, epoch=i // 64, partition=i % 8, kind="train")
    return SimpleNamespace(unit=unit, worker=i % 8, start=1e9 + i, end=1e9 + i + 0.5, num_examples=480,
                           state_bytes=19280, metrics={"loss": 0.5, "accuracy": 0.9}, error=None)


def _log_units(catalog: SQLiteCatalog) -> None:
    for i in range(ROWS):
        catalog.add_unit(i // 64, _report(i), "done")


@pytest.mark.parametrize("sign", [True, False], ids=["signed", "unsigned"])
def test_bench_catalog_unit_log(benchmark, tmp_path, sign):
    paths = iter(range(10**6))

    def setup():
        return (SQLiteCatalog(str(tmp_path / f"run-{next(paths)}.db"), sign=sign),), {}

    benchmark.pedantic(_log_units, setup=setup, rounds=5)
    benchmark.extra_info["us_per_row"] = benchmark.stats.stats.median / ROWS * 1e6


def test_bench_catalog_plain_sqlite_baseline(benchmark, tmp_path):
    """The same rows as plain autocommit INSERTs in WAL mode: what the log cost before rows were signed."""
    paths = iter(range(10**6))

    def setup():
        db = sqlite3.connect(str(tmp_path / f"plain-{next(paths)}.db"), isolation_level=None)
        db.execute("PRAGMA journal_mode=WAL")
        db.execute("PRAGMA synchronous=NORMAL")
        db.execute("CREATE TABLE units (seq INTEGER PRIMARY KEY AUTOINCREMENT, round, config_id, epoch, partition, "
                   "kind, worker, start, end, status, num_examples, state_bytes, metrics, error)")
        return (db,), {}

    def insert(db):
        for i in range(ROWS):
            r = _report(i)
            u = r.unit
            db.execute("INSERT INTO units (round, config_id, epoch, partition, kind, worker, start, end, status, "
                       "num_examples, state_bytes, metrics, error) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                       (i // 64, u.config_id, u.epoch, u.partition, u.kind, r.worker, r.start, r.end, "done",
                        r.num_examples, r.state_bytes, json.dumps(r.metrics), r.error))

    benchmark.pedantic(insert, setup=setup, rounds=5)
    benchmark.extra_info["us_per_row"] = benchmark.stats.stats.median / ROWS * 1e6


def test_bench_catalog_verify(benchmark, tmp_path):
    catalog = SQLiteCatalog(str(tmp_path / "run.db"))
    _log_units(catalog)
    catalog.close()
    reader = SQLiteCatalog(str(tmp_path / "run.db"), readonly=True)
    problems = benchmark(reader.verify)
    reader.close()
    assert problems == []
    benchmark.extra_info["us_per_row"] = benchmark.stats.stats.median / ROWS * 1e6
