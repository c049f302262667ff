"""Failures on a real local Ray cluster, each injected at an exact point (`framework.engine.faults`): killed and hung
workers, failing user code, lost state objects, checkpoints that never reached the disk, driver crashes, workers
joining, draining and autoscaling. Every test asserts that its recovery path ran and that nothing was lost and
nothing counted twice. No test races a timer: they pass the same way on an idle or a loaded machine."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys

import pandas as pd
import pytest
import torch

import automl
import framework
from framework.engine.catalog import SQLiteCatalog
from framework.engine.faults import Fault, FaultPlan
from simulators import validate_schedule
from tests.integration.ft_functions import classifier_eval_fn, classifier_train_fn, gated_train_fn, mlp_model_fn

pytestmark = pytest.mark.ray
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SPACE = {"hidden": [16], "lr": [0.05, 0.1, 0.2], "batch_size": [64]}


def _dataset(digits, rows=300, partitions=2, replicas=1):
    x, y = digits
    return framework.PartitionedDataset.from_arrays(x[:rows], y[:rows], num_partitions=partitions, seed=0,
                                                    replicas=replicas)


def _select(ds, storage, faults, space=SPACE, epochs=2, train_fn=classifier_train_fn, **options):
    options.setdefault("num_workers", ds.num_partitions)
    return framework.ModelSelection(
        mlp_model_fn, train_fn, classifier_eval_fn, ds, automl.GridSearch(space, epochs=epochs),
        storage_path=str(storage), progress=False, faults=faults, **options,
    )


def _events(result, kind):
    ev = result.events[result.events.kind == kind]
    return [json.loads(d) for d in ev.detail]


def _units_log(result) -> pd.DataFrame:
    catalog = SQLiteCatalog(os.path.join(result.storage_path, "run.db"))
    try:
        return catalog.units(status=None)
    finally:
        catalog.close()


def _assert_nothing_lost_or_counted_twice(result, partitions, epochs, configs=None, availability=None):
    """Each finished config absorbed every partition exactly once per epoch (its weights say so, and so does the
    log); each unit has one `done` row; every epoch's metrics are the example-weighted means of those rows; and
    every config's completeness proof (its state's visit record) agrees with the log (`Result.assert_complete`)."""
    configs = sorted(result.configs) if configs is None else configs
    report = validate_schedule(result.schedule, availability=availability, partitions=partitions)
    assert report.ok, report.violations
    done = _units_log(result).query("status == 'done'")
    assert not done.duplicated(["config_id", "epoch", "partition", "kind"]).any()
    for cid in configs:
        visited = result.load_state(cid)["visited"]
        assert {e: sorted(ps) for e, ps in visited.items()} == {e: partitions for e in range(epochs)}, cid
        assert sorted(result.metrics[result.metrics.config_id == cid].epoch) == list(range(epochs))
        for e in range(epochs):
            rows = done[(done.config_id == cid) & (done.epoch == e) & (done.kind == "train")]
            assert sorted(rows.partition) == partitions
            losses = [json.loads(m)["loss"] for m in rows.metrics]
            expect = sum(v * n for v, n in zip(losses, rows.num_examples)) / rows.num_examples.sum()
            got = result.metrics.set_index(["config_id", "epoch"]).loc[(cid, e), "train_loss"]
            assert got == pytest.approx(expect, rel=1e-9), (cid, e)
    result.assert_complete()


def _unit(cid, epoch, partition, kind="train"):
    return str(framework.scheduling.Unit(cid, epoch, partition, kind))


# ---- workers that die or hang -----------------------------------------------------------------------------------
def test_killed_workers_restart_and_rerun_only_their_unit(ray_cluster, digits, tmp_path):
    ds = _dataset(digits, rows=600, partitions=4, replicas=2)
    kills = [Fault("kill_worker", config_id=0, epoch=0, partition=1), Fault("kill_worker", config_id=1, epoch=1),
             Fault("kill_worker", config_id=2, epoch=1, kind="eval")]
    plan = FaultPlan(kills)
    sel = _select(ds, tmp_path / "kills", plan, num_workers=4, max_worker_restarts=5)
    result = sel.run()
    assert [f for f, _ in plan.fired] == kills
    failed = _events(result, "worker_failed")
    assert len(failed) == 3 and all(e["why"].startswith("died") for e in failed)
    # each death names the unit it was running as the worker knew it, whichever unit of its queue the fault hit (two
    # deaths close together may be found in either order); a unit ahead of it whose report died with the process
    # is a lost result, the units behind it never started
    assert sorted(e["requeued"] for e in failed) == sorted([str(u)] for _, u in plan.fired)
    ran = {str(u) for _, u in plan.fired}
    assert all(u not in ran for e in failed for u in e["unstarted"] + e["lost_results"])
    log = _units_log(result)
    assert (log.status == "lost").sum() == sum(len(e["lost_results"]) for e in failed)
    restarts = _events(result, "worker_restarting")
    assert sorted(e["worker"] for e in restarts) == sorted(e["worker"] for e in failed)
    _assert_nothing_lost_or_counted_twice(result, [0, 1, 2, 3], 2, availability=sel.placement)
    assert (result.status.status == "completed").all()


def test_a_unit_that_kills_its_worker_behind_another_is_named_running_whichever_reply_got_out(
        ray_cluster, digits, tmp_path):
    ds = _dataset(digits)
    plan = FaultPlan([Fault("kill_worker", worker=0, nth=2)])  # queued behind worker 0's first unit: it runs next
    # wide layers: the first unit's reply (a state of megabytes) takes a while to leave, and the kill often wins
    space = {**SPACE, "hidden": [8192]}
    result = _select(ds, tmp_path / "behind", plan, space=space, num_workers=1, max_worker_restarts=1).run()
    [(_, killed)] = plan.fired
    [failed] = _events(result, "worker_failed")
    assert failed["requeued"] == [str(killed)] and str(killed) not in failed["unstarted"]
    # the unit ahead of it ran to its end: its report left before the kill, or died with the process (a lost
    # result: it runs again)
    log = _units_log(result)
    assert len(failed["lost_results"]) == (log.status == "lost").sum() <= 1
    assert str(killed) not in failed["lost_results"]
    _assert_nothing_lost_or_counted_twice(result, [0, 1], 2)


def test_worker_past_its_restarts_hands_its_partitions_to_a_live_worker(ray_cluster, digits, tmp_path):
    ds = _dataset(digits)
    plan = FaultPlan([Fault("kill_worker", config_id=0, epoch=0, partition=1)])
    result = _select(ds, tmp_path / "reload", plan, max_worker_restarts=0).run()
    [dead] = _events(result, "worker_failed")
    survivor = 1 - dead["worker"]
    assert _events(result, "worker_restarting") == []
    reloads = _events(result, "partition_reload")
    assert reloads and all(e["worker"] == survivor for e in reloads)
    after = result.schedule[result.schedule.start > result.events[result.events.kind == "worker_failed"].t.iloc[0]]
    assert (after.worker == survivor).all()
    _assert_nothing_lost_or_counted_twice(result, [0, 1], 2)


def test_worker_that_dies_while_loading_is_started_again(ray_cluster, digits, tmp_path):
    ds = _dataset(digits)
    plan = FaultPlan([Fault("kill_loading", worker=1), Fault("kill_worker", config_id=0, epoch=1, worker=1),
                      Fault("kill_loading", worker=1, nth=2)])
    result = _select(ds, tmp_path / "loading", plan, max_worker_restarts=3).run()
    # worker 1 dies loading at its start and at its first restart, loads at the second, dies in a unit later
    assert [f.action for f, _ in plan.fired] == ["kill_loading", "kill_loading", "kill_worker"]
    assert [e["worker"] for e in _events(result, "worker_start_failed")] == [1, 1]
    assert [e["worker"] for e in _events(result, "worker_failed")] == [1]
    restarts = _events(result, "worker_restarting")
    assert [(e["worker"], e["attempt"]) for e in restarts] == [(1, 1), (1, 2), (1, 3)]
    assert (result.schedule.worker == 1).any()
    _assert_nothing_lost_or_counted_twice(result, [0, 1], 2)


def test_a_partition_with_no_holder_waits_for_an_added_worker(ray_cluster, digits, tmp_path):
    ds = _dataset(digits)
    added = []

    def on_event(kind, detail):
        if kind == "waiting_for_holder" and not added:
            added.append(detail)
            sel.add_workers(1, partitions=[0, 1])

    plan = FaultPlan([Fault("kill_worker", config_id=1, epoch=0)], on_event=on_event)
    sel = _select(ds, tmp_path / "orphan", plan, num_workers=1, max_worker_restarts=0)
    result = sel.run()
    assert added, "no partition waited for a holder"
    assert [e["worker"] for e in _events(result, "worker_added")] == [1]
    kill_t = result.events[result.events.kind == "worker_failed"].t.iloc[0]
    assert (result.schedule[result.schedule.start > kill_t].worker == 1).all()
    _assert_nothing_lost_or_counted_twice(result, [0, 1], 2)


def test_hung_unit_is_detected_its_worker_restarted_and_the_unit_rerun(ray_cluster, digits, tmp_path):
    ds = _dataset(digits, replicas=2)
    plan = FaultPlan([Fault("hang", config_id=1, epoch=0, partition=0)])
    result = _select(ds, tmp_path / "hang", plan, unit_timeout_s=5, max_worker_restarts=20).run()
    hung = [e for e in _events(result, "worker_failed") if e["why"].startswith("hung")]
    # a unit slowed down by a loaded machine may be declared hung too; the injected one must be among them
    assert any(e["requeued"] == [_unit(1, 0, 0)] for e in hung), hung
    assert _events(result, "worker_restarting")
    _assert_nothing_lost_or_counted_twice(result, [0, 1], 2)


@pytest.mark.timeout(120)  # a hang behind a lost state used to go unseen: the run waited forever
def test_a_unit_queued_behind_a_lost_state_is_found_hung(ray_cluster, digits, tmp_path):
    ds = _dataset(digits)
    # worker 0's first unit cannot fetch its state; the unit queued behind it starts then, and hangs
    plan = FaultPlan([Fault("lose_state", worker=0, nth=1), Fault("hang", worker=0, nth=2)])
    result = _select(ds, tmp_path / "lost-hang", plan, num_workers=1, unit_timeout_s=5, max_worker_restarts=20).run()
    assert [f.action for f, _ in plan.fired] == ["lose_state", "hang"]
    hung = [e for e in _events(result, "worker_failed") if e["why"].startswith("hung")]
    # a unit slowed down by a loaded machine may be declared hung too; the injected one must be among them
    assert any(e["requeued"] == [str(plan.fired[1][1])] for e in hung), hung
    assert [e["config_id"] for e in _events(result, "state_restored")] == [plan.fired[0][1].config_id]
    _assert_nothing_lost_or_counted_twice(result, [0, 1], 2)


# ---- failures in user code --------------------------------------------------------------------------------------
def test_user_code_failure_is_retried_then_fails_only_its_config(ray_cluster, digits, tmp_path):
    ds = _dataset(digits)
    plan = FaultPlan([Fault("raise", config_id=0, nth=2),  # one failure: retried
                      Fault("raise", config_id=1, nth=1), Fault("raise", config_id=1, nth=2)])  # two: fails
    result = _select(ds, tmp_path / "user", plan, max_unit_retries=1).run()
    assert sorted((e["config_id"], e["attempt"]) for e in _events(result, "unit_retry")) == [(0, 1), (1, 1)]
    assert _events(result, "worker_failed") == []  # a failure in user code is not a worker failure
    status = result.status.set_index("config_id").status
    assert status.to_dict() == {0: "completed", 1: "failed", 2: "completed"}
    assert "InjectedFault" in result.failures.set_index("config_id").error[1]
    log = _units_log(result)
    assert (log.status == "failed").sum() == 3
    assert log[log.status == "failed"].error.str.contains("InjectedFault").all()
    _assert_nothing_lost_or_counted_twice(result, [0, 1], 2, configs=[0, 2])
    assert result.best_config_id in (0, 2)


# ---- lost state objects -----------------------------------------------------------------------------------------
def test_lost_state_is_restored_from_its_checkpoint_and_the_missing_units_rerun(ray_cluster, digits, tmp_path):
    ds = _dataset(digits)
    plan = FaultPlan([Fault("skip_checkpoint", config_id=0, epoch=1, kind="train", nth=1),
                      Fault("lose_state", config_id=0, epoch=1, kind="train", nth=2),
                      Fault("lose_state", config_id=1, nth=1)])  # before its first unit: it starts afresh
    result = _select(ds, tmp_path / "lost", plan).run()
    assert [f.action for f, _ in plan.fired] == ["lose_state", "skip_checkpoint", "lose_state"]
    skipped = plan.fired[1][1]
    restored = {e["config_id"]: e for e in _events(result, "state_restored")}
    assert restored[0]["rerun"] == [skipped.partition] and restored[0]["units"] == 2  # the end of epoch 0
    assert restored[1]["rerun"] == [] and restored[1]["units"] == 0
    log = _units_log(result)
    superseded = log[(log.status == "lost") & (log.config_id == 0)]
    assert list(zip(superseded.epoch, superseded.partition, superseded.kind)) == [(1, skipped.partition, "train")]
    _assert_nothing_lost_or_counted_twice(result, [0, 1], 2)


def test_lost_state_without_a_usable_checkpoint_restarts_a_first_epoch_and_fails_a_committed_one(
        ray_cluster, digits, tmp_path):
    ds = _dataset(digits)
    plan = FaultPlan([
        # config 0: the checkpoint of its last epoch-0 unit never reached the disk; its epoch 0 is committed
        Fault("skip_checkpoint", config_id=0, epoch=0, kind="train", nth=2), Fault("lose_state", config_id=0, epoch=1),
        # config 1: no checkpoint at all, and its epoch 0 is committed
        Fault("skip_checkpoint", config_id=1, kind="train", nth=1),
        Fault("skip_checkpoint", config_id=1, kind="train", nth=2), Fault("lose_state", config_id=1, epoch=1),
        # config 2: no checkpoint at all, lost within its first epoch: it starts again from model_fn
        Fault("skip_checkpoint", config_id=2, kind="train", nth=1),
        Fault("lose_state", config_id=2, epoch=0, kind="train", nth=2),
    ])
    result = _select(ds, tmp_path / "unrecoverable", plan, checkpoint="unit").run()
    failed = {e["config_id"]: e["why"] for e in _events(result, "config_failed")}
    assert sorted(failed) == [0, 1]
    assert "1 units old" in failed[0]
    assert "no checkpoint is usable" in failed[1]
    assert sorted(result.metrics[result.metrics.config_id == 0].epoch) == [0]  # what was committed stays
    [restarted] = _events(result, "state_restored")
    first = next(u for f, u in plan.fired if f.action == "skip_checkpoint" and u.config_id == 2)
    assert (restarted["config_id"], restarted["source"], restarted["units"]) == (2, "model_fn", 0)
    assert restarted["rerun"] == [first.partition]
    log = _units_log(result)
    gone = log[(log.status == "lost") & (log.config_id == 2)]
    assert list(zip(gone.epoch, gone.partition, gone.kind)) == [(0, first.partition, "train")]
    assert result.status.set_index("config_id").status[2] == "completed"
    _assert_nothing_lost_or_counted_twice(result, [0, 1], 2, configs=[2])


# ---- driver crashes and resume ----------------------------------------------------------------------------------
def _crash_driver(tmp_path, crash, checkpoint="unit"):
    """Run tests/integration/resume_job.py in a subprocess that crashes itself at `crash`; return its storage."""
    storage = str(tmp_path / f"crashed-{crash}")
    env = {**os.environ, "RAY_ADDRESS": ray_cluster_address(),
           "PYTHONPATH": ROOT + os.pathsep + os.environ.get("PYTHONPATH", "")}
    proc = subprocess.run([sys.executable, "-m", "tests.integration.resume_job", storage, crash, checkpoint], cwd=ROOT,
                          env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == -9, f"the driver was not killed by its fault ({proc.returncode}):\n{proc.stderr[-3000:]}"
    return storage


def ray_cluster_address():
    import ray

    return ray.get_runtime_context().gcs_address


def _checkpoint_paths(storage):
    """Each config's latest checkpoint, as the catalog resolves it."""
    catalog = SQLiteCatalog(os.path.join(storage, "run.db"), readonly=True)
    try:
        return [catalog.checkpoints(int(cid))[0][2] for cid in catalog.configs().config_id]
    finally:
        catalog.close()


