"""Failures on a real local Ray cluster: killed worker processes, hung units, driver crashes, flaky user code,
replicas and elasticity. Nothing is lost and nothing is trained twice."""

from __future__ import annotations

import json
import os
import signal
import sqlite3
import subprocess
import sys
import threading
import time

import pytest
import torch

import automl
import framework
from simulators import validate_schedule
from tests.integration.ft_functions import (
    classifier_eval_fn,
    flaky_train_fn,
    hang_once_train_fn,
    mlp_model_fn,
    slow_train_fn,
)

pytestmark = pytest.mark.ray
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _assert_complete(result, partitions, epochs):
    """Every config absorbed each partition exactly once per epoch and has metrics for every epoch."""
    for cid in result.configs:
        visited = result.load_state(cid)["visited"]
        assert {e: sorted(ps) for e, ps in visited.items()} == {e: partitions for e in range(epochs)}, cid
        assert sorted(result.metrics[result.metrics.config_id == cid].epoch) == list(range(epochs))


def _tail(path, lines=40):
    with open(path) as f:
        return "".join(f.readlines()[-lines:])


def _events(result, kind):
    ev = result.events[result.events.kind == kind]
    return [json.loads(d) for d in ev.detail]


def test_chaos_killed_workers_with_replicas_lose_nothing(ray_cluster, digits, tmp_path):
    x, y = digits
    ds = framework.PartitionedDataset.from_arrays(x[:1200], y[:1200], num_partitions=4, seed=0, replicas=2)
    space = {"hidden": [16, 32], "lr": [0.05, 0.1], "batch_size": [64], "sleep": [0.25]}
    sel = framework.ModelSelection(
        mlp_model_fn, slow_train_fn, classifier_eval_fn, ds, automl.GridSearch(space, epochs=3),
        num_workers=4, storage_path=str(tmp_path / "chaos"), progress=False, max_worker_restarts=5,
    )
    kills: list[int] = []
    done = threading.Event()

    def chaos():
        time.sleep(2.0)
        while not done.is_set() and len(kills) < 3:
            w = sel.kill_worker_process()
            if w is not None:
                kills.append(w)
            done.wait(1.5)

    t = threading.Thread(target=chaos, daemon=True)
    t.start()
    try:
        result = sel.run()
    finally:
        done.set()
        t.join()
    assert kills, "the chaos thread killed no worker"
    assert len(_events(result, "worker_failed")) >= 1
    report = validate_schedule(result.schedule, availability=sel.placement, partitions=[0, 1, 2, 3])
    assert report.ok, report.violations
    _assert_complete(result, [0, 1, 2, 3], 3)
    assert (result.status.status == "stopped").all()


def test_hung_unit_is_detected_and_rerun_elsewhere(ray_cluster, digits, tmp_path):
    x, y = digits
    ds = framework.PartitionedDataset.from_arrays(x[:600], y[:600], num_partitions=2, seed=0, replicas=2)
    marker = str(tmp_path / "hung-once")
    space = {"hidden": [16, 32], "lr": [0.05], "batch_size": [64], "hang_hidden": [16], "marker": [marker]}
    result = framework.ModelSelection(
        mlp_model_fn, hang_once_train_fn, classifier_eval_fn, ds, automl.GridSearch(space, epochs=2),
        num_workers=2, storage_path=str(tmp_path / "hang"), progress=False, unit_timeout_s=3,
    ).run()
    assert os.path.exists(marker)
    failures = _events(result, "worker_failed")
    assert len(failures) == 1 and failures[0]["why"].startswith("hung")
    assert len(failures[0]["requeued"]) == 1
    _assert_complete(result, [0, 1], 2)
    assert (result.status.status == "stopped").all()


def test_user_code_failure_is_retried_without_killing_the_worker(ray_cluster, digits, tmp_path):
    x, y = digits
    ds = framework.PartitionedDataset.from_arrays(x[:600], y[:600], num_partitions=2, seed=0)
    space = {"hidden": [16], "lr": [0.05], "batch_size": [64], "marker": [str(tmp_path / "flaky")]}
    result = framework.ModelSelection(
        mlp_model_fn, flaky_train_fn, classifier_eval_fn, ds, automl.GridSearch(space, epochs=2),
        storage_path=str(tmp_path / "flaky-run"), progress=False, max_unit_retries=1,
    ).run()
    assert result.status.status.tolist() == ["stopped"]
    assert len(_events(result, "unit_retry")) == 1
    assert _events(result, "worker_failed") == []  # a failure in user code is not a worker failure
    _assert_complete(result, [0, 1], 2)


def test_replica_aware_scheduling_uses_every_replica_and_only_holders(ray_cluster, digits, tmp_path):
    x, y = digits
    ds = framework.PartitionedDataset.from_arrays(x[:900], y[:900], num_partitions=3, seed=0, replicas=2)
    space = {"hidden": [16, 32], "lr": [0.05, 0.1, 0.2], "batch_size": [64]}
    sel = framework.ModelSelection(
        mlp_model_fn, slow_train_fn, classifier_eval_fn, ds, automl.GridSearch({**space, "sleep": [0.02]}, epochs=3),
        num_workers=3, storage_path=str(tmp_path / "replicas"), progress=False,
    )
    result = sel.run()
    assert sel.placement == {0: [0, 1], 1: [1, 2], 2: [0, 2]}
    report = validate_schedule(result.schedule, availability=sel.placement, partitions=[0, 1, 2])
    assert report.ok, report.violations
    used = set(zip(result.schedule.partition, result.schedule.worker))
    assert used == {(p, w) for p, ws in sel.placement.items() for w in ws}


