"""The transfer planner on the MOP engine: frozen-prefix features materialized once per worker, hops carry only
trainable state, and the results equal a run without the planner."""

from __future__ import annotations

import copy
import functools
import json
import re

import pytest
import torch
from torch import nn

import automl
import framework
from framework.examples import digits_arrays, feature_classifier_eval_fn, feature_classifier_train_fn
from framework.planner import CostModel
from framework.planner.engine import extraction_memory, measure_split
from simulators import validate_schedule

pytestmark = pytest.mark.ray

SPACE = {"freeze": ["all", "first"], "lr": [0.05, 0.2], "batch_size": [64]}
EPOCHS = 2
CM = CostModel(1e9, 1e9)


@functools.lru_cache(maxsize=1)
def _pretrained() -> nn.Sequential:
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # the same floats in the driver and in every worker process
    try:
        return _pretrain()
    finally:
        torch.set_num_threads(threads)


def _pretrain() -> nn.Sequential:
    torch.manual_seed(1234)
    x, y = map(torch.as_tensor, digits_arrays())
    trunk = nn.Sequential(nn.Linear(64, 48), nn.BatchNorm1d(48), nn.ReLU(), nn.Linear(48, 32), nn.ReLU())
    probe = nn.Linear(32, 10)
    opt = torch.optim.Adam([*trunk.parameters(), *probe.parameters()], lr=1e-2)
    for i in range(0, 1024, 64):  # a short supervised pre-training on the first records
        opt.zero_grad()
        nn.functional.cross_entropy(probe(trunk(x[i : i + 64])), y[i : i + 64]).backward()
        opt.step()
    return trunk.eval()


def _pretrained_trunk() -> nn.Sequential:
    """A "pre-trained" trunk: the same weights on every call, without touching the global random stream."""
    with torch.random.fork_rng(devices=[]):
        return copy.deepcopy(_pretrained())


class Net(nn.Module):
    """Trunk + head; `freeze` says which trunk layers are frozen (requires_grad False and always in eval mode)."""

    def __init__(self, freeze: str) -> None:
        super().__init__()
        self.trunk = _pretrained_trunk()
        self.head = nn.Sequential(nn.Linear(32, 32), nn.ReLU(), nn.Dropout(0.1), nn.Linear(32, 10))
        self.frozen = 5 if freeze == "all" else 3  # trunk modules [0, frozen)
        for m in list(self.trunk)[: self.frozen]:
            for p in m.parameters():
                p.requires_grad_(False)

    def train(self, mode: bool = True) -> Net:
        super().train(mode)
        for m in list(self.trunk)[: self.frozen]:
            m.eval()
        return self

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.trunk(x))


def model_fn(config: dict) -> tuple[nn.Module, torch.optim.Optimizer]:
    net = Net(config["freeze"]).train()
    return net, torch.optim.SGD(net.parameters(), lr=config["lr"])


def _run(ds, tmp_path, name, fn, **kw):
    return framework.ModelSelection(
        fn, feature_classifier_train_fn, feature_classifier_eval_fn, ds, automl.GridSearch(SPACE, epochs=EPOCHS),
        storage_path=str(tmp_path / name), progress=False, metric="valid_accuracy", mode="max", **kw,
    ).run()


def _transfer(digits) -> framework.EngineTransfer:
    configs = automl.GridSearch(SPACE, epochs=EPOCHS).configs()
    return framework.transfer_on_engine(
        model_fn, configs, torch.as_tensor(digits[0][:2]), epochs=EPOCHS, records=1000, cost_model=CM
    )


def test_planner_on_engine_materializes_once_and_hops_carry_only_trainable_state(ray_cluster, digits, tmp_path):
    ds = framework.PartitionedDataset.from_arrays(*digits, num_partitions=2, seed=0)
    tr = _transfer(digits)
    assert tr.extract is not None and tr.plan.materialized
    result = _run(ds, tmp_path, "planner", tr.model_fn, extract=tr.extract)

    assert validate_schedule(result.schedule, partitions=[0, 1]).ok
    mat = result.events[result.events.kind == "features_materialized"]
    details = [json.loads(d) for d in mat.detail]
    assert sorted(d["worker"] for d in details) == [0, 1]  # once per worker
    assert all(d["bytes"] > 0 and d["seconds"] >= 0 and len(d["partitions"]) == 1 for d in details)
    assert sum(d["records"] for d in details) == len(digits[0])

    train = result.schedule[result.schedule.kind == "train"]
    for cid, cfg in result.configs.items():
        before, after = tr.hop_bytes(cfg)
        assert 0 < after < before
        assert set(train[train.config_id == cid].state_bytes) == {after}  # SGD without momentum: no optimizer state
    # freezing the whole trunk leaves the head's floats; freezing only the first layer adds the second (48 x 32 + 32)
    head = 32 * 32 + 32 + 32 * 10 + 10
    hops = {cfg["freeze"]: tr.hop_bytes(cfg)[1] for cfg in tr.configs}
    assert hops == {"all": head * 4, "first": (head + 48 * 32 + 32) * 4}

    # replay (in-process, one worker holding both partitions) needs the same extract, and reproduces the metrics
    with pytest.raises(ValueError, match="extract"):
        framework.replay(result.storage_path, model_fn=tr.model_fn)
    again = framework.replay(result.storage_path, model_fn=tr.model_fn, extract=tr.extract)
    cols = ["config_id", "epoch", "valid_loss", "valid_accuracy"]
    torch.testing.assert_close(
        torch.tensor(again.metrics.sort_values(cols[:2])[cols].to_numpy()),
        torch.tensor(result.metrics.sort_values(cols[:2])[cols].to_numpy()),
    )


