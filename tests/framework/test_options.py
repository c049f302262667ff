"""`RunOptions`: one record of a run's options, with one set of defaults, validated wherever it is built."""

from __future__ import annotations

import dataclasses
import inspect
import json
import os
import re
import subprocess
import sys

import numpy as np
import pytest

import automl
import framework
from framework.examples import classifier_eval_fn, classifier_train_fn, mlp_model_fn
from framework.options import RECORDED, RESUMABLE, RunOptions
from framework.scheduling import RandomizedScheduler
from framework.store.catalog import SQLiteCatalog

X = np.random.default_rng(0).standard_normal((100, 4)).astype(np.float32)
Y = (X[:, 0] > 0).astype(np.int64)
FNS = (mlp_model_fn, classifier_train_fn, classifier_eval_fn)


def _dataset(partitions: int = 2) -> framework.PartitionedDataset:
    return framework.PartitionedDataset.from_arrays(X, Y, num_partitions=partitions)


def _grid() -> automl.GridSearch:
    return automl.GridSearch({"lr": [0.1]}, epochs=1)


def _selection(tmp_path, **options) -> framework.ModelSelection:
    return framework.ModelSelection(*FNS, _dataset(), _grid(), storage_path=str(tmp_path / "run"), progress=False,
                                    **options)


def test_model_selection_options_are_run_options_defaults(tmp_path):
    sel = _selection(tmp_path)
    expected = RunOptions(num_workers=2, storage_path=sel.storage_path, check_metric=True)
    assert sel.options == expected
    assert (sel.queue_depth, sel.checkpoint, sel.scheduler_name, sel.num_workers) == (2, "epoch", "randomized", 2)


def test_model_selection_signature_defaults_are_run_options_defaults():
    params = inspect.signature(framework.ModelSelection).parameters
    defaults = RunOptions()
    for name in RECORDED:
        if name != "worker_resources":  # None there: RunOptions' default, one CPU
            assert params[name].default == getattr(defaults, name), name
    assert params["worker_resources"].default is None and defaults.worker_resources == {"CPU": 1}


def test_model_selection_options_pass_through_validated(tmp_path):
    sel = _selection(tmp_path, queue_depth=1, checkpoint=30, seed=4, worker_resources={"CPU": 2}, max_workers=3)
    assert sel.options == RunOptions(queue_depth=1, checkpoint=30, seed=4, worker_resources={"CPU": 2},
                                     max_workers=3, num_workers=2, storage_path=sel.storage_path, check_metric=True)
    assert sel.num_threads == 2


@pytest.mark.parametrize("option, value, error, match", [
    ("queue_depth", 0, ValueError, r"`queue_depth` is 0, but must be an int >= 1"),
    ("queue_depth", True, ValueError, r"`queue_depth` is True, but must be an int >= 1"),
    ("checkpoint", "epochs", ValueError, r"`checkpoint` is 'epochs', but must be one of \['epoch', 'unit', 'off'\]"),
    ("mode", "lowest", ValueError, r"`mode` is 'lowest', but must be one of \['min', 'max'\]"),
    ("metric", "loss", ValueError, r"`metric` is 'loss', but must name a reported metric"),
    ("executor", "dask", ValueError, r"`executor` is 'dask', but must be one of"),
    ("seed", -1, ValueError, r"`seed` is -1, but must be an int >= 0"),
    ("seed", 1.0, TypeError, r"`seed` is 1.0, but must be an int >= 0"),
    ("scheduler", "fifo", ValueError, r"`scheduler` is 'fifo', but must be one of"),
    ("unit_timeout_s", 0, ValueError, r"`unit_timeout_s` is 0, but must be a finite number > 0 or None"),
    ("max_unit_retries", -1, ValueError, r"`max_unit_retries` is -1, but must be an int >= 0"),
    ("num_workers", -1, ValueError, r"`num_workers` is -1, but must be an int >= 1"),
    ("max_workers", 0, ValueError, r"`max_workers` is 0, but must be an int >= 1 or None"),
    ("worker_resources", {"cpu": 1}, ValueError, r"`worker_resources` has the key 'cpu'.*did you mean 'CPU'"),
    ("freezing", "yes", TypeError, r"`freezing` is 'yes', but must be a dict of options or None"),
    ("deterministic", 1, TypeError, r"`deterministic` is 1, but must be True or False"),
    ("holder_wait_s", 0, ValueError, r"`holder_wait_s` is 0, but must be a number of seconds > 0"),
    ("barrier", "yes", TypeError, r"`barrier` is 'yes', but must be True, False or None"),
])
def test_run_options_reject_an_invalid_value_naming_it(option, value, error, match):
    with pytest.raises(error, match=match):
        RunOptions(**{option: value})


