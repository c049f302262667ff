"""A model-selection procedure of your own: successive halving in a dozen lines.

A procedure decides which configs train and when they stop (`automl.Procedure`, see the README's "Writing your own
procedure"). The engine calls `step(states)` once with `[]` at the start, then after every epoch barrier with the
state of every config it has seen, and applies the `automl.Decision` it returns:

    Decision(add=[configs], stop=[ids], pruned=[ids], clone=[(source_id, config)], resume=[ids])

`KeepBestHalf` starts 8 configs, and after each epoch keeps the better half of the configs still training; the
others stop. It says which stops are early stops for bad results (`Decision.pruned`, a subset of `stop`) and which
configs simply used up their budget (the rest of `stop`): `result.status` then shows `pruned` for the first and
`completed` for the second, as it does for HyperBand's and ASHA's lost rungs. Without `pruned` every stopped config
would read `completed`.

    python examples/custom_procedure.py

8 configs -> 4 after epoch 1 -> 2 after epoch 2 -> 1 after epoch 3, which trains to `max_epochs` (4): 15 config-epochs
instead of a grid's 32. The run goes under `$MODELHOPPER_STORAGE` (default `~/modelhopper_runs`).
"""

import automl
import framework
from automl import Decision, Procedure
from framework.examples import classifier_step_fn, digits_arrays, mlp_model_fn


class KeepBestHalf(Procedure):
    """Successive halving: start every config, then after each epoch prune the worse half of those still training;
    the last one left trains to `max_epochs` and completes."""

    def __init__(self, configs, max_epochs=4):
        if not configs:
            raise ValueError(f"`configs` is {configs!r}, but must hold at least one config dict")
        if not isinstance(max_epochs, int) or max_epochs < 1:
            raise ValueError(f"`max_epochs` is {max_epochs!r}, but must be an int >= 1")
        self.configs, self.max_epochs = list(configs), max_epochs

    def epochs_per_config(self):
        """The most epochs one config trains here (also the default budget of a config a person adds)."""
        return self.max_epochs

    def planned_epochs(self):
        """Config-epochs when nothing fails: n + n/2 + n/4 + ... (the progress bar's total; only a hint)."""
        n, total = len(self.configs), 0
        for _ in range(self.max_epochs):
            total += n
            n = max(1, n // 2)
        return total

    def step(self, states):
        if not states:  # the first call: what to start with
            return Decision(add=list(self.configs))
        # the configs this procedure decides about (a person's configs, added through `framework.connect`, are left
        # alone: they are filtered out here), all at the same epoch count after a barrier
        active = automl.own_active(states)
        if not active:
            return Decision()
        if active[0].epochs >= self.max_epochs:  # budget used up: they stop as completed, not pruned
            return Decision(stop=[s.id for s in active])
        ranked = self.rank(active)  # ids, best first, by the run's metric and mode (`metric=`, `mode=` below)
        cut = ranked[max(1, len(ranked) // 2):]  # the worse half; the best one always goes on
        return Decision(stop=cut, pruned=cut)  # stopped early for their results: `pruned`


def main():
    x, y = digits_arrays()
    dataset = framework.PartitionedDataset.from_arrays(x, y, num_partitions=2, valid_fraction=0.2, seed=0)
    # 8 configs: 2 widths x 4 learning rates (framework.examples.mlp_model_fn reads "hidden" and "lr")
    configs = [{"hidden": h, "lr": lr, "batch_size": 32} for h in (32, 128) for lr in (0.003, 0.01, 0.03, 0.1)]
    # `load_procedure` also takes a class, and checks the keyword arguments against its constructor
    procedure = automl.load_procedure(KeepBestHalf, configs=configs, max_epochs=4)
    result = framework.ModelSelection(mlp_model_fn, step_fn=classifier_step_fn, dataset=dataset,
                                      procedure=procedure, num_workers=2, metric="valid_accuracy", mode="max",
                                      seed=0, progress=False).run()

    status = result.status.set_index("config_id")
    board = result.get_dataframe().set_index("config_id")
    table = status[["status", "epochs"]].join(board[["valid_accuracy", "config/hidden", "config/lr"]])
    print(table.sort_values(["epochs", "valid_accuracy"], ascending=False).to_string())
    counts = status.status.value_counts().to_dict()
    print(f"statuses: {counts}; config-epochs trained: {int(status.epochs.sum())} (a grid would train "
          f"{len(configs) * procedure.max_epochs})")
    accuracy = board["valid_accuracy"]
    for cid in status.index[status.status == "completed"]:  # (one: the last config left)
        print(f"config {cid} survived every halving and trained all {status.epochs[cid]} epochs: valid_accuracy "
              f"{accuracy[cid]:.4f} after its last epoch")
    # `get_best_result` ranks every config at its own last epoch, so a config pruned early may still rank first
    best = result.get_best_result()
    if best.status == "completed":
        print(f"the best config by valid_accuracy after its last epoch is the survivor, config {best.config_id}")
    else:
        print(f"the best config by valid_accuracy after its own last epoch is config {best.config_id} ({best.status} "
              f"after {best.epochs} epochs, valid_accuracy {best.metrics['valid_accuracy']:.4f}): get_best_result "
              "ranks every config at its own last epoch, so a config pruned early can rank above the survivor")
    print(f"run directory: {result.storage_path}")


if __name__ == "__main__":
    main()
