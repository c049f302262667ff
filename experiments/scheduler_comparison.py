"""Cerebro Figure 6 on this machine: every scheduler on |S| in {16, 256} x p in {8, 16} x homo/hetero x 5 seeds.

Prints mean and max makespan / lower bound per scheduler and setting, and decision time per unit. Runs directly
(`python experiments/scheduler_comparison.py`) or via `ray job submit --working-dir . -- python
experiments/scheduler_comparison.py`; it needs no Ray (pure simulation), so it never starts one.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from dataclasses import asdict, dataclass, fields
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import pandas as pd  # noqa: E402

from simulators.compare import CompareConfig, compare_and_write  # noqa: E402


@dataclass
class Defaults:
    configs: str = "16,256"
    workers: str = "8,16"
    kinds: str = "homogeneous,heterogeneous"
    seeds: int = 5
    schedulers: str = "randomized,mwr,lpt,lookahead,approx,cpsat,milp"
    time_limit_s: float = 5.0
    out: str = "results/scheduler_comparison"


def main(argv: list[str] | None = None) -> int:
    d = Defaults()
    ap = argparse.ArgumentParser(description=__doc__)
    for f in fields(Defaults):
        ap.add_argument(f"--{f.name.replace('_', '-')}", type=type(getattr(d, f.name)), default=getattr(d, f.name))
    ap.add_argument("--quiet", action="store_true")
    a = ap.parse_args(argv)
    cfg = CompareConfig(
        configs=tuple(int(x) for x in a.configs.split(",")),
        workers=tuple(int(x) for x in a.workers.split(",")),
        kinds=tuple(a.kinds.split(",")),
        seeds=tuple(range(a.seeds)),
        schedulers=tuple(a.schedulers.split(",")),
        time_limit_s=a.time_limit_s,
    )
    out = Path(a.out)
    df, summ = compare_and_write(cfg, out, progress=not a.quiet)
    try:
        rev = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True, check=False).stdout.strip()
    except OSError:
        rev = ""
    (out / "run.json").write_text(json.dumps({"args": vars(a), "config": asdict(cfg), "git": rev}, indent=2))
    table = summ[["kind", "configs", "workers", "scheduler", "vs_lb_mean", "vs_lb_max", "ms_per_unit_mean"]]
    if "vs_randomized_mean" in summ:
        table = table.assign(vs_randomized_mean=summ["vs_randomized_mean"])
    with pd.option_context("display.width", 200, "display.max_rows", 500, "display.float_format", "{:.4f}".format):
        print(table.to_string(index=False))
    worst = df.groupby("scheduler")["vs_lb"].max().sort_values()
    print("\nworst makespan / LB over the whole grid:", ", ".join(f"{k} {v:.4f}" for k, v in worst.items()))
    print(f"results in {out}/ (comparison.csv, summary.csv, comparison.png, run.json)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
