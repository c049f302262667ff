"""Fused packs on the engine (`ModelSelection(pack=...)`) on the session's real Ray cluster: each packed config ends
as it would alone (SGD and Adam, per-member learning rates and weight decays) and the run replays bit for bit; ASHA
stops members of packs; a person's clone joins the packs; one member's NaN fails it alone; a worker killed in a
packed unit loses nothing; a packed run resumes after a driver crash. That a fused pass equals the members trained
one at a time is `tests/framework/engine/test_packs.py`; here it is the whole engine around it. Tiny data.

`python -m tests.integration.test_packs STORAGE` is the driver the resume test starts and crashes on purpose."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
import torch

import automl
import framework
from framework.callbacks import Callback
from framework.engine.faults import Fault, FaultPlan
from framework.engine.state import unpack_state
from framework.engine.worker import Worker
from framework.examples import classifier_step_fn, digits_arrays, mlp_model_fn
from framework.functions import UserFunctions
from framework.scheduling import TRAIN, SeededOrderScheduler, Unit, UnitTask
from tests.integration.ft_helpers import (
    ROOT,
    _assert_nothing_lost_or_counted_twice,
    _dataset,
    _events,
    _units_log,
    ray_cluster_address,
)

pytestmark = pytest.mark.ray
SPACE = {"hidden": [16], "lr": [0.02, 0.1], "weight_decay": [0.0, 1e-3], "optimizer": ["sgd", "adam"],
         "batch_size": [32]}


def _select(ds, storage, space=SPACE, epochs=2, procedure=None, **options):
    options.setdefault("num_workers", ds.num_partitions)
    return framework.ModelSelection(
        mlp_model_fn, step_fn=classifier_step_fn, dataset=ds,
        procedure=procedure or automl.GridSearch(space, epochs=epochs), storage_path=str(storage), progress=False,
        **options)


def _packs(result) -> list[list[int]]:
    """The configs of each pack in the schedule (groups whose rows are all on one worker)."""
    s = result.schedule[result.schedule.group.notna()]
    return [sorted(rows.config_id) for _, rows in s.groupby("group") if rows.worker.nunique() == 1]


def _same(a: dict, b: dict) -> bool:
    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def _assert_each_config_as_alone(result, ds, seed: int) -> None:
    """Each config's logged units, re-run alone in its logged order on one in-process worker: its metrics and final
    weights, up to float rounding (a fused pass sums in another order)."""
    worker = Worker(0, UserFunctions(mlp_model_fn, step_fn=classifier_step_fn))
    worker.load({p: ([ds.train[p]], [ds.valid[p]]) for p in range(ds.num_partitions)})
    done = _units_log(result).query("status == 'done'").sort_values("seq")
    threads = torch.get_num_threads()
    torch.set_num_threads(int(result.meta.get("num_threads", 1)))  # the run's workers' threads
    try:
        assert len(result.configs) > 1
        for cid, config in result.configs.items():
            state = None
            for row in done[done.config_id == cid].itertuples():
                task = UnitTask(Unit(cid, int(row.epoch), int(row.partition), row.kind), config, seed=seed)
                new_state, report = worker.run(task, state)
                assert report.error is None, report.error
                logged = json.loads(row.metrics)
                assert report.metrics["loss"] == pytest.approx(logged["loss"], rel=1e-3), (cid, row.epoch, row.kind)
                state = new_state if row.kind == TRAIN else state
            alone, packed = unpack_state(state), result.load_state(cid)
            assert alone["visited"] == packed["visited"]
            for k, v in alone["model"].items():
                torch.testing.assert_close(packed["model"][k], v, rtol=1e-3, atol=1e-4, msg=f"config {cid}: {k}")
    finally:
        torch.set_num_threads(threads)


def test_packed_configs_end_as_alone_and_the_run_replays_bit_for_bit(ray_cluster, digits, tmp_path, assert_complete):
    ds = _dataset(digits, rows=300, partitions=2)
    sel = _select(ds, tmp_path / "packed", pack=4, seed=4, queue_depth=1)
    result = sel.run()
    assert (result.status.status == "completed").all() and len(result.configs) == 8
    packs = _packs(result)
    assert packs and max(map(len, packs)) == 4  # SGD and Adam configs never share a pack (one optimizer class)
    for members in packs:
        assert len({result.configs[c]["optimizer"] for c in members}) == 1
    _assert_nothing_lost_or_counted_twice(result, [0, 1], 2, availability=sel.placement)
    assert_complete(result)

    _assert_each_config_as_alone(result, ds, seed=4)

    # the replay re-fuses the logged packs: bit for bit
    again = framework.replay(result.storage_path, out_path=str(tmp_path / "replay"))
    assert sorted(map(tuple, _packs(again))) == sorted(map(tuple, packs))
    for cid in result.configs:
        assert _same(again.load_state(cid)["model"], result.load_state(cid)["model"]), f"replay of config {cid}"
    merged = result.metrics.merge(again.metrics, on=["config_id", "epoch"], suffixes=("", "_replay"))
    for m in ("train_loss", "valid_accuracy"):
        assert (merged[m] == merged[f"{m}_replay"]).all(), m


def test_deterministic_packs_keep_every_configs_seeded_order_and_two_runs_are_bit_identical(
        ray_cluster, digits, tmp_path, assert_complete):
    ds = _dataset(digits, rows=300, partitions=2)
    space = {"hidden": [16], "lr": [0.02, 0.05, 0.1, 0.2], "optimizer": ["sgd", "adam"], "batch_size": [32]}
    runs = [_select(ds, tmp_path / f"det{i}", space=space, pack=4, seed=6, deterministic=True).run() for i in (0, 1)]
    a, b = runs
    assert _packs(a) and sorted(map(tuple, _packs(a))) == sorted(map(tuple, _packs(b)))  # the same packs
    # every config visits its partitions in its seeded order, as at pack=1 (the order is the seed's, not the pack's)
    policy = SeededOrderScheduler(6)
    s = a.schedule[a.schedule.kind == TRAIN].sort_values(["start", "end"])
    for (cid, epoch), rows in s.groupby(["config_id", "epoch"]):
        assert list(rows.partition) == policy.order(cid, epoch, [0, 1]), (cid, epoch)
    for cid in a.configs:  # bit for bit, whatever the two runs' timings
        assert _same(a.load_state(cid)["model"], b.load_state(cid)["model"]), f"config {cid}"
    merged = a.metrics.merge(b.metrics, on=["config_id", "epoch"], suffixes=("", "_b"))
    assert (merged.valid_loss == merged.valid_loss_b).all()
    _assert_each_config_as_alone(a, ds, seed=6)  # and each config as it would be at pack=1
    assert_complete(a)


def test_asha_stops_members_of_packs_and_a_nan_member_fails_alone(ray_cluster, digits, tmp_path, assert_complete):
    ds = _dataset(digits, rows=300, partitions=2)
    # a learning rate of 1e30 sends that config's weights, then its loss, to inf/NaN in its first unit
    space = {"hidden": [16], "lr": [0.01, 0.05, 0.1, 0.2, 1e30], "batch_size": [32]}
    asha = automl.ASHA(space, max_epochs=3, eta=2, max_configs=6, seed=1)
    result = _select(ds, tmp_path / "asha", procedure=asha, pack=8, seed=0, deterministic=True).run()
    status = result.status.set_index("config_id")
    poisoned = [c for c, cfg in result.configs.items() if cfg["lr"] == 1e30]
    assert poisoned and all(status.status[c] == "failed" for c in poisoned)
    assert "FloatingPointError" in status.error[poisoned[0]] and "non-finite loss" in status.error[poisoned[0]]
    assert (status.status == "pruned").any() and (status.status == "completed").any()
    assert set(status.status[[c for c in status.index if c not in poisoned]]) <= {"pruned", "completed"}
    # a poisoned config failed in a pack with healthy ones, which went on (their rows of that pack are done)
    log = _units_log(result)
    for cid in poisoned:
        [failed] = log[(log.config_id == cid) & (log.status == "failed")].itertuples()
        mates = log[(log.group == failed.group) & (log.config_id != cid)]
        assert len(mates) >= 1 and (mates.status == "done").all()
    # a stopped config leaves the packs: no unit of it after the epochs it trained
    s = result.schedule
    for cid, row in status.iterrows():
        assert (s[s.config_id == cid].epoch < max(row.epochs, 1)).all(), cid
    ok = [c for c in status.index if c not in poisoned]
    for cid in ok:
        epochs = int(status.epochs[cid])
        visited = result.load_state(cid)["visited"]
        assert {e: sorted(ps) for e, ps in visited.items()} == {e: [0, 1] for e in range(epochs)}
    assert not s.duplicated(["config_id", "epoch", "partition", "kind"]).any()
    assert_complete(result)


class _CloneOnce(Callback):
    """Clones config 1 (warm, another learning rate) as soon as its first training unit ends (the person's command,
    through the run's own command queue, as the dashboard and `modelhopper` send it)."""

    def __init__(self) -> None:
        self.selection = None

    def on_unit_end(self, config_id, epoch, partition, kind, worker, seconds, metrics) -> None:
        if self.selection is not None and (config_id, kind) == (1, TRAIN):
            self.selection._commands.put("clone_config", config_id=1, overrides={"lr": 0.03}, epochs=2)
            self.selection = None


def test_a_clone_joins_the_packs_and_a_killed_worker_loses_nothing(ray_cluster, digits, tmp_path, assert_complete):
    ds = _dataset(digits, rows=300, partitions=2)
    space = {"hidden": [16], "lr": [0.02, 0.05, 0.1, 0.2], "batch_size": [32]}
    kill = Fault("kill_worker", config_id=2, epoch=1, kind=TRAIN)  # whichever pack holds config 2 then
    clone = _CloneOnce()
    sel = _select(ds, tmp_path / "clone", space=space, pack=3, faults=FaultPlan([kill]), callbacks=[clone],
                  queue_depth=1)
    clone.selection = sel
    result = sel.run()
    status = result.status.set_index("config_id")
    assert len(status) == 5 and (status.status == "completed").all()
    assert result.configs[4]["lr"] == 0.03 and int(status.parent[4]) == 1
    assert any(4 in m and len(m) > 1 for m in _packs(result))  # the clone trained packed with others
    assert len(_events(result, "worker_failed")) == 1 and len(_events(result, "worker_restarting")) == 1
    log = _units_log(result)
    killed = log[log.status == "interrupted"]  # every member of the pack config 2 was in, one row each
    [(_, group)] = killed.groupby("group")
    assert 2 in set(group.config_id) and len(group) == len(_packs(result)[0]) or len(group) > 1
    assert [e["requeued"] for e in _events(result, "worker_failed")][0]  # ...they ran again...
    _assert_nothing_lost_or_counted_twice(result, [0, 1], 2, configs=[0, 1, 2, 3])  # ...once each
    assert_complete(result)


def _crashing_selection(storage: str) -> framework.ModelSelection:
    """The resume test's run: one worker, packs of 3, a checkpoint per unit, and a driver that SIGKILLs itself right
    after config 1's first unit of epoch 1 is logged (in a pack), before its checkpoint."""
    x, y = digits_arrays()
    ds = framework.PartitionedDataset.from_arrays(x[:300], y[:300], num_partitions=2, seed=0)
    crash_at = Fault("crash_driver", config_id=1, epoch=1, kind=TRAIN)
    return _select(ds, storage, space={"hidden": [16], "lr": [0.05, 0.1, 0.2], "batch_size": [32]}, num_workers=1,
                   seed=3, pack=3, queue_depth=1, checkpoint="unit", faults=FaultPlan([crash_at]))


def test_a_packed_run_resumes_after_a_driver_crash_and_replays_bit_for_bit(ray_cluster, tmp_path, assert_complete):
    storage = str(tmp_path / "crashed")
    env = {**os.environ, "RAY_ADDRESS": ray_cluster_address(),
           "PYTHONPATH": ROOT + os.pathsep + os.environ.get("PYTHONPATH", "")}
    proc = subprocess.run([sys.executable, "-m", "tests.integration.test_packs", storage], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=240)
    assert proc.returncode == -9, f"the driver was not killed by its fault ({proc.returncode}):\n{proc.stderr[-3000:]}"
    resumed = framework.ModelSelection.resume(storage, mlp_model_fn, step_fn=classifier_step_fn,
                                              progress=False).run()
    assert resumed.meta["pack"] == 3
    assert (resumed.status.status == "completed").all()
    assert any(len(m) == 3 for m in _packs(resumed))
    _assert_nothing_lost_or_counted_twice(resumed, [0, 1], 2)
    assert_complete(resumed)
    again = framework.replay(storage, out_path=str(tmp_path / "replay"))
    for cid in resumed.configs:
        a, b = resumed.load_state(cid), again.load_state(cid)
        assert a["visited"] == b["visited"] and _same(a["model"], b["model"]), f"config {cid} (run vs replay)"
    assert_complete(again)


if __name__ == "__main__":  # the resume test's driver (see the module docstring)
    _crashing_selection(sys.argv[1]).run()
