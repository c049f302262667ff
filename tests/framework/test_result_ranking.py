"""Result ranking: the leaderboard and `best_config_id` read from a hand-built run catalog with known metrics."""

from __future__ import annotations

import math

import pytest

from framework.result import CATALOG_FILE, NoResultError, Result
from framework.store.catalog import SQLiteCatalog


def _run_dir(tmp_path, mode: str, epochs: dict[int, list[float]], failed=(), metric: str = "valid_loss") -> str:
    """A run directory whose config `cid` reported `epochs[cid][e]` as `metric` at epoch `e`."""
    catalog = SQLiteCatalog(str(tmp_path / CATALOG_FILE))
    try:
        catalog.set_meta(metric=metric, mode=mode, start_time=0.0)
        for cid, values in epochs.items():
            catalog.add_config(cid, {"q": cid}, "stopped")
            for e, v in enumerate(values):
                catalog.add_epoch(cid, e, e, {metric: v, "train_loss": 1.0})
            catalog.update_config(cid, epochs=len(values))
        for cid in failed:
            catalog.update_config(cid, status="failed", error="Traceback: boom")
    finally:
        catalog.close()
    return str(tmp_path)


def _order(result: Result) -> list[int]:
    return [int(c) for c in result.leaderboard().config_id]


def test_result_ranks_smallest_first_in_min_mode(tmp_path):
    result = Result(_run_dir(tmp_path, "min", {0: [0.5], 1: [0.2], 2: [0.9], 3: [0.3]}))
    assert _order(result) == [1, 3, 0, 2]
    assert result.best_config_id == 1
    assert result.best_config == {"q": 1}


def test_result_ranks_largest_first_in_max_mode(tmp_path):
    result = Result(_run_dir(tmp_path, "max", {0: [0.5], 1: [0.2], 2: [0.9], 3: [0.3]}, metric="valid_accuracy"))
    assert _order(result) == [2, 0, 3, 1]
    assert result.best_config_id == 2
    assert list(result.leaderboard().valid_accuracy) == [0.9, 0.5, 0.3, 0.2]


@pytest.mark.parametrize("mode", ["min", "max"])
def test_result_ranks_by_latest_epoch_not_best_epoch_ever(tmp_path, mode):
    # config 0 had the best value of the run at epoch 0 but ends worst; config 1 ends best
    curves = {"min": {0: [0.01, 0.9], 1: [0.5, 0.4]}, "max": {0: [0.99, 0.1], 1: [0.5, 0.6]}}[mode]
    result = Result(_run_dir(tmp_path, mode, curves, metric="valid_score"))
    board = result.leaderboard()
    assert _order(result) == [1, 0]
    assert list(board.epoch) == [1, 1]
    assert list(board.valid_score) == [curves[1][1], curves[0][1]]
    assert result.best_config_id == 1


def test_result_ranks_each_config_at_its_own_latest_epoch(tmp_path):
    # config 1 was stopped after one epoch (early stopping): its epoch 0 competes with config 0's epoch 2
    result = Result(_run_dir(tmp_path, "min", {0: [0.9, 0.5, 0.3], 1: [0.4]}))
    board = result.leaderboard()
    assert _order(result) == [0, 1]
    assert dict(zip(board.config_id, board.epoch)) == {0: 2, 1: 0}


@pytest.mark.parametrize("mode", ["min", "max"])
def test_result_puts_failed_configs_last_and_never_best(tmp_path, mode):
    # the failed config 2 reported the best value of all before it failed
    best_value = 0.0 if mode == "min" else 1.0
    result = Result(_run_dir(tmp_path, mode, {0: [0.4], 1: [0.6], 2: [best_value]}, failed=[2]))
    board = result.leaderboard()
    assert int(board.config_id.iloc[-1]) == 2 and board.status.iloc[-1] == "failed"
    assert (board.status.iloc[:-1] != "failed").all()
    assert result.best_config_id == (0 if mode == "min" else 1)


def test_result_with_only_failed_configs_has_no_best(tmp_path):
    result = Result(_run_dir(tmp_path, "min", {0: [0.4], 1: [0.1]}, failed=[0, 1]))
    assert result.best_config_id is None and result.best_config is None
    assert sorted(_order(result)) == [0, 1]


