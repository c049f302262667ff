"""The driver loop on `LocalBackend`: every recovery path, commands, the barrier, determinism, in milliseconds.

Each run trains a real (tiny) MLP in this process with scripted faults; no Ray. Every test checks what the run
must never do: lose a unit or count one twice (`_assert_complete`).
"""

from __future__ import annotations

import dataclasses

import numpy as np
import pandas as pd
import pytest
import torch

import automl
from automl import ACTIVE, FAILED, STOPPED, Decision, Procedure
from framework.driver import Driver, MemoryRunLog
from framework.driver.commands import COMMANDS, QueueCommands
from framework.engine._base import UnitDone, WorkerLost
from framework.engine.faults import Fault, FaultPlan
from framework.engine.local import LocalBackend
from framework.examples import classifier_eval_fn, classifier_train_fn, mlp_model_fn
from framework.functions import UserFunctions
from framework.options import RunOptions
from framework.scheduling import EVAL, TRAIN
from framework.store.checkpoint import CorruptCheckpointError
from simulators import validate_schedule

P = 3  # partitions (and workers)
FNS = UserFunctions(mlp_model_fn, classifier_train_fn, classifier_eval_fn)
SPACE = {"lr": [0.01, 0.05, 0.1], "in_features": [8], "hidden": [8], "classes": [3], "batch_size": [16]}


def _entries(partitions: int = P, rows: int = 48) -> dict:
    """Seeded toy data for `LocalBackend`: per partition, one training batch of `rows` rows and one of 16 to
    validate on (other test files build theirs with it too)."""
    g = torch.Generator().manual_seed(0)
    out = {}
    for p in range(partitions):
        x, xv = torch.randn(rows, 8, generator=g), torch.randn(16, 8, generator=g)
        out[p] = ([(x, (x[:, 0] > 0).long() + (x[:, 1] > 0).long())], [(xv, (xv[:, 0] > 0).long())])
    return out


def _grid(epochs: int = 2) -> automl.GridSearch:
    return automl.GridSearch(SPACE, epochs=epochs)


def _run(procedure: Procedure, faults: FaultPlan | None = None, workers: int = P, unit_time=None,
         **options) -> tuple[Driver, MemoryRunLog]:
    backend = LocalBackend(FNS, _entries(), num_threads=1, unit_time=unit_time)
    log = MemoryRunLog()
    placement = {w: [p for p in range(P) if p % workers == w] for w in range(workers)}
    options = {"queue_depth": 1, **options}  # these schedules were written for one unit per worker at a time
    driver = Driver(backend, procedure, log, placement, list(range(P)), RunOptions(**options), faults)
    driver.run()
    return driver, log


def _events(log: MemoryRunLog, kind: str) -> list[dict]:
    return [d for k, d in log.events if k == kind]


def _assert_complete(driver: Driver, log: MemoryRunLog) -> None:
    """Every finished epoch of every config: each partition trained and evaluated exactly once, the visit record
    in the final state agrees, and the history has one entry per finished epoch."""
    done = log.schedule()
    assert not done.duplicated(["config_id", "epoch", "partition", "kind"]).any(), "a unit counted twice"
    assert validate_schedule(done).ok
    for c in driver.run_state.configs:
        if c.status == FAILED:
            continue
        for e in range(len(c.history)):
            mine = done[(done.config_id == c.id) & (done.epoch == e)]
            assert sorted(mine[mine.kind == TRAIN].partition) == list(range(P)), (c.id, e)
            assert sorted(mine[mine.kind == EVAL].partition) == list(range(P)), (c.id, e)
        state = driver.run_state.backend.get(c.state)
        assert {e: sorted(ps) for e, ps in state["visited"].items()} == {e: list(range(P)) for e in
                                                                         range(len(c.history))}


def test_a_clean_run_trains_every_config_every_epoch_once():
    driver, log = _run(_grid(epochs=2))
    _assert_complete(driver, log)
    assert [c.status for c in driver.run_state.configs] == [STOPPED] * 3
    assert all(len(c.history) == 2 and "valid_loss" in c.history[-1] for c in driver.run_state.configs)
    assert sorted((r, cid, e) for cid, e, r, _ in log.epochs) == [(e, c, e) for e in range(2) for c in range(3)]


