from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from framework.scheduling import DispatchState, Unit
from simulators import (
    Noise,
    Simulator,
    WorkerEvent,
    Workload,
    comm_costs,
    from_schedule_log,
    heterogeneous,
    homogeneous,
    lower_bound,
    replicate,
    simulate,
    validate_schedule,
)
from simulators.__main__ import main as cli


def test_comm_cost_table2_example_row_exact():
    assert comm_costs()["example"].tolist() == ["4 TB", "10 TB", "400 TB", "8 TB", "80 PB", "40 PB"]


def test_lower_bound_is_max_row_and_column_sum():
    w = Workload(np.array([[1.0, 5.0], [2.0, 1.0], [3.0, 1.0]]), {0: (0,), 1: (1,)})
    assert lower_bound(w) == 7.0  # worker 1: 5 + 1 + 1


def test_lower_bound_with_replicas_uses_cheapest_holder():
    w = Workload(np.array([[1.0, 4.0], [1.0, 4.0]]), {0: (0, 1), 1: (0, 1)})
    assert lower_bound(w) == 2.0  # 4 units of 1 on worker 0 spread over 2 workers; each config 1 + 1


def test_simulator_failure_requeues_exactly_the_failed_unit():
    w = homogeneous(4, 2, unit_time=1.0)
    r = simulate(w, "mwr", events=[WorkerEvent(0.5, 1, "fail"), WorkerEvent(2.0, 1, "return")])
    assert len(r.requeued) == 1 and len(r.failed) == 1
    lost = r.failed.iloc[0]
    assert (lost.worker, lost.start, lost.end) == (1, 0.0, 0.5)
    assert r.requeued[0] == Unit(int(lost.config_id), 0, int(lost.partition))
    assert validate_schedule(r.schedule, w.availability).ok and len(r.schedule) == 8


def test_dispatch_state_remove_worker_returns_only_its_running_unit():
    units = [Unit(c, 0, q) for c in range(3) for q in range(2)]
    s = DispatchState(units, {0: [0], 1: [1]})
    from framework.scheduling import Assignment

    s.start(Assignment(Unit(0, 0, 0), (0,)))
    s.start(Assignment(Unit(1, 0, 1), (1,)))
    assert s.remove_worker(1) == [Unit(1, 0, 1)]
    assert Unit(1, 0, 1) in s.pending and Unit(0, 0, 0) in s.running


def test_simulator_join_and_replicas_keep_invariants():
    w = replicate(heterogeneous(8, 4, seed=1), factor=2, seed=1)
    r = simulate(w, "randomized", epochs=2, events=[WorkerEvent(1.0, 3, "join"), WorkerEvent(2.0, 0, "fail")])
    assert validate_schedule(r.schedule, w.availability).ok
    assert len(r.schedule) == 2 * 8 * 4 and r.makespan >= lower_bound(w, epochs=2)


def test_simulator_noise_changes_times_not_validity():
    w = heterogeneous(8, 4, seed=2)
    a = simulate(w, "mwr", noise=Noise(sigma=0.3, straggler_prob=0.1), seed=1)
    b = simulate(w, "mwr")
    assert a.makespan != b.makespan and validate_schedule(a.schedule).ok


def test_simulator_stalls_loudly_without_holder():
    w = homogeneous(2, 2)
    with pytest.raises(RuntimeError, match="stalled"):
        simulate(w, "mwr", events=[WorkerEvent(0.5, 1, "fail")])


def test_simulator_rejects_zero_epochs():
    with pytest.raises(ValueError, match="epochs"):
        Simulator(homogeneous(2, 2), "mwr", epochs=0)


def test_validator_flags_each_invariant():
    ok = pd.DataFrame(
        [
            (0, 0, 0, 0, "train", 0, 1),
            (0, 0, 1, 1, "train", 1, 2),
            (1, 0, 1, 1, "train", 0, 1),
            (1, 0, 0, 0, "train", 1, 2),
        ],
        columns=["config_id", "epoch", "partition", "worker", "kind", "start", "end"],
    )
    assert validate_schedule(ok, {0: [0], 1: [1]}).ok
    overlap_cfg = ok.assign(start=[0, 0.5, 0, 1], end=[1, 1.5, 1, 2])
    assert not validate_schedule(overlap_cfg).ok
    missing = ok.iloc[:3]
    assert any("completeness" in v for v in validate_schedule(missing).violations)
    wrong_worker = ok.assign(worker=[1, 0, 0, 1])
    assert not validate_schedule(wrong_worker, {0: [0], 1: [1]}).ok
    with pytest.raises(ValueError):
        validate_schedule(overlap_cfg, raise_on_error=True)


def test_from_schedule_log_recovers_unit_times():
    w = heterogeneous(5, 3, seed=4)
    log = simulate(w, "mwr").schedule
    back = from_schedule_log(log)
    assert np.allclose(back.times, w.times) and back.availability == w.availability


def test_workload_rejects_bad_times():
    with pytest.raises(ValueError, match="times"):
        Workload(np.array([[1.0, -1.0]]), {0: (0,), 1: (1,)})


def test_lookahead_within_one_percent_of_lb_on_small_hetero():
    for seed in range(3):
        w = heterogeneous(16, 8, seed=seed)
        assert simulate(w, "lookahead").makespan <= 1.01 * lower_bound(w)


