"""The schedule validator, oracle of the scheduling tests: one valid schedule, then one broken invariant per test."""

from __future__ import annotations

import pandas as pd
import pytest

from simulators import validate_schedule
from simulators.validate import COLUMNS

# partition 0 on worker 0, partition 1 on worker 1, validation partition 2 on both
AVAILABILITY = {0: [0], 1: [1], 2: [0, 1]}


def _frame(rows: list[tuple]) -> pd.DataFrame:
    return pd.DataFrame(rows, columns=COLUMNS)


def _valid() -> pd.DataFrame:
    """2 configs x 2 epochs on 2 workers, every unit touching the next one (end == next start)."""
    return _frame(
        [
            # config, epoch, partition, worker, kind, start, end
            (0, 0, 0, 0, "train", 0.0, 1.0),
            (0, 0, 1, 1, "train", 1.0, 2.0),
            (0, 0, 2, 0, "eval", 2.0, 2.5),
            (1, 0, 1, 1, "train", 0.0, 1.0),
            (1, 0, 0, 0, "train", 1.0, 2.0),
            (1, 0, 2, 1, "eval", 2.0, 2.5),
            (0, 1, 0, 0, "train", 2.5, 3.5),
            (0, 1, 1, 1, "train", 3.5, 4.5),
            (1, 1, 1, 1, "train", 2.5, 3.5),
            (1, 1, 0, 0, "train", 3.5, 4.5),
        ]
    )


def _only_violation(df: pd.DataFrame, **kwargs) -> str:
    report = validate_schedule(df, **kwargs)
    assert not report.ok and not report
    assert len(report.violations) == 1, report.violations
    return report.violations[0]


def test_validate_accepts_valid_schedule_with_touching_units():
    report = validate_schedule(_valid(), AVAILABILITY, partitions=[0, 1], eval_partitions=[2])
    assert report.ok and bool(report) and report.violations == ()
    assert report.makespan == 4.5


def test_validate_makespan_is_last_end_minus_first_start():
    df = _valid().assign(start=lambda d: d["start"] + 10.0, end=lambda d: d["end"] + 10.0)
    assert validate_schedule(df).makespan == 4.5


def test_validate_touching_intervals_on_one_worker_and_one_config_are_not_overlaps():
    df = _frame([(0, 0, 0, 0, "train", 0.0, 1.0), (0, 0, 1, 0, "train", 1.0, 2.0), (1, 0, 0, 0, "train", 2.0, 3.0),
                 (1, 0, 1, 0, "train", 3.0, 4.0)])  # fmt: skip
    assert validate_schedule(df, {0: [0], 1: [0]}).ok


def test_validate_flags_overlap_just_beyond_tolerance():
    df = _frame([(0, 0, 0, 0, "train", 0.0, 1.0), (1, 0, 0, 0, "train", 1.0 - 1e-6, 2.0)])
    assert "overlap" in _only_violation(df)
    assert validate_schedule(df, tol=1e-3).ok


def test_validate_flags_worker_exclusivity():
    # two configs on worker 0 at once; each config alone is fine
    df = _frame([(0, 0, 0, 0, "train", 0.0, 1.0), (1, 0, 0, 0, "train", 0.5, 1.5)])
    assert validate_schedule(df.assign(start=[0.0, 1.0], end=[1.0, 2.0])).ok
    msg = _only_violation(df)
    assert msg.startswith("worker 0:") and "overlap" in msg


def test_validate_flags_model_isolation():
    # config 0 on two workers at once; each worker alone is fine
    df = _frame([(0, 0, 0, 0, "train", 0.0, 1.0), (0, 0, 1, 1, "train", 0.5, 1.5)])
    assert validate_schedule(df.assign(start=[0.0, 1.0], end=[1.0, 2.0])).ok
    msg = _only_violation(df)
    assert msg.startswith("config_id 0:") and "overlap" in msg


def test_validate_flags_duplicated_training_partition():
    df = _frame([(0, 0, 0, 0, "train", 0.0, 1.0), (0, 0, 0, 0, "train", 1.0, 2.0), (0, 0, 1, 1, "train", 2.0, 3.0)])
    msg = _only_violation(df)
    assert "config 0 epoch 0" in msg and "duplicated [0], missing [], unknown []" in msg


def test_validate_flags_missing_training_partition():
    # config 1 visits partitions 0 and 1, so config 0 lacks partition 1
    df = _valid()
    df = df.drop(df.index[(df["config_id"] == 0) & (df["epoch"] == 1) & (df["partition"] == 1)])
    msg = _only_violation(df)
    assert "config 0 epoch 1" in msg and "duplicated [], missing [1], unknown []" in msg