def test_planner_on_engine_matches_a_run_without_the_planner(ray_cluster, digits, tmp_path):
    ds = framework.PartitionedDataset.from_arrays(*digits, num_partitions=2, seed=0)
    tr = _transfer(digits)
    # one worker that takes its next unit only when the last one ended: the same visit order in both runs
    planned = _run(ds, tmp_path, "planned", tr.model_fn, extract=tr.extract, num_workers=1, queue_depth=1)
    plain = _run(ds, tmp_path, "plain", model_fn, num_workers=1, queue_depth=1)
    cols = ["config_id", "epoch", "valid_loss", "valid_accuracy", "train_loss"]
    a = planned.metrics.sort_values(["config_id", "epoch"])[cols].reset_index(drop=True)
    b = plain.metrics.sort_values(["config_id", "epoch"])[cols].reset_index(drop=True)
    assert len(a) == len(SPACE["freeze"]) * len(SPACE["lr"]) * EPOCHS
    assert a.valid_accuracy.max() > 0.6  # the heads learn on the pre-trained features
    torch.testing.assert_close(torch.tensor(a.to_numpy()), torch.tensor(b.to_numpy()), rtol=0, atol=1e-4)
    assert list(planned.schedule.config_id) == list(plain.schedule.config_id)  # same visit order
    # HAPI's split (an earlier, smaller layer) with extraction batches under a worker memory budget: same metrics
    per_record, model_bytes = extraction_memory(tr.plan.mm, tr.plan.input_key, _split(digits, "hapi").split_keys)
    hapi = _split(digits, "hapi", worker_memory_budget=model_bytes + 100 * per_record)
    assert hapi.extract.batch_size < len(digits[0]) // 2  # a partition is extracted in several batches
    split_run = _run(ds, tmp_path, "hapi", hapi.model_fn, extract=hapi.extract, num_workers=1, queue_depth=1)
    c = split_run.metrics.sort_values(["config_id", "epoch"])[cols].reset_index(drop=True)
    torch.testing.assert_close(torch.tensor(c.to_numpy()), torch.tensor(b.to_numpy()), rtol=0, atol=1e-4)
    # hops before the plan: the whole model's state, as the plain run measured it
    plain_train = plain.schedule[plain.schedule.kind == "train"]
    for cid, cfg in plain.configs.items():
        assert set(plain_train[plain_train.config_id == cid].state_bytes) == {tr.hop_bytes(cfg)[0]}


def test_extract_must_be_callable(digits, tmp_path):
    ds = framework.PartitionedDataset.from_arrays(*digits, num_partitions=2, seed=0)
    with pytest.raises(TypeError, match="`extract` is 3, but must be callable"):
        framework.ModelSelection(
            model_fn, feature_classifier_train_fn, feature_classifier_eval_fn, ds, automl.GridSearch(SPACE, 1),
            storage_path=str(tmp_path / "bad"), extract=3,
        )


def test_branch_state_holds_only_trainable_weights_and_restores(digits):
    tr = _transfer(digits)
    cfg = next(c for c in tr.configs if c["freeze"] == "first")
    branch, opt = tr.model_fn(cfg)
    state = branch.state_dict()
    assert sum(t.numel() * t.element_size() for t in state.values()) == tr.hop_bytes(cfg)[1]
    assert {id(p) for g in opt.param_groups for p in g["params"]} == {
        id(p) for p in branch.parameters() if p.requires_grad
    }
    other, _ = tr.model_fn(cfg)  # a fresh copy: plan weights, not the first copy's
    with torch.no_grad():
        for p in branch.parameters():
            if p.requires_grad:
                p.add_(1.0)
    other.load_state_dict(copy.deepcopy(branch.state_dict()))
    x = tr.extract(torch.as_tensor(digits[0][:8]))
    branch.eval(), other.eval()
    torch.testing.assert_close(branch(x), other(x))


def _split(digits, split: str, **kw) -> framework.EngineTransfer:
    configs = automl.GridSearch(SPACE, epochs=EPOCHS).configs()
    return framework.transfer_on_engine(
        model_fn, configs, torch.as_tensor(digits[0][:2]), epochs=EPOCHS, records=1000, cost_model=CM, split=split, **kw
    )


