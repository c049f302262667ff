"""End-to-end runs of ModelSelection on the session's real local Ray cluster with real torch training."""

from __future__ import annotations

import json
import math
import os
import sqlite3

import pytest
import torch

import automl
import framework
import framework.__main__
from framework.driver.units import MetricNotReportedError
from framework.examples import (
    classifier_eval_fn,
    classifier_train_fn,
    mlp_model_fn,
    scheduled_model_fn,
    scheduled_train_fn,
)
from framework.store.catalog import SQLiteCatalog, UnverifiedRunError, UnverifiedRunWarning
from framework.store.signing import SignatureError
from simulators import validate_schedule

pytestmark = pytest.mark.ray

SPACE = {"hidden": [32], "lr": [0.05, 0.2], "batch_size": [32]}


def assert_mop_invariants(schedule, partitions, availability=None):
    report = validate_schedule(schedule, availability=availability, partitions=partitions)
    assert report.ok, report.violations


def _run(ds, tmp_path, name, procedure=None, **kw):
    procedure = procedure or automl.GridSearch(SPACE, epochs=3)
    return framework.ModelSelection(
        mlp_model_fn, classifier_train_fn, classifier_eval_fn, ds, procedure,
        storage_path=str(tmp_path / name), progress=False, **kw,
    ).run()


def test_mop_grid_search_obeys_invariants_and_writes_results(ray_cluster, digits, tmp_path, assert_complete):
    ds = framework.PartitionedDataset.from_arrays(*digits, num_partitions=3, seed=0)
    result = _run(ds, tmp_path, "mop")
    assert len(result.configs) == 2
    assert set(result.metrics.epoch) == {0, 1, 2}
    assert {"train_loss", "valid_loss", "valid_accuracy"} <= set(result.metrics.columns)
    assert_mop_invariants(result.schedule, partitions=[0, 1, 2], availability={0: [0], 1: [1], 2: [2]})
    assert (result.schedule.kind == "eval").sum() == 2 * 3 * 3
    assert result.best_config_id in result.configs
    assert (tmp_path / "mop" / "metrics.csv").exists() and (tmp_path / "mop" / "schedule.csv").exists()
    # every config absorbed each partition exactly once per epoch (the counter inside its state)
    for cid in result.configs:
        visited = result.load_state(cid)["visited"]
        assert {e: sorted(ps) for e, ps in visited.items()} == {e: [0, 1, 2] for e in range(3)}
    model = result.load_model()
    assert isinstance(model, torch.nn.Module)
    assert_complete(result)


def test_mop_accuracy_matches_sequential_baseline(ray_cluster, digits, tmp_path):
    ds = framework.PartitionedDataset.from_arrays(*digits, num_partitions=2, seed=0)
    space = {"hidden": [64], "lr": [0.05], "batch_size": [32]}
    # 8 epochs: both have converged (at 4 epochs they still differed by 1.9 points: MOP 0.972, sequential 0.953)
    mop = _run(ds, tmp_path, "mop", automl.GridSearch(space, epochs=8))
    seq = _run(ds, tmp_path, "seq", automl.GridSearch(space, epochs=8), executor="sequential")
    best = lambda r: r.metrics.valid_accuracy.max()  # noqa: E731
    assert best(seq) > 0.9
    assert abs(best(mop) - best(seq)) <= 0.02
    assert set(seq.schedule.worker) == {0} and set(seq.schedule.partition) == {0}


def test_task_parallel_executor_holds_full_data_on_every_worker(ray_cluster, digits, tmp_path, assert_complete):
    ds = framework.PartitionedDataset.from_arrays(*digits, num_partitions=2, seed=0)
    result = _run(ds, tmp_path, "tp", automl.GridSearch(SPACE, epochs=1), executor="task_parallel")
    assert set(result.schedule.partition) == {0}
    assert (result.schedule.kind == "train").sum() == 2  # one whole-epoch unit per config
    assert_mop_invariants(result.schedule, partitions=[0])
    assert_complete(result)  # its one "partition" is all the data