def test_a_killed_worker_restarts_and_only_its_unit_runs_again():
    plan = FaultPlan([Fault("kill_worker", config_id=1, epoch=0, kind=TRAIN, nth=2)])
    driver, log = _run(_grid(), plan)
    _assert_complete(driver, log)
    [failed] = _events(log, "worker_failed")
    assert len(failed["requeued"]) == 1 and _events(log, "worker_restarting")
    assert len(log.schedule(status="interrupted")) == 1


def test_a_slow_unit_takes_its_extra_seconds_on_the_logical_clock_and_completes():
    plan = FaultPlan([Fault("slow", config_id=1, epoch=0, partition=2, kind=TRAIN, seconds=5.0)])
    driver, log = _run(_grid(), plan, unit_time=lambda unit, worker: 1.0)
    _assert_complete(driver, log)
    done = log.schedule()
    took = dict(zip(zip(done.config_id, done.epoch, done.partition, done.kind), done.end - done.start, strict=True))
    assert took[(1, 0, 2, TRAIN)] == 6.0 and sorted(set(took.values())) == [1.0, 6.0]
    assert [f.action for f, _ in plan.fired] == ["slow"] and not _events(log, "worker_failed")
    assert not _events(log, "unit_retry")


class _RepliesDieWithTheWorker(LocalBackend):
    """A unit that kills its worker takes with it the reports the worker sent in the same instant, as on Ray when a
    queued unit kills the process before the reply of the unit ahead of it has left; the worker knew it had started
    both (`WorkerLost.started`)."""

    def poll(self, timeout):
        events = super().poll(timeout)
        dying = {ev.worker for ev in events if isinstance(ev, WorkerLost) and ev.started}
        died = [ev.ticket for ev in events if isinstance(ev, UnitDone) and ev.worker in dying]
        return [dataclasses.replace(ev, started=(*died, *ev.started)) if isinstance(ev, WorkerLost) and ev.started
                else ev for ev in events if not (isinstance(ev, UnitDone) and ev.ticket in died)]


def test_a_killed_worker_names_the_unit_it_ran_and_the_one_whose_report_died_with_it():
    # worker 0 holds two units; the second kills it at its start, before the first one's report has left
    plan = FaultPlan([Fault("kill_worker", worker=0, nth=2)])
    backend = _RepliesDieWithTheWorker(FNS, _entries(), num_threads=1)
    log = MemoryRunLog()
    driver = Driver(backend, _grid(), log, {0: list(range(P))}, list(range(P)), RunOptions(queue_depth=2), plan)
    driver.run()
    [(_, killed)] = plan.fired
    [failed] = _events(log, "worker_failed")
    assert failed["requeued"] == [str(killed)] and failed["unstarted"] == []
    [finished] = failed["lost_results"]  # it ran to its end, but nothing of it counts: it runs again
    assert finished != str(killed)
    assert [str(r.unit) for _, r, st in log.units if st == "lost"] == [finished]
    assert [str(r.unit) for _, r, st in log.units if st == "interrupted"] == [str(killed)]
    _assert_complete(driver, log)


def test_a_hung_unit_is_found_by_the_health_check_and_runs_again():
    plan = FaultPlan([Fault("hang", config_id=0, epoch=1, kind=TRAIN)])
    driver, log = _run(_grid(), plan, unit_timeout_s=5.0)
    _assert_complete(driver, log)
    [failed] = _events(log, "worker_failed")
    assert failed["why"].startswith("hung: Unit(config_id=0, epoch=1")


def test_failing_user_code_is_retried_then_fails_only_its_config():
    retried, log = _run(_grid(), FaultPlan([Fault("raise", config_id=2)]), max_unit_retries=1)
    _assert_complete(retried, log)
    assert _events(log, "unit_retry") and all(c.status == STOPPED for c in retried.run_state.configs)

    failed, log = _run(_grid(), FaultPlan([Fault("raise", config_id=2, epoch=1)]))
    _assert_complete(failed, log)
    statuses = [c.status for c in failed.run_state.configs]
    assert statuses == [STOPPED, STOPPED, FAILED]
    assert len(failed.run_state.configs[2].history) == 1  # its first epoch stays committed
    assert "InjectedFault" in log.configs[2]["error"]


def test_a_lost_state_is_restored_from_its_checkpoint_and_the_missing_units_rerun():
    plan = FaultPlan([Fault("lose_state", config_id=0, epoch=1, kind=TRAIN, nth=2)])
    driver, log = _run(_grid(), plan)
    _assert_complete(driver, log)
    [restored] = _events(log, "state_restored")
    assert restored["config_id"] == 0


