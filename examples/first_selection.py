"""A first model selection: the README's first program, as a script.

Four configs (hidden width 32 or 128, learning rate 0.01 or 0.1) train for 3 epochs on 2 workers; the digits data
set is split once into 2 partitions that stay on the workers, and the configs hop between them. It starts an
embedded local Ray (no cluster needed) and takes a few seconds after Ray's start.

    python examples/first_selection.py

The run goes to a new folder `gridsearch-<timestamp>` under `$MODELHOPPER_STORAGE` (default `~/modelhopper_runs`),
never into the working directory; `modelhopper show <that folder>` reads it again later.
"""

import torch
import torch.nn.functional as F

import automl
import framework
from framework.examples import digits_arrays


def model_fn(config):
    """A config's model and optimizer, built on whichever worker trains it first."""
    hidden = config["hidden"]
    model = torch.nn.Sequential(torch.nn.Linear(64, hidden), torch.nn.ReLU(), torch.nn.Linear(hidden, 10))
    return model, torch.optim.SGD(model.parameters(), lr=config["lr"], momentum=0.9)


def step_fn(model, batch, config):
    """One step on one batch: its mean loss, and metrics (batch means) reported as train_<name> and valid_<name>."""
    x, y = batch
    logits = model(x)
    return F.cross_entropy(logits, y), {"accuracy": (logits.argmax(1) == y).float().mean()}


def main():
    x, y = digits_arrays()  # scikit-learn's 8x8 digits: 1,797 images as (N, 64) floats and (N,) labels
    # split once: 2 partitions, each with 20% of its rows held out for validation
    dataset = framework.PartitionedDataset.from_arrays(x, y, num_partitions=2, valid_fraction=0.2, seed=0)
    # every combination of the lists is one config; a constant ("batch_size") goes into every config
    search = automl.GridSearch({"hidden": [32, 128], "lr": [0.01, 0.1], "batch_size": 32}, epochs=3)
    selection = framework.ModelSelection(model_fn, step_fn=step_fn, dataset=dataset, procedure=search,
                                         num_workers=2, metric="valid_accuracy", mode="max", seed=0)
    result = selection.run()
    # the leaderboard: one row per config, best first by the run's metric
    print(result.get_dataframe()[["config_id", "valid_accuracy", "config/hidden", "config/lr"]])
    best = result.get_best_result()
    print(best.config, best.metrics["valid_accuracy"])
    print(f"run directory: {result.storage_path}")


if __name__ == "__main__":
    main()
