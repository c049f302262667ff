"""Packing (`framework.scheduling.packing`): any policy's assignments grown into packs of configs of one key at one
(epoch, partition, kind) on one worker; `"auto"` sizes them by the per-config time it measures; and the driver
loop on the in-process backend runs packed configs to the end, each unit once, with one row per member."""

from __future__ import annotations

import pytest
import torch

import automl
from framework.driver import Driver, MemoryRunLog
from framework.engine.local import LocalBackend
from framework.examples import classifier_step_fn, mlp_model_fn
from framework.functions import UserFunctions, pack_key
from framework.options import RunOptions
from framework.scheduling import EVAL, TRAIN, Assignment, DispatchState, Unit
from framework.scheduling.packing import GAIN, SAMPLES, Packer, PackSizer, check_pack
from tests.framework.driver.test_driver import P, _assert_complete, _entries


def _state(configs: int, partitions: int = 2) -> DispatchState:
    units = [Unit(c, 0, p, TRAIN) for c in range(configs) for p in range(partitions)]
    return DispatchState(units, {p: [p] for p in range(partitions)})


def test_a_policys_assignments_grow_into_packs_of_one_key_with_configs_the_policy_left():
    state = _state(7)
    keys = {0: "a", 1: "a", 2: "b", 3: "a", 4: None, 5: "a", 6: "b"}
    packer = Packer(3, keys.get)
    chosen = [Assignment(Unit(0, 0, 0, TRAIN), (0,)), Assignment(Unit(3, 0, 1, TRAIN), (1,))]
    # config 0's pack takes the free configs of key "a" that the policy did not choose (1 and 5), in id order
    assert packer.extend(chosen, state) == [Assignment(Unit(0, 0, 0, TRAIN), (0,), (0, 1, 5)),
                                            Assignment(Unit(3, 0, 1, TRAIN), (1,))]
    # a config the policy chose stays where the policy put it; a key of None never packs
    chosen = [Assignment(Unit(2, 0, 0, TRAIN), (0,)), Assignment(Unit(6, 0, 1, TRAIN), (1,))]
    assert packer.extend(chosen, state) == chosen
    assert packer.extend([Assignment(Unit(4, 0, 0, TRAIN), (0,))], state) == [Assignment(Unit(4, 0, 0, TRAIN), (0,))]
    grown = packer.extend(chosen[:1], state)
    assert grown == [Assignment(Unit(2, 0, 0, TRAIN), (0,), (2, 6))]
    state.start(grown[0])  # what the packer formed, the dispatch state accepts
    assert state.busy_configs == {2, 6}


def test_packs_keep_to_one_epoch_partition_and_kind_and_leave_gangs_alone():
    units = [Unit(0, 0, 0, TRAIN), Unit(1, 1, 0, TRAIN), Unit(2, 0, 0, EVAL), Unit(3, 0, 1, TRAIN),
             Unit(4, 0, 0, TRAIN)]
    state = DispatchState(units, {0: [0, 1], 1: [0, 1]})
    packer = Packer(8, lambda c: "k")
    assert packer.extend([Assignment(Unit(0, 0, 0, TRAIN), (0,))], state)[0].members == (0, 4)
    gang = Assignment(Unit(3, 0, 1, TRAIN), (0, 1), partitions=(1, 1))
    assert packer.extend([gang], state) == [gang]


def test_auto_doubles_while_the_per_config_time_falls_and_keeps_the_fastest_size():
    sizer = PackSizer()
    speed = {1: 1.0, 2: 0.6, 4: 0.4, 8: 0.38, 16: 0.2}  # per-config seconds per row: 8 is not worth its doubling
    asked = []
    while True:
        k = sizer.size("m")
        asked.append(k)
        if len(asked) > 20 or asked[-SAMPLES * 5:].count(k) > SAMPLES * 2:
            break
        sizer.observe("m", k, speed[k] * k * 100, 100)
    assert asked[0] == 1 and asked[-1] == 4  # 8 measured 0.95x of 4 (> GAIN): it stops there, at the fastest
    assert 0.38 > GAIN * 0.4