@pytest.mark.parametrize("kind, nth, lost", [(TRAIN, 3, 2), (EVAL, 2, P + 1)])
def test_a_lost_state_in_a_first_epoch_without_a_checkpoint_restarts_from_model_fn(kind, nth, lost):
    # config 0 loses its state after 2 of its 3 train units, or after its first eval unit; nothing is on disk
    plan = FaultPlan([Fault("lose_state", config_id=0, epoch=0, kind=kind, nth=nth)])
    driver, log = _run(_grid(), plan, checkpoint="off")
    [restored] = _events(log, "state_restored")
    assert (restored["source"], restored["units"]) == ("model_fn", 0)
    gone = log.schedule(status="lost")
    assert len(gone) == lost and (gone.config_id == 0).all()
    assert sorted(gone[gone.kind == TRAIN].partition) == sorted(restored["rerun"])
    done = log.schedule()
    mine = done[(done.config_id == 0) & (done.epoch == 0)]
    assert mine[mine.kind == EVAL].start.min() >= mine[mine.kind == TRAIN].end.max()  # it evaluated the new weights
    assert [c.status for c in driver.run_state.configs] == [STOPPED] * 3
    _assert_complete(driver, log)


def test_a_lost_state_past_the_first_epoch_without_a_checkpoint_fails_only_its_config():
    plan = FaultPlan([Fault("lose_state", config_id=0, epoch=1, kind=TRAIN)])  # only its final state is ever saved
    driver, log = _run(_grid(), plan, checkpoint="off")
    assert [c.status for c in driver.run_state.configs] == [FAILED, STOPPED, STOPPED]
    assert "no checkpoint is usable" in log.configs[0]["error"] and "epochs it committed" in log.configs[0]["error"]
    assert len(driver.run_state.configs[0].history) == 1  # its first epoch stays committed
    _assert_complete(driver, log)


@pytest.mark.timeout(60)  # the hang behind the lost state used to go unseen: the run spun forever
def test_a_lost_state_starts_the_hang_clock_of_the_unit_queued_behind_it():
    plan = FaultPlan([Fault("lose_state", worker=0, nth=1), Fault("hang", worker=0, nth=2)])
    driver, log = _run(_grid(), plan, workers=1, queue_depth=2, unit_timeout_s=5.0)
    assert [f.action for f, _ in plan.fired] == ["lose_state", "hang"]
    hung = plan.fired[1][1]
    [failed] = _events(log, "worker_failed")
    assert failed["why"].startswith(f"hung: {hung}") and failed["requeued"] == [str(hung)]
    assert len(_events(log, "state_restored")) == 1
    _assert_complete(driver, log)


def test_a_worker_that_dies_loading_is_started_again():
    driver, log = _run(_grid(epochs=1), FaultPlan([Fault("kill_loading", worker=1)]))
    _assert_complete(driver, log)
    assert _events(log, "worker_start_failed") and _events(log, "worker_restarting")
    assert sorted(driver.run_state.workers.holds) == [0, 1, 2]


def test_a_worker_out_of_restarts_hands_its_partitions_to_a_live_worker():
    plan = FaultPlan([Fault("kill_worker", worker=2, nth=1)])
    driver, log = _run(_grid(), plan, max_worker_restarts=0)
    _assert_complete(driver, log)
    [reload] = _events(log, "partition_reload")
    assert reload["partition"] == 2 and 2 not in driver.run_state.workers.holds


def test_a_live_worker_that_dies_loading_a_reassigned_partition_loses_its_units_like_any_death():
    # worker 2 dies for good; worker 0 is given its partition and dies loading it, with a unit of its own in flight
    # (that unit used to stay in flight forever: the run hung)
    plan = FaultPlan([Fault("kill_worker", worker=2, nth=1), Fault("kill_loading", worker=0, nth=2)])
    driver, log = _run(_grid(), plan, max_worker_restarts=0)
    assert len(plan.fired) == 2
    _assert_complete(driver, log)
    dead = {e["worker"]: e for e in _events(log, "worker_failed")}
    assert sorted(dead) == [0, 2] and dead[0]["why"] == "died while loading" and dead[0]["requeued"]
    assert driver.run_state.workers.holds == {1: {0, 1, 2}}


