"""Data-parallel gangs in live runs on Ray: configs train as gangs of worker actors that each keep their partitions
(`scheduler="data_parallel"`, `"cerebro"`, `"planner"`); a gang whose member is killed re-runs its step from the
config's last state, with nothing lost and nothing counted twice."""

from __future__ import annotations

import pytest

import framework
from framework.engine.faults import Fault, FaultPlan
from tests.integration.ft_helpers import (
    _assert_nothing_lost_or_counted_twice,
    _dataset,
    _events,
    _select,
    _units_log,
)

pytestmark = pytest.mark.ray
SPACE = {"hidden": [16], "lr": [0.05, 0.1], "batch_size": [32]}


def _gang_rows(result):
    """The schedule's gang steps: (config, epoch, kind) -> [(worker, partition), ...] per group."""
    rows = result.schedule[result.schedule.group.notna()]
    return {int(g): sorted(zip(r.worker, r.partition)) for g, r in rows.groupby("group")}


@pytest.mark.parametrize("scheduler", ["data_parallel", "cerebro"])
def test_configs_train_as_gangs_of_workers_that_keep_their_partitions(ray_cluster, digits, tmp_path, scheduler):
    ds = _dataset(digits, rows=400, partitions=2)
    sel = _select(ds, tmp_path / "run", None, space=SPACE, scheduler=scheduler)
    result = sel.run()
    assert (result.status.status == "completed").all()
    steps = _gang_rows(result)
    # two configs on two workers: Cerebro's switch goes data parallel at |S| <= p / 2 (never, here: it hops)
    if scheduler == "data_parallel":
        # every training step is one gang of both workers, each on the partition it holds: an epoch per step
        train = result.schedule[result.schedule.kind == "train"]
        assert train.group.notna().all() and len(steps) >= 2 * 2
        for members in steps.values():
            assert [w for w, _ in members] == [0, 1]
            assert all(p in sel.placement[w] for w, p in members)
    else:
        assert not steps
    _assert_nothing_lost_or_counted_twice(result, [0, 1], 2, availability=sel.placement)


@pytest.fixture(scope="module")
def replicated_gang_run(ray_cluster, digits, tmp_path_factory):
    """One data-parallel gang run that two tests only read: (its dataset, its `Result`). 3 partitions on both
    workers: a gang trains partitions 0 and 1, then both workers share partition 2's pass."""
    ds = _dataset(digits, rows=305, partitions=3, replicas=2)  # train 82, 81, 81 rows; valid 21, 20, 20
    result = _select(ds, tmp_path_factory.mktemp("replicated") / "run", None, space={**SPACE, "lr": [0.1]}, epochs=1,
                     num_workers=2, scheduler="data_parallel").run()
    return ds, result


def test_a_replicated_gangs_rows_add_up_to_the_examples_of_its_partitions(replicated_gang_run):
    ds, result = replicated_gang_run
    assert (result.status.status == "completed").all()
    rows = result.schedule
    assert rows.group.notna().all()
    examples = {(k, p): sorted(g.num_examples) for (k, p), g in rows.groupby(["kind", "partition"])}
    assert examples == {("train", 0): [82], ("train", 1): [81], ("train", 2): [40, 41],
                        ("eval", 0): [21], ("eval", 1): [20], ("eval", 2): [10, 10]}
    assert sum(len(x) for x, _ in ds.train) == 244 == rows[rows.kind == "train"].num_examples.sum()


def test_a_killed_gang_member_fails_the_step_which_reruns_from_the_last_state(ray_cluster, digits, tmp_path):
    ds = _dataset(digits, rows=400, partitions=2)
    plan = FaultPlan([Fault("kill_worker", config_id=0, epoch=1)])  # the gang's first member dies as its step starts
    sel = _select(ds, tmp_path / "run", plan, space=SPACE, scheduler="data_parallel", max_worker_restarts=2)
    result = sel.run()
    assert len(plan.fired) == 1
    failed = _events(result, "worker_failed")
    assert len(failed) == 1 and failed[0]["why"].startswith("died")
    assert sorted(failed[0]["requeued"]) == sorted(str(framework.scheduling.Unit(0, 1, p)) for p in (0, 1))
    assert (result.status.status == "completed").all()
    # the step's units ran again once each (as a gang of the live workers: the survivor alone while the other
    # restarts), and its first try left no done row
    log = _units_log(result)
    again = log[(log.config_id == 0) & (log.epoch == 1) & (log.kind == "train")]
    assert sorted(again[again.status == "done"].partition) == [0, 1]
    assert sorted(again[again.status == "interrupted"].partition) == [0, 1]
    _assert_nothing_lost_or_counted_twice(result, [0, 1], 2, availability=sel.placement)


def test_a_gang_run_is_refused_with_freezing_and_by_replay(ray_cluster, digits, tmp_path, replicated_gang_run):
    ds = _dataset(digits, rows=200, partitions=2)
    with pytest.raises(ValueError, match="`scheduler` is 'planner', which forms data-parallel gangs, and `freezing`"):
        _select(ds, tmp_path / "frozen", None, space=SPACE, scheduler="planner", freezing={})
    _, result = replicated_gang_run  # a finished run that trained in gangs of both workers
    assert (result.schedule.groupby("group").worker.nunique() > 1).any()
    with pytest.raises(ValueError, match="trained configs in data-parallel gangs"):
        framework.replay(result.storage_path)
