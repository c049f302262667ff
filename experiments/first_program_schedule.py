"""The README's figure: the schedule of the first program (4 configs of an MLP on scikit-learn's digits, 3 epochs,
2 workers, 2 partitions), as its run logged it, drawn as a Gantt chart: one row per worker, one bar per unit coloured
by config, eval units hatched. It shows model hopping: each config alternates between the two workers, one partition
at a time.

    python experiments/first_program_schedule.py                 # writes schedule.png to the results' folder
    python experiments/first_program_schedule.py --figure docs/schedule.png    # the README's copy

The figure's title names the revision and the machine it came from; the provenance lines are printed as well.
"""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

import automl  # noqa: E402
import framework  # noqa: E402
from experiments._common import parse_config, provenance_fields, record_run  # noqa: E402
from framework.examples import digits_arrays  # noqa: E402
from simulators.gantt import plot_gantt  # noqa: E402


@dataclass
class Defaults:
    epochs: int = 3  # epochs of every config
    workers: int = 2  # Ray workers, one partition each
    seed: int = 0  # the run's seed
    figure: str = ""  # also write the figure here (e.g. docs/schedule.png); empty: only into the results' folder


QUICK = dict(epochs=1)


def check(cfg: Defaults) -> None:
    for name in ("epochs", "workers"):
        if getattr(cfg, name) < 1:
            raise ValueError(f"`--{name}` is {getattr(cfg, name)}, but must be >= 1")
    if cfg.figure and not os.path.isdir(os.path.dirname(os.path.abspath(cfg.figure))):
        raise ValueError(f"`--figure` is {cfg.figure!r}, but its folder does not exist")


def model_fn(config):
    hidden = config["hidden"]
    model = torch.nn.Sequential(torch.nn.Linear(64, hidden), torch.nn.ReLU(), torch.nn.Linear(hidden, 10))
    return model, torch.optim.SGD(model.parameters(), lr=config["lr"], momentum=0.9)


def step_fn(model, batch, config):
    x, y = batch
    logits = model(x)
    return F.cross_entropy(logits, y), {"accuracy": (logits.argmax(1) == y).float().mean()}


def main(argv: list[str] | None = None) -> str:
    cfg, out = parse_config(Defaults, argv, __doc__, QUICK, check)
    x, y = digits_arrays()
    dataset = framework.PartitionedDataset.from_arrays(x, y, num_partitions=cfg.workers, valid_fraction=0.2,
                                                       seed=cfg.seed)
    search = automl.GridSearch({"hidden": [32, 128], "lr": [0.01, 0.1], "batch_size": 32}, epochs=cfg.epochs)
    result = framework.ModelSelection(model_fn, step_fn=step_fn, dataset=dataset, procedure=search,
                                      num_workers=cfg.workers, metric="valid_accuracy", mode="max", seed=cfg.seed,
                                      storage_path=os.path.join(out, "run"), progress=False).run()
    fields = provenance_fields()
    title = (f"the first program: 4 configs, {cfg.epochs} epochs, {cfg.workers} workers "
             f"(revision {fields['revision']}; {fields['machine'].split(', ')[1]}, {fields['software']})")
    path = os.path.join(out, "schedule.png")
    plot_gantt(result.schedule, path, title=title)
    if cfg.figure:
        plot_gantt(result.schedule, cfg.figure, title=title)
    print(f"{len(result.schedule)} units; figure: {path}" + (f" and {cfg.figure}" if cfg.figure else ""))
    record_run(out, cfg, figure=path)
    return path


if __name__ == "__main__":
    main()