def test_commands_add_and_drain_workers_at_known_rounds():
    commands = QueueCommands()

    def on_event(kind: str, detail: dict) -> None:
        if kind == "round_committed" and detail["round"] == 0:
            commands.put("add_workers", count=1, partitions=[0, 1, 2])
        if kind == "round_committed" and detail["round"] == 1:
            commands.put("drain_worker", worker=0)

    backend = LocalBackend(FNS, _entries(), num_threads=1)
    log = MemoryRunLog()
    driver = Driver(backend, _grid(epochs=3), log, {w: [w] for w in range(P)}, list(range(P)),
                    RunOptions(queue_depth=1), FaultPlan(on_event=on_event), commands=commands)
    driver.run()
    _assert_complete(driver, log)
    done = log.schedule()
    assert (done[done.epoch == 1].worker == 3).any()  # the new worker took units from the next round on
    assert not (done[done.epoch == 2].worker == 0).any()  # the drained one took none after it left
    assert [d["num_workers"] for d in _events(log, "workers_changed")] == [4, 3]
    logged = _events(log, "command")
    assert [(d["name"], d["applied"], d["outcome"]) for d in logged] == [
        ("add_workers", True, "started workers [3]"), ("drain_worker", True, "worker 0 draining")]


def test_an_invalid_command_is_rejected_with_its_reason_and_the_run_goes_on():
    commands = QueueCommands()

    def on_event(kind: str, detail: dict) -> None:
        if kind == "round_committed" and detail["round"] == 0:
            commands.put("drain_worker", worker=9)
            commands.put("add_workers", count=0)
            commands.put("add_workers", partitions=[7])
            commands.put("add_workers", count=100_000)  # would block the loop for an hour at 45 ms a worker
            commands.put("reboot")
            commands.put("unpause")
            commands.put("drain_worker", worker=1)

    log = MemoryRunLog()
    driver = Driver(LocalBackend(FNS, _entries(), num_threads=1), _grid(epochs=2), log, {w: [w] for w in range(P)},
                    list(range(P)), RunOptions(queue_depth=1, reassign_partitions=True),
                    FaultPlan(on_event=on_event), commands=commands)
    driver.run()
    _assert_complete(driver, log)
    logged = [(d["name"], d["applied"], d["outcome"]) for d in _events(log, "command")]
    assert logged[:6] == [
        ("drain_worker", False, "worker 9 does not live (live workers: [0, 1, 2])"),
        ("add_workers", False, "`count` is 0, but must be an int >= 1"),
        ("add_workers", False, "`partitions` is [7], but must be a non-empty list of the run's partitions [0, 1, 2]"),
        ("add_workers", False, "`count` is 100000, but one command starts at most 64; add a node (ray start "
                               "--address=...) first"),
        ("reboot", False, f"unknown command 'reboot'; known: {sorted(COMMANDS)}"),
        ("unpause", False, "the run is not paused"),
    ]
    assert logged[6] == ("drain_worker", True, "worker 1 draining")
    # the rejected commands were applied at the same point as the one that was: before the next dispatch
    rounds = [d["round"] for d in _events(log, "round_committed")]
    assert rounds == [-1, 0, 1]


class _Scripted(Procedure):
    def __init__(self, decisions):
        self.decisions = list(decisions)

    def step(self, states):
        return self.decisions.pop(0) if self.decisions else Decision(stop=[s.id for s in states if s.status == ACTIVE])


def test_decision_rules_are_one_set_for_every_caller():
    # an unknown id or a stopped one is an error; a clone starts from its source's weights
    ok = _Scripted([Decision(add=[{"lr": 0.05, **_fixed()}] * 2), Decision(stop=[0], clone=[(1, {"lr": 0.1, **_fixed()})]),
                    Decision(stop=[1, 2])])
    driver, log = _run(ok)
    _assert_complete(driver, log)
    configs = driver.run_state.configs
    assert [c.parent for c in configs] == [None, None, 1] and len(configs[2].history) == 1
    with pytest.raises(ValueError, match=r"`stop` holds 9, but only ACTIVE ids can be stopped \(it is unknown\)"):
        _run(_Scripted([Decision(add=[_fixed()]), Decision(stop=[9])]))
    with pytest.raises(ValueError, match=r"`stop` holds 0, .* \(it is stopped\)"):
        _run(_Scripted([Decision(add=[_fixed()] * 2), Decision(stop=[0]), Decision(stop=[0])]))


