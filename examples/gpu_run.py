"""A model selection on GPU workers, falling back to CPU workers where there is no GPU.

Each worker asks Ray for a share of a GPU, `worker_resources={"CPU": 1, "GPU": 0.5}`: two workers then share one
card (Ray places workers by these numbers; it does not split the card's memory or compute). A GPU worker builds
every model on its GPU; your `model_fn` and `step_fn` stay as they are on a CPU (the engine moves the model, and each
batch, to the worker's device). Without CUDA (`torch.cuda.is_available()` is False) the script says so in one line
and runs the same selection on CPU workers, `{"CPU": 1}`.

`data_on_device` says where a GPU worker keeps the partitions of the training data it holds; they are placed once,
when the worker loads them, not once per batch:

    None (the default)  on the GPU while the partitions the worker keeps there fit in a quarter
                        (`framework.engine.worker.DEVICE_DATA_SHARE`) of its share of the GPU's memory (a worker
                        with {"GPU": 0.5} counts half the card); a partition that would not fit stays in host memory,
                        and each of its batches is copied to the GPU as the step uses it
    True                on the GPU
    False               in host memory, each batch copied to the GPU as it is used

The batches, and so the results, are the same either way; only where they are copied from differs (a step's batch
already on the GPU costs no copy). On a CPU worker the data stays in host memory whatever `data_on_device` says.
Each worker's `worker_joined` event names where its partitions went (`data_device`), which the script prints.

    python examples/gpu_run.py                        # GPU workers when CUDA is available, else CPU workers
    python examples/gpu_run.py --data-on-device true  # or false; leave out for the default (None)
    python examples/gpu_run.py --gpu-share 1          # a whole GPU per worker (needs 2 GPUs for 2 workers)

On a cluster, submit it as cluster_job.py says; the driver then checks CUDA on its own node, so on a cluster whose
head has no GPU pass `--device cuda` to ask for GPU workers anyway (a request no node can meet raises at once,
naming what the cluster has). Runs go under `$MODELHOPPER_STORAGE` (default `~/modelhopper_runs`).
"""

import argparse
import json

import torch

import automl
import framework
from framework.examples import classifier_step_fn, digits_arrays, mlp_model_fn

PLACEMENTS = {"auto": None, "true": True, "false": False}


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", choices=("auto", "cuda", "cpu"), default="auto",
                        help="auto: GPU workers when this machine has CUDA, else CPU workers (default auto)")
    parser.add_argument("--gpu-share", type=float, default=0.5, help="the GPU each worker asks for (default 0.5)")
    parser.add_argument("--data-on-device", choices=tuple(PLACEMENTS), default="auto",
                        help="where a GPU worker keeps its partitions: auto (None), true, false (default auto)")
    parser.add_argument("--epochs", type=int, default=3, help="epochs per config (default 3)")
    args = parser.parse_args(argv)
    if not 0 < args.gpu_share <= 1:
        parser.error(f"`--gpu-share` is {args.gpu_share}, but must be in (0, 1]")
    if args.epochs < 1:
        parser.error(f"`--epochs` is {args.epochs}, but must be >= 1")
    return args


def main(argv=None):
    args = parse_args(argv)
    use_gpu = args.device == "cuda" or (args.device == "auto" and torch.cuda.is_available())
    if use_gpu:
        resources = {"CPU": 1, "GPU": args.gpu_share}
        name = torch.cuda.get_device_name(0) if torch.cuda.is_available() else "a GPU of the cluster"
        print(f"GPU run: 2 workers with {resources} each, on {name}", flush=True)
    else:
        resources = {"CPU": 1}
        print("CUDA is not available: falling back to CPU workers ({'CPU': 1} each); data_on_device has no effect",
              flush=True)

    x, y = digits_arrays()
    dataset = framework.PartitionedDataset.from_arrays(x, y, num_partitions=2, valid_fraction=0.2, seed=0)
    search = automl.GridSearch({"hidden": [64, 256], "lr": [0.03, 0.1], "batch_size": 64}, epochs=args.epochs)
    result = framework.ModelSelection(
        mlp_model_fn, step_fn=classifier_step_fn, dataset=dataset, procedure=search, num_workers=2,
        worker_resources=resources, data_on_device=PLACEMENTS[args.data_on_device],
        metric="valid_accuracy", mode="max", seed=0, progress=False).run()

    # where each worker put its partitions, as it reported when it joined: "cuda:0", "cpu", or "cpu+cuda:0"
    joined = result.events[result.events.kind == "worker_joined"]
    for detail in joined.detail:
        d = json.loads(detail)
        print(f"worker {d.get('worker')}: partitions {d.get('partitions')} in {d.get('data_device')}")
    train = result.schedule[result.schedule.kind == "train"]
    print(f"median training unit: {(train.end - train.start).median() * 1000:.0f} ms over {len(train)} units")
    print(result.get_dataframe()[["config_id", "valid_accuracy", "config/hidden", "config/lr"]].to_string(index=False))
    print(f"run directory: {result.storage_path}")


if __name__ == "__main__":
    main()
