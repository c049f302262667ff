from __future__ import annotations

import os
import pickle
from dataclasses import replace

import optuna
import pytest
from optuna.trial import TrialState

import automl
import simulators
from automl import ACTIVE, STOPPED, ConfigState


def test_asha_rungs_are_geometric_up_to_max_epochs():
    assert automl.asha_rungs(9, 3, 1) == [1, 3, 9]  # Cerebro section 6.3: R = 9, eta = 3
    assert automl.asha_rungs(10, 3, 1) == [1, 3, 9, 10]
    assert automl.asha_rungs(8, 2, 2) == [2, 4, 8]
    assert automl.asha_rungs(5, 3, 5) == [5]


def test_asha_promotable_is_top_one_over_eta_with_ties_by_id():
    recorded = [(-0.5, 0), (-0.3, 1), (-0.9, 2)]
    assert [automl.asha_promotable(s, i, recorded, 3) for s, i in recorded] == [False, True, False]
    assert automl.asha_promotable(-1.0, 0, [(-1.0, 0)], 3)  # the first result at a rung goes on
    six = [(-0.1 * k, k) for k in range(6)]  # 6 results: the best 2 go on
    assert [automl.asha_promotable(s, i, six, 3) for s, i in six] == [True, True, False, False, False, False]
    tie = [(-0.2, 4), (-0.2, 3), (-0.9, 5)]
    assert automl.asha_promotable(-0.2, 3, tie, 3) and not automl.asha_promotable(-0.2, 4, tie, 3)


def _drive(procedure, script: dict[int, list[float]], num_workers: int, max_rounds: int = 50):
    """A scripted engine: config `i` reports `script[i][e]` as valid_loss in its epoch `e`."""
    procedure.bind("valid_loss", "min", None, num_workers=num_workers)
    states: list[ConfigState] = []
    decisions = [procedure.step([])]
    states += [ConfigState(id=len(states) + k, config=c) for k, c in enumerate(decisions[-1].add)]
    for _ in range(max_rounds):
        if not any(s.status == ACTIVE for s in states):
            break
        for s in list(states):
            if s.status == ACTIVE:
                loss = script[s.id][s.epochs]
                states[s.id] = replace(s, epochs=s.epochs + 1, history=(*s.history, {"valid_loss": loss}))
        d = procedure.step(list(states))
        decisions.append(d)
        for i in d.stop:
            states[i] = replace(states[i], status=STOPPED)
        states += [ConfigState(id=len(states) + k, config=c) for k, c in enumerate(d.add)]
    return states, decisions


# Hand-computed trace, max_epochs=9, eta=3 (rungs 1, 3, 9), 3 workers, 6 configs:
# round 1: ids 0,1,2 reach rung 1 with 0.5, 0.3, 0.9 -> 3 results, top 1 -> 1 goes on, 0 and 2 stop; add 3, 4
# round 2: 3, 4 reach rung 1 with 0.2, 0.4 -> 5 results, top 1 -> 3 goes on, 4 stops; add 5 (the 6th, the last)
# round 3: 1 reaches rung 3 (0.15, alone: goes on); 5 reaches rung 1 with 0.1 -> 6 results, top 2 -> goes on
# round 4: 3 reaches rung 3 with 0.25 -> 2 results, top 1 is 1 -> 3 stops
# round 5: 5 reaches rung 3 with 0.05 -> 3 results, top 1 -> goes on
# round 9: 1 completes 9 epochs; round 11: 5 completes.
SCRIPT = {
    0: [0.5],
    1: [0.3, 0.2, 0.15, 0.14, 0.13, 0.12, 0.11, 0.1, 0.09],
    2: [0.9],
    3: [0.2, 0.22, 0.25],
    4: [0.4],
    5: [0.1, 0.08, 0.05, 0.04, 0.03, 0.02, 0.015, 0.012, 0.01],
}
EXPECTED = [  # (add count, stop) per decision
    (3, []),
    (2, [0, 2]),
    (1, [4]),
    (0, []),
    (0, [3]),
    (0, []),
    (0, []),
    (0, []),
    (0, []),
    (0, [1]),
    (0, []),
    (0, [5]),
]


