"""The completeness proof, checked (`framework.completeness`, `Result.check_completeness`): the rules with numbers,
then a real run directory (the driver on `LocalBackend`, real tiny MLPs, a PBT clone, no Ray) whose checkpoints and
schedule are edited and re-signed with this machine's key: the signatures verify, the proof does not."""

from __future__ import annotations

import shutil

import pandas as pd
import pytest

import automl
from framework.callbacks import Callback
from framework.completeness import (
    RULES,
    CompletenessProblem,
    IncompleteRunError,
    logged_visits,
    run_partitions,
    visit_problems,
)
from framework.driver import Driver, MemoryRunLog, SQLiteRunLog
from framework.engine.local import LocalBackend
from framework.options import RunOptions
from framework.result import CATALOG_FILE, Result
from framework.store.catalog import SQLiteCatalog
from framework.store.checkpoint import CheckpointStore, load_latest_verified, write_atomic
from tests.framework.driver.test_driver import FNS, SPACE, P, _entries

PARTS = [0, 1, 2]


def _rules(problems: list[CompletenessProblem]) -> set[tuple[int | None, str]]:
    return {(p.epoch, p.rule) for p in problems}


def _found(problems: pd.DataFrame) -> set[tuple[int, int | None, str]]:
    """`check_completeness`'s rows as (config, epoch or None, rule)."""
    return {(int(r.config_id), None if pd.isna(r.epoch) else int(r.epoch), r.rule) for r in problems.itertuples()}


def _check(visited, logged, status="completed", epochs=2, units=None, metric_epochs=None):
    units = sum(map(len, visited.values())) if units is None and visited is not None else units
    return visit_problems(7, status=status, epochs=epochs, partitions=PARTS, visited=visited, units=units,
                          logged=logged, metric_epochs=range(epochs) if metric_epochs is None else metric_epochs)


# ---- the rules, with numbers -----------------------------------------------------------------------------------
def test_visit_problems_none_when_state_log_and_epochs_agree():
    assert _check({0: [2, 0, 1], 1: [1, 2, 0]}, [(0, 2), (0, 0), (0, 1), (1, 1), (1, 2), (1, 0)]) == []


def test_visit_problems_a_clone_that_kept_its_sources_visits_is_caught():
    # the clone trained epoch 0 once (the log); its record also holds its source's epoch 0 and 1
    logged = [(0, 0), (0, 1), (0, 2)]
    problems = _check({0: [0, 1, 2, 0, 1, 2], 1: [0, 1, 2]}, logged, epochs=1, units=3)
    assert _rules(problems) >= {(0, "repeated"), (0, "unlogged"), (1, "unlogged"), (1, "uncommitted"),
                                (None, "count")}


def test_visit_problems_a_lost_visit_is_caught_as_lost_and_as_a_gap():
    problems = _check({0: [0, 1, 2], 1: [1, 0]}, [(0, 0), (0, 1), (0, 2), (1, 1), (1, 2), (1, 0)])
    assert _rules(problems) == {(1, "lost"), (1, "gap")}
    assert "[2]" in next(p.detail for p in problems if p.rule == "lost")


def test_visit_problems_a_visit_the_log_never_ran_is_unlogged():
    assert _rules(_check({0: [0, 1, 2]}, [(0, 0), (0, 1)], epochs=1)) == {(0, "unlogged")}


def test_visit_problems_another_order_than_the_log_is_caught():
    assert _rules(_check({0: [0, 2, 1]}, [(0, 0), (0, 1), (0, 2)], epochs=1)) == {(0, "order")}


def test_visit_problems_epochs_after_the_one_in_progress_are_beyond():
    logged = [(e, p) for e in (0, 1, 3) for p in PARTS]
    problems = _check({e: PARTS for e in (0, 1, 3)}, logged, status="stopped")
    assert _rules(problems) == {(3, "beyond")}


def test_visit_problems_a_completed_config_never_trains_past_its_committed_epochs():
    logged = [(0, p) for p in PARTS] + [(1, 0)]
    assert _rules(_check({0: PARTS, 1: [0]}, logged, epochs=1)) == {(1, "uncommitted")}
    assert _rules(_check({0: PARTS, 1: [0]}, logged, status="pruned", epochs=1)) == {(1, "uncommitted")}


def test_visit_problems_a_stopped_config_may_end_in_a_partial_epoch():
    logged = [(0, p) for p in PARTS] + [(1, 2)]
    assert _check({0: PARTS, 1: [2]}, logged, status="stopped", epochs=1) == []


def test_visit_problems_an_active_configs_state_may_lag_the_log_in_its_epoch_in_progress_only():
    logged = [(0, p) for p in PARTS] + [(1, 0), (1, 1)]
    assert _check({0: PARTS, 1: [0]}, logged, status="active", epochs=1) == []
    assert _check({0: PARTS}, logged, status="active", epochs=1) == []
    assert _rules(_check({0: [0, 1]}, logged, status="active", epochs=1)) == {(0, "lost"), (0, "gap")}
    assert _rules(_check({0: PARTS, 1: [1]}, logged, status="active", epochs=1)) == {(1, "order")}


