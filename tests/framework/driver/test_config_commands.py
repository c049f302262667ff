"""Commands about configs on the driver loop (`LocalBackend`, real tiny MLPs, no Ray): a person stops a config in
the middle of an epoch, resumes it, adds one, clones one warm or cold, extends the procedure's budget. Every test
checks that no unit runs twice and that every epoch a config finished trained on every partition once."""

from __future__ import annotations

import pytest
import torch

import automl
from automl import ACTIVE, PERSON, PROCEDURE, STOPPED, ConfigState
from framework.callbacks import Callback
from framework.driver import Driver, MemoryRunLog
from framework.driver.commands import QueueCommands
from framework.engine.local import LocalBackend
from framework.options import RunOptions
from framework.scheduling import EVAL, TRAIN
from simulators import validate_schedule
from tests.framework.driver.test_driver import FNS, SPACE, P, _entries, _events


class _At(Callback):
    """Puts commands when a hook fires: `when(hook, *args) -> list of (name, args)`."""

    def __init__(self, commands: QueueCommands, when) -> None:
        self.commands, self.when, self.driver = commands, when, None

    def _put(self, *event) -> None:
        for name, args in self.when(self.driver, *event):
            self.commands.put(name, **args)

    def on_unit_end(self, config_id, epoch, partition, kind, worker, seconds, metrics) -> None:
        self._put("unit_end", config_id, epoch, partition, kind)

    def on_event(self, kind, detail) -> None:
        self._put(kind, detail)


def _run(procedure, when, unit_time=None, **options) -> tuple[Driver, MemoryRunLog]:
    commands = QueueCommands()
    at = _At(commands, when)
    log = MemoryRunLog()
    driver = Driver(LocalBackend(FNS, _entries(), num_threads=1, unit_time=unit_time), procedure, log, {w: [w] for w in range(P)},
                    list(range(P)), RunOptions(queue_depth=1, **options), commands=commands, observers=[at])
    at.driver = driver
    driver.run()
    return driver, log


def _commands(log: MemoryRunLog) -> list[tuple[str, bool, str]]:
    return [(d["name"], d["applied"], d["outcome"]) for d in _events(log, "command")]


def _check_no_unit_twice(driver: Driver, log: MemoryRunLog) -> None:
    done = log.schedule()
    assert not done.duplicated(["config_id", "epoch", "partition", "kind"]).any(), "a unit counted twice"
    cut = [(c.id, c.epoch) for c in driver.run_state.configs if c.outcome == "stopped" and c.visited.get(c.epoch)]
    assert validate_schedule(done, cut=cut).ok
    for c in driver.run_state.configs:
        for e in range(len(c.history)):
            mine = done[(done.config_id == c.id) & (done.epoch == e)]
            assert sorted(mine[mine.kind == TRAIN].partition) == list(range(P)), (c.id, e)
            assert sorted(mine[mine.kind == EVAL].partition) == list(range(P)), (c.id, e)


class _WallClockLocal(LocalBackend):
    """The local backend on the wall clock, where a run can be paused."""

    wall_clock = True


def _events_of(catalog) -> list[dict]:
    import json

    return [json.loads(d) for d in catalog.events("command").detail]


def _once(fn):
    """A `when` that fires at most once."""
    fired = []

    def when(driver, hook, *args):
        if fired:
            return []
        out = fn(driver, hook, *args)
        if out:
            fired.append(True)
        return out or []
    return when


def test_a_stop_acts_at_the_next_unit_boundary_and_a_resume_finishes_that_epoch_without_repeating_a_unit():
    state = {}

    def when(driver, hook, *args):
        if hook == "unit_end" and args[:2] == (0, 1) and "stopped" not in state:  # config 0's first unit of epoch 1
            state["stopped"] = True
            return [("stop_config", {"config_id": 0})]
        if hook == "round_committed" and args[0]["round"] == 2 and "resumed" not in state:
            state["resumed"] = True
            return [("resume_config", {"config_id": 0, "epochs": 3})]
        return []

    driver, log = _run(automl.GridSearch(SPACE, epochs=4), when)
    outcomes = _commands(log)
    assert outcomes[0][:2] == ("stop_config", True) and "stopped in epoch 1" in outcomes[0][2], outcomes
    assert outcomes[1] == ("resume_config", True, "config 0 trains again, from epoch 1 to 3 epochs")
    c0 = driver.run_state.configs[0]
    assert (c0.status, c0.outcome, c0.owner, len(c0.history)) == (STOPPED, "completed", PERSON, 3)
    done = log.schedule()
    first = done[(done.config_id == 0) & (done.epoch == 1)].sort_values("start")
    # epoch 1 was cut after at most a unit or two (those already on their way), and finished after the resume
    assert first.start.diff().max() > 0 and len(first) == 2 * P
    assert [len(driver.run_state.configs[i].history) for i in (1, 2)] == [4, 4]
    _check_no_unit_twice(driver, log)
    final = driver.run_state.backend.get(c0.state)["visited"]
    assert {e: sorted(ps) for e, ps in final.items()} == {e: list(range(P)) for e in range(3)}