def test_asha_promotions_follow_a_scripted_sequence(space):
    asha = automl.ASHA(space, max_epochs=9, eta=3, max_configs=6, seed=0)
    states, decisions = _drive(asha, SCRIPT, num_workers=3)
    assert [(len(d.add), d.stop) for d in decisions] == EXPECTED
    assert {s.id: s.epochs for s in states} == {0: 1, 1: 9, 2: 1, 3: 3, 4: 1, 5: 9}
    # configs 1 and 5 reach max_epochs (completed); the rest lose a rung (pruned)
    assert sorted(i for d in decisions for i in d.pruned) == [0, 2, 3, 4]


def test_asha_records_reports_and_stops_in_the_study(space):
    asha = automl.ASHA(space, max_epochs=9, eta=3, max_configs=6, seed=0)
    _drive(asha, SCRIPT, num_workers=3)
    trials = asha.study.trials
    assert [t.state for t in trials] == [
        TrialState.PRUNED,
        TrialState.COMPLETE,
        TrialState.PRUNED,
        TrialState.PRUNED,
        TrialState.PRUNED,
        TrialState.COMPLETE,
    ]
    assert trials[1].intermediate_values == dict(enumerate(SCRIPT[1]))  # steps are 0-based epochs
    assert trials[3].intermediate_values == {0: 0.2, 1: 0.22, 2: 0.25}
    assert [t.user_attrs["config_id"] for t in trials] == list(range(6))
    assert [t.value for t in trials] == [0.5, 0.09, 0.9, 0.25, 0.4, 0.01]
    assert asha.study.study_name == "ASHA-seed0"


def test_asha_study_persists_in_sqlite_under_storage_path(space, objective, tmp_path):
    asha = automl.ASHA(space, max_epochs=3, eta=3, max_configs=4, seed=2)
    run = simulators.run_procedure_offline(asha, objective, storage_path=str(tmp_path), num_workers=2)
    assert os.path.exists(tmp_path / "optuna.db")
    study = optuna.load_study(study_name="ASHA-seed2", storage=f"sqlite:///{tmp_path / 'optuna.db'}")
    assert len(study.trials) == len(run.states) == 4
    assert all(t.state in (TrialState.PRUNED, TrialState.COMPLETE) for t in study.trials)
    assert [t.params["act"] for t in study.trials] == [s.config["act"] for s in run.states]


def test_asha_keeps_num_workers_configs_active(space, objective):
    asha = automl.ASHA(space, max_epochs=9, max_configs=100, seed=0)
    engine = simulators.OfflineEngine(asha, objective, num_workers=5)
    assert len(engine.states) == 5
    for _ in range(6):
        engine.run_rounds(1)
        assert sum(s.status == ACTIVE for s in engine.states) == 5


def test_asha_defaults_to_four_workers_without_a_hint(space):
    assert len(automl.ASHA(space, max_epochs=9, max_configs=20).step([]).add) == 4


def test_asha_stops_at_max_configs(space, objective):
    run = simulators.run_procedure_offline(automl.ASHA(space, max_epochs=9, max_configs=7), objective, num_workers=3)
    assert run.finished and len(run.states) == 7


class FakeClock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_asha_stops_adding_configs_when_the_time_budget_is_spent(space, objective):
    clock = FakeClock()
    asha = automl.ASHA(space, max_epochs=9, time_budget_s=10, clock=clock)

    def tick(rounds: int, states) -> None:
        clock.now = 3.0 * rounds  # each round takes 3 s

    run = simulators.run_procedure_offline(asha, objective, num_workers=2, on_round=tick)
    assert run.finished
    adds = [len(d.add) for d in run.decisions]
    assert all(n == 0 for n in adds[4:])  # after round 4, 12 s > 10 s: nothing new
    assert sum(adds[:4]) == len(run.states) > 2


@pytest.mark.parametrize(
    ("kwargs", "error", "message"),
    [
        ({"eta": 1}, ValueError, r"`eta` is 1, but must be >= 2"),
        ({"min_epochs": 0}, ValueError, r"`min_epochs` is 0, but must be >= 1"),
        ({"max_epochs": 2, "min_epochs": 3}, ValueError, r"`max_epochs` is 2, but must be >= `min_epochs` \(3\)"),
        ({"max_configs": 0}, ValueError, r"`max_configs` is 0, but must be >= 1"),
        ({"time_budget_s": 0}, ValueError, r"`time_budget_s` is 0, but must be a finite number > 0"),
        ({"max_configs": None}, ValueError, r"`max_configs` and `time_budget_s` are both None"),
        ({"seed": -3}, ValueError, r"`seed` is -3, but must be an int >= 0"),
        ({"clock": 3.0}, TypeError, r"`clock` is 3.0, but must be a callable"),
        ({"max_epochs": "9"}, TypeError, r"`max_epochs` is '9', but must be an int >= 1"),
    ],
)
def test_asha_rejects_bad_arguments(space, kwargs, error, message):
    with pytest.raises(error, match=message):
        automl.ASHA(space, **{"max_epochs": 9, "max_configs": 5, **kwargs})