def test_visit_problems_a_failed_configs_state_may_lag_but_never_holds_what_the_log_lacks():
    logged = [(0, p) for p in PARTS] + [(1, 0), (1, 1)]
    assert _check({0: [0]}, logged, status="failed", epochs=1) == []
    assert _check(None, logged, status="failed", epochs=1) == []
    assert _rules(_check({0: [0, 0]}, logged, status="failed", epochs=1)) == {(0, "repeated"), (0, "unlogged")}
    assert _rules(_check({0: PARTS, 2: [1]}, logged, status="failed", epochs=1)) == {(2, "beyond"), (2, "unlogged")}


def test_visit_problems_a_config_that_trained_without_a_readable_state_is_unreadable():
    assert _rules(_check(None, [(0, 0)], epochs=0)) == {(None, "unreadable")}
    assert _check(None, [], epochs=0) == []  # never trained: nothing to prove


def test_visit_problems_checks_the_count_partitions_and_metrics_epochs():
    logged = [(0, p) for p in PARTS]
    assert _rules(_check({0: PARTS}, logged, epochs=1, units=4)) == {(None, "count")}
    assert _rules(_check({0: [0, 1, 2, 5]}, [*logged, (0, 5)], epochs=1)) == {(0, "unknown_partition")}
    assert _rules(_check({0: PARTS}, logged, epochs=1, metric_epochs=[0, 1])) == {(None, "metrics")}


def test_visit_problems_without_a_log_checks_the_record_alone():
    # the driver's mirror at the end of a run: no log, no unit count
    ok = visit_problems(0, status="completed", epochs=2, partitions=PARTS, visited={0: PARTS, 1: [2, 1, 0]})
    assert ok == []
    bad = visit_problems(0, status="completed", epochs=2, partitions=PARTS, visited={0: [0, 1, 2, 2], 1: [0, 1]})
    assert _rules(bad) == {(0, "repeated"), (1, "gap")}


def test_completeness_problem_rejects_an_unknown_rule():
    with pytest.raises(ValueError, match="`rule` is 'late', but must be one of"):
        CompletenessProblem(0, 0, "late", "")
    assert len(RULES) == len(set(RULES))


def test_logged_visits_counts_a_gang_step_once_per_partition_and_leaves_out_eval_units():
    schedule = pd.DataFrame({
        "config_id": [0, 0, 0, 0, 1, 1, 0],
        "epoch": [0, 0, 0, 0, 0, 0, 0],
        "partition": [0, 0, 2, 1, 1, 1, 0],
        "kind": ["train", "train", "train", "train", "train", "train", "eval"],
        "group": pd.array([4, 4, 4, pd.NA, pd.NA, pd.NA, pd.NA], dtype="Int64"),
    })
    # gang 4: two workers shared partition 0 and a third trained partition 2; config 1 trained partition 1 twice
    assert logged_visits(schedule) == {0: [(0, 0), (0, 2), (0, 1)], 1: [(0, 1), (0, 1)]}


def test_run_partitions_from_the_recorded_dataset_else_the_placement_and_log():
    empty = pd.DataFrame({"partition": [], "kind": []})
    assert run_partitions({"dataset": {"kind": "arrays", "num_partitions": 4}}, empty) == [0, 1, 2, 3]
    assert run_partitions({"dataset": {"kind": "files", "train": ["a", "b"]}}, empty) == [0, 1]
    log = pd.DataFrame({"partition": [5, 1], "kind": ["train", "eval"]})
    assert run_partitions({"placement": {"0": [0, 1], "3": [1]}}, log) == [0, 3, 5]
    assert run_partitions({"executor": "task_parallel", "dataset": {"kind": "arrays", "num_partitions": 4}}, log) == [0]


# ---- a real run directory, edited and re-signed ---------------------------------------------------------------
@pytest.fixture(scope="module")
def pbt_dir(tmp_path_factory):
    """A finished PBT run (population 4, 3 epochs, one clone per epoch boundary at least) on `LocalBackend`."""
    root = tmp_path_factory.mktemp("pbt")
    catalog = SQLiteCatalog(str(root / CATALOG_FILE))
    catalog.set_meta(metric="valid_loss", mode="min", dataset={"kind": "arrays", "num_partitions": P})
    ckpt = CheckpointStore(str(root / "checkpoints"), catalog)
    pbt = automl.PBT({**SPACE, "lr": automl.loguniform(0.01, 0.1)}, population=4, epochs=3, perturbation_interval=1,
                     seed=0)
    driver = Driver(LocalBackend(FNS, _entries(), num_threads=1), pbt, SQLiteRunLog(catalog, ckpt),
                    {w: [w] for w in range(P)}, list(range(P)), RunOptions(seed=5, checkpoint="epoch", queue_depth=1))
    assert driver.run() is True
    ckpt.close()
    catalog.close()
    return root