def _resume(storage):
    return framework.ModelSelection.resume(
        storage, mlp_model_fn, classifier_train_fn, classifier_eval_fn, progress=False).run()


def test_resume_reruns_a_unit_logged_before_its_checkpoint_reached_disk(ray_cluster, tmp_path, assert_complete):
    from tests.integration.resume_job import selection

    storage = _crash_driver(tmp_path, "unit")
    catalog = SQLiteCatalog(os.path.join(storage, "run.db"))
    try:
        log = catalog.units(status="done")
        crashed = log[(log.config_id == 1) & (log.epoch == 1) & (log.kind == "train")]
        assert len(crashed) == 1, "the crash unit was not logged"
        assert max(units for _, units, _, _ in catalog.checkpoints(1)) == 2  # its checkpoint never came
        assert catalog.last_round()[0] == 0
    finally:
        catalog.close()
    # crashed: config 1's state lags the log by that unit, in the epoch it has not committed (what resume re-runs)
    assert_complete(storage)

    resumed = _resume(storage)
    [plan] = _events(resumed, "resume_plan")
    assert plan["round"] == 1 and plan["lost_units"] == 1
    log = _units_log(resumed)
    [lost] = log[log.status == "lost"].itertuples()
    assert (lost.config_id, lost.epoch, lost.partition, lost.kind) == (1, 1, crashed.partition.iloc[0], "train")
    _assert_nothing_lost_or_counted_twice(resumed, [0, 1], 3)

    reference = selection(str(tmp_path / "reference")).run()
    same = 0
    for cid in reference.configs:
        a, b = resumed.load_state(cid), reference.load_state(cid)
        if a["visited"] != b["visited"]:
            continue  # its visit order changed with the crash: different (equally valid) SGD order
        same += 1
        for k in a["model"]:
            assert torch.equal(a["model"][k], b["model"][k]), f"config {cid} differs although its visits match"
    assert same >= 1


