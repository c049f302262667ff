"""Steering a running model selection: pause it, look at its configs, stop one, add one, add a worker, clone the
leader with another learning rate, and wait for the end.

A run reads commands while it goes on, from any program on the machine (or through a shared file system) that can
write its run directory and holds your signing key: `framework.connect(run_directory)` returns a handle whose
methods send one command each and return once the run's driver has applied or rejected it (a
`CommandOutcome(name, args, applied, outcome)`). Each acts at the next unit boundary (within about 0.25 s).

Here the run trains on a background thread of this process, so the script is self-contained; the handle does not
care: from another terminal, `framework.connect(...)` in another Python process or the command line does the same:

    modelhopper pause RUN
    modelhopper stop RUN 3
    modelhopper add RUN '{"hidden": 64, "lr": 0.05, "batch_size": 32}' --epochs 2
    modelhopper workers RUN --add 1
    modelhopper unpause RUN
    modelhopper clone RUN 0 --set lr=0.02 --epochs 2
    modelhopper watch RUN                    # a live leaderboard, until the run ends

    python examples/steering_session.py

Every command and its outcome is in the run's record (`result.commands`); a config a person stopped says `stopped`
in `result.status`. The run starts on one worker holding both partitions and gets a second one by command (the
cluster must have room for it: a larger count is rejected, and the outcome says how many fit). Runs go under
`$MODELHOPPER_STORAGE` (default `~/modelhopper_runs`).
"""

import os
import threading
import time

import automl
import framework
from framework.engine.ray_backend import ensure_ray
from framework.examples import classifier_step_fn, digits_arrays, mlp_model_fn
from framework.steering.connect import NotRunningError


def start_in_background(selection):
    """Run `selection` on a daemon thread; returns the thread and a dict that gets its "result" or "error"."""
    out = {}

    def target():
        try:
            out["result"] = selection.run()
        except BaseException as e:  # noqa: BLE001 - handed to the main thread, which raises it
            out["error"] = e

    thread = threading.Thread(target=target, name="model-selection", daemon=True)
    thread.start()
    return thread, out


def wait_until(condition, what, thread, timeout=120.0):
    """Poll `condition()` until it holds; fail when the run's thread ended first or after `timeout` seconds."""
    deadline = time.monotonic() + timeout
    while not condition():
        if not thread.is_alive():
            raise RuntimeError(f"the run ended before {what}")
        if time.monotonic() > deadline:
            raise TimeoutError(f"waited {timeout:g} s for {what}")
        time.sleep(0.1)


def epochs_of(path, config_id):
    """How many epochs config `config_id` has committed so far, read from the run's directory."""
    with framework.Result.open(path) as result:
        row = result.status[result.status.config_id == config_id]
        return int(row.epochs.iloc[0]) if len(row) else 0


def show(outcome):
    print(f"  {outcome.name}{outcome.args}: {'applied' if outcome.applied else 'rejected'}: {outcome.outcome}",
          flush=True)


def main():
    x, y = digits_arrays()
    dataset = framework.PartitionedDataset.from_arrays(x, y, num_partitions=2, valid_fraction=0.2, seed=0)
    search = automl.GridSearch({"hidden": [32, 128], "lr": [0.01, 0.1], "batch_size": 32}, epochs=4)
    selection = framework.ModelSelection(mlp_model_fn, step_fn=classifier_step_fn, dataset=dataset,
                                         procedure=search, num_workers=1, metric="valid_accuracy", mode="max",
                                         seed=0, progress=False)
    path = selection.storage_path  # known before the run starts: a new folder under $MODELHOPPER_STORAGE
    # `run()` starts Ray when nothing did (attaching to $RAY_ADDRESS's cluster if set); here Ray starts on the main
    # thread instead, where Ray installs its signal handlers, with CPUs for a second worker even on one core
    ensure_ray(min_cpus=2)
    thread, out = start_in_background(selection)
    print(f"run started in the background: {path}", flush=True)

    # the run directory appears, then the driver takes the run's lock and starts its worker
    wait_until(lambda: os.path.isfile(os.path.join(path, "run.db")), "the run directory appeared", thread)
    handle = framework.connect(path)
    wait_until(lambda: handle.status()["status"] == "running", "the run was running", thread)

    # pause first, so what follows happens at a known point whatever the machine's speed: units running finish,
    # nothing new starts, the worker keeps its data
    show(handle.pause())
    with framework.Result.open(path) as now:
        print("configs of the run:")
        for cid, config in now.configs.items():
            status = now.status.set_index("config_id").status.get(cid)
            print(f"  config {cid}: {config} ({status})")

    show(handle.stop(3))  # a config we do not want: it keeps what it trained and says `stopped`
    show(handle.add({"hidden": 64, "lr": 0.05, "batch_size": 32}, epochs=2))  # one the grid lacks, for 2 epochs
    added = handle.add_workers(1)  # a second worker: it loads a replica of a partition, then takes units
    show(added)
    if added.applied:  # a new worker process takes a few seconds to start: let it join before training resumes
        wait_until(lambda: handle.status()["workers"]["live"] >= 2, "the new worker joined", thread)
        print(f"  workers now: {handle.status()['workers']['live']}")
    show(handle.unpause())

    # once config 0 has trained an epoch, clone it with another learning rate, starting from its weights
    wait_until(lambda: epochs_of(path, 0) >= 1, "config 0 finished an epoch", thread)
    try:
        show(handle.clone(0, lr=0.02, epochs=2))
    except NotRunningError as e:  # the run may have ended in the meantime on a fast machine
        print(f"  clone not sent: {e}")
    print(f"status while it runs: {handle.status()['configs']}", flush=True)

    thread.join()  # wait for the end: every config done, stopped or failed
    if "error" in out:
        raise out["error"]
    result = out["result"]
    print("\ncommands the run recorded:")
    print(result.commands[["name", "source", "applied", "outcome"]].to_string(index=False))
    print("\nhow each config ended:")
    table = result.status.set_index("config_id")[["status", "epochs", "parent"]].astype({"parent": "Int64"})
    table["config"] = [result.configs[cid] for cid in table.index]  # config 3 trained nothing: it has no metrics
    table = table.join(result.get_dataframe().set_index("config_id")[["valid_accuracy"]])
    print(table.to_string())
    print(f"workers that trained units: {sorted(result.schedule.worker.unique().tolist())}")
    print(f"run directory: {result.storage_path}")


if __name__ == "__main__":
    main()
