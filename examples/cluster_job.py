"""A model selection written as a Ray job: the same script runs on a laptop and on a cluster.

Run directly, it starts an embedded local Ray of its own and trains there:

    python examples/cluster_job.py
    python examples/cluster_job.py --workers 4 --samples 8 --storage-path /shared/runs/random-1

On a cluster (modelhopper and its dependencies installed on every node, in the same Python environment), start Ray
on each node and submit the script as a job from the repository's root. Ray's token authentication keeps others
from running code on your nodes (copy the token to every node and to where you submit from):

    ray get-auth-token --generate                 # once: writes the cluster's token to ~/.ray/auth_token
    export RAY_AUTH_MODE=token                    # on every node, and where you submit from
    ray start --head                              # on the head node
    ray start --address=HEAD:6379                 # on each other node
    ray job submit --working-dir . -- python examples/cluster_job.py --workers 8 --storage-path /shared/runs/job-1

`ray job submit` sets `RAY_ADDRESS` for the script, and the run attaches to that cluster; without `RAY_ADDRESS` (or a
`ray.init(address=...)` of your own before `run()`) it never attaches to a cluster another process started on the
machine. Workers are Ray actors placed anywhere in the cluster: `num_workers` sets how many, `worker_resources` what
each asks for (here one CPU; `{"CPU": 1, "GPU": 1}` for a GPU each, see gpu_run.py).

Where the results go: `--storage-path` (a path every node can reach, or a URI such as `s3://bucket/runs/job-1`), else
a new folder under `$MODELHOPPER_STORAGE`, else `~/modelhopper_runs`, on the node that runs the driver; never the
job's working directory, a temporary copy Ray may delete. `ray job submit` uploads no `.git`, so pass the code's
revision for the run's record with
`--runtime-env-json '{"env_vars": {"MODELHOPPER_GIT_REVISION": "'$(git rev-parse HEAD)'"}}'`. In a job's log (no
terminal) the progress bar becomes a status line every 30 s.
"""

import argparse
import os

import automl
import framework
from framework.examples import classifier_step_fn, digits_arrays, mlp_model_fn


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workers", type=int, default=2, help="worker actors, and partitions of the data (default 2)")
    parser.add_argument("--samples", type=int, default=4, help="configs random search draws (default 4)")
    parser.add_argument("--epochs", type=int, default=2, help="epochs per config (default 2)")
    parser.add_argument("--storage-path", default=None,
                        help="the run's directory or URI (default: a new folder under $MODELHOPPER_STORAGE or "
                             "~/modelhopper_runs)")
    args = parser.parse_args(argv)
    for name in ("workers", "samples", "epochs"):
        if getattr(args, name) < 1:
            parser.error(f"`--{name}` is {getattr(args, name)}, but must be >= 1")
    return args


def main(argv=None):
    args = parse_args(argv)
    where = f"the cluster at RAY_ADDRESS={os.environ['RAY_ADDRESS']}" if os.environ.get("RAY_ADDRESS") else \
        "an embedded local Ray (no RAY_ADDRESS set)"
    print(f"driver: {where}", flush=True)

    x, y = digits_arrays()
    # one partition per worker: each worker loads its partition once; the configs' models travel instead
    dataset = framework.PartitionedDataset.from_arrays(x, y, num_partitions=args.workers, valid_fraction=0.2, seed=0)
    space = {"hidden": [32, 64, 128], "lr": automl.loguniform(0.01, 0.2), "layers": automl.randint(1, 2),
             "batch_size": 32}
    selection = framework.ModelSelection(
        mlp_model_fn, step_fn=classifier_step_fn, dataset=dataset,
        procedure=automl.RandomSearch(space, num_samples=args.samples, epochs=args.epochs, seed=0),
        num_workers=args.workers, worker_resources={"CPU": 1}, storage_path=args.storage_path,
        metric="valid_accuracy", mode="max", seed=0)
    result = selection.run()  # attaches to RAY_ADDRESS's cluster, or starts a local Ray, then trains

    import ray  # after run(): Ray is up, whichever way it started

    nodes = [n for n in ray.nodes() if n.get("Alive")]
    print(f"Ray: {len(nodes)} node(s), {ray.cluster_resources().get('CPU', 0):g} CPUs; units ran on workers "
          f"{sorted(result.schedule.worker.unique().tolist())}")
    print(result.get_dataframe()[["config_id", "valid_accuracy", "config/hidden", "config/layers", "config/lr"]]
          .to_string(index=False))
    print(f"run directory: {result.storage_path}")


if __name__ == "__main__":
    main()