def test_resume_with_epoch_checkpoints_reruns_the_unfinished_epoch(ray_cluster, tmp_path, assert_complete):
    storage = _crash_driver(tmp_path, "unit", checkpoint="epoch")
    catalog = SQLiteCatalog(os.path.join(storage, "run.db"))
    try:
        done = catalog.units(status="done")
        open_epoch = done[(done.epoch == 1) & (done.kind == "train")]
        # the state at the end of epoch 0 is on disk for every config, and nothing after it but whole epochs
        assert all(units % 2 == 0 for cid in (0, 1, 2, 3) for _, units, _, _ in catalog.checkpoints(cid))
    finally:
        catalog.close()
    assert_complete(storage)  # every state lags the log within its epoch in progress only
    resumed = _resume(storage)
    [plan] = _events(resumed, "resume_plan")
    log = _units_log(resumed)
    lost = log[log.status == "lost"]
    assert plan["lost_units"] == len(lost) >= 1  # config 1's unit of epoch 1 at least: no epoch-end checkpoint yet
    assert set(lost.epoch) == {1} and set(lost.kind) == {"train"} and len(lost) <= len(open_epoch)
    _assert_nothing_lost_or_counted_twice(resumed, [0, 1], 3)


def test_resume_after_a_commit_reruns_nothing_that_was_committed(ray_cluster, tmp_path):
    storage = _crash_driver(tmp_path, "commit")
    catalog = SQLiteCatalog(os.path.join(storage, "run.db"))
    try:
        assert catalog.last_round()[0] == 0
        before = catalog.units(status="done")
    finally:
        catalog.close()
    assert set(before["round"]) == {0} and len(before) == 4 * 4  # 4 configs x (2 train + 2 eval)

    moved = shutil.move(storage, str(tmp_path / "moved"))  # a crashed run copied elsewhere resumes there
    # config 3's newest checkpoint is corrupt: the one before it lacks half of epoch 0, which round 0 committed;
    # resume rebuilds it from the log (the run's very bytes) before any worker starts
    with open(_checkpoint_paths(moved)[3], "r+b") as f:
        f.seek(64)
        f.write(b"\xff" * 16)
    catalog = SQLiteCatalog(os.path.join(moved, "run.db"))
    assert catalog.meta()["max_worker_restarts"] == 3
    catalog.set_meta(max_worker_restarts=7)  # as if the run had been made with 7: resume keeps the run's setting
    catalog.close()
    sel = framework.ModelSelection.resume(moved, mlp_model_fn, classifier_train_fn, classifier_eval_fn)
    assert sel.max_worker_restarts == 7 and sel.unit_timeout_s is None and sel.max_unit_retries == 0
    partial = os.path.join(moved, "checkpoints", "config_0_u3.pt.tmp.123.456")  # what a crash mid-write leaves
    with open(partial, "wb") as f:
        f.write(b"half a checkpoint")
    resumed = _resume(moved)
    assert resumed.storage_path == moved and not os.path.exists(partial)
    assert _events(resumed, "resumed")[-1]["partial_checkpoints_removed"] == 1
    [rebuilt] = _events(resumed, "checkpoint_rebuilt")
    assert rebuilt["config_id"] == 3 and "corrupt" in rebuilt["damage"] and rebuilt["units"] == 2
    # queued writes of one config coalesce, so the state it starts from is the unit before it or none (under load)
    assert rebuilt["rerun"] == 2 - rebuilt["from_units"] >= 1
    [plan] = _events(resumed, "resume_plan")
    assert (plan["round"], plan["lost_units"], plan["rerun"]) == (1, 0, 16)  # epoch 1 of configs 0-3: 4 units each
    assert not _events(resumed, "resume_gap") and (resumed.status.status == "completed").all()
    log = _units_log(resumed)
    assert (log.status == "done").all()
    assert (log[log["round"] == 0].seq.tolist()) == before.seq.tolist()  # round 0 was not run again
    _assert_nothing_lost_or_counted_twice(resumed, [0, 1], 3)
    assert not os.path.exists(storage) and all(os.path.exists(p) for p in _checkpoint_paths(moved))
    # resuming the finished run returns its result without Ray or workers, and writes nothing
    db = os.path.join(moved, "run.db")
    before_db = (os.stat(db).st_mtime_ns, os.stat(db).st_size)
    again = _resume(moved)
    assert (os.stat(db).st_mtime_ns, os.stat(db).st_size) == before_db  # no event, no worker: nothing ran
    assert again.metrics.equals(resumed.metrics)


