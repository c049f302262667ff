"""Worker actors kept between runs of one process (`framework.cluster.spares`): the next run's workers
start on them, train exactly as new actors would, and a spare no run takes is killed."""

from __future__ import annotations

import json
import time

import pandas as pd
import pytest

import automl
import framework
from framework.cluster import spares
from framework.engine.ledger import PROCESS_LEDGER
from framework.engine.ray_backend import SPARES, release_spare_workers
from framework.examples import classifier_eval_fn, classifier_train_fn, mlp_model_fn

pytestmark = pytest.mark.ray

SPACE = {"hidden": [16], "lr": [0.05, 0.2], "batch_size": [64]}


def _run(ds, path, **kw):
    return framework.ModelSelection(
        mlp_model_fn, classifier_train_fn, classifier_eval_fn, ds, automl.GridSearch(SPACE, epochs=2),
        storage_path=str(path), progress=False, deterministic=True, seed=3, **kw).run()


def _pids(result) -> set[int]:
    joined = result.events[result.events.kind == "worker_joined"]
    return {json.loads(d)["pid"] for d in joined.detail}


def _metrics(result) -> pd.DataFrame:
    return result.metrics.sort_values(["config_id", "epoch"]).reset_index(drop=True)[
        ["config_id", "epoch", "train_loss", "valid_loss"]]


def test_the_next_run_starts_on_the_last_runs_actors_and_trains_as_on_new_ones(ray_cluster, digits, tmp_path):
    ds = framework.PartitionedDataset.from_arrays(*digits, num_partitions=2, seed=0)  # (on earlier tests' spares)
    first = _run(ds, tmp_path / "first")
    second = _run(ds, tmp_path / "second", queue_depth=1)  # (any depth up to UNIT_THREADS: the same thread groups)
    assert len(_pids(first)) == 2 and _pids(second) == _pids(first)  # the same processes
    pd.testing.assert_frame_equal(_metrics(second), _metrics(first))
    second.assert_complete()
    # another key (the actors' resources): new actors, before which the spares of the other key are killed
    other = _run(ds, tmp_path / "other", worker_resources={"CPU": 0.5})
    assert not _pids(other) & _pids(first)
    assert release_spare_workers() == 2  # the other run's two: the first two were killed when it started


def test_a_run_that_needs_fewer_workers_leaves_the_other_spares_to_the_next(ray_cluster, digits, tmp_path):
    ds = framework.PartitionedDataset.from_arrays(*digits, num_partitions=2, seed=0)
    first = _run(ds, tmp_path / "first")  # two workers (on earlier tests' spares, or new)
    one = _run(ds, tmp_path / "one", num_workers=1)  # takes one; needs no new actor, so the other spare lives on
    again = _run(ds, tmp_path / "again")
    assert len(_pids(one)) == 1 and _pids(one) < _pids(first)
    assert _pids(again) == _pids(first)  # no new actor: both spares were there
    # what spares hold counts as free for a worker a run adds (it takes one, or kills them first)
    held = SPARES.held().get("CPU", 0)
    assert held >= 2
    # work this process cannot hand its spares to has only as many killed as it needs: what Ray reports free counts
    free = ray_cluster.available_resources().get("CPU", 0)
    assert release_spare_workers({"CPU": free}) == 0
    assert release_spare_workers({"CPU": free + 1}) == 1 and SPARES.held()["CPU"] == held - 1
    for bad in (-1, float("nan"), "2", True):
        with pytest.raises(ValueError, match=r"`free` is \{'CPU': .*\}, but each amount must be a number >= 0"):
            release_spare_workers({"CPU": bad})


def test_a_spare_no_run_takes_is_killed_after_its_time(ray_cluster, digits, tmp_path, monkeypatch):
    ds = framework.PartitionedDataset.from_arrays(*digits, num_partitions=2, seed=0)
    release_spare_workers()
    _run(ds, tmp_path / "run")  # its two workers are the only spares now
    [key] = SPARES._by_key
    assert len(SPARES._by_key[key]) == 2
    monkeypatch.setattr(spares, "SPARE_TTL_S", 0.5)
    SPARES.put(key, SPARES.take(key), {"CPU": 1})  # the timer starts again, at 0.5 s
    deadline = time.time() + 30
    while sum(map(len, SPARES._by_key.values())) and time.time() < deadline:
        time.sleep(0.1)
    assert release_spare_workers() == 0  # the timer killed them


def test_the_runs_of_a_process_share_one_start_ledger_and_a_dead_one_is_replaced(ray_cluster, digits, tmp_path):
    import ray

    ledger = PROCESS_LEDGER.get()
    ds = framework.PartitionedDataset.from_arrays(*digits, num_partitions=2, seed=0)
    _run(ds, tmp_path / "run")
    assert PROCESS_LEDGER.get()._actor_id == ledger._actor_id  # the run used it and left it alive
    ray.kill(ledger, no_restart=True)
    deadline = time.monotonic() + 30  # (the kill lands a moment later: a call made before then is still answered)
    while True:
        try:
            ray.get(ledger.last.remote(None), timeout=10)
        except ray.exceptions.RayActorError:
            break
        assert time.monotonic() < deadline, "the killed ledger still answers after 30 s"
        time.sleep(0.05)
    fresh = PROCESS_LEDGER.get()
    assert fresh._actor_id != ledger._actor_id and ray.get(fresh.last.remote(None)) == -1