def test_replay_gives_bit_identical_weights(ray_cluster, digits, tmp_path, assert_complete):
    ds = framework.PartitionedDataset.from_arrays(*digits, num_partitions=3, seed=1)
    result = _run(ds, tmp_path, "run", automl.GridSearch(SPACE, epochs=2), seed=7)
    before = sorted(os.listdir(result.storage_path))
    again = framework.replay(result.storage_path)
    # next to the run, never inside it: reading a run writes nothing into it
    assert again.storage_path == os.path.normpath(result.storage_path) + "-replay"
    assert sorted(os.listdir(result.storage_path)) == before
    for cid in result.configs:
        a, b = result.load_state(cid), again.load_state(cid)
        assert a["visited"] == b["visited"]
        for k in a["model"]:
            assert torch.equal(a["model"][k], b["model"][k]), f"config {cid} {k} differs after replay"
    merged = result.metrics.merge(again.metrics, on=["config_id", "epoch"], suffixes=("", "_replay"))
    assert (merged.valid_loss == merged.valid_loss_replay).all()
    assert again.meta["replay_device"] == "cpu"
    assert_complete(result)
    assert_complete(again)
    # the replay goes to the run's device: a run whose workers asked for a GPU replays on "cuda"
    with pytest.raises(ValueError, match="`device` is 'tpu:9'"):
        framework.replay(result.storage_path, device="tpu:9")
    catalog = SQLiteCatalog(os.path.join(result.storage_path, "run.db"))
    catalog.set_meta(worker_resources={"CPU": 1, "GPU": 0.5})
    catalog.close()
    if not torch.cuda.is_available():
        with pytest.raises(ValueError, match="no CUDA device; pass device='cpu'"):
            framework.replay(result.storage_path)
    on_cpu = framework.replay(result.storage_path, device="cpu")
    assert on_cpu.storage_path.endswith("replay-2") and on_cpu.meta["replay_device"] == "cpu"  # never overwritten
    assert (on_cpu.metrics.valid_loss.to_numpy() == again.metrics.valid_loss.to_numpy()).all()
    # a run directory cannot make replay import and call what it names: every row is signed
    db = os.path.join(result.storage_path, "run.db")
    planted = tmp_path / "planted"
    original = _edit(db, "SELECT value FROM meta WHERE key = 'functions'")[0][0]
    _edit(db, "UPDATE meta SET value = ? WHERE key = 'functions'",
          (json.dumps({**json.loads(original), "model_fn": "os:system"}),))
    _edit(db, "UPDATE configs SET config = ? WHERE id = 0", (json.dumps(f"touch {planted}"),))
    with pytest.raises(UnverifiedRunError, match=r"replay refuses .*meta 'functions' does not verify .*config 0"):
        framework.replay(result.storage_path, device="cpu")
    with pytest.raises(SignatureError, match=r"model_fn=os:system, .* does not verify"), \
            pytest.warns(UnverifiedRunWarning):  # a caller who accepts the run: still nothing it names is imported
        framework.replay(result.storage_path, device="cpu", trust_unverified=True)
    assert framework.__main__.main(["replay", result.storage_path, "--device", "cpu"]) == 2
    assert not planted.exists()  # nothing ran
    _edit(db, "UPDATE meta SET value = ? WHERE key = 'functions'", (original,))  # the names as they were
    with pytest.raises(UnverifiedRunError, match=r"\(config 0 does not verify"):  # an edited config alone is refused
        framework.replay(result.storage_path, device="cpu")
    _edit(db, "UPDATE configs SET config = ? WHERE id = 0", (json.dumps(result.configs[0]),))
    threads = _edit(db, "SELECT value FROM meta WHERE key = 'num_threads'")[0][0]
    _edit(db, "UPDATE meta SET value = '3' WHERE key = 'num_threads'")  # so is any meta row
    with pytest.raises(UnverifiedRunError, match=r"\(meta 'num_threads' does not verify"):
        framework.replay(result.storage_path, device="cpu")
    _edit(db, "UPDATE meta SET value = ? WHERE key = 'num_threads'", (threads,))
    passed = framework.replay(result.storage_path, device="cpu", model_fn=mlp_model_fn, train_fn=classifier_train_fn,
                              eval_fn=classifier_eval_fn)  # what the caller passes is trusted
    assert (passed.metrics.valid_loss.to_numpy() == again.metrics.valid_loss.to_numpy()).all()
    assert passed.meta["functions"]["train_fn"].endswith(":classifier_train_fn")  # the replay names what it ran
    assert not planted.exists()


