"""Bad input is rejected at construction, before any work (and before Ray starts), with a message naming it."""

from __future__ import annotations

import math
import os
import re

import numpy as np
import pytest
import torch

import automl
import framework
from framework.examples import classifier_eval_fn, classifier_train_fn, mlp_model_fn
from framework.store.storage import StorageUnreachableError

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


def _step(model, batch, config):
    return torch.nn.functional.cross_entropy(model(batch[0]), batch[1])


@pytest.mark.parametrize(("kwargs", "message"), [
    ({"train_fn": None}, r"`train_fn` and `step_fn` are both None, but a config trains by one of them"),
    ({"step_fn": _step}, r"`train_fn` and `step_fn` are both given, but one does what the other does"),
    ({"train_fn": None, "step_fn": _step, "eval_step": _step},
     r"`eval_fn` and `eval_step` are both given, but one does what the other does"),
    ({"eval_fn": None}, r"`eval_fn` is None, and there is no `eval_step` or `step_fn` to evaluate with"),
    ({"train_fn": None, "step_fn": "loss"}, r"`step_fn` is 'loss', but must be callable or None"),
])
def test_validation_names_a_missing_or_doubled_training_or_evaluation(kwargs, message):
    with pytest.raises(TypeError, match=message):
        _make(**kwargs)


def test_a_step_fn_alone_trains_and_evaluates():
    sel = _make(train_fn=None, eval_fn=None, step_fn=_step)
    assert sel.step_fn is _step and sel.train_fn is None and sel.eval_fn is None


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
    from framework.store.catalog import SQLiteCatalog

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
    with pytest.raises(TypeError, match=r"`data_on_device` is 'yes', but must be None \(on a GPU when it fits\), True "
                                        r"or False"):
        _make(data_on_device="yes")


def test_a_run_without_storage_path_gets_a_named_folder_under_the_storage_root(monkeypatch, tmp_path):
    monkeypatch.setenv("MODELHOPPER_STORAGE", str(tmp_path))
    sel = _make()
    folder = os.path.basename(sel.storage_path)
    assert os.path.dirname(sel.storage_path) == str(tmp_path)
    assert folder.startswith(type(sel.procedure).__name__.lower() + "-")
    assert _make(name="my-run").storage_path == str(tmp_path / "my-run")
    with pytest.raises(ValueError, match=r"`name` is 'a/b', but must be a folder name"):
        _make(name="a/b")


@pytest.mark.parametrize("name, holds", [("run-\udcff", "'\\\\udcff'"), ("run\x1b[31m", "'\\\\x1b'"),
                                         ("a\nb", "'\\\\n'"), ("nul\x00", "'\\\\x00'")])
def test_validation_rejects_a_name_that_is_not_printable_utf8(monkeypatch, tmp_path, name, holds):
    monkeypatch.setenv("MODELHOPPER_STORAGE", str(tmp_path))
    rule = r"must be a folder name of printable UTF-8 text \(no control characters or lone surrogates\)"
    with pytest.raises(ValueError, match=rf"`name` is {re.escape(repr(name))}, but {rule}.*; it holds {holds}"):
        _make(name=name)
    assert os.listdir(tmp_path) == []


def test_validation_rejects_a_name_longer_than_a_folder_name_may_be(monkeypatch, tmp_path):
    monkeypatch.setenv("MODELHOPPER_STORAGE", str(tmp_path))
    with pytest.raises(ValueError, match=r"`name` is 'ééé.*'\.\.\. \(256 bytes\), but must be a folder name .* "
                                         r"at most 255 bytes"):
        _make(name="é" * 128)  # 128 characters, 256 bytes
    assert _make(name="é" * 127).storage_path == str(tmp_path / ("é" * 127))


@pytest.mark.parametrize("storage_path", ["{tmp}/run-\udcff", "{tmp}/\udcfe\udcff/run", "file://{tmp}/run-\udcff"])
def test_validation_rejects_a_storage_path_that_is_not_utf8(tmp_path, storage_path):
    path = storage_path.format(tmp=tmp_path)
    with pytest.raises(ValueError, match=r"`storage_path` is '.*\\xff.*', but it holds (\\xfe)?\\xff, which is not "
                                         r"UTF-8 text .*, so SQLite cannot open a run's catalog there"):
        _make(storage_path=path)
    assert os.listdir(tmp_path) == []


def test_validation_rejects_an_empty_storage_path():
    with pytest.raises(ValueError, match=r"`storage_path` is '', but must be a non-empty path, a URI or None"):
        _make(storage_path="")


def test_validation_rejects_a_storage_path_that_is_a_file(tmp_path):
    (tmp_path / "a-file").write_text("x")
    with pytest.raises(ValueError, match=r"`storage_path` is '.*a-file', but the run's folder .* cannot be made: it "
                                         r"is a file"):
        _make(storage_path=str(tmp_path / "a-file"))
    with pytest.raises(ValueError, match=r"cannot be made: its parent '.*a-file' is a file"):
        _make(storage_path=str(tmp_path / "a-file" / "run"))


