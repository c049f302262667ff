"""A driver that tests/integration/test_own_ray.py starts beside a foreign `ray start` cluster: `python -m
tests.integration.own_ray_job WORKDIR` builds a Ray Data dataset first (Ray Data's readers start Ray implicitly), then
runs one selection on it, one on the same Parquet files and one on arrays, and prints as its last line a JSON report
of the Ray they ran on: its GCS address, whether this process started it, Ray's dashboard URL, the ports the
process of Ray's dashboard listens on, Ray's own processes, and those the record for `modelhopper cleanup` lists."""

from __future__ import annotations

import json
import os
import sys

import psutil

import automl
import framework
from framework.cluster import orphans
from framework.examples import arrays_as_parquet, classifier_step_fn, digits_arrays, mlp_model_fn

SPACE = {"hidden": [16], "lr": [0.1], "batch_size": [64]}


def _report() -> dict:
    import ray

    node = ray._private.worker._global_node
    listens = []
    for proc in psutil.Process().children(recursive=True):
        if "dashboard/dashboard.py" in " ".join(proc.cmdline()):
            listens += [c.laddr.port for c in proc.net_connections(kind="inet") if c.status == psutil.CONN_LISTEN]
    with open(orphans._record_path(os.getpid())) as f:
        recorded = [pid for pid, _ in json.load(f)["processes"]]
    return {"gcs": node.gcs_address, "started_here": node.head, "webui_url": node.address_info.get("webui_url"),
            "dashboard_listens": listens, "ray_processes": [p.process.pid for ps in node.all_processes.values()
                                                            for p in ps], "recorded": recorded}


def main(workdir: str) -> None:
    import ray.data  # (after framework, as a program that uses modelhopper imports it)

    x, y = digits_arrays()
    data = os.path.join(workdir, "data")
    arrays_as_parquet(data, x[:300], y[:300])
    train, valid = ray.data.read_parquet(f"{data}/train"), ray.data.read_parquet(f"{data}/valid")  # Ray starts here
    datasets = {
        "ray": framework.PartitionedDataset.from_ray_dataset(train, 2, valid=valid),
        "parquet": framework.PartitionedDataset.from_parquet(f"{data}/train", f"{data}/valid", num_partitions=2),
        "arrays": framework.PartitionedDataset.from_arrays(x[:300], y[:300], num_partitions=2),
    }
    for kind, ds in datasets.items():
        framework.ModelSelection(
            mlp_model_fn, step_fn=classifier_step_fn, dataset=ds, procedure=automl.GridSearch(SPACE, epochs=1),
            num_workers=2, seed=0, storage_path=os.path.join(workdir, kind), progress=False,
        ).run()
    print(json.dumps(_report()), flush=True)


if __name__ == "__main__":
    main(sys.argv[1])
