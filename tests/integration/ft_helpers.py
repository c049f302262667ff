"""What the fault-tolerance tests share: small selections with a fault plan, the checks that nothing was lost and
nothing counted twice, and a driver crashed on purpose in a subprocess (tests/integration/resume_job.py) on the
session's Ray."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time

import pandas as pd
import pytest

import automl
import framework
from framework.store.catalog import SQLiteCatalog
from simulators import validate_schedule
from tests.integration.ft_functions import classifier_eval_fn, classifier_train_fn, mlp_model_fn

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SPACE = {"hidden": [16], "lr": [0.05, 0.1, 0.2], "batch_size": [64]}


def _dataset(digits, rows=300, partitions=2, replicas=1):
    x, y = digits
    return framework.PartitionedDataset.from_arrays(x[:rows], y[:rows], num_partitions=partitions, seed=0,
                                                    replicas=replicas)


def _select(ds, storage, faults, space=SPACE, epochs=2, train_fn=classifier_train_fn, **options):
    options.setdefault("num_workers", ds.num_partitions)
    return framework.ModelSelection(
        mlp_model_fn, train_fn, classifier_eval_fn, ds, automl.GridSearch(space, epochs=epochs),
        storage_path=str(storage), progress=False, faults=faults, **options,
    )


def _events(result, kind):
    ev = result.events[result.events.kind == kind]
    return [json.loads(d) for d in ev.detail]


def _units_log(result) -> pd.DataFrame:
    catalog = SQLiteCatalog(os.path.join(result.storage_path, "run.db"))
    try:
        return catalog.units(status=None)
    finally:
        catalog.close()


def _assert_nothing_lost_or_counted_twice(result, partitions, epochs, configs=None, availability=None):
    """Each finished config absorbed every partition exactly once per epoch (its weights say so, and so does the
    log); each unit has one `done` row; every epoch's metrics are the example-weighted means of those rows; and
    every config's completeness proof (its state's visit record) agrees with the log (`Result.assert_complete`)."""
    configs = sorted(result.configs) if configs is None else configs
    report = validate_schedule(result.schedule, availability=availability, partitions=partitions)
    assert report.ok, report.violations
    done = _units_log(result).query("status == 'done'")
    assert not done.duplicated(["config_id", "epoch", "partition", "kind"]).any()
    for cid in configs:
        visited = result.load_state(cid)["visited"]
        assert {e: sorted(ps) for e, ps in visited.items()} == {e: partitions for e in range(epochs)}, cid
        assert sorted(result.metrics[result.metrics.config_id == cid].epoch) == list(range(epochs))
        for e in range(epochs):
            rows = done[(done.config_id == cid) & (done.epoch == e) & (done.kind == "train")]
            assert sorted(rows.partition) == partitions
            losses = [json.loads(m)["loss"] for m in rows.metrics]
            expect = sum(v * n for v, n in zip(losses, rows.num_examples)) / rows.num_examples.sum()
            got = result.metrics.set_index(["config_id", "epoch"]).loc[(cid, e), "train_loss"]
            assert got == pytest.approx(expect, rel=1e-9), (cid, e)
    result.assert_complete()


def _unit(cid, epoch, partition, kind="train"):
    return str(framework.scheduling.Unit(cid, epoch, partition, kind))



def _crash_driver(tmp_path, crash, checkpoint="unit"):
    """Run tests/integration/resume_job.py in a subprocess that crashes itself at `crash`; return its storage."""
    return _start_crash_driver(tmp_path, crash, checkpoint)()


def _start_crash_driver(tmp_path, crash, checkpoint="unit"):
    """`_crash_driver` started, not waited for (several crash at once, sharing the CPUs' idle moments); `wait()` on
    what it returns waits for the crash as `_crash_driver` does and returns the storage."""
    storage = str(tmp_path / f"crashed-{crash}")
    env = {**os.environ, "RAY_ADDRESS": ray_cluster_address(),
           "PYTHONPATH": ROOT + os.pathsep + os.environ.get("PYTHONPATH", "")}
    err = tempfile.TemporaryFile("w+")  # (not in tmp_path: a caller may list it as a folder of runs)
    proc = subprocess.Popen([sys.executable, "-m", "tests.integration.resume_job", storage, crash, checkpoint],
                            cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=err, text=True)
    deadline = time.monotonic() + 300

    def wait():
        try:
            returncode = proc.wait(timeout=max(1.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
            raise
        finally:
            err.seek(0)
            stderr = err.read()
            err.close()
        assert returncode == -9, f"the driver was not killed by its fault ({returncode}):\n{stderr[-3000:]}"
        return storage

    return wait


def ray_cluster_address(cpus: int = 1):
    """The address of the session's Ray, for a driver in a subprocess to attach to whose workers take `cpus` CPUs.
    As many of this process's spare worker actors as it takes for that many to be free are killed first (the
    subprocess cannot take them); the others stay for this process's next runs. Drivers started together ask for
    their sum once, before the first starts (its workers are not yet counted in what Ray reports taken)."""
    import ray

    from framework.engine.ray_backend import release_spare_workers

    release_spare_workers({"CPU": cpus})
    return ray.get_runtime_context().gcs_address


def _checkpoint_paths(storage):
    """Each config's latest checkpoint, as the catalog resolves it."""
    catalog = SQLiteCatalog(os.path.join(storage, "run.db"), readonly=True)
    try:
        return [catalog.checkpoints(int(cid))[0][2] for cid in catalog.configs().config_id]
    finally:
        catalog.close()


def _resume(storage):
    return framework.ModelSelection.resume(
        storage, mlp_model_fn, classifier_train_fn, classifier_eval_fn, progress=False).run()