@pytest.mark.parametrize("slower", [1.0, 1.3, 3.0])
def test_auto_settles_on_one_where_packing_does_not_pay(slower):
    sizer = PackSizer()
    for _ in range(SAMPLES):
        sizer.observe("m", 1, 1.0, 10)
    for _ in range(SAMPLES):
        sizer.observe("m", 2, 2 * slower, 10)  # per config: `slower` times one alone
    assert sizer.size("m") == 1


def test_pack_sizes_are_checked_and_capped_by_state_memory():
    for bad in (0, 17, 2.0, True, "8", None):
        with pytest.raises(ValueError, match="`pack` is"):
            check_pack(bad)
    packer = Packer(16, lambda c: "k", max_bytes=1000)
    assert packer.target("k") == 16
    packer.state_bytes["k"] = 300
    assert packer.target("k") == 3
    with pytest.raises(ValueError, match="`pack` is 'auto' and `freezing` is set"):
        RunOptions(pack=3).replace(pack="auto", freezing={})


def test_the_pack_key_is_the_architecture_optimizer_and_batch_size_built_on_the_meta_device():
    key = pack_key(mlp_model_fn)
    base = {"hidden": 16, "batch_size": 32, "lr": 0.1}
    assert key(base) == key({**base, "lr": 0.5, "weight_decay": 1e-3})  # optimizer-only changes pack together
    assert key(base) != key({**base, "hidden": 32}) != key({**base, "optimizer": "adam"})
    assert key(base) != key({**base, "batch_size": 16})
    assert pack_key(lambda config: 1 / 0)(base) is None  # what cannot be built on the meta device trains alone

    def dropout_fn(config):  # same shapes, another forward: never one pack
        import torch

        net = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.Dropout(config["p"]))
        return net, torch.optim.SGD(net.parameters(), lr=0.1)

    assert pack_key(dropout_fn)({"p": 0.1}) != pack_key(dropout_fn)({"p": 0.5})


class _FusedClock(LocalBackend):
    """The in-process backend on a logical clock where a pack of k takes `k ** exponent` units' time."""

    def __init__(self, exponent: float, **kw) -> None:
        super().__init__(**kw)
        self.exponent = exponent

    def _execute(self, workers, ticket, task, state):
        out = super()._execute(workers, ticket, task, state)
        if out is None:
            return None
        k = max(1, len(task.members))  # (a unit of its own has no members listed)
        return 1.0 * k ** self.exponent, out[1]


def _packed_run(pack, exponent: float = 0.5, configs: int = 6, epochs: int = 2):
    space = {"lr": [0.01 * (i + 1) for i in range(configs)], "in_features": [8], "hidden": [8], "classes": [3],
             "batch_size": [16]}
    backend = _FusedClock(exponent, functions=UserFunctions(mlp_model_fn, step_fn=classifier_step_fn),
                          entries=_entries(), num_threads=1)
    log = MemoryRunLog()
    driver = Driver(backend, automl.GridSearch(space, epochs=epochs), log, {w: [w] for w in range(P)},
                    list(range(P)), RunOptions(queue_depth=1, pack=pack), pack_key=pack_key(mlp_model_fn))
    driver.run()
    return driver, log


def test_a_packed_run_trains_every_config_to_the_end_each_unit_once_one_row_per_member():
    driver, log = _packed_run(3)
    _assert_complete(driver, log)
    s = log.schedule()
    sizes = s.groupby("group").config_id.count()
    assert sizes.max() == 3 and s.group.notna().mean() > 0.5  # (the policy spreads some configs over the workers)
    assert (s.groupby("group")[["worker", "epoch", "partition", "kind"]].nunique() == 1).all().all()


def test_auto_grows_packs_where_they_pay_and_stays_alone_where_they_do_not():
    driver, log = _packed_run("auto", exponent=0.3, configs=8, epochs=3)
    _assert_complete(driver, log)
    sizes = log.schedule().query("kind == 'train'").groupby("group").config_id.count()
    assert sizes.max() >= 4
    driver, log = _packed_run("auto", exponent=1.2, configs=8, epochs=3)
    _assert_complete(driver, log)
    s = log.schedule().query("kind == 'train'")
    assert s.group.isna().mean() > 0.7  # after the probe of 2, every pack is one config alone
    assert s.group.notna().sum() <= SAMPLES * 2 * 2 + 4


