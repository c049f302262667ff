"""The step-level contract (`ModelSelection(step_fn=...)`, `framework.engine.steps`) on the session's real Ray cluster
(that a step trains to the weights of the equivalent hand loop is `tests/framework/engine/test_steps.py`): a
data-parallel gang of step loops takes the
steps of one worker on the global batches (no `gang_size` in user code); and a step run resumes after a driver crash, replays bit for bit, freezes layers and runs
ASHA. Real Ray, real torch, no mocks; tiny data (the whole file is a handful of short runs).

`python -m tests.integration.test_step_contract STORAGE` is the driver the resume test starts in a subprocess and
crashes on purpose (`Fault("crash_driver", ...)` SIGKILLs its own process)."""

from __future__ import annotations

import math
import os
import subprocess
import sys

import pytest
import torch
import torch.nn.functional as F

import automl
import framework
from framework.data import shard_data
from framework.engine.faults import Fault, FaultPlan
from framework.engine.gang import gang_id
from framework.engine.runner import seed_everything
from framework.engine.state import unpack_state
from framework.engine.worker import Worker
from framework.examples import (
    classifier_step_fn,
    digits_arrays,
    mlp_model_fn,
)
from framework.functions import UserFunctions
from framework.scheduling import TRAIN, Unit, UnitTask
from framework.scheduling.units import unit_seed
from simulators import validate_schedule
from tests.integration.ft_helpers import (
    ROOT,
    _assert_nothing_lost_or_counted_twice,
    _dataset,
    _events,
    _units_log,
    ray_cluster_address,
)

pytestmark = pytest.mark.ray
SPACE = {"hidden": [16], "lr": [0.05, 0.1], "batch_size": [32]}


def _step_select(ds, storage, space=SPACE, epochs=2, procedure=None, step_fn=classifier_step_fn, **options):
    """A `ModelSelection` of `mlp_model_fn` trained by `step_fn` (the engine's loop), evaluated by the step."""
    options.setdefault("num_workers", ds.num_partitions)
    return framework.ModelSelection(
        mlp_model_fn, step_fn=step_fn, dataset=ds, procedure=procedure or automl.GridSearch(space, epochs=epochs),
        storage_path=str(storage), progress=False, **options)


def _assert_same_weights(a: dict, b: dict, what: str) -> None:
    assert a.keys() == b.keys(), what
    for k in a:
        assert torch.equal(a[k], b[k]), f"{what}: {k} differs"


# ---- 2. a gang of step loops --------------------------------------------------------------------------------------
class _StepWorker(Worker):
    """A worker actor of the step contract (one torch thread), as the engine starts them."""

    def __init__(self, worker_id: int) -> None:
        super().__init__(worker_id, UserFunctions(mlp_model_fn, step_fn=classifier_step_fn), num_threads=1)


GANG_CONFIG = {"in_features": 64, "hidden": 16, "lr": 0.1, "batch_size": 32}


def _one_worker_on_the_global_batches(data, seed: int, cid: int, epochs: int) -> dict[str, torch.Tensor]:
    """What one worker reaches on the gang's global batches: step i trains on the concatenation of member 0's and
    member 1's i-th local batch (`batch_size // 2` rows each, drawn from the member's share with its unit's seed)."""
    seed_everything(unit_seed(seed, cid))
    model, optimizer = mlp_model_fn(GANG_CONFIG)
    local = GANG_CONFIG["batch_size"] // 2
    for epoch in range(epochs):
        members = []
        for r in range(2):
            x, y = shard_data(data, r, 2)
            seed_everything(unit_seed(seed, cid, epoch, 0, 1, r, 2))
            members.append([(x[ids], y[ids]) for ids in torch.randperm(len(x)).split(local)])
        assert len(members[0]) == len(members[1])  # equal shares: every step has a batch from each member
        for (x0, y0), (x1, y1) in zip(*members, strict=True):
            optimizer.zero_grad()
            F.cross_entropy(model(torch.cat([x0, x1])), torch.cat([y0, y1])).backward()
            optimizer.step()
    return model.state_dict()