def test_a_stopped_config_keeps_its_partial_epoch_and_the_procedure_sees_it_stopped_by_a_person():
    seen = []

    class Watch(automl.GridSearch):
        def step(self, states):
            seen.append([(s.id, s.status) for s in states])
            return super().step(states)

    when = _once(lambda d, hook, *a: [("stop_config", {"config_id": 2})] if hook == "unit_end" and a[:2] == (2, 0)
                 else None)
    driver, log = _run(Watch(SPACE, epochs=2), when)
    c2 = driver.run_state.configs[2]
    assert (c2.status, c2.outcome, c2.owner, len(c2.history)) == (STOPPED, "stopped", PROCEDURE, 0)
    assert 1 <= len(c2.visited.get(0, ())) < P
    assert seen[1][2] == (2, STOPPED)
    _check_no_unit_twice(driver, log)


def test_added_and_cloned_configs_are_the_persons_train_their_budget_and_leave_the_procedures_ids_alone():
    def when(driver, hook, *args):
        if hook == "round_committed" and args[0]["round"] == 1:  # after epoch 1 of every config
            run = driver.run_state
            return [("add_config", {"config": {**SPACE_ONE, "lr": 0.2}, "epochs": 1}),
                    ("clone_config", {"config_id": 1, "overrides": {"lr": 0.001}}),
                    ("clone_config", {"config_id": 1, "overrides": {"lr": 0.3}, "warm": False, "epochs": 1})] \
                if len(run.configs) == 3 else []
        if hook == "command" and args[0]["name"] == "clone_config" and args[0]["applied"]:
            run = driver.run_state
            new = run.configs[len(run.configs) - 1]
            if new.parent is not None:  # warm: the clone's weights are its source's after its epoch 1
                got, want = (run.backend.get(h)["model"] for h in (new.state, run.configs[1].epoch_state))
                assert all(torch.equal(got[k], want[k]) for k in want)
                assert run.backend.get(new.state)["visited"] == {}
            else:
                assert new.state is None  # cold: model_fn builds it
        return []

    driver, log = _run(automl.GridSearch(SPACE, epochs=3), when)
    assert [o[:2] for o in _commands(log)] == [("add_config", True), ("clone_config", True), ("clone_config", True)]
    configs = driver.run_state.configs
    assert [(c.id, c.origin, c.owner, c.budget, len(c.history), c.outcome) for c in configs] == [
        (0, PROCEDURE, PROCEDURE, None, 3, "completed"), (1, PROCEDURE, PROCEDURE, None, 3, "completed"),
        (2, PROCEDURE, PROCEDURE, None, 3, "completed"), (3, PERSON, PERSON, 1, 1, "completed"),
        (4, PERSON, PERSON, 3, 3, "completed"), (5, PERSON, PERSON, 1, 1, "completed")]
    assert configs[4].parent == 1 and configs[5].parent is None and configs[4].config["lr"] == 0.001
    assert _commands(log)[1][2] == ("config 4 cloned from config 1 with {'lr': 0.001}, from config 1's weights "
                                    f"after {2 * P} training units, 3 epochs")
    _check_no_unit_twice(driver, log)


SPACE_ONE = {k: v[0] for k, v in SPACE.items()}