def test_the_packer_leaves_a_policys_units_unchanged_when_pack_is_one():
    assert Driver(LocalBackend(), automl.GridSearch({"lr": [0.1]}, epochs=1), MemoryRunLog(), {0: [0]}, [0],
                  RunOptions()).run_state.dispatch.packer is None


def _bn_model_fn(config):
    """A small MLP with batch norm, and the optimizer the config names (per-member lr and weight decay)."""
    import torch

    net = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.ReLU(), torch.nn.BatchNorm1d(8), torch.nn.Linear(8, 3))
    lr, wd, name = config["lr"], config["weight_decay"], config["optimizer"]
    if name == "sgd":
        return net, torch.optim.SGD(net.parameters(), lr=lr, momentum=0.9, nesterov=True, weight_decay=wd)
    return net, (torch.optim.Adam if name == "adam" else torch.optim.AdamW)(net.parameters(), lr=lr, weight_decay=wd)


DET_SPACE = {"optimizer": ["sgd", "adam", "adamw"], "lr": [0.01, 0.05], "weight_decay": [0.0, 1e-3],
             "batch_size": [16]}


def _deterministic_run(pack, unit_time, scheduler=None, seed: int = 5):
    """A 12-config grid, 2 epochs, on the in-process backend: `deterministic=True` (or the seeded order given as
    `scheduler`), timed by `unit_time(unit, worker, members)` on the logical clock."""
    from framework.scheduling import SeededOrderScheduler

    class Clock(LocalBackend):
        def _execute(self, workers, ticket, task, state):
            out = super()._execute(workers, ticket, task, state)
            if out is None:
                return None
            return unit_time(task.unit, workers[0], max(1, len(task.members))), out[1]

    backend = Clock(functions=UserFunctions(_bn_model_fn, step_fn=classifier_step_fn), entries=_entries(),
                    num_threads=1)
    log = MemoryRunLog()
    options = (RunOptions(scheduler=SeededOrderScheduler(seed), seed=seed, pack=pack) if scheduler else
               RunOptions(deterministic=True, seed=seed, pack=pack))
    driver = Driver(backend, automl.GridSearch(DET_SPACE, epochs=2), log, {w: [w] for w in range(P)},
                    list(range(P)), options, pack_key=pack_key(_bn_model_fn))
    driver.run()
    _assert_complete(driver, log)
    weights = {c.id: driver.run_state.backend.get(c.state)["model"] for c in driver.run_state.configs}
    return log.schedule(), weights, {c.id: c.history for c in driver.run_state.configs}


def _visit_orders(s) -> dict:
    t = s[s.kind == TRAIN].sort_values(["start", "seq"] if "seq" in s else ["start"])
    return {key: tuple(g.partition) for key, g in t.groupby(["config_id", "epoch"])}


def _pack_members(s) -> list[tuple]:
    g = s[s.group.notna()]
    return sorted(tuple(sorted(rows.config_id)) + (int(rows.epoch.iloc[0]), int(rows.partition.iloc[0]),
                                                     rows.kind.iloc[0]) for _, rows in g.groupby("group"))


def _even(unit, worker, k):
    return 1.0 * k ** 0.5


def _skewed(unit, worker, k):
    return (1.0 + (7 * unit.config_id + 3 * unit.partition + unit.epoch) % 5) * k ** 0.5