def test_run_options_replace_validates_again():
    with pytest.raises(ValueError, match=r"`queue_depth` is 0, but must be an int >= 1"):
        RunOptions().replace(queue_depth=0)
    assert RunOptions().replace(queue_depth=3).queue_depth == 3


def test_run_options_check_workers_against_each_other():
    with pytest.raises(ValueError, match=r"`max_workers` is 2, but must be an int >= `num_workers` \(3\)"):
        RunOptions(num_workers=3, max_workers=2)
    with pytest.raises(ValueError, match=r"`num_workers` is 2, but executor='sequential' uses exactly 1"):
        RunOptions(executor="sequential", num_workers=2)
    with pytest.raises(ValueError, match=r"`max_workers` is set, but executor='sequential' uses exactly 1 worker"):
        RunOptions(executor="sequential", max_workers=2)


def test_resolve_workers_defaults_to_one_per_partition_and_checks_the_partitions():
    assert RunOptions().resolve_workers(4).num_workers == 4
    assert RunOptions(executor="sequential").resolve_workers(4).num_workers == 1
    assert RunOptions(executor="task_parallel", num_workers=6).resolve_workers(4).num_workers == 6
    with pytest.raises(ValueError, match=r"`num_workers` is 5, but must be <= the number of partitions \(4\)"):
        RunOptions(num_workers=5).resolve_workers(4)
    with pytest.raises(ValueError, match=r"`num_workers` is 0, but must be an int >= 1"):
        RunOptions(num_workers=0).resolve_workers(4)
    with pytest.raises(ValueError, match=r"`max_workers` is 3, but must be an int >= `num_workers` \(4\)"):
        RunOptions(max_workers=3).resolve_workers(4)


def test_to_meta_and_from_meta_round_trip_through_json():
    options = RunOptions(seed=3, metric="valid_acc", mode="max", scheduler="mwr", executor="task_parallel",
                         num_workers=3, worker_resources={"CPU": 2, "GPU": 0.5}, unit_timeout_s=30.0,
                         max_unit_retries=1, max_worker_restarts=5, max_workers=4, freezing={"modules": "children"},
                         deterministic=True, queue_depth=1, checkpoint=12.5, data_on_device=True)
    meta = json.loads(json.dumps(options.to_meta()))
    assert set(meta) == set(RECORDED)
    assert RunOptions.from_meta(meta) == options
    assert RunOptions.from_meta({**meta, "placement": {"0": [0]}, "procedure": "GridSearch"}) == options


def test_to_meta_names_a_scheduler_instance_and_from_meta_asks_for_it_again():
    instance = RandomizedScheduler(seed=0)
    meta = RunOptions(scheduler=instance).to_meta()
    assert meta["scheduler"] == "RandomizedScheduler"
    with pytest.raises(ValueError, match=r"used the scheduler instance 'RandomizedScheduler'.*pass `scheduler=`"):
        RunOptions.from_meta(meta)
    assert RunOptions.from_meta(meta, scheduler=instance).scheduler is instance


def test_from_meta_gives_unrecorded_options_the_defaults():
    old = {"seed": 1, "metric": "valid_loss", "mode": "min", "scheduler": "randomized", "executor": "mop",
           "num_workers": 2, "worker_resources": {"CPU": 1}}  # a run from before queue_depth and checkpoint existed
    options = RunOptions.from_meta(old)
    assert options == RunOptions(seed=1, num_workers=2)
    assert (options.queue_depth, options.checkpoint) == (RunOptions().queue_depth, RunOptions().checkpoint)