def _fixed() -> dict:
    return {"in_features": 8, "hidden": 8, "classes": 3, "batch_size": 16}


def test_without_a_barrier_a_fast_config_starts_its_next_epoch_before_a_slow_one_ends():
    # config 0 is ten times slower on the logical clock; TPE keeps the barrier off (synchronous = False)
    slow = lambda unit, worker: 10.0 if unit.config_id == 0 else 1.0  # noqa: E731
    tpe = automl.TPE(SPACE, num_samples=3, epochs=3, concurrency=3, seed=0)
    driver, log = _run(tpe, unit_time=slow)
    _assert_complete(driver, log)
    done = log.schedule()
    fast_epoch2 = done[(done.config_id == 1) & (done.epoch == 2)].start.min()
    slow_epoch0 = done[(done.config_id == 0) & (done.epoch == 0)].end.max()
    assert fast_epoch2 < slow_epoch0
    barrier, blog = _run(automl.TPE(SPACE, num_samples=3, epochs=3, concurrency=3, seed=0), unit_time=slow,
                         deterministic=True)
    _assert_complete(barrier, blog)
    assert log.schedule().end.max() <= blog.schedule().end.max()


def test_deterministic_runs_give_the_same_metrics_whatever_the_timing():
    def histories(unit_time, **options):
        driver, log = _run(_grid(epochs=2), unit_time=unit_time, **options)
        _assert_complete(driver, log)
        return [c.history for c in driver.run_state.configs], log.schedule()

    uniform = lambda unit, worker: 1.0  # noqa: E731
    skewed = lambda unit, worker: 1.0 + (7 * unit.config_id + 3 * unit.partition + unit.epoch) % 5  # noqa: E731
    a, sa = histories(uniform, deterministic=True, seed=3)
    b, sb = histories(skewed, deterministic=True, seed=3)
    assert a == b and not sa[["start", "end"]].equals(sb[["start", "end"]])
    order = lambda s: [tuple(g.partition) for _, g in s[s.kind == TRAIN].groupby(["config_id", "epoch"])]  # noqa: E731
    assert order(sa) == order(sb)
    # timing-driven dispatch: the visit order follows the timing (for some seeds: 3 configs on 3 workers leave a
    # randomized dispatch few orders to choose from)
    assert any(order(histories(uniform, seed=s)[1]) != order(histories(skewed, seed=s)[1]) for s in range(4))


def test_the_same_scripted_workload_gives_the_same_schedule_on_local_and_simulated_backends():
    from automl import FixedEpochsProcedure
    from simulators import Workload
    from simulators.backend import SimulatedBackend

    rng = np.random.default_rng(0)
    wl = Workload(rng.uniform(1, 3, size=(3, P)).round(2), {p: (p,) for p in range(P)})

    class Three(FixedEpochsProcedure):
        def configs(self):
            return [{"lr": 0.05, **_fixed()} for _ in range(3)]

    def schedule(backend) -> pd.DataFrame:
        log = MemoryRunLog()
        d = Driver(backend, Three(2), log, {w: [w] for w in range(P)}, list(range(P)),
                   RunOptions(scheduler="randomized", seed=5, queue_depth=1), eval_partitions=[], estimate=wl.duration)
        d.run()
        return log.schedule()

    local = schedule(LocalBackend(FNS, _entries(), num_threads=1, unit_time=wl.duration))
    simulated = schedule(SimulatedBackend(wl))
    pd.testing.assert_frame_equal(local, simulated)
    assert len(local) == 3 * 2 * P


class _CountingLog(MemoryRunLog):
    """A memory log that remembers every checkpoint the driver asks for, as (config, units)."""

    def __init__(self) -> None:
        super().__init__()
        self.written: list[tuple[int, int]] = []

    def checkpoint(self, config_id, epoch, units, backend, handle, worker=None) -> None:
        self.written.append((config_id, units))
        super().checkpoint(config_id, epoch, units, backend, handle, worker)