def _edit(db: str, sql: str, args: tuple = ()) -> list[tuple]:
    """Edit run.db by hand, as someone with write access to the run directory (but not the key) could."""
    conn = sqlite3.connect(db, isolation_level=None)
    try:
        return conn.execute(sql, args).fetchall()
    finally:
        conn.close()


def test_a_metric_no_fn_returns_stops_the_run_at_its_first_report(ray_cluster, digits, tmp_path):
    ds = framework.PartitionedDataset.from_arrays(*digits, num_partitions=2, seed=0)
    with pytest.raises(MetricNotReportedError, match=r"`metric` is 'valid_acc', but eval_fn returned no .* reported \["):
        _run(ds, tmp_path, "typo", automl.GridSearch(SPACE, epochs=20), metric="valid_acc", mode="max")
    catalog = SQLiteCatalog(str(tmp_path / "typo" / "run.db"))
    units = catalog.units(status="done")
    catalog.close()
    # stopped at the first report: one epoch of the 20 at most (2 configs x (2 train + 2 eval) units)
    assert len(units) <= 8 and set(units.epoch) <= {0}


def _failing_model_fn(config):
    if config["hidden"] == 13:
        raise RuntimeError("model_fn exploded on purpose")
    return mlp_model_fn(config)


def _nan_train_fn(model, optimizer, data, config):
    metrics = classifier_train_fn(model, optimizer, data, config)
    return {**metrics, "loss": float("nan")} if config["lr"] == 1e6 else metrics


def test_failing_configs_are_reported_and_the_rest_finish(ray_cluster, digits, tmp_path, assert_complete):
    ds = framework.PartitionedDataset.from_arrays(*digits, num_partitions=2, seed=0)
    space = {"hidden": [13, 32], "lr": [0.05, 1e6], "batch_size": [32]}  # hidden=13 raises; lr=1e6 reports NaN
    result = framework.ModelSelection(
        _failing_model_fn, _nan_train_fn, classifier_eval_fn, ds, automl.GridSearch(space, epochs=3),
        storage_path=str(tmp_path / "fail"), progress=False,
    ).run()
    status = result.status.set_index("config_id")
    by_cfg = {cid: cfg for cid, cfg in result.configs.items()}
    for cid, cfg in by_cfg.items():
        if cfg["hidden"] == 13:
            assert status.loc[cid, "status"] == "failed"
            assert "model_fn exploded on purpose" in status.loc[cid, "error"]
        elif cfg["lr"] == 1e6:
            assert status.loc[cid, "status"] == "failed"
            assert "non-finite loss" in status.loc[cid, "error"]
        else:
            assert status.loc[cid, "status"] == "completed"
            assert status.loc[cid, "epochs"] == 3
    healthy = [cid for cid, c in by_cfg.items() if c["hidden"] == 32 and c["lr"] == 0.05]
    assert result.best_config_id == healthy[0]
    assert len(result.failures) == 3
    assert not math.isnan(result.leaderboard().iloc[0]["valid_loss"])
    assert_complete(result)