# ---- elasticity -------------------------------------------------------------------------------------------------
def test_workers_join_and_drain_at_known_rounds(ray_cluster, digits, tmp_path):
    ds = _dataset(digits)
    gate = tmp_path / "gate"
    space = {"hidden": [16, 32], "lr": [0.05, 0.1], "batch_size": [64], "gate": [str(gate)]}

    def on_event(kind, detail):
        if kind == "round_committed" and detail["round"] == 0:
            gate.touch()  # round 1 cannot finish before worker 2 has joined
            sel.add_workers(1, partitions=[0, 1])
        elif kind == "worker_joined" and detail["worker"] == 2:
            gate.unlink()
        elif kind == "round_committed" and detail["round"] == 2:
            sel.drain_worker(0)

    sel = _select(ds, tmp_path / "elastic", FaultPlan(on_event=on_event), space=space, epochs=5,
                  train_fn=gated_train_fn)
    result = sel.run()
    [joined] = [e for e in _events(result, "worker_joined") if e["worker"] == 2]
    assert sorted(joined["partitions"]) == [0, 1]
    s = result.schedule
    assert (s[s["round"] == 1].worker == 2).any(), "the new worker got no unit in the round it joined"
    [drained] = result.events[result.events.kind == "worker_drained"].itertuples()
    assert not (s[s.worker == 0].end > drained.t).any()
    assert (s[s["round"] >= 3].worker != 0).all()
    assert (s[s["round"] < 3].worker == 0).any()
    assert [e["num_workers"] for e in _events(result, "workers_changed")] == [3, 2]
    _assert_nothing_lost_or_counted_twice(result, [0, 1], 5)