def test_workers_join_and_drain_while_running(ray_cluster, digits, tmp_path):
    x, y = digits
    ds = framework.PartitionedDataset.from_arrays(x[:800], y[:800], num_partitions=2, seed=0)
    space = {"hidden": [16, 32], "lr": [0.05, 0.1], "batch_size": [64], "sleep": [0.25]}
    epochs = 12  # long enough that a worker started mid-run (seconds under load) joins and another drains
    sel = framework.ModelSelection(
        mlp_model_fn, slow_train_fn, classifier_eval_fn, ds, automl.GridSearch(space, epochs=epochs),
        num_workers=2, storage_path=str(tmp_path / "elastic"), progress=False,
    )
    drained_at: list[int] = []

    def wait_for(condition, timeout=120.0):
        deadline = time.time() + timeout
        while not condition() and time.time() < deadline:
            time.sleep(0.05)
        return condition()

    def scale():
        assert wait_for(lambda: sel.rounds_completed >= 1)
        sel.add_workers(1, partitions=[0, 1])
        assert wait_for(lambda: sel.pool is not None and 2 in sel.pool.holds)  # the new worker has loaded its data
        joined_round = sel.rounds_completed
        assert wait_for(lambda: sel.rounds_completed >= joined_round + 1)
        drained_at.append(sel.rounds_completed)
        sel.drain_worker(0)

    t = threading.Thread(target=scale, daemon=True)
    t.start()
    result = sel.run()
    t.join()
    assert drained_at and drained_at[0] < epochs - 1, "the run ended before the drain could be tested"
    joined = [e for e in _events(result, "worker_joined") if e["worker"] == 2]
    assert joined and sorted(joined[0]["partitions"]) == [0, 1]
    assert (result.schedule.worker == 2).any(), "the new worker never got a unit"
    drained = result.events[result.events.kind == "worker_drained"]
    assert len(drained) == 1
    assert not (result.schedule[result.schedule.worker == 0].start > drained.t.iloc[0]).any()
    assert (result.schedule[result.schedule["round"] > drained_at[0]].worker != 0).all()
    _assert_complete(result, [0, 1], epochs)


def test_driver_crash_resume_loses_only_in_flight_units(ray_cluster, tmp_path):
    from tests.integration.resume_job import selection

    storage = str(tmp_path / "crashed")
    env = {**os.environ, "RAY_ADDRESS": ray_cluster.get_runtime_context().gcs_address,
           "PYTHONPATH": ROOT + os.pathsep + os.environ.get("PYTHONPATH", "")}
    log = open(tmp_path / "driver.log", "w")  # noqa: SIM115 - closed below
    proc = subprocess.Popen([sys.executable, "-m", "tests.integration.resume_job", storage], cwd=ROOT, env=env,
                            stdout=log, stderr=subprocess.STDOUT)
    db = os.path.join(storage, "run.db")
    deadline = time.time() + 300
    try:
        while time.time() < deadline:  # kill the driver in the middle of round 1 (its second epoch)
            if os.path.exists(db):
                with sqlite3.connect(db) as con:
                    n = con.execute("SELECT COUNT(*) FROM units WHERE round = 1 AND kind = 'train'").fetchone()[0]
                if n >= 3:
                    break
            if proc.poll() is not None:
                pytest.fail(f"the driver exited early with {proc.returncode}:\n{_tail(tmp_path / 'driver.log')}")
            time.sleep(0.05)
        else:
            pytest.fail(f"the driver never reached round 1:\n{_tail(tmp_path / 'driver.log')}")
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
        log.close()

    resumed = framework.ModelSelection.resume(
        storage, mlp_model_fn, slow_train_fn, classifier_eval_fn, progress=False).run()
    reference = selection(str(tmp_path / "reference")).run()
    assert "resumed" in set(resumed.events.kind)
    _assert_complete(resumed, [0, 1], 3)
    report = validate_schedule(resumed.schedule, partitions=[0, 1])
    assert report.ok, report.violations
    same = 0
    for cid in reference.configs:
        a, b = resumed.load_state(cid), reference.load_state(cid)
        if a["visited"] != b["visited"]:
            continue  # its visit order changed with the crash: different (equally valid) SGD order
        same += 1
        for k in a["model"]:
            assert torch.equal(a["model"][k], b["model"][k]), f"config {cid} differs although its visits match"
        m = resumed.metrics.set_index(["config_id", "epoch"]).valid_loss
        r = reference.metrics.set_index(["config_id", "epoch"]).valid_loss
        assert (m.loc[cid] == r.loc[cid]).all()
    assert same >= 1


def test_max_workers_grows_into_free_cluster_resources(ray_cluster, digits, tmp_path):
    x, y = digits
    ds = framework.PartitionedDataset.from_arrays(x[:600], y[:600], num_partitions=2, seed=0)
    space = {"hidden": [16, 32], "lr": [0.05], "batch_size": [64], "sleep": [0.2]}
    result = framework.ModelSelection(
        mlp_model_fn, slow_train_fn, classifier_eval_fn, ds, automl.GridSearch(space, epochs=20),
        num_workers=1, max_workers=2, storage_path=str(tmp_path / "autoscale"), progress=False,
    ).run()  # 20 rounds of ~0.8 s: time for the new worker to start and load its partition, even under load
    assert len(_events(result, "autoscale")) == 1  # the session cluster has 4 CPUs: room for the second worker
    assert any(e["worker"] == 1 for e in _events(result, "worker_joined"))
    assert (result.schedule.worker == 1).any()
    _assert_complete(result, [0, 1], 20)
    with pytest.raises(ValueError, match="`max_workers` is 1, but must be an int >= `num_workers` \\(2\\)"):
        framework.ModelSelection(mlp_model_fn, slow_train_fn, classifier_eval_fn, ds,
                                 automl.GridSearch(space, epochs=1), max_workers=1)
