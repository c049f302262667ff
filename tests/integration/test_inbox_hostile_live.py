"""A live run whose inbox someone without the key replaces while it runs (other bytes, a link out of the run, a table
with TEXT ids) goes on, says so once per kind, refuses senders clearly, and resumes after a crash with the broken
inbox still in place (real Ray, real training, the driver in a process of its own)."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import sqlite3
import subprocess
import sys
import time

import pytest

import framework
from framework.store.catalog import CatalogError, SQLiteCatalog
from framework.store.inbox import INBOX_FILE, InboxError
from framework.store.lock import is_being_written
from tests.integration.ft_functions import classifier_eval_fn, gated_train_fn, mlp_model_fn

pytestmark = pytest.mark.ray
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
DRIVER = """
import sys
import automl, framework
from framework.examples import digits_arrays
from tests.integration.ft_functions import classifier_eval_fn, gated_train_fn, mlp_model_fn
x, y = digits_arrays()
ds = framework.PartitionedDataset.from_arrays(x[:300], y[:300], num_partitions=2, seed=0)
space = {"hidden": [16], "lr": [0.05, 0.1], "batch_size": [64], "gate": [sys.argv[2]]}
framework.ModelSelection(mlp_model_fn, gated_train_fn, classifier_eval_fn, ds, automl.GridSearch(space, epochs=1),
                         num_workers=1, storage_path=sys.argv[1], progress=False).run()
"""


def _wait(what, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while not what():
        if time.monotonic() > deadline:
            raise TimeoutError(f"waited {timeout:g} s")
        time.sleep(0.05)


def _events(path: str, kind: str) -> list[dict]:
    """The run's events of `kind` that verify (the driver signed them), read while it runs."""
    try:
        catalog = SQLiteCatalog(os.path.join(path, "run.db"), readonly=True)
    except CatalogError:  # not there yet, or being made this instant
        return []
    try:
        return [json.loads(d) for d in catalog.events(kind, verified=True).detail]
    finally:
        catalog.close()


def _replace(path: str, make) -> None:
    """Swap the inbox for what `make(tmp)` made, in one rename (as an attacker would)."""
    tmp = os.path.join(path, "swap.tmp")
    make(tmp)
    os.replace(tmp, os.path.join(path, INBOX_FILE))


def _text_ids(tmp: str) -> None:
    db = sqlite3.connect(tmp)
    db.execute("CREATE TABLE requests (id TEXT, time REAL, nonce TEXT, name TEXT, args TEXT, source TEXT, mac TEXT)")
    db.execute("INSERT INTO requests VALUES ('x', 0, 'n', 'add_workers', '{\"count\": 9}', 'x', 'ab')")
    db.commit()
    db.close()


def test_a_run_whose_inbox_is_replaced_while_it_runs_goes_on_and_resumes(ray_cluster, tmp_path):
    from tests.integration.ft_helpers import ray_cluster_address

    path, gate, outside = str(tmp_path / "run"), tmp_path / "gate", tmp_path / "outside.db"
    gate.write_text("")  # closed: the run's units wait while its inbox is replaced
    outside.write_bytes(b"not the run's")
    env = {**os.environ, "RAY_ADDRESS": ray_cluster_address(), "PYTHONPATH": ROOT}
    driver = subprocess.Popen([sys.executable, "-c", DRIVER, path, str(gate)], cwd=ROOT, env=env, text=True,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        _wait(lambda: is_being_written(path) and _events(path, "workers_started"), timeout=120)
        handle = framework.connect(path)
        before = handle.unpause()  # the inbox works: a signed request is answered
        assert (before.applied, before.outcome) == (False, "the run is not paused")
        swaps = [("unreadable", lambda tmp: open(tmp, "wb").write(os.urandom(8192))),
                 ("link", lambda tmp: os.symlink(outside, tmp)),
                 ("schema", _text_ids)]
        for n, (problem, make) in enumerate(swaps, 1):
            _replace(path, make)
            _wait(lambda n=n: len(_events(path, "inbox")) == n)
            assert _events(path, "inbox")[-1]["problem"] == problem
        with pytest.raises(InboxError, match="move inbox.db and any inbox.db-wal, -shm aside"):
            handle.send("unpause", timeout=10)  # a sender: one clear error, nothing written
        time.sleep(1.2)  # more reads of the broken inbox (one a second while broken): still one event per kind
        assert [e["problem"] for e in _events(path, "inbox")] == ["unreadable", "link", "schema"]
        assert driver.poll() is None, driver.communicate()[1][-3000:]  # the driver goes on
    finally:
        driver.send_signal(signal.SIGKILL)  # a crash, with the broken inbox in place
        out, err = driver.communicate(timeout=60)
    assert "Traceback" not in err, err[-3000:]
    said = [line for line in out.splitlines() if line.startswith("inbox: ")]  # its console: one line per kind
    assert len(said) == 3 and all(line.endswith("Read as empty: the run goes on") for line in said), out

    gate.unlink()
    result = framework.ModelSelection.resume(path, mlp_model_fn, gated_train_fn, classifier_eval_fn,
                                             progress=False).run()
    assert result.verified and result.status.status.tolist() == ["completed", "completed"]
    assert [e["problem"] for e in _events(path, "inbox")] == ["unreadable", "link", "schema", "schema"]
    assert result.commands[["name", "applied"]].values.tolist() == [["unpause", False]]  # once, not again on resume
    assert outside.read_bytes() == b"not the run's" and not os.path.exists(f"{outside}-wal")
    with contextlib.closing(sqlite3.connect(os.path.join(path, INBOX_FILE))) as db:  # evidence, left as it was
        assert db.execute("SELECT id FROM requests").fetchall() == [("x",)]
