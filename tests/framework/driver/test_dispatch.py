"""The schedule log's rows of an assignment in flight (`Flight.rows`): one per worker of a gang that trained the
unit's partition, each counting the examples that worker trained."""

from __future__ import annotations

import pytest

from framework.data import shard_data
from framework.driver.dispatch import Flight
from framework.scheduling import TRAIN, Assignment, Unit
from framework.scheduling.units import EVAL, UnitReport, example_share


def _report(unit: Unit, n: int) -> UnitReport:
    """A gang's merged report of `unit` (as the backend makes it: its sharers' examples summed)."""
    return UnitReport(unit, worker=3, start=1.0, end=2.0, metrics={"loss": 0.5}, num_examples=n)


@pytest.mark.parametrize("total", [0, 1, 2, 7, 1438])
@pytest.mark.parametrize("count", [1, 2, 3, 5])
def test_example_share_is_what_shard_data_gives_each_sharer(total, count):
    data = list(range(total))
    assert [example_share(total, i, count) for i in range(count)] == [len(shard_data(data, i, count))
                                                                      for i in range(count)]


def test_rows_of_a_replicated_gang_carry_each_workers_share_of_the_examples():
    # workers 3 and 5 share partition 0's pass (every 2nd example each): 1,437 examples are 719 + 718
    for kind in (TRAIN, EVAL):
        unit = Unit(0, 1, 0, kind)
        rows = Flight(Assignment(unit, workers=(3, 5)), 0.0, group=7).rows(_report(unit, 1437))
        assert [(r.worker, r.group, r.num_examples) for r in rows] == [(3, 7, 719), (5, 7, 718)]
        assert all(r.unit == unit and r.metrics == {"loss": 0.5} for r in rows)


def test_rows_of_a_gang_over_partitions_count_each_partitions_examples_once():
    # workers 3 and 5 share partition 0, worker 4 trains partition 2 alone
    a = Assignment(Unit(0, 1, 0), workers=(3, 4, 5), partitions=(0, 2, 0))
    f = Flight(a, 0.0, group=2)
    shared = f.rows(_report(Unit(0, 1, 0), 5))
    alone = f.rows(_report(Unit(0, 1, 2), 4))
    assert [(r.worker, r.unit.partition, r.num_examples) for r in shared + alone] == [(3, 0, 3), (5, 0, 2),
                                                                                      (4, 2, 4)]


def test_rows_of_a_unit_of_its_own_are_its_report():
    unit = Unit(0, 0, 1)
    report = _report(unit, 9)
    assert Flight(Assignment(unit, workers=(3,)), 0.0).rows(report) == [report]
