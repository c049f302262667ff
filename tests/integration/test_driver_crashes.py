"""Driver crashes on a real local Ray cluster: a driver killed on purpose at an exact point (a unit logged before
its checkpoint reached the disk, an epoch's checkpoints, a commit) in a subprocess, then `resume`: every test asserts
that what ran is rerun only where it must be, nothing lost and nothing counted twice."""

from __future__ import annotations

import os
import shutil

import pytest
import torch

import framework
from framework.store.catalog import SQLiteCatalog
from tests.integration.ft_functions import classifier_eval_fn, classifier_train_fn, mlp_model_fn
from tests.integration.ft_helpers import (
    _assert_nothing_lost_or_counted_twice,
    _checkpoint_paths,
    _events,
    _resume,
    _start_crash_driver,
    _units_log,
    ray_cluster_address,
)

pytestmark = pytest.mark.ray

#: each test's crashed driver: (crash point, checkpoint policy) of tests/integration/resume_job.py
CRASHES = {
    "test_resume_reruns_a_unit_logged_before_its_checkpoint_reached_disk": ("unit", "unit"),
    "test_resume_with_epoch_checkpoints_reruns_the_unfinished_epoch": ("unit", "epoch"),
    "test_resume_after_a_commit_reruns_nothing_that_was_committed": ("commit", "unit"),
}


@pytest.fixture(scope="module")
def crashed_drivers(ray_cluster, request, tmp_path_factory):
    """The crashed drivers of this module's tests that will run, started together before any test resumes one:
    the spare workers a resume leaves serve the next resume (a subprocess driver frees them as it starts), and the
    drivers' start-ups overlap. Each test's `crashed_drivers[name]()` waits for its driver's crash and returns its
    storage."""
    names = {item.originalname for item in request.session.items if getattr(item, "module", None) is request.module}
    ray_cluster_address(cpus=len(names))  # (one worker each, all at once)
    return {name: _start_crash_driver(tmp_path_factory.mktemp("crash"), crash, checkpoint)
            for name, (crash, checkpoint) in CRASHES.items() if name in names}


@pytest.fixture
def crashed(crashed_drivers, request):
    """This test's crashed driver's storage (`CRASHES`)."""
    return crashed_drivers[request.node.originalname]()


# ---- driver crashes and resume ----------------------------------------------------------------------------------
def test_resume_reruns_a_unit_logged_before_its_checkpoint_reached_disk(crashed, tmp_path, assert_complete):
    from tests.integration.resume_job import selection

    storage = crashed  # crashed right after config 1's first unit of epoch 1 was logged, before its checkpoint
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


def test_resume_with_epoch_checkpoints_reruns_the_unfinished_epoch(crashed, assert_complete):
    storage = crashed  # as above, with checkpoints at epoch ends only
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


def test_resume_after_a_commit_reruns_nothing_that_was_committed(crashed, tmp_path):
    storage = crashed  # crashed right after round 0 committed
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
