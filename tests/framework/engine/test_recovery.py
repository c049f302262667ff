"""The driver's recovery rules, with numbers alone: retries, units to redo after a restore, units kept on resume."""

from __future__ import annotations

from framework.engine.recovery import resume_units, should_retry, units_to_redo
from framework.scheduling import EVAL, TRAIN, Unit


def test_should_retry_up_to_max_retries_then_fail():
    assert [should_retry(f, 2) for f in (1, 2, 3)] == [True, True, False]
    assert should_retry(1, 0) is False  # no retries: the first failure fails the config


def test_units_to_redo_are_the_epochs_partitions_the_checkpoint_lacks():
    mirror = {0: [1, 0], 1: [2, 0, 1]}
    restored = {0: [1, 0], 1: [2]}
    assert units_to_redo(mirror, restored, epoch=1, behind=2) == [0, 1]  # in the order they were absorbed


def test_units_to_redo_nothing_when_the_checkpoint_is_current():
    assert units_to_redo({0: [0, 1]}, {0: [0, 1]}, epoch=0, behind=0) == []
    assert units_to_redo({}, {}, epoch=0, behind=0) == []  # lost before the config's first unit


def test_units_to_redo_none_when_the_loss_crosses_a_committed_epoch():
    # the checkpoint lacks epoch 0's last unit too: 2 units behind, only 1 of them in the current epoch
    assert units_to_redo({0: [0, 1], 1: [1]}, {0: [0]}, epoch=1, behind=2) is None
    # the driver saw nothing of epoch 1 yet, but the checkpoint is a unit behind
    assert units_to_redo({0: [0, 1]}, {0: [0]}, epoch=1, behind=1) is None


def test_resume_units_keeps_only_what_the_checkpoint_absorbed():
    logged = [(10, Unit(3, 1, 0, TRAIN)), (11, Unit(3, 1, 1, TRAIN)), (12, Unit(3, 1, 2, TRAIN))]
    kept, lost, todo = resume_units(3, 1, [0, 1, 2], absorbed=[0, 1], logged=logged)
    assert (kept, lost) == ([10, 11], [12])  # unit 12 was logged, but its checkpoint never reached the disk
    assert todo == [Unit(3, 1, 2, TRAIN), Unit(3, 1, 0, EVAL), Unit(3, 1, 1, EVAL), Unit(3, 1, 2, EVAL)]


def test_resume_units_keeps_evals_only_of_a_complete_epoch():
    logged = [(1, Unit(0, 2, 0, TRAIN)), (2, Unit(0, 2, 1, TRAIN)), (3, Unit(0, 2, 1, EVAL))]
    kept, lost, todo = resume_units(0, 2, [1, 0], absorbed=[1, 0], logged=logged)
    assert (kept, lost) == ([1, 2, 3], [])
    assert todo == [Unit(0, 2, 0, EVAL)]
    # the same eval row when the checkpoint missed a partition: the eval saw weights that are gone
    kept, lost, todo = resume_units(0, 2, [0, 1], absorbed=[0], logged=logged)
    assert (kept, lost) == ([1], [2, 3])
    assert todo == [Unit(0, 2, 1, TRAIN), Unit(0, 2, 0, EVAL), Unit(0, 2, 1, EVAL)]


def test_resume_units_with_nothing_logged_runs_the_whole_epoch():
    kept, lost, todo = resume_units(5, 0, [0, 1], absorbed=[], logged=[])
    assert (kept, lost) == ([], [])
    assert todo == [Unit(5, 0, 0, TRAIN), Unit(5, 0, 1, TRAIN), Unit(5, 0, 0, EVAL), Unit(5, 0, 1, EVAL)]