def test_from_meta_validates_its_overrides():
    meta = RunOptions(num_workers=2).to_meta()
    assert RunOptions.from_meta(meta, queue_depth=4, checkpoint="unit").queue_depth == 4
    with pytest.raises(ValueError, match=r"`queue_depth` is 0, but must be an int >= 1"):
        RunOptions.from_meta(meta, queue_depth=0)
    with pytest.raises(ValueError, match=r"`worker_resources\['GPU'\]` is -1, but must be a finite number >= 0"):
        RunOptions.from_meta(meta, worker_resources={"GPU": -1})


@pytest.mark.parametrize("option", ["seed", "executor", "num_workers", "max_workers", "storage_path", "nonsense"])
def test_from_meta_rejects_an_option_a_resume_may_not_change_naming_the_allowed_ones(option):
    allowed = re.escape(str(sorted(RESUMABLE)))
    with pytest.raises(TypeError, match=rf"unknown options \['{option}'\] for resume\(\); allowed: {allowed}"):
        RunOptions.from_meta(RunOptions().to_meta(), **{option: 1})


def _old_run(path: str) -> None:
    """A run directory whose meta predates `queue_depth` and `checkpoint` (and the failure handling options)."""
    dataset = _dataset()
    catalog = SQLiteCatalog(os.path.join(path, "run.db"))
    catalog.set_meta(seed=0, executor="mop", scheduler="randomized", num_workers=2, worker_resources={"CPU": 1},
                     metric="valid_loss", mode="min", placement={"0": [0], "1": [1]}, freezing=None, extract=None,
                     dataset=dataset.save(os.path.join(path, "data")))
    catalog.close()


def test_resume_of_a_run_that_recorded_no_queue_depth_or_checkpoint_gets_the_defaults(tmp_path, monkeypatch):
    monkeypatch.setenv("MODELHOPPER_STORAGE", str(tmp_path / "root"))
    _old_run(str(tmp_path))
    sel = framework.ModelSelection.resume(str(tmp_path), *FNS, procedure=_grid(), progress=False)
    defaults = RunOptions()
    assert (sel.queue_depth, sel.checkpoint) == (defaults.queue_depth, defaults.checkpoint)
    assert sel.options == RunOptions(num_workers=2, storage_path=str(tmp_path), check_metric=True)
    resumed = framework.ModelSelection.resume(str(tmp_path), *FNS, procedure=_grid(), progress=False, queue_depth=1,
                                              checkpoint="unit", max_worker_restarts=7)
    assert (resumed.queue_depth, resumed.checkpoint, resumed.max_worker_restarts) == (1, "unit", 7)


def test_resume_validates_its_overrides(tmp_path, monkeypatch):
    monkeypatch.setenv("MODELHOPPER_STORAGE", str(tmp_path / "root"))
    _old_run(str(tmp_path))
    with pytest.raises(ValueError, match=r"`queue_depth` is 0, but must be an int >= 1"):
        framework.ModelSelection.resume(str(tmp_path), *FNS, procedure=_grid(), queue_depth=0)
    with pytest.raises(TypeError, match=r"unknown options \['seed'\] for resume\(\)"):
        framework.ModelSelection.resume(str(tmp_path), *FNS, procedure=_grid(), seed=1)


def test_run_options_field_defaults_are_documented_once():
    """Every field has a default (one record, one set of defaults) and a line in the class docstring."""
    doc = RunOptions.__doc__ or ""
    for f in dataclasses.fields(RunOptions):
        assert f.default is not dataclasses.MISSING or f.default_factory is not dataclasses.MISSING, f.name
        assert f"{f.name}:" in doc or f"{f.name}," in doc, f.name


def test_options_module_needs_neither_torch_nor_ray():
    code = ("import sys, framework.options as o; o.RunOptions().resolve_workers(2).to_meta();"
            "assert not {'torch', 'ray'} & set(sys.modules), sorted({'torch', 'ray'} & set(sys.modules))")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr


def test_run_options_is_public():
    assert framework.RunOptions is RunOptions


def test_selection_module_stays_at_most_300_lines():
    path = os.path.join(os.path.dirname(framework.__file__), "selection.py")
    with open(path) as f:
        lines = f.read().splitlines()
    assert len(lines) <= 300, f"framework/selection.py has {len(lines)} lines"