def test_mwr_reaches_lb_on_homogeneous_where_randomized_does_not():
    w = homogeneous(16, 8)
    assert simulate(w, "mwr").makespan == lower_bound(w) == 16
    assert simulate(w, "randomized").makespan > 16


def test_cli_comm_cost_and_gantt(tmp_path, capsys):
    assert cli(["comm-cost", "--out", str(tmp_path)]) == 0
    assert "80 PB" in capsys.readouterr().out
    assert (
        cli(["gantt", "--configs", "4", "--workers", "2", "--fail", "0.1:1", "--ret", "1:1", "--out", str(tmp_path)])
        == 0
    )
    assert list(tmp_path.glob("*.png"))


def test_cli_compare_writes_csv_and_plot(tmp_path):
    args = ["compare", "--configs", "4", "--workers", "2", "--seeds", "1", "--time-limit", "1", "--quiet"]
    assert cli([*args, "--out", str(tmp_path)]) == 0
    df = pd.read_csv(tmp_path / "comparison.csv")
    assert (
        set(df["scheduler"]) >= {"randomized", "cpsat", "milp", "lookahead"} and (tmp_path / "comparison.png").exists()
    )


def test_simulate_selection_runs_a_procedure_through_the_driver_with_failures():
    import automl
    from simulators import RETURN, simulate_selection

    space = {"lr": automl.loguniform(1e-3, 1e-1)}
    proc = automl.HyperBand(space, max_epochs=3, eta=3, seed=0, iterations=2)
    w = replicate(heterogeneous(sum(b.rungs[0].n for b in proc.brackets), 8, seed=0), factor=2, seed=0)
    first = float(w.times.min()) / 2  # every worker is inside its first unit (10 configs, 8 workers)
    events = [WorkerEvent(first, 3, "fail"), WorkerEvent(4.0, 3, RETURN), WorkerEvent(first, 5, "fail")]
    r = simulate_selection(proc, w, lambda c, e: {"valid_loss": abs(np.log10(c["lr"]) + 2) + 1 / (1 + e)},
                           events=events)
    assert len(r.configs) == 2 * 5 and set(r.configs.status) == {"stopped"}
    assert len(r.failed) == 2 and validate_schedule(r.schedule, w.availability).ok
    done = r.schedule
    for row in r.configs.itertuples():  # every epoch a config trained visited every partition exactly once
        mine = done[done.config_id == row.config_id]
        assert len(mine) == row.epochs * len(w.train_partitions)
        assert not mine.duplicated(["epoch", "partition"]).any()
    assert sorted(r.configs.epochs.unique()) == [1, 3]  # rungs at 1 and 3 epochs


@pytest.mark.parametrize("argv, message", [
    (["gantt", "--fail", "bad"], "argument --fail: 'bad' is not TIME:WORKER"),
    (["compare", "--configs", "a,b"], "'a,b' is not a comma-separated list of ints"),
])
def test_cli_rejects_malformed_flags_in_one_line(argv, message, capsys):
    with pytest.raises(SystemExit) as e:
        cli(argv)
    err = capsys.readouterr().err
    assert e.value.code == 2 and message in err
    assert err.startswith(f"python -m simulators {argv[0]}: error: ") and err.endswith(" (see --help)\n")
    assert err.count("\n") == 1


@pytest.mark.parametrize("argv, message", [
    (["--schedule", "missing.csv"], "missing.csv"),
    (["--schedule", "columns.csv"], "is not a schedule: schedule lacks columns"),
    (["--schedule", "empty.csv"], "is not a schedule"),
    (["--schedule", "header.csv"], "holds no units"),
    (["--scheduler", "nope"], "`scheduler` is 'nope'"),
])
def test_cli_gantt_makes_nothing_for_bad_input(argv, message, tmp_path, capsys):
    (tmp_path / "columns.csv").write_text("a,b\n1,2\n")
    (tmp_path / "empty.csv").write_text("")
    (tmp_path / "header.csv").write_text("config_id,epoch,partition,worker,kind,start,end\n")
    argv = [str(tmp_path / a) if a.endswith(".csv") else a for a in argv]
    out = tmp_path / "out"
    assert cli(["gantt", *argv, "--out", str(out)]) == 2
    assert message in capsys.readouterr().err
    assert not out.exists()


def test_cli_options_say_more_than_their_names():
    from simulators.__main__ import build_parser

    subparsers = next(a for a in build_parser()._actions if a.choices and a.dest == "command").choices
    for name, parser in subparsers.items():
        for action in parser._actions:
            for flag in action.option_strings:
                words = flag.lstrip("-").replace("-", " ").replace("_", " ")
                assert action.help and action.help.strip().lower() != words.lower(), f"{name} {flag}: {action.help!r}"


def test_cli_reports_bad_input_in_one_line_without_a_traceback(tmp_path, capsys):
    assert cli(["gantt", "--scheduler", "nope", "--out", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("python -m simulators gantt: error: `scheduler` is 'nope'") and "Traceback" not in err
    assert cli(["gantt", "--schedule", str(tmp_path / "missing.csv"), "--out", str(tmp_path)]) == 2
    assert "missing.csv" in capsys.readouterr().err