@pytest.mark.parametrize("scheduler", [None, "seeded"], ids=["deterministic", "seeded-scheduler"])
def test_packing_never_changes_a_configs_visit_order_or_what_it_learns(scheduler):
    s1, w1, h1 = _deterministic_run(1, _even, scheduler)
    s4, w4, h4 = _deterministic_run(4, _skewed, scheduler)
    assert s1.group.isna().all() and s4.group.notna().any()
    assert max(len(p) - 3 for p in _pack_members(s4)) >= 2
    assert _visit_orders(s4) == _visit_orders(s1)  # the seeded order, packed or not
    assert w4.keys() == w1.keys() and len(w1) == 12
    for cid in w1:
        for name, t in w1[cid].items():
            if t.is_floating_point():
                # fused arithmetic sums in another order: rounding, far below what a different order changes
                torch.testing.assert_close(w4[cid][name], t, rtol=1e-4, atol=1e-5, msg=f"config {cid}: {name}")
            else:
                assert torch.equal(w4[cid][name], t)
        for e1, e4 in zip(h1[cid], h4[cid], strict=True):
            assert e4["valid_loss"] == pytest.approx(e1["valid_loss"], rel=1e-4, abs=1e-6)


def test_two_packed_runs_with_one_seed_make_the_same_packs_and_are_bit_identical_whatever_the_timing():
    sa, wa, ha = _deterministic_run(4, _even)
    sb, wb, hb = _deterministic_run(4, _skewed)
    assert not sa[["start", "end"]].equals(sb[["start", "end"]])  # (other timings)
    assert _pack_members(sa) == _pack_members(sb) and _pack_members(sa)
    assert ha == hb
    for cid in wa:
        assert all(torch.equal(wa[cid][n], wb[cid][n]) for n in wa[cid]), f"config {cid}"


def test_auto_packs_without_changing_what_a_config_learns():
    s1, w1, _ = _deterministic_run(1, _even)
    sa, wa, _ = _deterministic_run("auto", lambda unit, worker, k: 1.0 * k ** 0.3)
    assert sa.group.notna().any()
    assert _visit_orders(sa) == _visit_orders(s1)
    for cid in w1:
        for name, t in w1[cid].items():
            torch.testing.assert_close(wa[cid][name], t, rtol=1e-4, atol=1e-5, msg=f"config {cid}: {name}")


def test_under_a_fixed_order_a_config_joins_a_pack_only_at_its_own_next_unit_and_in_its_chunk():
    from framework.scheduling import SeededOrderScheduler

    policy = SeededOrderScheduler(0)
    parts = [0, 1, 2]
    orders = {c: policy.order(c, 0, parts) for c in range(9)}
    assert orders[0] == orders[3] == orders[6] and orders[0] != orders[1]  # a Latin square: c and c + p share
    assert sorted(orders[0]) == parts and {orders[c][0] for c in range(3)} == set(parts)
    units = [Unit(c, 0, p, TRAIN) for c in range(9) for p in parts]
    state = DispatchState(units, {p: [p] for p in parts})
    first = orders[0][0]
    w = first  # (worker w holds partition w)
    packer = Packer(2, lambda c: "k")
    lead = Assignment(Unit(0, 0, first, TRAIN), (w,))
    # configs 3 and 6 share config 0's order; config 1's next partition is elsewhere; chunks of 2 by id: (0, 3), (6,)
    assert packer.extend([lead], state, policy)[0].members == (0, 3)
    assert packer.extend([Assignment(Unit(6, 0, first, TRAIN), (w,))], state, policy)[0].members == (6,)
    # without a fixed order (policy None or one that fixes none), any free config at the unit may join
    assert len(Packer(4, lambda c: "k").extend([lead], state)[0].members) == 4


def test_a_resumed_packer_sizes_and_refuses_as_one_that_never_stopped():
    keys = {c: "m" for c in range(8)}
    live = Packer("auto", keys.get)
    rows, group = [], 0
    for size, seconds in ((1, 1.0), (1, 1.0), (2, 1.2), (2, 1.2), (4, 1.6), (4, 1.7)):
        members = tuple(range(size))
        live.observe(Assignment(Unit(0, 0, 0, TRAIN), (0,), members), seconds, 100, 500, None)
        rows += [(c, TRAIN, 10.0, 10.0 + seconds, 100, 500, group if size > 1 else None) for c in members]
        group += 1
    resumed = Packer("auto", keys.get)
    resumed.restore(rows)
    assert resumed.target("m") == live.target("m") == 8 and resumed.state_bytes == live.state_bytes == {"m": 500}
    resumed.restore([], refused=[(3, TRAIN, "not fused: config 3's own forward differs")])
    assert resumed.key(5) is None and resumed.key(5, "eval") == "m" and "own forward differs" in resumed.refused[("m", TRAIN)]