@pytest.fixture
def run_dir(pbt_dir, tmp_path):
    """A copy of the PBT run to edit (a copy verifies: what is signed is the run's own id, not its folder)."""
    return shutil.copytree(pbt_dir, tmp_path / "run")


def _clone_id(result: Result) -> int:
    clones = result.status.dropna(subset=["parent"])
    assert not clones.empty, "PBT cloned no config"
    return int(clones.config_id.iloc[0])


def _replant(run_dir, config_id: int, edit) -> None:
    """Edit the visit record of a config's latest checkpoint and record the new file with the store's own API,
    which signs its row with this machine's key."""
    catalog = SQLiteCatalog(str(run_dir / CATALOG_FILE))
    try:
        state, epoch, units, _ = load_latest_verified(catalog, config_id)
        path = state.pop("checkpoint")["path"]
        state["visited"] = edit(state["visited"])
        digest, size = write_atomic(state, path)
        catalog.add_checkpoint(config_id, epoch, units, path, digest, size)
    finally:
        catalog.close()


def test_check_completeness_holds_on_a_finished_run_with_clones(pbt_dir):
    result = Result(str(pbt_dir))
    assert result.verified and _clone_id(result) is not None
    problems = result.check_completeness()
    assert list(problems.columns) == ["config_id", "epoch", "rule", "detail"] and problems.empty, problems
    result.assert_complete()


def test_a_clone_planted_with_its_sources_visits_verifies_but_fails_the_check(run_dir):
    result = Result(str(run_dir))
    clone = _clone_id(result)
    source = int(result.status.set_index("config_id").parent[clone])
    inherited = Result(str(run_dir)).load_state(source)["visited"]
    _replant(run_dir, clone, lambda own: {e: [*inherited.get(e, []), *own.get(e, [])] for e in {*inherited, *own}})
    again = Result(str(run_dir))
    assert again.verified  # the signature proves who wrote the record, not that it is complete
    problems = again.check_completeness()
    assert set(problems.config_id) == {clone}
    assert {"repeated", "unlogged", "count"} <= set(problems.rule)
    with pytest.raises(IncompleteRunError, match=f"config {clone}, epoch 0: repeated"):
        again.assert_complete()


def test_a_state_that_lost_a_visit_verifies_but_fails_the_check(run_dir):
    result = Result(str(run_dir))
    cid = int(result.status[result.status.epochs == 3].config_id.iloc[0])
    _replant(run_dir, cid, lambda v: {**v, 1: v[1][:-1]})
    problems = Result(str(run_dir)).check_completeness()
    assert _found(problems) >= {(cid, 1, "lost"), (cid, 1, "gap")}
    assert set(problems.config_id) == {cid}


def test_a_done_unit_taken_out_of_the_schedule_fails_the_check(run_dir):
    catalog = SQLiteCatalog(str(run_dir / CATALOG_FILE))
    try:
        done = catalog.units(status="done")
        row = done[(done.kind == "train") & (done.epoch == 0)].iloc[0]
        catalog.mark_units([int(row.seq)], "lost")  # re-signed: the writer verified the row it changes
    finally:
        catalog.close()
    result = Result(str(run_dir))
    assert result.verified
    problems = result.check_completeness()
    assert _found(problems) == {(int(row.config_id), 0, "unlogged")}


def test_a_corrupt_newest_checkpoint_makes_the_proof_stale(run_dir):
    result = Result(str(run_dir))
    cid = int(result.status[result.status.epochs == 3].config_id.iloc[0])
    catalog = SQLiteCatalog(str(run_dir / CATALOG_FILE), readonly=True)
    try:
        [newest, _] = catalog.checkpoints(cid)[:2]  # an older one to fall back to
    finally:
        catalog.close()
    with open(newest[2], "r+b") as f:
        f.seek(64)
        f.write(b"\0" * 8)
    problems = Result(str(run_dir)).check_completeness()
    # the older proof lacks the last epoch: what the newest held is no longer proven
    assert _found(problems) >= {(cid, None, "stale"), (cid, 2, "lost"), (cid, 2, "gap")}


class _Miscount(Callback):
    """A bookkeeping bug: the driver's mirror counts config 0's first unit twice."""

    def __init__(self) -> None:
        self.driver = None

    def on_unit_end(self, config_id, epoch, partition, kind, worker, seconds, metrics) -> None:
        c = self.driver.run_state.configs[config_id]
        if (config_id, epoch, kind) == (0, 0, "train") and len(c.visited[0]) == 1:
            c.visited[0].append(partition)


def test_the_drivers_run_end_check_refuses_a_mirror_that_counted_a_unit_twice():
    bug = _Miscount()
    driver = Driver(LocalBackend(FNS, _entries(), num_threads=1), automl.GridSearch(SPACE, epochs=1), MemoryRunLog(),
                    {w: [w] for w in range(P)}, list(range(P)), RunOptions(queue_depth=1), observers=[bug])
    bug.driver = driver
    with pytest.raises(RuntimeError, match="completeness check failed .*\n.*config 0, epoch 0: repeated"):
        driver.run()