def test_extend_resumes_the_configs_that_completed_the_old_budget_while_a_persons_config_still_trains():
    def when(driver, hook, *args):
        # rounds: -1 is the first decision, round r commits epoch r
        if hook == "round_committed" and args[0]["round"] == 0 and len(driver.run_state.configs) == 3:
            return [("add_config", {"config": SPACE_ONE, "epochs": 4})]  # trains epochs 0..3 in rounds 1..4
        if hook == "round_committed" and args[0]["round"] == 2 and not _events(driver.run_state.log, "command")[1:]:
            return [("extend", {"epochs": 1}), ("extend", {"samples": 2})]
        return []

    driver, log = _run(automl.GridSearch(SPACE, epochs=2), when)
    assert _commands(log)[1] == ("extend", True, "GridSearch: every config now trains 3 epochs")
    assert _commands(log)[2] == ("extend", False, "`samples` is 2, but GridSearch trains a fixed set of configs: it "
                                                  "can only extend `epochs`")
    assert [len(c.history) for c in driver.run_state.configs] == [3, 3, 3, 4]
    _check_no_unit_twice(driver, log)


def test_commands_about_configs_that_cannot_apply_are_rejected_with_their_reason():
    def when(driver, hook, *args):
        if hook == "round_committed" and args[0]["round"] == 0 and not _events(driver.run_state.log, "command"):
            return [("stop_config", {"config_id": 7}), ("stop_config", {"config_id": "0"}),
                    ("resume_config", {"config_id": 0}), ("add_config", {"config": [1, 2]}),
                    ("add_config", {"config": SPACE_ONE, "epochs": 0}),
                    ("clone_config", {"config_id": 0, "warm": "yes"}), ("extend", {}),
                    ("stop_config", {"config_id": 1}), ("stop_config", {"config_id": 1}),
                    ("resume_config", {"config_id": 1, "epochs": 1})]
        return []

    driver, log = _run(automl.RandomSearch({"lr": [0.01, 0.1], **{k: v for k, v in SPACE.items() if k != "lr"}},
                                           num_samples=3, epochs=2), when)
    assert [(n, a) for n, a, _ in _commands(log)] == [(n, False) for n in (
        "stop_config", "stop_config", "resume_config", "add_config", "add_config", "clone_config", "extend")] + [
        ("stop_config", True), ("stop_config", False), ("resume_config", False)]
    reasons = [o for _, _, o in _commands(log)]
    assert reasons[0] == "`config_id` is 7, but no config has that id (ids 0..2)"
    assert reasons[1] == "`config_id` is '0', but must be a config id (an int)"
    assert reasons[2] == "config 0 is active: only a stopped config can be resumed"
    assert reasons[3] == "`config` is [1, 2], but must be a dict of hyper-parameter name -> value"
    assert reasons[4] == "`epochs` is 0, but must be an int >= 1 (the epochs the config trains in all)"
    assert reasons[5].startswith("`warm` is 'yes', but must be True")
    assert reasons[6] == "`epochs` and `samples` are both None: say what to extend"
    assert reasons[8] == "config 1 is stopped: only an active config can be stopped"
    assert reasons[9] == ("`epochs` is 1, but config 1 has trained 1 epochs already: pass more (its epochs in all)")
    assert [len(c.history) for c in driver.run_state.configs] == [2, 1, 2]
    _check_no_unit_twice(driver, log)


@pytest.mark.parametrize("make", [
    lambda: automl.ASHA({"lr": automl.loguniform(1e-3, 1e-1)}, max_epochs=3, max_configs=4, seed=0),
    lambda: automl.OptunaSearch({"lr": automl.loguniform(1e-3, 1e-1)}, num_samples=4, epochs=2, seed=0),
    lambda: automl.HyperBand({"lr": automl.loguniform(1e-3, 1e-1)}, max_epochs=3, eta=3, seed=0),
    lambda: automl.PBT({"lr": automl.loguniform(1e-3, 1e-1)}, population=4, epochs=4, perturbation_interval=2),
])
def test_procedures_leave_a_persons_configs_alone_and_number_their_own_after_them(make, tmp_path):
    """A config a person added between two steps: the procedure neither stops nor ranks it, and the ids it
    predicts for its own new configs skip it."""
    procedure = make()
    procedure.bind("valid_loss", "min", str(tmp_path), num_workers=2)
    states = [ConfigState(c.id if hasattr(c, "id") else i, c) for i, c in enumerate(procedure.step([]).add)]
    person = ConfigState(len(states), {"lr": 0.5}, 0, (), ACTIVE, None, PERSON, PERSON)
    history = tuple({"valid_loss": 1.0 / (i + 1)} for i in range(3))
    states = [ConfigState(s.id, s.config, 3, history, ACTIVE) for s in states] + [
        ConfigState(person.id, person.config, 3, history, ACTIVE, None, PERSON, PERSON)]
    decision = procedure.step(states)
    assert person.id not in decision.stop
    assert all(cid != person.id for cid, _ in decision.clone)
    if isinstance(procedure, automl.PBT):
        assert person.id not in procedure.members