def test_configs_at_different_epochs_share_a_pack_only_where_allowed():
    units = [Unit(0, 2, 0, TRAIN), Unit(1, 0, 0, TRAIN), Unit(2, 1, 0, TRAIN), Unit(3, 0, 0, EVAL)]
    state = DispatchState(units, {0: [0]})
    lead = Assignment(Unit(0, 2, 0, TRAIN), (0,))
    mixed = Packer(4, lambda c: "k", mix_epochs=True).extend([lead], state)[0]
    assert mixed.members == (0, 1, 2) and mixed.epochs == (2, 0, 1)  # (never an eval unit in a training pack)
    assert mixed.units == (Unit(0, 2, 0, TRAIN), Unit(1, 0, 0, TRAIN), Unit(2, 1, 0, TRAIN))
    assert Packer(4, lambda c: "k").extend([lead], state)[0].members == (0,)  # the step takes `epoch`: never
    from framework.scheduling import SeededOrderScheduler

    fixed = Packer(4, lambda c: "k", mix_epochs=True).extend([lead], state, SeededOrderScheduler(0))[0]
    assert fixed.members == (0,)  # a fixed order is an epoch's
    with pytest.raises(ValueError, match="`epochs` is"):
        Assignment(Unit(0, 2, 0, TRAIN), (0,), (0, 1), epochs=(1, 0))


def test_an_asynchronous_procedures_configs_pack_across_epochs_and_each_ends_as_alone():
    from framework.engine.state import unpack_state
    from framework.engine.worker import Worker
    from framework.scheduling import UnitTask

    space = {"lr": [0.01, 0.02, 0.05, 0.1, 0.2], "in_features": [8], "hidden": [8], "classes": [3],
             "batch_size": [16]}
    asha = automl.ASHA(space, max_epochs=4, eta=2, max_configs=16, seed=0)

    class Clock(LocalBackend):  # configs drift apart: their units take other times
        def _execute(self, workers, ticket, task, state):
            out = super()._execute(workers, ticket, task, state)
            return None if out is None else (1.0 + task.unit.config_id % 3) * len(task.units) ** 0.5, out[1]

    backend = Clock(functions=UserFunctions(mlp_model_fn, step_fn=classifier_step_fn), entries=_entries(),
                    num_threads=1)
    log = MemoryRunLog()
    driver = Driver(backend, asha, log, {w: [w] for w in range(P)}, list(range(P)), RunOptions(queue_depth=1, pack=2),
                    pack_key=pack_key(mlp_model_fn), pack_epochs=True)
    driver.run()
    _assert_complete(driver, log)
    s = log.schedule()
    groups = s[s.group.notna()].groupby("group")
    assert (groups.epoch.nunique() > 1).any()  # a pack of configs at different epochs
    assert (groups[["worker", "partition", "kind"]].nunique() == 1).all().all()
    worker = Worker(0, UserFunctions(mlp_model_fn, step_fn=classifier_step_fn))
    worker.load(_entries())
    configs = {c.id: c for c in driver.run_state.configs}
    assert len(configs) == 16
    for cid, c in configs.items():  # each config's units alone, in its logged order: its weights
        state = None
        for row in s[s.config_id == cid].itertuples():  # (in the order they were logged)
            new, report = worker.run(UnitTask(Unit(cid, int(row.epoch), int(row.partition), row.kind), c.config, 0),
                                     state)
            state = new if row.kind == TRAIN else state
        alone, packed = unpack_state(state)["model"], driver.run_state.backend.get(c.state)["model"]
        for name, t in alone.items():
            torch.testing.assert_close(packed[name], t, rtol=1e-4, atol=1e-6, msg=f"config {cid}: {name}")
