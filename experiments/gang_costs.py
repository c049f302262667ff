"""What a data-parallel gang costs on this machine: setting up its process group, and one averaging step.

k Ray actors (the engine's workers are Ray actors) form a gang (`framework.engine.gang`: a gloo group over a TCP store
hosted by rank 0) and all-reduce a flat float32 buffer the size of a model's gradients, as `Gang.average` does at
every optimizer step. For each k and model size it prints the set-up time (store and rendezvous) and the median
time of one step, and how many steps the set-up is worth: why the engine keeps a group while its gang lives
instead of paying it per unit.

    python experiments/gang_costs.py --quick
    python experiments/gang_costs.py --sizes 100000,1000000,10000000 --gangs 2,4
"""

from __future__ import annotations

import os
import sys
import time
from dataclasses import dataclass

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402
import ray  # noqa: E402
import torch  # noqa: E402

from experiments._common import parse_config, record_run  # noqa: E402
from framework.engine.gang import GangMember  # noqa: E402
from framework.engine.ray_backend import ensure_ray  # noqa: E402


@dataclass
class Defaults:
    gangs: str = "2,4"  # gang sizes k (comma-separated)
    sizes: str = "100000,1000000,10000000"  # floats per all-reduce: a model's trainable parameters
    steps: int = 20  # timed steps per setting (after one warm-up)
    repeats: int = 3  # gangs set up per k (the set-up time is their median)


QUICK = dict(gangs="2", sizes="100000,1000000", steps=5, repeats=2)


class Member(GangMember):
    def __init__(self) -> None:
        torch.set_num_threads(1)

    def timed_join(self, gang_id: str, rank: int, size: int, port: int) -> float:
        t0 = time.perf_counter()
        self.join_gang(gang_id, rank, size, port)
        return time.perf_counter() - t0

    def steps(self, size: int, steps: int) -> list[float]:
        param = torch.nn.Parameter(torch.zeros(size))
        param.grad = torch.ones(size)
        self.gang.average([param], contributes=True)  # warm-up
        out = []
        for _ in range(steps):
            t0 = time.perf_counter()
            self.gang.average([param], contributes=True)
            out.append(time.perf_counter() - t0)
        return out


def main(argv: list[str] | None = None) -> pd.DataFrame:
    cfg, out = parse_config(Defaults, argv, __doc__, QUICK)
    gangs = [int(k) for k in str(cfg.gangs).split(",")]
    sizes = [int(n) for n in str(cfg.sizes).split(",")]
    ensure_ray(min_cpus=max(gangs))
    member = ray.remote(num_cpus=1)(Member)
    rows = []
    for k in gangs:
        setups, actors = [], []
        for r in range(cfg.repeats):
            for a in actors:
                ray.kill(a)
            actors = [member.remote() for _ in range(k)]
            ray.get([a.__ray_ready__.remote() for a in actors])  # started: time the rendezvous alone
            t0 = time.perf_counter()
            port = ray.get(actors[0].host_gang.remote())
            ray.get([a.timed_join.remote(f"k{k}-{r}", i, k, port) for i, a in enumerate(actors)])
            setups.append(time.perf_counter() - t0)
        setup = float(np.median(setups))
        for n in sizes:
            times = ray.get([a.steps.remote(n, cfg.steps) for a in actors])
            step = float(np.median([max(ts) for ts in zip(*times)]))  # a step ends when its slowest member's does
            rows.append({"k": k, "floats": n, "MB": 4 * n / 1e6, "setup_s": setup, "step_s": step,
                         "setup_in_steps": setup / step, "GB_per_s": 2 * (k - 1) / k * 4 * n / step / 1e9})
        for a in actors:
            ray.kill(a)
    table = pd.DataFrame(rows)
    table.to_csv(os.path.join(out, "gang_costs.csv"), index=False)
    print(f"gloo gangs of Ray actors on this machine ({os.cpu_count()} cores); median over {cfg.steps} steps, "
          f"set-up median over {cfg.repeats} gangs:")
    print(table.to_string(index=False, float_format=lambda v: f"{v:.4g}"))
    record_run(out, cfg)
    return table


if __name__ == "__main__":
    main()
