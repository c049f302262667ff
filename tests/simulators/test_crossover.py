"""Hybrid parallelism on the simulator (`framework.scheduling.parallelism`, `simulators.crossover`): the real driver
runs MOP, data-parallel gangs, Cerebro's switch and the joint planner at every |S| from 1 to p."""

from __future__ import annotations

import pandas as pd
import pytest

from framework.scheduling import DataParallel, ParallelismPlanner, make_scheduler
from framework.scheduling.parallelism import PROBE_EVERY, gang_seconds, plan_parallelism, solve_budget
from simulators import homogeneous, simulate, validate_schedule
from simulators.__main__ import main
from simulators.backend import CostModel
from simulators.crossover import CrossoverConfig, config_counts, policy, run_crossover, summarize, workload


def test_the_planner_gives_each_config_a_gang_of_its_share_of_the_workers_when_there_are_few():
    work = {c: (8, 1.0) for c in range(4)}  # 4 configs, 8 units of 1 s each, on 8 workers
    plan, order, span, how = plan_parallelism(work, 8, (1, 2, 4, 8), comm_s=0.05, time_limit_s=1)
    assert plan == dict.fromkeys(range(4), 2) and span == pytest.approx(8 * gang_seconds(1.0, 2, 0.05))
    assert sorted(order) == list(range(4))
    hop, _, span, _ = plan_parallelism({c: (8, 1.0) for c in range(16)}, 8, (1, 2, 4, 8), 0.05, 1)
    assert set(hop.values()) == {1} and span == pytest.approx(16.0)  # more configs than workers: every one hops


def test_without_a_time_limit_the_solver_gets_a_share_of_the_plan_it_improves():
    assert solve_budget(1.0) == pytest.approx(0.02)  # a second of work left: 20 ms to plan it
    assert solve_budget(0.1) == 0.01 and solve_budget(3600.0) == 2.0  # within 10 ms and 2 s
    assert solve_budget(3600.0, time_limit_s=30.0) == 30.0  # as given
    with pytest.raises(ValueError, match="`time_limit_s` is 0, but must be > 0"):
        ParallelismPlanner(time_limit_s=0)
    planner = ParallelismPlanner(comm_s=0.1)
    simulate(workload("heterogeneous", 3, 4, 0), planner, cost=CostModel(comm_s=0.1))
    assert planner.plan_seconds > 0 and planner.solver_status


@pytest.mark.parametrize("kind", ["homogeneous", "heterogeneous"])
def test_at_every_config_count_the_planner_is_within_2_percent_of_the_better_of_mop_and_data_parallel(kind):
    cfg = CrossoverConfig(workers=(8,), kinds=(kind,), time_limit_s=0.5, hyperband_workers=0)
    summary = summarize(run_crossover(cfg, progress=False))
    assert summary.configs.tolist() == config_counts(8) == list(range(1, 9))
    assert (summary.planner_vs_best <= 1.02).all(), summary
    assert (summary.planner_vs_best < 0.9).any(), summary  # strictly better in the crossover region
    assert summary.cerebro.notna().all()


def test_gang_schedules_keep_the_mop_invariants_and_take_what_the_cost_model_says():
    w = workload("homogeneous", 2, 4, 0)  # 2 configs, 4 workers: MOP takes 4 s, one unit per second per config
    dp = simulate(w, DataParallel(), cost=CostModel(comm_s=0.1))
    rows = dp.schedule
    assert validate_schedule(rows).ok
    assert set(rows.groupby("group").worker.nunique()) == {4}  # each unit: one row per member of a gang of 4
    assert dp.makespan == pytest.approx(2 * 4 * gang_seconds(1.0, 4, 0.1))  # 3.2 s
    planner = ParallelismPlanner(comm_s=0.1, time_limit_s=0.5)
    planned = simulate(w, planner, cost=CostModel(comm_s=0.1))
    assert planner.plan == {0: 2, 1: 2}  # a gang of 2 each, side by side: 4 x (0.5 + 0.1) = 2.4 s
    assert validate_schedule(planned.schedule).ok and planned.makespan == pytest.approx(2.4)
    done = planned.schedule.drop_duplicates(["config_id", "epoch", "partition", "kind"])
    assert len(done) == 2 * 4  # every unit once, however it was run