@pytest.mark.parametrize("policy", ["unit", "epoch", "off", 1e9])
def test_the_checkpoint_policy_decides_which_states_reach_the_disk(policy):
    backend = LocalBackend(FNS, _entries(), num_threads=1, unit_time=lambda u, w: 1.0)
    log = _CountingLog()
    driver = Driver(backend, _grid(epochs=2), log, {w: [w] for w in range(P)}, list(range(P)),
                    RunOptions(checkpoint=policy, queue_depth=2))
    driver.run()
    _assert_complete(driver, log)
    configs = range(len(SPACE["lr"]))
    if policy == "unit":
        expected = {(c, u) for c in configs for u in range(1, 2 * P + 1)}
    elif policy == "off":  # only the final state, when the config stops
        expected = {(c, 2 * P) for c in configs}
    else:  # epoch ends (a number of seconds no run reaches adds nothing)
        expected = {(c, u) for c in configs for u in (P, 2 * P)}
    assert set(log.written) == expected and len(log.written) == len(expected)
    for c in configs:  # whatever the policy, the final state is there
        state, _, units = log.load_latest(c)
        assert units == 2 * P and sorted(state["visited"]) == [0, 1]


def test_a_queued_unit_starts_when_the_one_ahead_of_it_ends():
    driver, log = _run(_grid(epochs=2), unit_time=lambda u, w: 2.0 if u.kind == TRAIN else 1.0, queue_depth=2)
    _assert_complete(driver, log)
    done = log.schedule().sort_values("start")
    for _, g in done.groupby("worker"):  # a worker runs its units back to back, never two at once
        starts, ends = g.start.to_numpy(), g.end.to_numpy()
        assert (starts[1:] >= ends[:-1] - 1e-9).all()
    assert done.start.min() == 0.0


@pytest.mark.parametrize("metric, fn, kind", [("valid_acc", "eval_fn", "eval"), ("train_acc", "train_fn", "train")])
def test_a_metric_no_fn_returns_stops_the_run_at_its_first_report(metric, fn, kind):
    from framework.driver.units import MetricNotReportedError

    match = rf"`metric` is '{metric}', but {fn} returned no 'acc' \(config \d+, {kind} unit of epoch 0\); {fn} reported \["
    with pytest.raises(MetricNotReportedError, match=match):
        _run(_grid(epochs=20), metric=metric, mode="max", check_metric=True)
    driver, _ = _run(_grid(epochs=1), metric=metric, mode="max")  # simulations and replays do not check
    assert all(c.status == STOPPED for c in driver.run_state.configs)


class _StopsOneEarly(automl.GridSearch):
    """Grid search whose config 0 stops after its first epoch (the rest train `epochs`)."""

    def step(self, states):
        d = super().step(states)
        early = [s.id for s in states if s.id == 0 and s.status == ACTIVE and s.epochs >= 1]
        return Decision(add=d.add, stop=sorted(set(d.stop) | set(early)), pruned=early)


def test_a_resume_after_some_configs_stopped_finishes_its_completeness_check(tmp_path):
    from framework.driver import SQLiteRunLog
    from framework.store.catalog import SQLiteCatalog
    from framework.store.checkpoint import CheckpointStore
    from framework.store.signing import loads_signed

    def driver(catalog, ckpt, procedure):
        backend = LocalBackend(FNS, _entries(), num_threads=1)
        return Driver(backend, procedure, SQLiteRunLog(catalog, ckpt), {w: [w] for w in range(P)}, list(range(P)),
                      RunOptions(checkpoint="unit", queue_depth=1))

    catalog = SQLiteCatalog(str(tmp_path / "run.db"))
    ckpt = CheckpointStore(str(tmp_path / "checkpoints"), catalog)
    first = driver(catalog, ckpt, _StopsOneEarly(SPACE, epochs=3))
    assert first.run(max_commits=2) is False  # stopped (as by a crash) after round 1: config 0 has ended
    ckpt.flush()
    assert first.run_state.configs[0].status == STOPPED
    _, blob, signature = catalog.last_round()
    resumed = driver(catalog, ckpt, loads_signed(blob, signature))  # the procedure as the last commit left it
    assert resumed.run(resume_from=catalog) is True  # the completeness check passes for config 0 too
    assert [len(c.history) for c in resumed.run_state.configs] == [1, 3, 3]
    ckpt.close()
    catalog.close()


class _UnreadableLog(MemoryRunLog):
    """A memory log where no checkpoint of some configs can be read (as if every file of theirs were corrupt)."""

    def __init__(self, unreadable: set[int]) -> None:
        super().__init__()
        self.unreadable = unreadable

    def load_latest(self, config_id):
        if config_id in self.unreadable:
            raise CorruptCheckpointError(f"no valid checkpoint for config {config_id}: every one is corrupt")
        return super().load_latest(config_id)