def test_a_run_stopped_after_commands_resumes_with_every_persons_decision_and_finishes_them(tmp_path,
                                                                                          assert_complete):
    """Commands are committed with their effect: a resume (here after the driver stopped as by a crash) keeps the
    configs a person added, cloned, stopped and resumed, with their owners and budgets, and resumes a stopped one
    from its checkpoint, its cut epoch finished without repeating a unit."""
    from framework.driver import SQLiteRunLog
    from framework.store.catalog import SQLiteCatalog
    from framework.store.checkpoint import CheckpointStore
    from framework.store.signing import loads_signed

    commands = QueueCommands()

    def driver(procedure, when, backend=LocalBackend):
        at = _At(commands, when)
        d = Driver(backend(FNS, _entries(), num_threads=1), procedure, SQLiteRunLog(catalog, ckpt),
                   {w: [w] for w in range(P)}, list(range(P)), RunOptions(checkpoint="unit", queue_depth=1),
                   commands=commands, observers=[at])
        at.driver = d
        return d

    def first_when(d, hook, *args):
        if hook == "round_committed" and args[0]["round"] == 0:
            return [("add_config", {"config": SPACE_ONE, "epochs": 2}), ("clone_config", {"config_id": 0})]
        if hook == "unit_end" and args[:2] == (1, 1) and d.run_state.configs[1].status == ACTIVE:
            return [("stop_config", {"config_id": 1})]
        return []

    catalog = SQLiteCatalog(str(tmp_path / "run.db"))
    ckpt = CheckpointStore(str(tmp_path / "checkpoints"), catalog)
    first = driver(automl.GridSearch(SPACE, epochs=4), first_when)
    assert first.run(max_commits=3) is False  # stopped after round 1 (as by a crash after that commit)
    ckpt.flush()
    cut = sorted(first.run_state.configs[1].visited[1])
    assert 1 <= len(cut) < P
    # the person paused it just before it stopped (what its driver would have recorded; the local backend's clock
    # is simulated, and a simulated run cannot be paused)
    catalog.record_command({"name": "pause", "args": {}, "source": "api", "id": 9, "request": None, "applied": True,
                            "outcome": "paused: nothing new is dispatched; 0 running unit(s) finish"})
    _, blob, signature = catalog.last_round()
    resume_at = [("resume_config", {"config_id": 1})]
    resumed = driver(loads_signed(blob, signature), _once(lambda d, hook, *a: resume_at if hook == "round_committed"
                                                          else None), _WallClockLocal)
    notices = []
    resumed.run_state.observers.add(type("N", (Callback,), {"on_notice": lambda self, line: notices.append(line)})())
    commands.put("unpause")  # the run resumes paused, as the person left it, until this unpause
    assert resumed.run(resume_from=catalog) is True
    assert any("stays paused" in n for n in notices), [(d["name"], d["outcome"]) for d in _events_of(catalog)]
    assert [d["outcome"] for d in _events_of(catalog) if d["name"] == "unpause"][-1] == "dispatching again"
    configs = resumed.run_state.configs
    assert [(c.id, c.origin, c.owner, c.budget, len(c.history), c.outcome) for c in configs] == [
        (0, PROCEDURE, PROCEDURE, None, 4, "completed"), (1, PROCEDURE, PERSON, 4, 4, "completed"),
        (2, PROCEDURE, PROCEDURE, None, 4, "completed"), (3, PERSON, PERSON, 2, 2, "completed"),
        (4, PERSON, PERSON, 4, 4, "completed")]
    done = catalog.units(status="done")
    assert not done.duplicated(["config_id", "epoch", "partition", "kind"]).any()
    mine = done[(done.config_id == 1) & (done.epoch == 1) & (done.kind == TRAIN)]
    assert sorted(mine.partition) == list(range(P))  # the cut epoch, finished after the resume
    ckpt.close()
    catalog.close()
    assert_complete(tmp_path)  # the added, the warm clone, the cut and resumed config: each state proves its visits