def test_a_gang_of_step_loops_takes_the_steps_of_one_worker_on_the_global_batches(ray_actors, digits):
    ray_cluster = ray_actors
    x, y = (torch.from_numpy(a) for a in digits)
    train, valid = (x[:200], y[:200]), (x[200:240], y[200:240])  # partition 0: shares of 100 rows, 7 steps a pass
    actor = ray_cluster.remote(num_cpus=1)(_StepWorker)
    a, b = actor.remote(0), actor.remote(1)
    try:
        assert ray_cluster.get([w.load.remote({0: ([train], [valid])}) for w in (a, b)]) == [{0: 200}, {0: 200}]
        name = gang_id((0, 1))
        port = ray_cluster.get(a.host_gang.remote(name))
        assert ray_cluster.get([a.join_gang.remote(name, 0, 2, port), b.join_gang.remote(name, 1, 2, port)]) == [0, 1]
        seed, cid, state = 5, 3, None
        for epoch in range(2):  # two units: the second starts from the gang's state (weights and momentum)
            task = UnitTask(Unit(cid, epoch, 0, TRAIN), GANG_CONFIG, seed, workers=(0, 1))
            (state, ra), (other, rb) = ray_cluster.get([a.run.remote(task, state), b.run.remote(task, state)])
            assert ra.error is None and rb.error is None, ra.error or rb.error
            assert other is None and state is not None  # the first member returns the gang's state
            assert ra.unit == rb.unit == Unit(cid, epoch, 0, TRAIN)
            assert ra.num_examples == rb.num_examples == 100  # each its own share, counted exactly...
            assert ra.num_examples + rb.num_examples == len(train[0])  # ...which together are the partition
            assert ra.comm_s > 0 and rb.comm_s > 0  # they averaged gradients
            assert math.isfinite(ra.metrics["loss"]) and 0 <= ra.metrics["accuracy"] <= 1
    finally:
        for w in (a, b):
            ray_cluster.kill(w)
    gang = unpack_state(state)
    assert gang["visited"] == {0: [0], 1: [0]}
    reference = _one_worker_on_the_global_batches(train, seed, cid, epochs=2)
    for k, v in reference.items():
        assert torch.allclose(gang["model"][k], v, atol=1e-6), f"{k}: the gang differs from one worker on the " \
                                                              "global batches"


def test_a_data_parallel_step_run_counts_every_row_of_every_partition_once(ray_cluster, digits, tmp_path,
                                                                           assert_complete):
    ds = _dataset(digits, rows=300, partitions=2)
    sel = _step_select(ds, tmp_path / "dp", space={**SPACE, "lr": [0.1]}, scheduler="data_parallel")
    result = sel.run()
    assert (result.status.status == "completed").all()
    train = result.schedule[result.schedule.kind == TRAIN]
    assert train.group.notna().all()  # every training step a gang of both workers, each on its own partition
    sizes = {p: len(ds.train[p][0]) for p in range(2)}
    assert train.groupby(["config_id", "epoch", "partition"]).num_examples.sum().to_dict() == {
        (0, e, p): n for e in range(2) for p, n in sizes.items()}
    assert train.groupby(["config_id", "epoch"]).num_examples.sum().to_dict() == {(0, 0): 240, (0, 1): 240}
    _assert_nothing_lost_or_counted_twice(result, [0, 1], 2, availability=sel.placement)
    assert_complete(result)


# ---- 3. resume, replay, freezing, ASHA (packs: tests/integration/test_packs.py) ------------------------------------
RESUME_SPACE = {"hidden": [16], "lr": [0.05, 0.1], "batch_size": [32]}


def _crashing_selection(storage: str) -> framework.ModelSelection:
    """The resume test's run: one worker holding both partitions, no queue, a checkpoint per unit, and a driver
    that SIGKILLs itself right after config 1's first unit of epoch 1 is logged, before its checkpoint."""
    x, y = digits_arrays()
    ds = framework.PartitionedDataset.from_arrays(x[:300], y[:300], num_partitions=2, seed=0)
    crash_at = Fault("crash_driver", config_id=1, epoch=1, kind=TRAIN)
    return _step_select(ds, storage, space=RESUME_SPACE, num_workers=1, seed=3, scheduler="mwr", queue_depth=1,
                        checkpoint="unit", faults=FaultPlan([crash_at]))