def test_hapi_split_picks_the_earliest_frozen_layer_smaller_than_a_record(digits):
    names = {}
    for split in ("hapi", "freeze", "plan"):
        tr = _split(digits, split)
        names[split] = [tr.plan.mm.layers[k].name for k in tr.split_keys]
    # trunk 64 -> 48 (BN, ReLU) is frozen in every config: 48 floats < 64, so HAPI cuts after the first linear layer;
    # the freeze index is the last layer all configs share (the ReLU); the plan stores what each config reads
    assert names["hapi"] == ["trunk_0"] and names["freeze"] == ["trunk_2"]
    assert sorted(names["plan"]) == ["trunk_2", "trunk_4"]
    x = torch.as_tensor(digits[0][:64])
    rep = {s: measure_split(_split(digits, s), x, repeats=1) for s in ("hapi", "freeze", "plan", "input")}
    assert rep["hapi"]["bytes_per_record"] == 48 * 4 == rep["freeze"]["bytes_per_record"]
    assert rep["plan"]["bytes_per_record"] == (48 + 32) * 4 and rep["input"]["bytes_per_record"] == 64 * 4
    # a slow link: no layer's batch crosses it in 1 s, so HAPI falls back to the freeze index
    tr = _split(digits, "hapi", link_bytes_per_s=100.0)
    assert [tr.plan.mm.layers[k].name for k in tr.split_keys] == ["trunk_2"]


def test_worker_memory_budget_sets_the_extraction_batch_and_keeps_the_features(digits):
    x = torch.as_tensor(digits[0][:300])
    whole = _split(digits, "freeze")
    per_record, model_bytes = extraction_memory(whole.plan.mm, whole.plan.input_key, whole.split_keys)
    budget = model_bytes + 50 * per_record
    tr = _split(digits, "freeze", worker_memory_budget=budget)
    assert tr.extract.batch_size in (49, 50) and whole.extract.batch_size is None  # eq. 1 rounds sizes up a little
    torch.testing.assert_close(tr.extract(x), whole.extract(x), rtol=0, atol=0)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"worker_memory_budget": 0}, "`worker_memory_budget` is 0, but must be a positive number"),
        ({"worker_memory_budget": float("nan")}, "`worker_memory_budget` is nan, but must be a positive number"),
        ({"worker_memory_budget": 10.0}, "`worker_memory_budget` is 10.0, but must hold the extractor"),
        ({"link_bytes_per_s": -1.0}, "`link_bytes_per_s` is -1.0, but must be a positive number"),
        ({"split": "middle"}, "`split` is 'middle', but must be one of"),
    ],
)
def test_transfer_on_engine_rejects_bad_split_arguments(digits, kwargs, message):
    split = kwargs.pop("split", "freeze")
    with pytest.raises(ValueError, match=re.escape(message)):
        _split(digits, split, **kwargs)


def test_a_step_fn_trains_on_the_planners_features_as_the_hand_loop_does(digits):
    """The step-level contract on materialized features (`extract=`): a worker's step loop batches the features the
    planner's frozen prefix made and trains the head to the weights of the hand-written feature loop (in-process
    workers, no Ray)."""
    from framework.engine.state import unpack_state
    from framework.engine.worker import Worker
    from framework.examples import classifier_step_fn
    from framework.functions import UserFunctions
    from framework.scheduling import EVAL, Unit, UnitTask

    tr = _transfer(digits)
    ds = framework.PartitionedDataset.from_arrays(*digits, num_partitions=2, seed=0)
    entries = {p: ([ds.train[p]], [ds.valid[p]]) for p in range(2)}
    step = Worker(0, UserFunctions(tr.model_fn, step_fn=classifier_step_fn, extract=copy.deepcopy(tr.extract)))
    hand = Worker(1, UserFunctions(tr.model_fn, feature_classifier_train_fn, feature_classifier_eval_fn,
                                   extract=copy.deepcopy(tr.extract)))
    assert step.load(entries) == hand.load(entries)
    config = tr.configs[0]
    out = []
    for w in (step, hand):
        state = None
        for unit in (Unit(0, 0, 0), Unit(0, 0, 1), Unit(0, 1, 1)):
            state, report = w.run(UnitTask(unit, config, seed=2), state)
            assert report.error is None, report.error
            assert report.num_examples == len(ds.train[unit.partition][0])  # rows, not the features' keys
        _, ev = w.run(UnitTask(Unit(0, 1, 0, EVAL), config, seed=2), state)
        out.append((unpack_state(state)["model"], ev))
    (a, ev_a), (b, ev_b) = out
    assert a.keys() == b.keys()
    for k in a:
        assert torch.equal(a[k], b[k]), k
    assert ev_a.num_examples == ev_b.num_examples
    assert ev_a.metrics["accuracy"] == pytest.approx(ev_b.metrics["accuracy"])