def test_a_resume_before_the_barrier_cancels_a_stop_that_waits_for_it():
    evals = []

    def when(driver, hook, *args):
        if hook == "unit_end" and args[0] == 0 and args[1] == 0 and args[3] == EVAL:
            evals.append(args)
            if len(evals) == P:  # config 0's epoch 0 is done; the others' is not: it waits at the barrier
                return [("stop_config", {"config_id": 0}), ("resume_config", {"config_id": 0, "epochs": 3})]
        return []

    # config 0's units are the fastest: its epoch ends while the others' go on
    driver, log = _run(automl.GridSearch(SPACE, epochs=2), when, unit_time=lambda u, w: 1.0 + 4.0 * (u.config_id > 0))
    assert _commands(log) == [
        ("stop_config", True, "config 0 stops: its epoch 0 has ended and closes with the round"),
        ("resume_config", True, "config 0 trains on to 3 epochs (its stop had not taken effect)")]
    c0 = driver.run_state.configs[0]
    assert (c0.owner, len(c0.history), c0.outcome) == (PERSON, 3, "completed")
    _check_no_unit_twice(driver, log)


def test_an_optuna_trial_a_person_resumed_hears_of_no_more_epochs(tmp_path):
    """ASHA and the Optuna procedures told the trial its end: a person's resume of the config must not report to
    the finished trial (Optuna refuses that, which would end the run)."""
    search = automl.OptunaSearch({"lr": automl.loguniform(1e-3, 1e-1)}, num_samples=2, epochs=1, seed=0)
    search.bind("valid_loss", "min", str(tmp_path), num_workers=2)
    added = search.step([]).add
    one = ({"valid_loss": 0.5},)
    done = search.step([ConfigState(i, c, 1, one) for i, c in enumerate(added)])
    assert sorted(done.stop) == [0, 1]
    two = ({"valid_loss": 0.5}, {"valid_loss": 0.4})
    resumed = ConfigState(0, added[0], 2, two, ACTIVE, None, PROCEDURE, PERSON)
    decision = search.step([resumed, ConfigState(1, added[1], 1, one, STOPPED)])
    assert decision.stop == [] and decision.add == []


def test_stopping_every_active_config_of_an_asynchronous_run_asks_the_procedure_for_more():
    """A stop frees a procedure's slot without ending an epoch: when a person stops every active config, the run
    must not end while the procedure would still start configs (found by experiments/soak.py: ASHA with budget left
    ended the run)."""
    @_once
    def when(driver, hook, *args):  # at the first unit's end: stop every config then active
        if hook == "unit_end":
            return [("stop_config", {"config_id": c.id}) for c in driver.run_state.configs.active()]
        return []

    asha = automl.ASHA({**SPACE, "lr": automl.loguniform(1e-3, 1e-1)}, max_epochs=2, max_configs=P + 2, seed=0)
    driver, log = _run(asha, when, barrier=False)
    configs = list(driver.run_state.configs)
    assert [c.status for c in configs[:P]] == [STOPPED] * P and all(ok for _, ok, _ in _commands(log))
    assert len(configs) == P + 2 and asha._issued == P + 2  # the procedure started every config it may
    assert all(c.status != ACTIVE and len(c.history) >= 1 for c in configs[P:])
    _check_no_unit_twice(driver, log)


def test_commands_registry_entries_name_their_arguments_and_describe_themselves_as_json():
    import json

    from framework.driver.commands import ARG_TYPES, COMMANDS, OUTSIDE_COMMANDS

    assert COMMANDS and all(name == c.name and callable(c.handler) and c.doc for name, c in COMMANDS.items())
    assert OUTSIDE_COMMANDS == {n for n, c in COMMANDS.items() if c.outside} and "kill_worker" not in OUTSIDE_COMMANDS
    for c in COMMANDS.values():
        assert all(a.type in ARG_TYPES and a.rule for a in c.args)
        assert c.target == "run" or "config_id" in [a.name for a in c.args]
        assert json.loads(json.dumps(c.describe()))["args"] == [dict(vars(a)) for a in c.args]