@pytest.mark.parametrize("nth", [1, 2])
def test_a_clone_without_a_usable_checkpoint_restarts_from_its_donor_weights_while_the_driver_holds_them(nth):
    def run(faults):
        # config 2 is a clone of config 1 after epoch 0, and trains one epoch; none of its checkpoints can be read
        procedure = _Scripted([Decision(add=[{"lr": 0.05, **_fixed()}] * 2),
                               Decision(clone=[(1, {"lr": 0.1, **_fixed()})])])
        driver = Driver(LocalBackend(FNS, _entries(), num_threads=1), procedure, _UnreadableLog({2}),
                        {w: [w] for w in range(P)}, list(range(P)), RunOptions(deterministic=True, queue_depth=1),
                        faults)
        driver.run()
        return driver, driver.run_state

    _, clean = run(None)
    driver, faulted = run(FaultPlan([Fault("lose_state", config_id=2, nth=nth)]))
    clone = faulted.configs[2]
    if nth == 1:  # lost before its first unit ended: the driver still holds its starting point
        _assert_complete(driver, faulted.log)
        [restored] = [d for k, d in faulted.log.events if k == "state_restored"]
        assert restored["source"] == "clone_start" and clone.status == STOPPED
        weights = faulted.backend.get(clone.state)["model"]
        expected = clean.backend.get(clean.configs[2].state)["model"]
        assert all(torch.equal(weights[k], expected[k]) for k in expected)  # not model_fn's: its donor's, trained
    else:  # a barrier lets a config's older states go with its first unit: the clone fails, and says why
        assert clone.status == FAILED and "no longer held" in faulted.log.configs[2]["error"]


def test_a_command_answers_a_wait_for_a_partition_holder():
    # the only worker dies and none restarts: the run waits for a holder, and an add_workers given then is applied
    commands = QueueCommands()

    def on_event(kind: str, detail: dict) -> None:
        if kind == "waiting_for_holder" and not _events(log, "worker_added"):
            commands.put("add_workers", count=1, partitions=[0, 1, 2])

    log = MemoryRunLog()
    driver = Driver(LocalBackend(FNS, _entries(), num_threads=1), _grid(epochs=1), log, {0: [0, 1, 2]}, [0, 1, 2],
                    RunOptions(queue_depth=1, max_worker_restarts=0, reassign_partitions=False),
                    FaultPlan([Fault("kill_worker", config_id=1, epoch=0)], on_event=on_event), commands=commands)
    driver.run()
    _assert_complete(driver, log)
    assert [d["worker"] for d in _events(log, "worker_added")] == [1]


def test_an_error_in_the_fault_plans_observer_ends_the_run():
    def on_event(kind: str, detail: dict) -> None:
        if kind == "round_committed":
            raise AssertionError("the harness saw something wrong")

    with pytest.raises(AssertionError, match="the harness saw something wrong"):
        _run(_grid(epochs=1), FaultPlan(on_event=on_event))


def test_a_simulated_run_keeps_its_old_objects_from_the_collector_and_gives_them_back():
    import gc

    from automl import FixedEpochsProcedure
    from framework.callbacks import Callback
    from framework.driver.loop import YOUNG_OBJECTS
    from simulators import Workload
    from simulators.backend import SimulatedBackend

    seen: list[tuple[int, int]] = []

    class Look(Callback):
        def on_round_end(self, round: int) -> None:
            seen.append((gc.get_freeze_count(), gc.get_threshold()[0]))

    class Three(FixedEpochsProcedure):
        def configs(self):
            return [{"lr": 0.05, **_fixed()} for _ in range(3)]

    before = gc.get_threshold()
    assert gc.get_freeze_count() == 0
    wl = Workload(np.ones((3, P)), {p: (p,) for p in range(P)})
    Driver(SimulatedBackend(wl), Three(3), MemoryRunLog(), {w: [w] for w in range(P)}, list(range(P)),
           RunOptions(seed=0, queue_depth=1), eval_partitions=[], estimate=wl.duration, observers=[Look()]).run()
    # each round ends before the decision that freezes what is alive then: from the second on, old objects are frozen
    assert len(seen) == 3 and all(frozen > 0 and young == max(before[0], YOUNG_OBJECTS) for frozen, young in seen[1:])
    assert gc.get_freeze_count() == 0 and gc.get_threshold() == before  # all given back