def test_a_gang_measured_slower_than_the_plan_assumed_is_planned_again_from_what_was_measured():
    w = workload("homogeneous", 1, 4, 0)  # 1 config, 4 workers, units of 1 s, 3 epochs
    cost = CostModel(comm_s=2.0)  # all-reduces so slow that a gang of 4 takes 0.25 + 3 s a unit, a hop 1 s
    planner = ParallelismPlanner(comm_s=0.0, time_limit_s=0.5)  # told that all-reduces are free
    planned = simulate(w, planner, epochs=3, cost=cost)
    hop = simulate(w, make_scheduler("randomized"), epochs=3, cost=cost)
    dp = simulate(w, DataParallel(), epochs=3, cost=cost)
    assert planner.plan == {0: 1} and planner.replans >= 1  # its gang step showed what gangs cost
    sizes = planned.schedule.dropna(subset=["group"]).groupby("group").worker.nunique()
    # one step of a gang of 4, then it hops: the ratio measured for 4 corrects the model of 2 as well
    assert sorted(sizes) == [4]
    assert dp.makespan == pytest.approx(12 * 3.25) and hop.makespan == pytest.approx(12.0)
    assert planned.makespan == pytest.approx(4 * 3.25 + 8 * 1.0)  # 4 units at 3.25 s in the gang, 8 hopping


def test_measuring_its_costs_the_planner_hops_first_and_probes_a_hop_again_where_a_gang_gains_little():
    w = homogeneous(1, 4)  # 1 config, 4 workers, a partition each, units of 1 s
    cost = CostModel(comm_s=0.4)  # a gang of 4: 0.25 + 0.6 s a unit, 15% under a hop's 1 s
    planner = ParallelismPlanner()  # told nothing: costs measured
    r = simulate(w, planner, epochs=6, cost=cost)
    train = r.schedule[r.schedule.kind == "train"].sort_values(["start", "worker"])
    assert pd.isna(train.group.iloc[0])  # the first unit hops: the baseline every gang is compared with
    steps = train.drop_duplicates(["start", "group"]).group.isna().tolist()  # per step: a hop?
    after_gangs = [i for i in range(PROBE_EVERY, len(steps)) if steps[i] and not any(steps[i - PROBE_EVERY:i])]
    assert after_gangs, steps  # a hop after PROBE_EVERY gang steps in a row
    assert validate_schedule(r.schedule).ok
    assert r.makespan < 24.0  # 24 units hopping one at a time: 24 s
    told = ParallelismPlanner(comm_s=0.4)  # told the costs: it trusts them, and neither hops first nor probes
    r = simulate(w, told, epochs=6, cost=cost)
    assert r.schedule[r.schedule.kind == "train"].group.notna().all()


def test_a_policy_by_name_and_a_bad_kind_is_one_error():
    assert type(policy("planner", 0.1, 0, 1.0)).__name__ == "ParallelismPlanner"
    with pytest.raises(ValueError, match="`kind` is 'gpu', but must be"):
        workload("gpu", 2, 4, 0)


def test_the_cli_writes_a_table_and_a_png(tmp_path, capsys):
    out = tmp_path / "xo"
    assert main(["crossover", "--workers", "4", "--kinds", "homogeneous", "--time-limit", "0.3",
                 "--hyperband-workers", "4", "--out", str(out), "--quiet"]) == 0
    assert (out / "crossover.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert {"crossover.csv", "crossover_summary.csv", "hyperband.csv"} <= {p.name for p in out.iterdir()}
    assert "planner_vs_best" in capsys.readouterr().out
    assert main(["crossover", "--kinds", "gpu", "--out", str(tmp_path / "bad")]) == 2
    assert not (tmp_path / "bad").exists()


def test_a_live_run_refuses_a_policy_that_forms_gangs_with_freezing_before_it_starts(tmp_path):
    import numpy as np

    import automl
    import framework
    from framework.examples import classifier_eval_fn, classifier_train_fn, mlp_model_fn

    ds = framework.PartitionedDataset.from_arrays(np.zeros((8, 4), np.float32), np.zeros(8, np.int64),
                                                  num_partitions=2, seed=0)
    for scheduler in ("planner", DataParallel()):
        with pytest.raises(ValueError, match="which forms data-parallel gangs, and `freezing` is set"):
            framework.ModelSelection(mlp_model_fn, classifier_train_fn, classifier_eval_fn, ds,
                                     automl.GridSearch({"lr": [0.1]}, epochs=1), scheduler=scheduler,
                                     storage_path=str(tmp_path / "run"), freezing={})
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize("comm", [0.2, 1.0])
def test_the_planner_measures_the_all_reduce_from_the_gangs_that_ran_and_plans_again(comm):
    """Told nothing, the planner first costs a gang's all-reduce at 0 (so data parallelism looks free); the first
    gang's step measures it (`DispatchState.comm_s`, what a live gang reports), and the planner plans again: slower
    than a planner told the cost, faster than one that goes on ignoring it."""
    w = workload("homogeneous", 3, 8, 0)
    runs = {}
    for name, c in (("blind", 0.0), ("told", comm), ("measured", None)):
        planner = ParallelismPlanner(comm_s=c, time_limit_s=0.5)
        runs[name] = (planner, simulate(w, planner, cost=CostModel(comm_s=comm)))
    planner, measured = runs["measured"]
    assert planner._comm_used == pytest.approx(comm) and planner.replans >= 1
    assert runs["told"][1].makespan <= measured.makespan < runs["blind"][1].makespan
    assert validate_schedule(measured.schedule).ok