def test_asha_rejects_unknown_options(space):
    with pytest.raises(TypeError, match="unexpected keyword argument 'reduction_factor'"):
        automl.ASHA(space, max_epochs=9, max_configs=5, reduction_factor=3)


def test_asha_resumes_from_a_pickle_with_its_sqlite_study(space, objective, tmp_path):
    whole = simulators.run_procedure_offline(
        automl.ASHA(space, max_epochs=3, max_configs=5, seed=1), objective, storage_path=str(tmp_path / "a")
    )
    engine = simulators.OfflineEngine(
        automl.ASHA(space, max_epochs=3, max_configs=5, seed=1), objective, storage_path=str(tmp_path / "b")
    )
    engine.run_rounds(2)
    engine.objective = None
    resumed = pickle.loads(pickle.dumps(engine))  # what a driver restart sees: the study is reopened from optuna.db
    resumed.objective = objective
    assert resumed.run_rounds(50).trace() == whole.trace()
    assert len(resumed.procedure.study.trials) == len(whole.states) == 5


def test_asha_keeps_the_study_in_memory_for_a_remote_storage_path(space):
    asha = automl.ASHA(space, max_epochs=3, max_configs=2)
    with pytest.warns(UserWarning, match="remote URI"):
        asha.bind("valid_loss", "min", "s3://bucket/run", num_workers=2)
    assert len(asha.step([]).add) == 2


def test_asha_concurrency_follows_the_live_worker_count():
    asha = automl.ASHA({"lr": automl.loguniform(1e-3, 1.0)}, max_epochs=9, eta=3, max_configs=20, seed=0)
    asha.bind("valid_loss", "min", None, num_workers=2)
    first = asha.step([])
    assert len(first.add) == 2
    states = [ConfigState(id=i, config=c) for i, c in enumerate(first.add)]
    asha.workers_changed(5)  # three workers joined
    assert len(asha.step(states).add) == 3  # five configs train at once now


def test_asha_resumed_behind_its_study_neither_tells_twice_nor_leaves_trials_running(tmp_path):
    """The study is written as a decision is made, the run's catalog when it commits: a driver killed in between
    resumes a procedure (pickled at the last commit) behind its study. The decision made again must not tell a trial
    twice (Optuna: "Cannot tell a PRUNED trial", found by experiments/soak.py), and trials asked by the lost decision
    end as FAIL."""
    asha = automl.ASHA({"lr": automl.loguniform(1e-3, 1.0)}, max_epochs=9, eta=3, max_configs=6, seed=0)
    asha.bind("valid_loss", "min", str(tmp_path), num_workers=3)
    states = [ConfigState(id=i, config=c) for i, c in enumerate(asha.step([]).add)]
    committed = pickle.dumps(asha)  # the last commit
    states = [replace(s, epochs=1, history=({"valid_loss": 0.5 - 0.1 * s.id},)) for s in states]
    lost = asha.step(states)  # prunes configs 0 and 1, asks for 2 more; then the driver is killed
    assert lost.pruned == [0, 1] and len(lost.add) == 2
    resumed = pickle.loads(committed)
    again = resumed.step(states)  # the same decision, made again
    assert (again.stop, again.pruned, again.add) == (lost.stop, lost.pruned, lost.add)
    trials = optuna.load_study(study_name=resumed.study_name, storage=f"sqlite:///{tmp_path}/optuna.db").trials
    assert [t.state for t in trials[:3]] == [TrialState.PRUNED, TrialState.PRUNED, TrialState.RUNNING]
    assert [(t.state, t.user_attrs.get("orphan")) for t in trials[3:5]] == [(TrialState.FAIL, True)] * 2
    assert [t.state for t in trials[5:]] == [TrialState.RUNNING] * 2 and len(trials) == 7
