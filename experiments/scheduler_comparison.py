"""Cerebro Figure 6 on this machine: every scheduler on |S| in {16, 256} x p in {8, 16} x homo/hetero x 5 seeds.

    python experiments/scheduler_comparison.py --quick

Prints mean and max makespan / lower bound per scheduler and setting, and decision time per unit. Runs directly
(`python experiments/scheduler_comparison.py`) or via `ray job submit --working-dir . -- python
experiments/scheduler_comparison.py`; it needs no Ray (pure simulation), so it never starts one.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import pandas as pd  # noqa: E402

from experiments._common import parse_config, record_run  # noqa: E402
from framework.scheduling import SCHEDULERS  # noqa: E402
from simulators.compare import CompareConfig, compare_and_write  # noqa: E402


@dataclass
class Defaults:
    configs: tuple = (16, 256)  # |S| values
    workers: tuple = (8, 16)  # p values
    kinds: tuple = ("homogeneous", "heterogeneous")  # workload kinds
    seeds: int = 5  # seeds per setting
    schedulers: tuple = ("randomized", "mwr", "lpt", "lookahead", "approx", "cpsat", "milp")  # policies compared
    time_limit: float = 5.0  # seconds per exact (cpsat, milp) solve; the paper used 300
    quiet: bool = False  # no progress bar


QUICK = dict(configs=(16,), workers=(8,), seeds=2, time_limit=1.0)


def compare_config(a: Defaults) -> CompareConfig:
    """The simulators' grid for these options; raises ValueError naming a bad one."""
    unknown = sorted(set(a.schedulers) - set(SCHEDULERS))
    if unknown:
        raise ValueError(f"`--schedulers` has {unknown}, but must be among {list(SCHEDULERS)}")
    return CompareConfig(configs=tuple(a.configs), workers=tuple(a.workers), kinds=tuple(a.kinds),
                         seeds=tuple(range(a.seeds)), schedulers=tuple(a.schedulers), time_limit_s=a.time_limit)


def main(argv: list[str] | None = None) -> int:
    a, out = parse_config(Defaults, argv, __doc__, QUICK, check=compare_config)
    cfg = compare_config(a)
    df, summ = compare_and_write(cfg, Path(out), progress=not a.quiet)
    table = summ[["kind", "configs", "workers", "scheduler", "vs_lb_mean", "vs_lb_max", "ms_per_unit_mean"]]
    if "vs_randomized_mean" in summ:
        table = table.assign(vs_randomized_mean=summ["vs_randomized_mean"])
    with pd.option_context("display.width", 200, "display.max_rows", 500, "display.float_format", "{:.4f}".format):
        print(table.to_string(index=False))
    worst = df.groupby("scheduler")["vs_lb"].max().sort_values()
    print("\nworst makespan / LB over the whole grid:", ", ".join(f"{k} {v:.4f}" for k, v in worst.items()))
    record_run(out, a)
    return 0


if __name__ == "__main__":
    sys.exit(main())