def test_a_command_with_an_argument_it_does_not_take_is_rejected_and_defaults_fill_the_rest():
    from framework.driver.commands import COMMANDS, CommandRejected

    with pytest.raises(CommandRejected, match=r"^'stop_config' takes no argument 'force'; it takes \['config_id'\]$"):
        COMMANDS["stop_config"].check({"config_id": 0, "force": True})
    with pytest.raises(CommandRejected, match=r"^`config_id` is None, but must be a config id \(an int\)$"):
        COMMANDS["stop_config"].check({})
    assert COMMANDS["clone_config"].check({"config_id": 1}) == {"config_id": 1, "overrides": {}, "warm": True}
    assert COMMANDS["add_workers"].check({"count": 2}) == {"count": 2}


def test_checkpoint_config_writes_a_configs_latest_weights_now_whatever_the_policy():
    seen = {}

    def when(driver, hook, *args):
        if hook == "round_committed" and args[0]["round"] == 0 and not _events(driver.run_state.log, "command"):
            return [("checkpoint_config", {"config_id": 0}), ("checkpoint_config", {"config_id": 0}),
                    ("checkpoint_config", {"config_id": 9}), ("checkpoint_config", {"config_id": 1, "now": 1})]
        if hook == "command" and args[0]["applied"] and "written" not in seen:  # on disk as the outcome says
            seen["written"] = driver.run_state.log.load_latest(0)
        return []

    driver, log = _run(automl.GridSearch(SPACE, epochs=2), when, checkpoint="off")
    outcomes = _commands(log)
    assert outcomes[0] == ("checkpoint_config", True, f"config 0's weights after {P} training units (epoch 0) written")
    assert outcomes[1] == ("checkpoint_config", False, f"config 0's weights after {P} training units are on disk "
                                                       "already")
    assert outcomes[2] == ("checkpoint_config", False, "`config_id` is 9, but no config has that id (ids 0..2)")
    assert outcomes[3] == ("checkpoint_config", False,
                           "'checkpoint_config' takes no argument 'now'; it takes ['config_id']")
    state, epoch, units = seen["written"]
    assert (epoch, units) == (0, P) and {e: sorted(ps) for e, ps in state["visited"].items()} == {0: list(range(P))}
    _check_no_unit_twice(driver, log)


def test_a_config_a_person_adds_or_clones_holds_what_every_procedures_config_holds():
    """`automl.json_exact`: numpy numbers become the Python ones they equal (what a resume and a replay read back);
    what the run could not record exactly is rejected in one line naming it, and nothing is added."""
    import math

    import numpy as np

    def when(driver, hook, *args):
        if hook == "round_committed" and args[0]["round"] == 0 and not _events(driver.run_state.log, "command"):
            return [("add_config", {"config": {**SPACE_ONE, "lr": np.float32(0.05), "shape": (2, 2)}, "epochs": 1}),
                    ("add_config", {"config": {**SPACE_ONE, "lr": {0.1}}}),
                    ("add_config", {"config": {**SPACE_ONE, "steps": 10**400}}),
                    ("clone_config", {"config_id": 0, "overrides": {"lr": math.nan}, "warm": False}),
                    ("clone_config", {"config_id": 0, "overrides": {"lr": np.float64(0.02)}, "warm": False,
                                      "epochs": 1})]
        return []

    driver, log = _run(automl.GridSearch(SPACE, epochs=2), when)
    assert [(n, a) for n, a, _ in _commands(log)] == [("add_config", True), ("add_config", False),
                                                      ("add_config", False), ("clone_config", False),
                                                      ("clone_config", True)]
    reasons = [o for _, _, o in _commands(log)]
    assert reasons[1].startswith("`config['lr']` is {0.1}, a set, but a config holds JSON values only")
    assert reasons[2].startswith("`config['steps']` is 1.00000e+400 (an int), but an int in a config must be in")
    assert reasons[3] == "`overrides['lr']` is nan, but a float in a config must be finite (JSON has no nan or inf)"
    assert all("\n" not in r for r in reasons)
    added, cloned = (driver.run_state.configs[i].config for i in (3, 4))
    assert type(added["lr"]) is float and added["lr"] == float(np.float32(0.05)) and added["shape"] == [2, 2]
    assert type(cloned["lr"]) is float and cloned["lr"] == 0.02
    assert [len(c.history) for c in driver.run_state.configs] == [2, 2, 2, 1, 1]
