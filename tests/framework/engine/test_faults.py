"""Fault plans: which dispatch a fault fires on, and the rules for building one."""

from __future__ import annotations

import pytest

from framework.engine.faults import Fault, FaultPlan
from framework.scheduling import EVAL, TRAIN, Unit


def test_fault_fires_once_on_the_nth_matching_dispatch():
    plan = FaultPlan([Fault("raise", config_id=1, nth=2)])
    dispatches = [Unit(0, 0, 0), Unit(1, 0, 0), Unit(0, 0, 1), Unit(1, 0, 1), Unit(1, 0, 0, EVAL), Unit(1, 1, 0)]
    fired = [[f.action for f in plan.on_dispatch(u, 0)] for u in dispatches]
    assert fired == [[], [], [], ["raise"], [], []]
    assert plan.fired == [(Fault("raise", config_id=1, nth=2), Unit(1, 0, 1))]


def test_fault_filters_all_have_to_match():
    f = Fault("kill_worker", config_id=2, epoch=1, partition=3, kind=EVAL, worker=4)
    assert f.matches(Unit(2, 1, 3, EVAL), 4)
    for other in (Unit(9, 1, 3, EVAL), Unit(2, 0, 3, EVAL), Unit(2, 1, 0, EVAL), Unit(2, 1, 3, TRAIN)):
        assert not f.matches(other, 4)
    assert not f.matches(Unit(2, 1, 3, EVAL), 0)
    assert Fault("hang").matches(Unit(5, 7, 1, TRAIN), 0)


def test_fault_on_load_counts_the_starts_of_its_worker_only():
    plan = FaultPlan([Fault("kill_loading", worker=1, nth=2)])
    assert [plan.on_load(w) for w in (0, 1, 0, 1, 1)] == [[], [], [], [Fault("kill_loading", worker=1, nth=2)], []]
    assert plan.on_dispatch(Unit(0, 0, 0), 1) == []  # a load fault never fires on a unit


def test_fault_on_load_takes_no_unit_filters():
    with pytest.raises(ValueError, match="fires on a worker's load: it takes only `worker` and `nth`"):
        Fault("kill_loading", config_id=1)


def test_fault_plan_counts_each_fault_separately():
    plan = FaultPlan([Fault("skip_checkpoint", config_id=0, nth=1), Fault("lose_state", config_id=0, nth=2)])
    assert plan.on_dispatch(Unit(0, 0, 0), 0) == [plan.faults[0]]
    assert plan.on_dispatch(Unit(0, 0, 1), 0) == [plan.faults[1]]
    assert plan.on_dispatch(Unit(0, 1, 0), 0) == []


def test_fault_plan_crashes_after_the_named_commit_only():
    plan = FaultPlan([Fault("crash_driver", after_commit=2)])
    assert [plan.crash_after_commit(r) for r in (-1, 0, 1, 2, 3)] == [False, False, False, True, False]
    assert plan.on_dispatch(Unit(0, 0, 0), 0) == []  # a commit fault never fires on a unit


def test_fault_plan_shows_events_to_its_observer():
    seen = []
    plan = FaultPlan(on_event=lambda kind, detail: seen.append((kind, detail)))
    plan.observe("worker_joined", {"worker": 3})
    assert seen == [("worker_joined", {"worker": 3})]
    FaultPlan().observe("worker_joined", {})  # no observer: nothing happens


def test_fault_rejects_an_unknown_action():
    with pytest.raises(ValueError, match="`action` is 'explode', but must be one of"):
        Fault("explode")


def test_fault_rejects_an_unknown_kind():
    with pytest.raises(ValueError, match="`kind` is 'test', but must be one of"):
        Fault("raise", kind="test")


def test_fault_rejects_nth_below_one():
    with pytest.raises(ValueError, match="`nth` is 0, but must be an int >= 1"):
        Fault("raise", nth=0)


def test_fault_after_commit_is_only_for_driver_crashes():
    with pytest.raises(ValueError, match="`after_commit` is 1, but only a 'crash_driver' fault takes it"):
        Fault("raise", after_commit=1)


def test_fault_after_commit_takes_no_unit_filters():
    with pytest.raises(ValueError, match="takes no unit filters"):
        Fault("crash_driver", config_id=0, after_commit=1)


def test_fault_plan_rejects_what_is_not_a_fault():
    with pytest.raises(TypeError, match="must hold framework.engine.faults.Fault objects"):
        FaultPlan(["raise"])


def test_fault_plan_rejects_an_observer_that_is_not_callable():
    with pytest.raises(TypeError, match="`on_event` is 3, but must be callable or None"):
        FaultPlan(on_event=3)


def test_fault_kinds_each_name_where_they_are_carried_out_and_an_effect():
    from framework.engine.faults import ACTIONS, DRIVER_ACTIONS, FAULT_KINDS, LOAD_ACTIONS, WORKER_ACTIONS

    assert FAULT_KINDS and all(name == k.name and k.doc for name, k in FAULT_KINDS.items())
    assert sorted(WORKER_ACTIONS + DRIVER_ACTIONS + LOAD_ACTIONS) == sorted(ACTIONS) == sorted(FAULT_KINDS)
    assert FAULT_KINDS["kill_worker"].effect == FAULT_KINDS["kill_loading"].effect  # one behaviour, two places


def test_fault_slow_takes_a_number_of_seconds_above_zero():
    assert Fault("slow", config_id=0, seconds=2.5).seconds == 2.5
    for bad in (None, 0, -1.0, float("nan"), True, "3"):
        with pytest.raises(ValueError, match=f"`seconds` is {bad!r}, but a 'slow' fault needs a number of seconds"):
            Fault("slow", seconds=bad)


def test_fault_seconds_is_only_for_the_kinds_that_take_it():
    with pytest.raises(ValueError, match=r"`seconds` is 1.0, but only a fault of \['slow'\] takes it"):
        Fault("raise", seconds=1.0)


def test_fault_plan_hands_out_the_fault_with_its_parameters():
    plan = FaultPlan([Fault("slow", epoch=1, seconds=4.0)])
    assert plan.on_dispatch(Unit(0, 0, 0), 0) == []
    [slow] = plan.on_dispatch(Unit(0, 1, 0), 0)
    assert (slow.action, slow.seconds, slow.spec.where) == ("slow", 4.0, "worker")