def test_validate_flags_missing_partition_against_given_partitions():
    df = _frame([(0, 0, 0, 0, "train", 0.0, 1.0)])
    assert validate_schedule(df).ok  # partition 1 never appears: only `partitions` can tell it is missing
    assert "missing [1]" in _only_violation(df, partitions=[0, 1])


def test_validate_flags_unknown_training_partition():
    df = _valid()
    assert validate_schedule(df, partitions=[0, 1]).ok
    msgs = validate_schedule(df, partitions=[0]).violations
    assert len(msgs) == 4 and all("missing [], unknown [1]" in m for m in msgs)  # 2 configs x 2 epochs


def test_validate_flags_eval_partition_evaluated_twice():
    df = _frame([(0, 0, 0, 0, "train", 0.0, 1.0), (0, 0, 2, 0, "eval", 1.0, 1.5), (0, 0, 2, 1, "eval", 1.5, 2.0)])
    assert validate_schedule(df.assign(partition=[0, 2, 3])).ok
    assert _only_violation(df) == "config 0 epoch 0: an eval partition evaluated twice"


def test_validate_flags_eval_before_training_ended():
    # the eval unit runs between the config's two training units, overlapping nothing
    df = _frame([(0, 0, 0, 0, "train", 0.0, 1.0), (0, 0, 2, 1, "eval", 1.0, 1.5), (0, 0, 1, 1, "train", 1.5, 2.5)])
    assert validate_schedule(df.assign(start=[0.0, 2.5, 1.0], end=[1.0, 3.0, 2.5])).ok
    assert _only_violation(df) == "config 0 epoch 0: eval started before training finished"


def test_validate_flags_epoch_order():
    # config 0 starts epoch 1 on worker 0 while its epoch 0 still has a unit to run on worker 1
    df = _frame([(0, 0, 0, 0, "train", 0.0, 1.0), (0, 1, 0, 0, "train", 1.0, 2.0), (0, 0, 1, 1, "train", 2.0, 3.0),
                 (0, 1, 1, 1, "train", 3.0, 4.0)])  # fmt: skip
    assert validate_schedule(df.assign(epoch=[0, 0, 1, 1], partition=[0, 1, 0, 1], worker=[0, 1, 0, 1])).ok
    assert _only_violation(df) == "config 0: epoch 1 starts before epoch 0 ends"


def test_validate_flags_unit_on_worker_without_its_partition():
    df = _valid()
    df.loc[(df["config_id"] == 0) & (df["epoch"] == 1) & (df["partition"] == 1), "worker"] = 0
    df.loc[(df["config_id"] == 1) & (df["epoch"] == 1) & (df["partition"] == 0), "worker"] = 1
    assert validate_schedule(df).ok  # no overlap: only the availability map rules it out
    msgs = validate_schedule(df, AVAILABILITY).violations
    assert sorted(msgs) == [
        "config 0: partition 1 ran on worker 0, not a holder",
        "config 1: partition 0 ran on worker 1, not a holder",
    ]


def test_validate_flags_row_ending_before_it_starts():
    df = _frame([(0, 0, 0, 0, "train", 0.0, 1.0), (0, 0, 1, 1, "train", 2.0, 1.5)])
    assert _only_violation(df) == "1 rows end before they start"


def test_validate_flags_eval_partitions_mismatch():
    df = _valid()
    assert validate_schedule(df, eval_partitions=[2]).ok
    msgs = validate_schedule(df, eval_partitions=[2, 3]).violations
    assert msgs == (
        "config 0 epoch 0: evaluated on [2], expected [2, 3]",
        "config 1 epoch 0: evaluated on [2], expected [2, 3]",
    )


def test_validate_raise_on_error_raises_value_error_naming_the_violation():
    df = _frame([(0, 0, 0, 0, "train", 0.0, 1.0), (1, 0, 0, 0, "train", 0.5, 1.5)])
    with pytest.raises(ValueError, match="invalid schedule: worker 0"):
        validate_schedule(df, raise_on_error=True)
    assert validate_schedule(_valid(), raise_on_error=True).ok


def test_validate_reads_csv_path(tmp_path):
    path = tmp_path / "schedule.csv"
    _frame([(0, 0, 0, 0, "train", 0.0, 1.0), (1, 0, 0, 0, "train", 0.5, 1.5)]).to_csv(path, index=False)
    assert not validate_schedule(path).ok and validate_schedule(str(path)).makespan == 1.5


def test_validate_rejects_frame_without_required_columns():
    with pytest.raises(ValueError, match="worker"):
        validate_schedule(_valid().drop(columns=["worker"]))
