"""Steering a running selection from another process: the CLI and `framework.connect` send commands through the
run's inbox; the driver applies them between events and records each in `run.db` (real Ray, real training)."""

from __future__ import annotations

import json
import os
import sqlite3
import subprocess
import sys
import threading
import time

import pytest

import automl
import framework
from framework.engine.inbox import INBOX_FILE
from framework.run_record import is_being_written
from tests.integration.ft_functions import classifier_eval_fn, gated_train_fn, mlp_model_fn

pytestmark = pytest.mark.ray
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _cli(*args: str) -> subprocess.CompletedProcess:
    """`python -m framework ARGS` in a process of its own."""
    return subprocess.run([sys.executable, "-m", "framework", *args], capture_output=True, text=True, timeout=120,
                          cwd=ROOT, env={**os.environ, "PYTHONPATH": ROOT})


def _wait(what, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while not what():
        if time.monotonic() > deadline:
            raise TimeoutError("waited 60 s")
        time.sleep(0.05)


def test_commands_from_another_process_reach_the_running_driver_and_stay_in_its_record(ray_cluster, digits,
                                                                                       tmp_path):
    gate = tmp_path / "gate"
    gate.write_text("")  # closed: every unit waits, so the run goes on while the commands arrive
    x, y = digits
    ds = framework.PartitionedDataset.from_arrays(x[:300], y[:300], num_partitions=2, seed=0)
    path = str(tmp_path / "run")
    space = {"hidden": [16], "lr": [0.05, 0.1], "batch_size": [64], "gate": [str(gate)]}
    sel = framework.ModelSelection(mlp_model_fn, gated_train_fn, classifier_eval_fn, ds,
                                   automl.GridSearch(space, epochs=2), num_workers=2, storage_path=path,
                                   progress=False, metric="valid_accuracy", mode="max")
    done: dict = {}
    runner = threading.Thread(target=lambda: done.setdefault("result", sel.run()), daemon=True)
    runner.start()
    try:
        _wait(lambda: os.path.isfile(os.path.join(path, "run.db")) and is_being_written(path)
              and len(sel.live_workers()) == 2)

        added = _cli("workers", path, "--add", "1")
        assert added.returncode == 0, added.stderr
        assert added.stdout.strip() == "add_workers: started workers [2]"
        bad = _cli("workers", path, "--drain", "7")
        assert bad.returncode == 1 and "drain_worker rejected: worker 7 does not live" in bad.stdout, bad.stderr
        # from Python in another process: a command the driver does not know is rejected with the known ones
        code = (f"import framework, json; h = framework.connect({path!r}); o = h.send('fly', timeout=30); "
                "print(json.dumps([o.applied, o.outcome]))")
        out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, cwd=ROOT,
                             env={**os.environ, "PYTHONPATH": ROOT})
        applied, outcome = json.loads(out.stdout.strip().splitlines()[-1])
        assert not applied and outcome.startswith("unknown command 'fly'"), out.stderr
        # a request planted in the inbox by someone without the key is rejected, and says why
        db = sqlite3.connect(os.path.join(path, INBOX_FILE))
        db.execute("INSERT INTO requests (time, nonce, name, args, source, mac) VALUES (0, 'planted', "
                   "'add_workers', '{\"count\": 8}', 'x', '00')")
        db.commit()
        db.close()
        handle = framework.connect(path)
        _wait(lambda: handle._answer("planted") is not None)
        _wait(lambda: sel.live_workers() == [0, 1, 2])  # the added worker joins once it has loaded its data
        watched = _cli("watch", path, "--once")  # reads the running run: its status, leaderboard, recent events
        assert watched.returncode == 0, watched.stderr
        assert f"{path}: running, 2 configs" in watched.stdout and "  command " in watched.stdout
    finally:
        gate.unlink()
        runner.join(timeout=180)
    result = done["result"]
    cmds = result.commands
    assert cmds[["name", "applied"]].values.tolist() == [
        ["add_workers", True], ["drain_worker", False], ["fly", False], ["add_workers", False]]
    assert cmds.source.tolist() == ["inbox:cli", "inbox:cli", "inbox:connect", "inbox:x"]
    assert "cannot be trusted: its signature does not verify" in cmds.outcome.iloc[3]
    assert (cmds.t.diff().dropna() >= 0).all()
    assert result.status.status.tolist() == ["completed", "completed"]
    assert set(result.schedule.worker) <= {0, 1, 2}
    # the run has ended: a command cannot reach it, in one line
    late = _cli("workers", path, "--add", "1")
    assert late.returncode == 2 and late.stderr.count("\n") == 1 and "is finished, not running" in late.stderr


