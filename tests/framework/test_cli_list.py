"""`modelhopper list` and `status` without pandas: a run that verifies is read from its catalog's rows as they are
(`framework.steering.status._plain_reading`), and what that gives equals what reading it as a `Result` gives (its status,
its best config: `Result.get_best_result()`); any other run is read as a `Result`, as before. `list` prints its rows as
pandas printed its DataFrame (`framework.text.text_table`, `json_records`). Runs are made by hand with the real catalog
(no Ray)."""

from __future__ import annotations

import json
import math
import os
import pathlib
import random
import socket
import sqlite3
import time

import pandas as pd
import pytest

from framework.__main__ import main as cli
from framework.result import NoResultError, Result
from framework.runs.manage import LIST_COLUMNS, age, list_runs, run_rows
from framework.scheduling.units import Unit, UnitReport
from framework.steering.status import _plain_reading, _reading_of, _status_dict, opened, run_status
from framework.store.catalog import CATALOG_FILE, SQLiteCatalog
from framework.text import json_records, text_table

NOW = 2_000_000_000.0


def _make(path, configs: dict[int, tuple[str, list[dict]]], meta: dict | None = None, events=(), units=(),
          rounds: int = 0) -> str:
    """A run of `configs` (id -> (status, metrics of each epoch)) with `meta` (default: valid_loss, min), `events`
    ((kind, detail)), `units` ((config, epoch, partition, kind, end)) and `rounds` committed rounds."""
    os.makedirs(path)
    catalog = SQLiteCatalog(str(path / CATALOG_FILE))
    catalog.set_meta(**{"metric": "valid_loss", "mode": "min", "start_time": 100.0, **(meta or {})})
    for cid, (status, epochs) in configs.items():
        catalog.add_config(cid, {"lr": 0.1 * (cid + 1), "name": f"c{cid}"}, "active")
        for e, metrics in enumerate(epochs):
            catalog.add_epoch(cid, e, e, metrics)
        catalog.update_config(cid, status=status, epochs=len(epochs))
    for cid, epoch, part, kind, end in units:
        catalog.add_unit(0, UnitReport(Unit(cid, epoch, part, kind), worker=0, start=end - 1, end=end), "done")
    for kind, detail in events:
        catalog.add_event(kind, **detail)
    for r in range(rounds):
        catalog.commit_round(r, [], [], [], None)
    catalog.close()
    return str(path)


def _loss(*values: float) -> list[dict]:
    return [{"valid_loss": v, "valid_accuracy": 1 - v, "train_loss": v + 1} for v in values]


