"""Multi-objective ranking: Pareto fronts of a hand-made run whose fronts are known."""

from __future__ import annotations

import numpy as np
import pytest

from framework.result import CATALOG_FILE, NoResultError, Result, pareto_ranks
from framework.store.catalog import SQLiteCatalog

# config -> per epoch (valid_loss, valid_accuracy, valid_time); ranked by loss min, accuracy max
CURVES = {
    0: [(0.9, 0.50, 3.0), (0.30, 0.80, 3.0)],  # front 0: best loss
    1: [(0.40, 0.90, 5.0)],  # front 0: best accuracy
    2: [(0.35, 0.85, 1.0)],  # front 0: between the two
    3: [(0.50, 0.70, 1.0)],  # front 1: beaten by 2 in both
    4: [(0.60, 0.60, 1.0)],  # front 2: beaten by 3
    5: [(0.10, 0.99, 1.0)],  # failed: best of all, never ranked
    6: [(float("nan"), 0.95, 1.0)],  # a missing loss: no rank
}


@pytest.fixture(name="result")
def result_fixture(tmp_path) -> Result:
    catalog = SQLiteCatalog(str(tmp_path / CATALOG_FILE))
    try:
        catalog.set_meta(metric="valid_loss", mode="min", start_time=0.0)
        for cid, rows in CURVES.items():
            catalog.add_config(cid, {"q": cid}, "stopped")
            for e, (loss, acc, t) in enumerate(rows):
                catalog.add_epoch(cid, e, e, {"valid_loss": loss, "valid_accuracy": acc, "valid_time": t})
            catalog.update_config(cid, epochs=len(rows))
        catalog.update_config(5, status="failed", error="Traceback: boom")
    finally:
        catalog.close()
    return Result(str(tmp_path))


def test_pareto_ranks_sorts_into_fronts():
    values = np.array([[1, 4], [2, 2], [4, 1], [3, 3], [4, 4], [1, 4]], dtype=float)
    assert list(pareto_ranks(values)) == [0, 0, 0, 1, 2, 0]  # an equal row does not dominate its twin
    assert list(pareto_ranks(np.zeros((0, 2)))) == []


def test_dataframe_of_two_metrics_has_the_fronts(result):
    board = result.get_dataframe(["valid_loss", "valid_accuracy"], ["min", "max"])
    assert list(board.config_id) == [0, 2, 1, 3, 4, 5, 6]  # fronts, then the first metric; unranked last
    assert list(board.pareto_rank[:5]) == [0, 0, 0, 1, 2]
    assert board.pareto_rank[5:].isna().all()
    assert list(board.epoch[:1]) == [1]  # each config at its last epoch


def test_best_results_are_the_pareto_front(result):
    front = result.get_best_results(["valid_loss", "valid_accuracy"], ["min", "max"])
    assert [r.config_id for r in front] == [0, 2, 1]
    assert front[0].metrics["valid_loss"] == 0.30


def test_modes_decide_the_front(result):
    # maximising the loss too: 4 (worst loss) and 3 join the front; 0 and 2 are beaten by 1 in both
    board = result.get_dataframe(["valid_loss", "valid_accuracy"], ["max", "max"])
    assert set(board.config_id[board.pareto_rank == 0]) == {1, 3, 4}


def test_three_metrics_and_an_averaging_scope(result):
    board = result.get_dataframe(["valid_loss", "valid_accuracy", "valid_time"], ["min", "max", "min"], "avg")
    assert board.set_index("config_id").loc[0, "score/valid_loss"] == pytest.approx(0.6)
    assert set(board.config_id[board.pareto_rank == 0]) == {1, 2}  # 0's mean loss 0.6 is beaten by 2


@pytest.mark.parametrize(
    ("call", "message"),
    [
        (lambda r: r.get_dataframe(["valid_loss", "valid_accuracy"], "min"), r"`mode` is 'min', but `metric` is a list"),
        (lambda r: r.get_dataframe(["valid_loss", "valid_accuracy"], ["min", "max"], "all"), r"`scope` is 'all'"),
        (lambda r: r.get_dataframe(["valid_loss", "train_x"], ["min", "max"]), r"`metric` is 'train_x'"),
        (lambda r: r.get_dataframe("valid_loss", ["min"]), r"`mode` is \['min'\], a list"),
        (lambda r: r.get_best_result(["valid_loss", "valid_accuracy"], ["min", "max"]), r"get_best_results"),
        (lambda r: r.get_best_results("valid_loss", "min"), r"must be a list of metrics"),
    ],
)
def test_bad_objectives_are_refused(result, call, message):
    with pytest.raises(ValueError, match=message):
        call(result)


def test_no_front_when_no_config_has_every_value(tmp_path):
    catalog = SQLiteCatalog(str(tmp_path / CATALOG_FILE))
    catalog.set_meta(metric="valid_loss", mode="min", start_time=0.0)
    catalog.add_config(0, {"q": 0}, "stopped")
    catalog.add_epoch(0, 0, 0, {"valid_loss": float("nan"), "valid_accuracy": 0.5})
    catalog.update_config(0, epochs=1)
    catalog.close()
    with pytest.raises(NoResultError, match="every one of"):
        Result(str(tmp_path)).get_best_results(["valid_loss", "valid_accuracy"], ["min", "max"])