def test_commands_sent_while_the_run_was_down_are_applied_once_when_it_resumes(ray_cluster, tmp_path):
    from framework.engine.catalog import SQLiteCatalog
    from framework.engine.inbox import send_request
    from framework.steering import NotRunningError
    from tests.integration.test_fault_tolerance import _crash_driver, _resume

    storage = _crash_driver(tmp_path, "commit")  # 1 worker, round 0 committed, then SIGKILL
    with pytest.raises(NotRunningError, match="is crashed, not running"):
        framework.connect(storage).add_workers(1)
    catalog = SQLiteCatalog(os.path.join(storage, "run.db"), readonly=True)
    run_id = catalog.meta()["run_id"]
    catalog.close()
    send_request(storage, run_id, "add_workers", {"count": 1})  # what a sender whose run stopped leaves behind
    for _ in range(999):  # a long log of commands: each applied (here: rejected) once, in order
        send_request(storage, run_id, "unpause", {})
    result = _resume(storage)
    cmds = result.commands
    assert len(cmds) == 1000 and cmds[["name", "applied", "outcome"]].iloc[0].tolist() == [
        "add_workers", True, "started workers [1]"]
    assert set(cmds.outcome.iloc[1:]) == {"the run is not paused"} and result.verified
    assert set(result.status.status) == {"completed"}


def test_a_paused_run_starts_nothing_new_until_it_is_unpaused(ray_cluster, digits, tmp_path):
    from tests.integration.ft_functions import slow_train_fn

    x, y = digits
    ds = framework.PartitionedDataset.from_arrays(x[:300], y[:300], num_partitions=2, seed=0)
    path = str(tmp_path / "run")
    space = {"hidden": [16], "lr": [0.05, 0.1], "batch_size": [64], "sleep": [0.3]}
    sel = framework.ModelSelection(mlp_model_fn, slow_train_fn, classifier_eval_fn, ds,
                                   automl.GridSearch(space, epochs=4), num_workers=2, storage_path=path,
                                   progress=False)
    done: dict = {}
    runner = threading.Thread(target=lambda: done.setdefault("result", sel.run()), daemon=True)
    runner.start()
    _wait(lambda: os.path.isfile(os.path.join(path, "run.db")) and is_being_written(path)
          and sel.rounds_completed >= 1)
    handle = framework.connect(path)  # through the inbox, as from another process (the CLI is tested above)
    early = handle.unpause()
    assert (early.applied, early.outcome) == (False, "the run is not paused")
    paused = handle.pause()
    assert paused.applied and paused.outcome.startswith("paused"), paused
    running = int(paused.outcome.split(";")[1].split()[0])  # "...; N running unit(s) finish"
    time.sleep(2.0)  # without the pause, 2 workers would start about a dozen 0.3 s units in this time
    assert handle.unpause().applied
    runner.join(timeout=180)
    result = done["result"]
    cmds = result.commands
    assert cmds[["name", "applied"]].values.tolist() == [["unpause", False], ["pause", True], ["unpause", True]]
    t_pause, t_unpause = cmds.t.iloc[1], cmds.t.iloc[2]
    assert t_unpause - t_pause >= 2.0
    started_while_paused = result.schedule[(result.schedule.start > t_pause) & (result.schedule.start < t_unpause)]
    assert len(started_while_paused) <= running  # only what was already on its way to a worker
    assert (result.schedule.start > t_unpause).any() and set(result.status.status) == {"completed"}