#: runs that verify, each read without pandas: name -> (configs, meta, events, units, rounds)
VERIFIED = {
    "plain": ({0: ("stopped", _loss(0.5, 0.4)), 1: ("stopped", _loss(0.3, 0.2)), 2: ("failed", _loss(0.9))}, {},
              (), (), 0),
    "failed-config-best": ({0: ("failed", _loss(0.01)), 1: ("stopped", _loss(0.3))}, {}, (), (), 1),
    "every-config-failed": ({0: ("failed", _loss(0.1)), 1: ("failed", _loss(0.2))}, {}, (), (), 1),
    "ties-min": ({0: ("stopped", _loss(0.5, 0.2)), 1: ("stopped", _loss(0.2)), 2: ("stopped", _loss(0.2))}, {},
                 (), (), 1),
    "ties-max": ({0: ("stopped", _loss(0.5)), 1: ("stopped", _loss(0.1)), 2: ("stopped", _loss(0.1, 0.1))},
                 {"metric": "valid_accuracy", "mode": "max"}, (), (), 1),
    "nan-and-inf": ({0: ("stopped", _loss(0.1, math.nan)), 1: ("stopped", _loss(math.inf)),
                     2: ("stopped", _loss(-math.inf, 0.7)), 3: ("active", _loss(0.05))}, {}, (), (), 1),
    "all-nan": ({0: ("stopped", _loss(math.nan)), 1: ("active", [])}, {}, (), (), 1),
    "inf-best-max": ({0: ("stopped", _loss(0.3)), 1: ("stopped", [{"valid_accuracy": math.inf}])},
                     {"metric": "valid_accuracy", "mode": "max"}, (), (), 1),
    "metric-missing-at-last-epoch": ({0: ("stopped", [{"valid_loss": 0.01}, {"train_loss": 0.5}]),
                                      1: ("stopped", _loss(0.4))}, {}, (), (), 1),
    "train-metric": ({0: ("stopped", _loss(0.5)), 1: ("stopped", _loss(0.3))}, {"metric": "train_loss"}, (), (), 1),
    "no-epochs": ({0: ("active", []), 1: ("active", [])}, {}, (), (), 0),
    "no-configs": ({}, {}, (), (), 0),
    "metric-not-reported": ({0: ("stopped", _loss(0.5))}, {"metric": "valid_f1"}, (), (), 1),
    "mode-not-min-or-max": ({0: ("stopped", _loss(0.5))}, {"mode": "up"}, (), (), 1),
    "mode-a-list": ({0: ("stopped", _loss(0.5))}, {"mode": ["min"]}, (), (), 1),
    "mode-none": ({0: ("stopped", _loss(0.5))}, {"mode": None}, (), (), 1),
    "metric-not-utf8": ({0: ("stopped", _loss(0.5))}, {"metric": "valid_\udcff\x1b"}, (), (), 1),
    "int-values": ({0: ("stopped", [{"valid_loss": 3}]), 1: ("stopped", [{"valid_loss": 2}])}, {}, (), (), 1),
    "ended-run-with-units-and-events": (
        {0: ("completed", _loss(0.5, 0.4)), 1: ("active", _loss(0.3))},
        {"end_time": 180.0, "num_workers": 2, "executor": "mop", "scheduler": "randomized",
         "driver": {"pid": os.getpid(), "host": socket.gethostname()}, "procedure": "GridSearch",
         "functions": {"model_fn": "m:f"}},
        [("workers_started", {"count": 2}), ("worker_failed", {"worker": 1}), ("worker_restarting", {"worker": 1}),
         ("workers_changed", {"num_workers": 3}), ("resumed", {"pid": 99999999, "host": "elsewhere"}),
         ("resumed", {"note": "no pid"})],
        [(0, 0, 0, "train", 150.0), (0, 0, 1, "train", 151.5), (0, 0, 0, "eval", 152.0), (1, 0, 0, "train", 149)],
        2),
    "alive-driver-here": ({0: ("active", _loss(0.5))},
                          {"driver": {"pid": os.getpid(), "host": socket.gethostname()}}, [("workers_started", {})],
                          (), 1),
    "replay": ({0: ("completed", _loss(0.5))}, {"replay_of": "/somewhere", "driver": {"pid": 1, "host": "x"}}, (),
               (), 1),
    "start-time-zero": ({0: ("completed", _loss(0.5))}, {"start_time": 0}, (), (), 1),
    "finished": ({0: ("completed", _loss(0.5, 0.3)), 1: ("pruned", _loss(0.6)), 2: ("stopped", _loss(0.2))}, {},
                 (), (), 3),
}


@pytest.fixture(scope="module")
def root(tmp_path_factory) -> str:
    root = tmp_path_factory.mktemp("runs")
    for name, (configs, meta, events, units, rounds) in VERIFIED.items():
        _make(root / name, configs, meta, events, units, rounds)
    return str(root)


def _as_result(path: str) -> dict:
    """`run_status` as it read every run before: from a `Result`."""
    with opened(path) as result:
        return {**_status_dict(_reading_of(result), NOW), "path": path}


def _same(a, b) -> bool:
    """Equal, NaN equal to NaN."""
    if isinstance(a, float) and isinstance(b, float) and a != a and b != b:
        return True
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(_same(a[k], b[k]) for k in a)
    return type(a) is type(b) and a == b