def test_a_step_run_resumes_after_a_driver_crash_and_replays_bit_for_bit(ray_cluster, tmp_path, assert_complete):
    storage = str(tmp_path / "crashed")
    env = {**os.environ, "RAY_ADDRESS": ray_cluster_address(),
           "PYTHONPATH": ROOT + os.pathsep + os.environ.get("PYTHONPATH", "")}
    proc = subprocess.run([sys.executable, "-m", "tests.integration.test_step_contract", storage], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=240)
    assert proc.returncode == -9, f"the driver was not killed by its fault ({proc.returncode}):\n{proc.stderr[-3000:]}"

    resumed = framework.ModelSelection.resume(storage, mlp_model_fn, step_fn=classifier_step_fn,
                                              progress=False).run()
    [plan] = _events(resumed, "resume_plan")
    assert plan["lost_units"] == 1  # the unit logged before its checkpoint reached the disk runs again
    log = _units_log(resumed)
    [lost] = log[log.status == "lost"].itertuples()
    assert (lost.config_id, lost.epoch, lost.kind) == (1, 1, TRAIN)
    assert (resumed.status.status == "completed").all()
    _assert_nothing_lost_or_counted_twice(resumed, [0, 1], 2)
    assert_complete(resumed)

    # the replay imports the recorded functions (the step included), runs the logged units in order in-process,
    # and reaches the resumed run's checkpoints bit for bit
    again = framework.replay(storage, out_path=str(tmp_path / "replay"))
    assert again.meta["functions"]["step_fn"] == "framework.examples:classifier_step_fn"
    assert again.status.set_index("config_id").status.to_dict() == resumed.status.set_index("config_id").status.to_dict()
    for cid in resumed.configs:
        a, b = resumed.load_state(cid), again.load_state(cid)
        assert a["visited"] == b["visited"]
        _assert_same_weights(a["model"], b["model"], f"config {cid} (run vs replay)")
    merged = resumed.metrics.merge(again.metrics, on=["config_id", "epoch"], suffixes=("", "_replay"))
    assert len(merged) == len(resumed.metrics) == 2 * 2
    for m in ("train_loss", "train_accuracy", "valid_loss", "valid_accuracy"):
        assert (merged[m] == merged[f"{m}_replay"]).all(), m
    assert_complete(again)


FREEZE_AT = 2 * 4  # after 2 units of 4 steps (120 rows in batches of 32): the first step of a config's epoch 1


def _freeze_early_step_fn(model, batch, config, freezing):
    """`classifier_step_fn`, which first freezes the model's first module once the config has taken `FREEZE_AT`
    steps (forced, to make the test exact), through the `FreezingController` a step gets as `freezing` (None when
    it evaluates)."""
    if freezing is not None and freezing.step >= FREEZE_AT and freezing.frozen == 0:
        freezing.freeze(1)
    return classifier_step_fn(model, batch, config)


def test_asha_with_a_freezing_step_fn_stops_configs_early_and_counts_every_step(ray_cluster, digits, tmp_path,
                                                                               assert_complete):
    ds = _dataset(digits, rows=300, partitions=2)
    steps_per_epoch = sum(math.ceil(len(ds.train[p][0]) / 32) for p in range(2))
    assert steps_per_epoch == FREEZE_AT
    space = {"hidden": [32], "layers": [2], "lr": automl.loguniform(0.01, 0.3), "batch_size": [32]}
    asha = automl.ASHA(space, max_epochs=3, eta=3, max_configs=4, seed=0)
    # under the barrier (`deterministic`) each rung decision sees the round's results: of the two configs that
    # reach a rung together, one is promoted and one stopped, whatever the timing
    result = _step_select(ds, tmp_path / "asha", procedure=asha, step_fn=_freeze_early_step_fn, seed=0,
                          deterministic=True, freezing={"modules": "children", "eval_interval": 4, "cache": True}).run()
    status = result.status.set_index("config_id")
    assert len(status) == 4 and "failed" not in set(status.status)
    for cid, row in status.iterrows():  # the configs that reach max_epochs complete, the others are pruned
        assert row.status == ("completed" if row.epochs == 3 else "pruned"), (cid, row.epochs)
    assert (status.status == "pruned").any() and (status.status == "completed").any()
    assert {"train_loss", "train_accuracy", "valid_loss", "valid_accuracy"} <= set(result.metrics.columns)
    report = validate_schedule(result.schedule, availability={0: [0], 1: [1]}, partitions=[0, 1])
    assert report.ok, report.violations
    for cid, row in status.iterrows():
        state = result.load_state(cid)
        fstate = state["freezing"]
        # the engine's loop told the controller of every step, across hops; a config that trained past its first
        # epoch froze its first layer there
        assert fstate["step"] == row.epochs * steps_per_epoch, cid
        assert fstate["policy"]["frozen"] == (1 if row.epochs > 1 else 0), cid
        assert "frozen" not in state and "0.weight" in state["model"]  # the checkpoint holds the full weights
        if row.epochs > 1:  # the hops after the freeze left the frozen layer behind
            train = result.schedule[(result.schedule.config_id == cid) & (result.schedule.kind == TRAIN)]
            train = train.sort_values("start")
            frozen_bytes = sum(v.numel() * v.element_size() for k, v in state["model"].items() if k.startswith("0."))
            assert train.state_bytes.iloc[-1] == train.state_bytes.iloc[0] - frozen_bytes, cid
    assert_complete(result)


if __name__ == "__main__":  # the resume test's driver (see the module docstring)
    _crashing_selection(sys.argv[1]).run()
