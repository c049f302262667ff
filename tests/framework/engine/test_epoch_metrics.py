"""A config's epoch metrics: example-weighted means of its units' metrics, train_ and valid_ kept apart."""

from __future__ import annotations

import pytest

from framework.scheduling import EVAL, TRAIN, Unit
from framework.scheduling.units import UnitReport, epoch_metrics


def _report(partition: int, kind: str, n: int, **metrics: float) -> UnitReport:
    return UnitReport(Unit(0, 0, partition, kind), worker=0, start=0.0, end=1.0, metrics=metrics, num_examples=n)


def test_epoch_metrics_weights_train_and_eval_units_by_their_examples():
    reports = [
        _report(0, TRAIN, 10, loss=1.0, accuracy=0.5),
        _report(1, TRAIN, 30, loss=3.0, accuracy=0.9),
        _report(2, EVAL, 1, loss=4.0, accuracy=0.0),
        _report(3, EVAL, 3, loss=2.0, accuracy=1.0),
    ]
    got = epoch_metrics(reports)
    # unweighted means would be train 2.0 / 0.7 and valid 3.0 / 0.5
    assert got == pytest.approx(
        {"train_loss": 2.5, "train_accuracy": 0.8, "valid_loss": 2.5, "valid_accuracy": 0.75}, rel=1e-12
    )
    assert set(got) == {"train_loss", "train_accuracy", "valid_loss", "valid_accuracy"}


def test_epoch_metrics_does_not_depend_on_report_order():
    reports = [_report(0, EVAL, 2, loss=1.0), _report(1, TRAIN, 5, loss=7.0), _report(2, EVAL, 6, loss=5.0)]
    assert (
        epoch_metrics(reports) == epoch_metrics(reports[::-1]) == pytest.approx({"train_loss": 7.0, "valid_loss": 4.0})
    )


def test_epoch_metrics_without_eval_units_has_no_valid_keys():
    assert epoch_metrics([_report(0, TRAIN, 4, loss=2.0), _report(1, TRAIN, 12, loss=6.0)]) == {"train_loss": 5.0}


def test_epoch_metrics_skips_a_kind_whose_units_saw_no_examples():
    assert epoch_metrics([_report(0, TRAIN, 0, loss=1.0), _report(1, EVAL, 8, loss=3.0)]) == {"valid_loss": 3.0}
    assert epoch_metrics([]) == {}