@pytest.mark.parametrize("name", sorted(VERIFIED))
def test_a_run_that_verifies_is_read_without_pandas_as_a_result_reads_it(root, name):
    path = os.path.join(root, name)
    plain = _plain_reading(path)
    assert plain is not None  # read from its rows
    got = {**_status_dict(plain, NOW), "path": path}
    want = _as_result(path)
    assert list(got) == list(want)  # (the order of `status --json`)
    assert _same(got, want), {k: (got[k], want[k]) for k in got if not _same(got[k], want[k])}
    assert json.dumps(got, indent=1, default=str) == json.dumps(want, indent=1, default=str)
    assert _same(run_status(path, NOW), want)


@pytest.mark.parametrize("name", sorted(VERIFIED))
def test_the_best_value_is_what_get_best_result_gives(root, name):
    path = os.path.join(root, name)
    best = _status_dict(_plain_reading(path), NOW)["best"]
    with Result(path) as result:
        try:
            want = result.get_best_result()
        except (NoResultError, ValueError):
            assert best is None
            return
    assert (best["config_id"], best["epoch"], best["config"]) == (want.config_id, want.epoch, want.config)
    assert want.status != "failed" and best["value"] == want.metrics[result.metric]


def test_the_best_config_follows_the_rule(root):
    def best(name):
        return run_status(os.path.join(root, name), NOW)["best"]

    assert best("failed-config-best")["config_id"] == 1  # a failed config is never best
    assert best("every-config-failed") is None and best("all-nan") is None and best("no-epochs") is None
    assert (best("ties-min")["config_id"], best("ties-max")["config_id"]) == (0, 1)  # the first of equals
    assert best("nan-and-inf")["value"] == 0.05 and best("inf-best-max")["value"] == math.inf  # NaN is no value
    assert best("metric-missing-at-last-epoch")["config_id"] == 1  # each config's last epoch
    assert best("mode-not-min-or-max") is None and best("metric-not-reported") is None
    assert best("int-values") == {"config_id": 1, "config": {"lr": 0.2, "name": "c1"}, "epoch": 0, "value": 2.0}


def _edit(path: str, sql: str) -> None:
    conn = sqlite3.connect(os.path.join(path, CATALOG_FILE), isolation_level=None)
    conn.execute(sql)
    conn.close()


@pytest.mark.filterwarnings("ignore::framework.store.catalog.UnverifiedRunWarning")
@pytest.mark.parametrize("edit", [
    "UPDATE epochs SET metrics = json_set(metrics, '$.valid_loss', 0.0001) WHERE config_id = 2",  # a row edited
    "DELETE FROM epochs WHERE config_id = 1",  # rows deleted
    "UPDATE digests SET mac = NULL WHERE tbl = '*'",  # the head digest
    "CREATE VIEW v AS SELECT 1",  # something no run writes
])
def test_a_run_that_does_not_verify_is_read_as_a_result_and_listed_unverified(tmp_path, edit):
    path = _make(tmp_path / "run", VERIFIED["plain"][0])
    _edit(path, edit)
    assert _plain_reading(path) is None  # nothing of it is read from its rows as they are
    s = run_status(path, NOW)
    assert _same(s, _as_result(path)) and not s["verified"] and s["problems"]
    [row] = run_rows(str(tmp_path), now=NOW)
    assert (row["status"], row["configs"], row["verified"]) == (s["status"], s["num_configs"], False)


@pytest.mark.filterwarnings("ignore::framework.store.catalog.UnverifiedRunWarning")
def test_a_run_read_under_another_key_is_unverified(tmp_path, monkeypatch):
    from framework.store.signing import KEY_ENV

    path = _make(tmp_path / "run", VERIFIED["plain"][0])
    monkeypatch.setenv(KEY_ENV, "another machine's key, long enough to be one")
    assert _plain_reading(path) is None
    s = run_status(path, NOW)
    assert s["verified"] is False and _same(s, _as_result(path))


