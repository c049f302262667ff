"""Bad input is rejected at construction, before any work (and before Ray starts), with a message naming it."""

from __future__ import annotations

import os

import numpy as np
import pytest

import automl
import framework
from framework.examples import classifier_eval_fn, classifier_train_fn, mlp_model_fn

X = np.random.default_rng(0).standard_normal((100, 4)).astype(np.float32)
Y = (X[:, 0] > 0).astype(np.int64)


def _make(**overrides):
    kw = dict(
        model_fn=mlp_model_fn, train_fn=classifier_train_fn, eval_fn=classifier_eval_fn,
        dataset=framework.PartitionedDataset.from_arrays(X, Y, num_partitions=2),
        procedure=automl.GridSearch({"lr": [0.1]}, epochs=1), progress=False,
    )
    kw.update(overrides)
    return framework.ModelSelection(**kw)


def test_validation_rejects_more_workers_than_partitions():
    with pytest.raises(ValueError, match=r"`num_workers` is 3, but must be <= the number of partitions \(2\)"):
        _make(num_workers=3)


def test_validation_rejects_non_callable_functions():
    with pytest.raises(TypeError, match="`train_fn` is 5, but must be callable"):
        _make(train_fn=5)


def test_validation_rejects_unknown_scheduler():
    with pytest.raises(ValueError, match="`scheduler` is 'fifo', but must be one of"):
        _make(scheduler="fifo")


def test_validation_rejects_unknown_mode():
    with pytest.raises(ValueError, match="`mode` is 'lowest', but must be one of"):
        _make(mode="lowest")


def test_validation_rejects_unknown_executor():
    with pytest.raises(ValueError, match="`executor` is 'dask'"):
        _make(executor="dask")


def test_validation_rejects_metric_without_prefix():
    with pytest.raises(ValueError, match="`metric` is 'loss'"):
        _make(metric="loss")


def test_validation_rejects_non_procedure():
    with pytest.raises(TypeError, match="`procedure` is"):
        _make(procedure=object())


def test_validation_rejects_empty_space():
    with pytest.raises(ValueError, match="`space` is {}"):
        automl.GridSearch({}, epochs=1)


def test_validation_rejects_empty_value_list():
    with pytest.raises(ValueError, match=r"`space\['lr'\]` is \[\]"):
        automl.GridSearch({"lr": []}, epochs=1)


def test_validation_rejects_no_partitions():
    with pytest.raises(ValueError, match="`train` has 0 partitions"):
        framework.PartitionedDataset.from_files(train=[], valid=[])


def test_validation_rejects_too_many_partitions_for_rows():
    with pytest.raises(ValueError, match="`num_partitions` is 90"):
        framework.PartitionedDataset.from_arrays(X, Y, num_partitions=90)


def test_validation_rejects_negative_resources():
    with pytest.raises(ValueError, match=r"`worker_resources\['CPU'\]` is -1"):
        _make(worker_resources={"CPU": -1})


def test_validation_rejects_existing_run_directory(tmp_path):
    (tmp_path / "run.db").write_text("")
    with pytest.raises(FileExistsError, match="already holds a run"):
        _make(storage_path=str(tmp_path))


def test_validation_rejects_faults_that_are_not_a_fault_plan():
    with pytest.raises(TypeError, match="`faults` is \\[\\], but must be a framework.engine.faults.FaultPlan or None"):
        _make(faults=[])


def test_resume_refuses_to_guess_a_scheduler_instance(tmp_path):
    from framework.engine.catalog import SQLiteCatalog

    catalog = SQLiteCatalog(str(tmp_path / "run.db"))
    catalog.set_meta(scheduler="MyScheduler", extract=None)
    catalog.close()
    with pytest.raises(ValueError, match="used the scheduler instance 'MyScheduler'.*pass `scheduler=`"):
        framework.ModelSelection.resume(str(tmp_path), mlp_model_fn, classifier_train_fn, classifier_eval_fn,
                                        procedure=automl.GridSearch({"lr": [0.1]}, epochs=1))


@pytest.mark.parametrize("bad", [0, -1, 1.5, True])
def test_validation_rejects_a_queue_depth_that_is_not_a_positive_int(bad):
    with pytest.raises(ValueError, match=rf"`queue_depth` is {bad!r}, but must be an int >= 1"):
        _make(queue_depth=bad)


@pytest.mark.parametrize("bad", ["epochs", 0, -5.0, True])
def test_validation_rejects_an_unknown_checkpoint_policy(bad):
    with pytest.raises(ValueError, match=r"`checkpoint` is .*, but must be one of \['epoch', 'unit', 'off'\]"):
        _make(checkpoint=bad)


def test_validation_rejects_a_data_on_device_that_is_not_a_bool():
    with pytest.raises(TypeError, match=r"`data_on_device` is 'yes', but must be True or False"):
        _make(data_on_device="yes")


def test_a_run_without_storage_path_gets_a_named_folder_under_the_storage_root(monkeypatch, tmp_path):
    monkeypatch.setenv("MODELHOPPER_STORAGE", str(tmp_path))
    sel = _make()
    folder = os.path.basename(sel.storage_path)
    assert os.path.dirname(sel.storage_path) == str(tmp_path)
    assert folder.startswith(type(sel.procedure).__name__.lower() + "-")
    assert _make(name="my-run").storage_path == str(tmp_path / "my-run")
    with pytest.raises(ValueError, match=r"`name` is 'a/b', but must be a non-empty folder name"):
        _make(name="a/b")