@pytest.mark.parametrize("mode", ["min", "max"])
def test_result_puts_nan_metrics_last(tmp_path, mode):
    result = Result(_run_dir(tmp_path, mode, {0: [math.nan], 1: [0.7], 2: [0.2]}))
    board = result.leaderboard()
    assert _order(result) == ([2, 1, 0] if mode == "min" else [1, 2, 0])
    assert math.isnan(board.valid_loss.iloc[-1])
    assert result.best_config_id == (2 if mode == "min" else 1)


def test_result_nan_metrics_rank_before_failed_configs(tmp_path):
    result = Result(_run_dir(tmp_path, "min", {0: [0.1], 1: [math.nan], 2: [0.5]}, failed=[0]))
    assert _order(result) == [2, 1, 0]
    assert result.best_config_id == 2


def test_result_with_only_nan_metrics_has_no_best(tmp_path):
    result = Result(_run_dir(tmp_path, "max", {0: [math.nan], 1: [math.nan]}))
    assert result.best_config_id is None


def test_result_leaderboard_file_is_written_in_rank_order(tmp_path):
    import pandas as pd

    result = Result(_run_dir(tmp_path, "max", {0: [0.5], 1: [0.8], 2: [0.1]}))
    paths = result.write()
    assert list(pd.read_csv(paths["leaderboard"]).config_id) == [1, 0, 2]



def test_result_leaderboard_of_a_run_without_epochs_has_the_ranking_columns(tmp_path):
    result = Result(_run_dir(tmp_path, "min", {0: [], 1: []}))
    board = result.leaderboard()
    assert board.empty and list(board.columns) == ["config_id", "epoch", "valid_loss", "status", "epochs_trained"]
    assert result.best_config_id is None


def test_result_leaderboard_names_a_metric_the_run_never_reported(tmp_path):
    result = Result(_run_dir(tmp_path, "min", {0: [0.5]}, metric="valid_loss"))
    result.metric = "valid_acc"
    with pytest.raises(ValueError, match=r"`metric` is 'valid_acc', but the run reported only \['train_loss', 'valid_loss'\]"):
        result.leaderboard()


def test_get_dataframe_scope_last_ranks_last_epochs_and_scope_all_best_epochs(tmp_path):
    # config 0 was best at epoch 0 and got worse; config 1 ends best
    result = Result(_run_dir(tmp_path, "min", {0: [0.1, 0.6], 1: [0.5, 0.3], 2: [0.4]}, failed=[2]))
    last = result.get_dataframe()
    assert list(last.config_id) == [1, 0, 2] and list(last.epoch) == [1, 1, 0]
    assert list(last.status) == ["completed", "completed", "failed"] and list(last.epochs_trained) == [2, 2, 1]
    assert list(last["config/q"]) == [1, 0, 2]
    best = result.get_dataframe(scope="all")
    assert list(best.config_id) == [0, 1, 2] and list(best.epoch) == [0, 1, 0]
    assert result.get_best_result().config_id == 1
    r = result.get_best_result(scope="all")
    assert (r.config_id, r.epoch, r.config, r.status, r.epochs) == (0, 0, {"q": 0}, "completed", 2)
    assert r.metrics == {"valid_loss": 0.1, "train_loss": 1.0}
    assert result.get_best_result(metric="valid_loss", mode="max").config_id == 0  # 0.6 at its last epoch
    with pytest.raises(ValueError, match=r"`scope` is 'best', but must be one of \['last', 'all', 'avg', "):
        result.get_dataframe(scope="best")
    with pytest.raises(ValueError, match=r"`mode` is 'up', but must be 'min' or 'max'"):
        result.get_best_result(mode="up")


def test_metrics_carry_a_config_column_per_hyper_parameter(tmp_path):
    result = Result(_run_dir(tmp_path, "min", {0: [0.5, 0.4], 1: [0.2]}))
    assert list(result.metrics["config/q"]) == [0, 0, 1]


def test_a_run_where_every_config_failed_says_so_instead_of_a_key_error(tmp_path):
    result = Result(_run_dir(tmp_path, "min", {0: [0.5], 1: []}, failed=[0, 1]))
    assert result.best_config_id is None
    with pytest.raises(NoResultError, match=r"no config .* has a value of 'valid_loss': 2 configs, 2 failed"):
        result.get_best_result()
    with pytest.raises(NoResultError, match="2 failed"):
        result.load_model(model_fn=lambda config: None)