def test_validation_rejects_worker_resources_that_are_not_a_dict():
    with pytest.raises(TypeError, match=r"`worker_resources` is 'CPU', but must be a dict of Ray resource names"):
        _make(worker_resources="CPU")


@pytest.mark.parametrize("bad", [math.nan, math.inf, True, "1"])
def test_validation_rejects_a_resource_amount_that_is_not_a_finite_number(bad):
    with pytest.raises(ValueError, match=rf"`worker_resources\['CPU'\]` is {re.escape(repr(bad))}, but must be a "
                                         r"finite number >= 0"):
        _make(worker_resources={"CPU": bad})


@pytest.mark.parametrize("name", ["cpu", "Gpu"])
def test_validation_rejects_a_lower_case_resource_name_with_a_hint(name):
    import ray

    started = ray.is_initialized()  # an earlier test of the session may have started the shared local Ray
    with pytest.raises(ValueError, match=rf"`worker_resources` has the key '{name}', but Ray resource names are "
                                         rf"case-sensitive: did you mean '{name.upper()}'\?"):
        _make(worker_resources={name: 1})
    assert ray.is_initialized() == started  # refused by the constructor: no Ray started for it


def test_validation_rejects_a_bool_seed():
    with pytest.raises(TypeError, match=r"`seed` is True, but must be an int >= 0"):
        _make(seed=True)


def test_validation_rejects_a_negative_seed():
    with pytest.raises(ValueError, match=r"`seed` is -1, but must be an int >= 0"):
        _make(seed=-1)


def test_validation_rejects_a_bool_num_workers():
    with pytest.raises(ValueError, match=r"`num_workers` is True, but must be an int >= 1"):
        _make(num_workers=True)


@pytest.mark.parametrize("bad", [True, math.inf, math.nan, 0])
def test_validation_rejects_a_unit_timeout_that_is_not_a_finite_positive_number(bad):
    with pytest.raises(ValueError, match=rf"`unit_timeout_s` is {bad!r}, but must be a finite number > 0 or None"):
        _make(unit_timeout_s=bad)


@pytest.mark.parametrize("arg", ["max_unit_retries", "max_worker_restarts"])
def test_validation_rejects_a_bool_retry_count(arg):
    with pytest.raises(ValueError, match=rf"`{arg}` is True, but must be an int >= 0"):
        _make(**{arg: True})


def test_validation_rejects_a_procedure_string_that_needs_options():
    with pytest.raises(TypeError, match=r"`procedure` is 'automl:GridSearch': GridSearch needs the option\(s\) "
                                        r"\['space', 'epochs'\], which were not given; .* procedure_args="):
        _make(procedure="automl:GridSearch")


@pytest.mark.parametrize("procedure", ["grid", "automl:GridSearch", "automl.grid:GridSearch"])
def test_a_procedure_by_name_takes_its_arguments(procedure, tmp_path):
    sel = _make(procedure=procedure, procedure_args={"space": {"lr": [0.1, 0.2]}, "epochs": 2},
                storage_path=str(tmp_path / "run"))
    assert isinstance(sel.procedure, automl.GridSearch) and sel.procedure.planned_epochs() == 4


def test_procedure_args_with_a_missing_or_unknown_option_name_it():
    with pytest.raises(TypeError, match=r"`procedure` is 'grid' with `procedure_args`: GridSearch needs the "
                                        r"option\(s\) \['epochs'\]"):
        _make(procedure="grid", procedure_args={"space": {"lr": [0.1]}})
    with pytest.raises(TypeError, match=r"GridSearch got unknown option\(s\) \['epoch'\]"):
        _make(procedure="grid", procedure_args={"space": {"lr": [0.1]}, "epochs": 1, "epoch": 1})
    with pytest.raises(TypeError, match=r"`procedure_args` is \{'epochs': 1\}, but `procedure` is an instance"):
        _make(procedure_args={"epochs": 1})


def test_validation_rejects_a_procedure_string_that_does_not_import():
    with pytest.raises(ValueError, match=r"`procedure` is 'automl:NoSuchSearch': .* has no attribute"):
        _make(procedure="automl:NoSuchSearch")


def test_validation_rejects_an_unreachable_uri_storage_path():
    # nothing listens on port 9: pyarrow's S3 client gives up after its retries (a few seconds)
    uri = "s3://bucket/runs/x?endpoint_override=127.0.0.1:9&scheme=http&region=us-east-1"
    with pytest.raises(StorageUnreachableError, match=r"`storage_path` is 's3://bucket/runs/x\?.*', but it cannot be "
                                                      r"listed: .*"):
        _make(storage_path=uri)