def _signed_config_row(catalog: SQLiteCatalog, config_id: int, text: str) -> None:
    """A configs row whose JSON `text` the catalog's own writer refuses (`automl.json_exact`), signed as one."""
    from framework.store.catalog import _config_row

    with catalog._tx():
        catalog._insert("configs", {**_config_row(config_id, {}, "active", None, 0), "config": text})


@pytest.mark.parametrize("edit", [
    # what no run writes, signed as a run signs it: read as a Result, which says what it makes of it
    lambda c: c.set_meta(metric="loss"),  # a metric that is neither train_* nor valid_*
    lambda c: c.set_meta(metric=5),
    lambda c: c.set_meta(start_time="yesterday"),
    lambda c: _signed_config_row(c, 7, '{"name": "\\udcff"}'),  # text a DataFrame cannot hold (no run writes it)
    lambda c: c.add_epoch(0, 5, 5, {"valid_loss": "low"}),
    lambda c: c.add_epoch(0, 5, 5, {"accuracy": 0.5}),
    lambda c: c.add_epoch(0, 5, 5, {"valid_loss": 2**60}),
    lambda c: c.add_epoch(9, 0, 0, {"valid_loss": 0.5}),  # a config the run does not have
    lambda c: c.update_config(0, status="weird"),
])
def test_a_run_that_verifies_but_holds_what_no_run_writes_is_read_as_a_result(tmp_path, edit):
    path = _make(tmp_path / "run", VERIFIED["plain"][0])
    catalog = SQLiteCatalog(os.path.join(path, CATALOG_FILE))
    edit(catalog)
    catalog.close()
    reading = _plain_reading(path)
    try:
        want = _as_result(path)
    except Exception as e:  # noqa: BLE001 - whatever a Result raises, run_status raises
        assert reading is None
        with pytest.raises(type(e)):
            run_status(path, NOW)
        return
    assert reading is None or _same({**_status_dict(reading, NOW), "path": path}, want)
    assert _same(run_status(path, NOW), want)


# ---- list --------------------------------------------------------------------------------------------------------
def _old_text(runs: pd.DataFrame) -> str:
    """The table `list` printed from `list_runs`' DataFrame before it printed `run_rows`."""
    return pd.DataFrame({
        "path": runs.path, "status": runs.status, "configs": runs.configs,
        "best": [("-" if b != b else f"{b:.4g}") + (f" {m} ({d})" if isinstance(m, str) else "")
                 for b, m, d in zip(runs.best, runs.metric, runs["mode"])],
        "age": runs.age_s.map(age), "verified": runs.verified.map({True: "yes", False: "no"}),
    }).to_string(index=False)


@pytest.fixture(scope="module")
def listed(root) -> str:
    """`root` with an unreadable run, one that does not verify, and a copy four folders down."""
    os.makedirs(os.path.join(root, "garbage"))
    with open(os.path.join(root, "garbage", CATALOG_FILE), "w") as f:
        f.write("x" * 300)
    edited = _make(pathlib.Path(root) / "deep" / "er" / "edited", VERIFIED["plain"][0])
    _edit(edited, "UPDATE configs SET config = '{\"lr\": 9}' WHERE id = 0")
    return root


@pytest.mark.filterwarnings("ignore::framework.store.catalog.UnverifiedRunWarning")
def test_list_prints_what_it_printed_from_the_dataframe(listed, capsys, monkeypatch):
    rows = run_rows(listed, now=NOW)
    frame = list_runs(listed, now=NOW)
    assert len(rows) == len(VERIFIED) + 2 and list(frame.columns) == LIST_COLUMNS
    assert [r["path"] for r in rows] == frame.path.tolist()  # newest first, equals in the order found
    assert {r["path"]: r["verified"] for r in rows}["deep/er/edited"] is False
    assert {r["path"]: r["status"] for r in rows}["garbage"] == "unreadable"
    assert json_records(rows, LIST_COLUMNS, int_columns=["pid"]) == frame.to_json(orient="records", indent=1)

    monkeypatch.setattr(time, "time", lambda: NOW)  # the time `list` reads the ages at
    codes = cli(["list", listed]), cli(["list", listed, "--json"])
    monkeypatch.undo()
    assert codes == (0, 0)
    assert capsys.readouterr().out == _old_text(frame) + "\n" + frame.to_json(orient="records", indent=1) + "\n"