def test_outcomes_tell_pruned_configs_from_completed_ones(tmp_path):
    path = _run_dir(tmp_path, "min", {0: [0.5, 0.4], 1: [0.9], 2: [0.3]})
    catalog = SQLiteCatalog(str(tmp_path / CATALOG_FILE))
    catalog.commit_round(0, epochs=[], statuses=[(0, "stopped", 2, "completed"), (1, "stopped", 1, "pruned"),
                                                  (2, "active", 1, None)], new_configs=[], procedure=None)
    catalog.close()
    assert Result(path).status.set_index("config_id").status.to_dict() == {0: "completed", 1: "pruned", 2: "active"}


def test_opening_a_result_never_writes_into_the_run(tmp_path):
    path = _run_dir(tmp_path, "min", {0: [0.5]})
    db = tmp_path / CATALOG_FILE
    before = (db.stat().st_mtime_ns, db.stat().st_size)
    Result(path).leaderboard()
    assert (db.stat().st_mtime_ns, db.stat().st_size) == before
    empty = tmp_path / "empty"
    empty.mkdir()
    (empty / CATALOG_FILE).write_bytes(b"")
    with pytest.raises(Exception, match="is not a run catalog"):
        Result(str(empty))
    assert (empty / CATALOG_FILE).stat().st_size == 0


def test_a_metric_other_than_the_run_s_needs_its_mode(tmp_path):
    # the run ranks valid_accuracy (max); its valid_loss must not be ranked max by default: the worst loss would win
    catalog = SQLiteCatalog(str(tmp_path / CATALOG_FILE))
    try:
        catalog.set_meta(metric="valid_accuracy", mode="max", start_time=0.0)
        for cid, (acc, loss) in enumerate([(0.9, 0.2), (0.5, 0.9), (0.7, 0.4)]):
            catalog.add_config(cid, {"q": cid}, "stopped")
            catalog.add_epoch(cid, 0, 0, {"valid_accuracy": acc, "valid_loss": loss})
            catalog.update_config(cid, epochs=1)
    finally:
        catalog.close()
    result = Result(str(tmp_path))
    with pytest.raises(ValueError, match="`metric` is 'valid_loss', but `mode` is not given: the run ranks "
                                         "'valid_accuracy' with mode 'max'"):
        result.get_best_result(metric="valid_loss")
    with pytest.raises(ValueError, match="pass mode='min' or mode='max'"):
        result.get_dataframe(metric="valid_loss")
    assert result.get_best_result(metric="valid_loss", mode="min").config_id == 0
    assert result.get_best_result(metric="valid_loss", mode="max").config_id == 1
    assert result.get_best_result(metric="valid_accuracy").config_id == 0  # the run's own metric needs no mode


@pytest.mark.parametrize("scope, best", [("last", 2), ("all", 0), ("avg", 1), ("last-2-avg", 1), ("last-1-avg", 2)])
def test_scopes_rank_by_the_last_the_best_or_a_mean_of_epochs(tmp_path, scope, best):
    curves = {0: [0.1, 0.9, 0.9], 1: [0.5, 0.5, 0.5], 2: [0.9, 0.9, 0.3]}
    result = Result(_run_dir(tmp_path, "min", curves))
    r = result.get_best_result(scope=scope)
    assert r.config_id == best
    if scope.endswith("avg"):
        board = result.get_dataframe(scope=scope)
        window = 3 if scope == "avg" else int(scope.split("-")[1])
        expected = {c: sum(v[-window:]) / window for c, v in curves.items()}
        assert dict(zip(board.config_id, board.score)) == pytest.approx(expected)
        assert r.metrics["valid_loss"] == curves[best][-1]  # the config's metrics are its last epoch's


@pytest.mark.parametrize("scope", ["first", "last-0-avg", "last-x-avg", "avg-5"])
def test_an_unknown_scope_is_refused(tmp_path, scope):
    result = Result(_run_dir(tmp_path, "min", {0: [0.1]}))
    with pytest.raises(ValueError, match=rf"`scope` is '{scope}', but must be one of .* or 'last-N-avg' with N >= 1"):
        result.get_best_result(scope=scope)