def test_max_workers_grows_into_free_cluster_resources(ray_cluster, digits, tmp_path):
    ds = _dataset(digits)
    gate = tmp_path / "gate"
    space = {"hidden": [16, 32], "lr": [0.05], "batch_size": [64], "gate": [str(gate)]}

    def on_event(kind, detail):
        if kind == "autoscale":
            gate.touch()  # the next round waits for the new worker
        elif kind == "worker_joined" and detail["worker"] == 1:
            gate.unlink(missing_ok=True)

    sel = _select(ds, tmp_path / "autoscale", FaultPlan(on_event=on_event), space=space, epochs=3,
                  train_fn=gated_train_fn, num_workers=1, max_workers=2)
    result = sel.run()
    assert len(_events(result, "autoscale")) == 1  # the session cluster has 4 CPUs: room for the second worker
    assert [e["num_workers"] for e in _events(result, "workers_changed")] == [2]
    assert sel.procedure.num_workers == 2  # the procedure's concurrency hint followed the pool
    assert any(e["worker"] == 1 for e in _events(result, "worker_joined"))
    assert (result.schedule[result.schedule["round"] == 1].worker == 1).any()
    _assert_nothing_lost_or_counted_twice(result, [0, 1], 3)
    with pytest.raises(ValueError, match="`max_workers` is 1, but must be an int >= `num_workers` \\(2\\)"):
        _select(ds, tmp_path / "bad", None, max_workers=1)


def test_replica_aware_scheduling_uses_every_replica_and_only_holders(ray_cluster, digits, tmp_path):
    ds = _dataset(digits, rows=900, partitions=3, replicas=2)
    space = {"hidden": [16, 32], "lr": [0.05, 0.1, 0.2], "batch_size": [64]}
    sel = _select(ds, tmp_path / "replicas", None, space=space, epochs=3, num_workers=3)
    result = sel.run()
    assert sel.placement == {0: [0, 1], 1: [1, 2], 2: [0, 2]}
    _assert_nothing_lost_or_counted_twice(result, [0, 1, 2], 3, availability=sel.placement)
    used = set(zip(result.schedule.partition, result.schedule.worker))
    assert used == {(p, w) for p, ws in sel.placement.items() for w in ws}