def test_list_of_no_runs_prints_an_empty_list(tmp_path, capsys):
    assert cli(["list", str(tmp_path), "--json"]) == 0
    out = capsys.readouterr().out
    assert out == pd.DataFrame([], columns=LIST_COLUMNS).to_json(orient="records", indent=1) + "\n"
    assert json.loads(out) == []


# ---- text_table and json_records, against pandas ---------------------------------------------------------------
def _texts(rng: random.Random, n: int) -> list[str]:
    alphabet = ["a", "Z", " ", "/", "\\", '"', "é", "日本", "\U0001F600", "-", "0", ".", "\t", "\x1b", "\x7f", "&<>"]
    return ["".join(rng.choice(alphabet) for _ in range(rng.randrange(0, 12))) for _ in range(n)]


def _floats(rng: random.Random, n: int) -> list[float]:
    special = [0.0, -0.0, 0.5, 0.15, 1e-15, 9.9e-16, -1e-16, 1e16, 1e16 + 2, 9999999999999998.0, 1e20, 123.456,
               1e15 + 0.3, 2 / 3, math.nan, math.inf, -math.inf, 1764219729.1234567, 0.99999999999, 0.00000000005,
               0.00000000015, 0.00000000025, -2.5e-11, 12.000001]
    return [rng.choice(special) if rng.random() < 0.4 else rng.choice([-1, 1]) * 10 ** rng.uniform(-17, 22)
            for _ in range(n)]


@pytest.mark.parametrize("seed", range(20))
def test_text_table_is_pandas_to_string(seed):
    rng = random.Random(seed)
    n = rng.randrange(1, 6)
    columns = {"path": _texts(rng, n), "configs": [rng.choice([0, 7, 12345678901]) for _ in range(n)],
               "best": _texts(rng, n), "v": [rng.choice(["yes", "no", ""]) for _ in range(n)]}
    want = pd.DataFrame(columns).to_string(index=False)
    assert text_table(columns) == want


@pytest.mark.parametrize("seed", range(40))
def test_json_records_is_pandas_to_json(seed):
    rng = random.Random(seed)
    n = rng.randrange(0, 6)
    floats = _floats(rng, n)
    rows = [{"path": t, "configs": rng.choice([0, 3, 2**40]), "best": f,
             "metric": rng.choice(["valid_loss", None, "x/y", 5, 0.5, {"a": [1, 2.5, None, {}], "b": []}]),
             "mode": rng.choice(["min", None]), "last_activity": rng.choice([f, 5]), "age_s": float(i),
             "verified": rng.choice([True, False]), "pid": rng.choice([None, 1234]), "error": rng.choice([None, t])}
            for i, (t, f) in enumerate(zip(_texts(rng, n), floats))]
    frame = pd.DataFrame(rows, columns=LIST_COLUMNS)
    frame["pid"] = frame.pid.astype("Int64")
    assert json_records(rows, LIST_COLUMNS, int_columns=["pid"]) == frame.to_json(orient="records", indent=1)


def test_run_rows_lists_the_newest_first_and_time_ties_in_the_order_found(tmp_path):
    for name in ("a", "b", "c"):
        _make(tmp_path / name, {0: ("completed", _loss(0.5))}, {"start_time": 150.0 if name == "b" else 100.0},
              rounds=1)
    assert [r["path"] for r in run_rows(str(tmp_path), now=time.time())] == ["b", "a", "c"]