def test_lr_schedule_and_grad_scaler_hop_checkpoint_and_replay_bit_identically(ray_cluster, digits, tmp_path):
    x, y = digits
    ds = framework.PartitionedDataset.from_arrays(x[:600], y[:600], num_partitions=2, seed=0)
    space = {"hidden": [32], "lr": [0.1, 0.2], "batch_size": [32], "epochs": [3], "amp": [True]}
    result = framework.ModelSelection(
        scheduled_model_fn, scheduled_train_fn, classifier_eval_fn, ds, automl.GridSearch(space, epochs=3),
        storage_path=str(tmp_path / "scheduled"), progress=False, seed=4,
    ).run()
    assert len(result.configs) == 2
    for cid, config in result.configs.items():
        lrs = result.metrics[result.metrics.config_id == cid].sort_values("epoch").train_lr.tolist()
        cosine = [config["lr"] * (1 + math.cos(math.pi * e / 3)) / 2 for e in range(3)]
        assert lrs == pytest.approx(cosine, rel=1e-6)  # one step per epoch, whichever worker ran the unit
        state = result.load_state(cid)
        assert state["lr_scheduler"]["last_epoch"] == 2 and state["grad_scaler"]["scale"] > 0
    again = framework.replay(result.storage_path)
    for cid in result.configs:
        a, b = result.load_state(cid), again.load_state(cid)
        assert a["lr_scheduler"] == b["lr_scheduler"] and a["grad_scaler"] == b["grad_scaler"]
        for k in a["model"]:
            assert torch.equal(a["model"][k], b["model"][k]), f"config {cid} {k} differs after replay"


def test_deterministic_runs_with_one_seed_report_the_same_metrics(ray_cluster, digits, tmp_path):
    """deterministic=True: the seed fixes every config's visit order, so two runs (different timings, fresh worker
    processes) train the same weights; the default dispatch follows the timing instead."""
    ds = framework.PartitionedDataset.from_arrays(*digits, num_partitions=3, seed=2)
    runs = [_run(ds, tmp_path, f"det{i}", automl.GridSearch(SPACE, epochs=2), seed=11, deterministic=True)
            for i in range(2)]
    a, b = (r.metrics.sort_values(["config_id", "epoch"]).reset_index(drop=True) for r in runs)
    assert a[["valid_loss", "valid_accuracy", "train_loss"]].equals(b[["valid_loss", "valid_accuracy", "train_loss"]])
    for cid in runs[0].configs:
        sa, sb = runs[0].load_state(cid), runs[1].load_state(cid)
        assert sa["visited"] == sb["visited"]
        assert all(torch.equal(sa["model"][k], sb["model"][k]) for k in sa["model"])
    assert runs[0].schedule.kind.eq("train").sum() == 2 * 2 * 3


@pytest.mark.parametrize("request_", [{"CPU": 1, "GPU": 1}, {"CPU": 1, "accelerator_x": 2}, {"CPU": 64}])
def test_a_resource_request_no_node_can_meet_fails_before_any_work(request_, ray_cluster, digits, tmp_path):
    """Ray would wait forever for a worker that asks for a GPU on a cluster without one; the run refuses at once,
    naming `worker_resources` and what the cluster has, and writes no run."""
    ds = framework.PartitionedDataset.from_arrays(*digits, num_partitions=2, seed=0)
    sel = framework.ModelSelection(mlp_model_fn, classifier_train_fn, classifier_eval_fn, ds,
                                   automl.GridSearch(SPACE, epochs=1), worker_resources=request_,
                                   storage_path=str(tmp_path / "never"), progress=False)
    [(name, amount)] = [(k, v) for k, v in request_.items() if k != "CPU" or v > 4]
    with pytest.raises(ValueError, match=rf"`worker_resources` asks for {name}={amount:g} per worker, but the Ray "
                                         rf"cluster has {name}=\d+ in all \(CPU=4"):
        sel.run()
    assert not (tmp_path / "never").exists()
