"""Cerebro's Figure 17, and beyond it: the runtime of one epoch of |S| configs on p workers, for MOP, data
parallelism, Cerebro's switch and the joint planner (`framework.scheduling.parallelism`), through the real driver
on a simulated clock (`python -m simulators crossover`).

Every worker holds every partition here (a data-parallel gang shares a partition's pass, so each member needs it);
a gang unit of k takes `max_w t(c, w) / k + comm * mean(t) * 2 (k - 1) / k` (`CostModel`): `comm` is the all-reduce
of one unit as a fraction of a mean unit's compute. A HyperBand run (its |S| shrinks rung by rung) is simulated
with each policy too.
"""

from __future__ import annotations

import dataclasses
import math
from pathlib import Path

import pandas as pd

import automl
from framework.scheduling import ParallelismPlanner, make_scheduler
from simulators.backend import CostModel
from simulators.simulator import simulate, simulate_selection
from simulators.workload import Workload, heterogeneous, homogeneous, replicate

POLICIES = ("mop", "data_parallel", "cerebro", "planner")


@dataclasses.dataclass(frozen=True)
class CrossoverConfig:
    workers: tuple[int, ...] = (8, 16, 64)
    kinds: tuple[str, ...] = ("homogeneous", "heterogeneous")
    comm: float = 0.05  # all-reduce per gang unit, as a fraction of a mean unit's compute
    seed: int = 0
    time_limit_s: float | None = None  # the planner's CP-SAT budget per plan, reference seconds of deterministic
    # work (None: as in a live run, 2% of its greedy makespan, 10 ms to 2 s)
    hyperband_workers: int = 8  # p of the HyperBand run (0: none)
    hyperband_epochs: int = 9  # its max_epochs (R)


def config_counts(p: int) -> list[int]:
    """|S| from 1 to p: every value for p <= 16, else a grid dense below p/2 (where the policies cross)."""
    if p <= 16:
        return list(range(1, p + 1))
    return sorted({1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, p})


def workload(kind: str, n_configs: int, p: int, seed: int) -> Workload:
    if kind not in ("homogeneous", "heterogeneous"):
        raise ValueError(f"`kind` is {kind!r}, but must be 'homogeneous' or 'heterogeneous'")
    base = homogeneous(n_configs, p) if kind == "homogeneous" else heterogeneous(n_configs, p, seed=seed)
    return replicate(base, p)


def policy(name: str, comm_s: float, seed: int, time_limit_s: float | None = None):
    if name == "planner":
        return ParallelismPlanner(seed=seed, comm_s=comm_s, time_limit_s=time_limit_s)
    return make_scheduler("randomized" if name == "mop" else name, seed=seed)


def run_crossover(cfg: CrossoverConfig, progress: bool = True) -> pd.DataFrame:
    """One row per (p, kind, |S|, policy): the makespan of one epoch, and the planner's ratio to the better of MOP
    and data parallel."""
    rows = []
    cases = [(p, kind, s) for p in cfg.workers for kind in cfg.kinds for s in config_counts(p)]
    for i, (p, kind, s) in enumerate(cases):
        w = workload(kind, s, p, cfg.seed)
        comm_s = cfg.comm * float(w.times.mean())
        for name in POLICIES:
            r = simulate(w, policy(name, comm_s, cfg.seed, cfg.time_limit_s), cost=CostModel(comm_s=comm_s),
                         seed=cfg.seed)
            rows.append({"workers": p, "kind": kind, "configs": s, "policy": name, "makespan": r.makespan,
                         "wall_s": r.wall_s})
        if progress:
            print(f"\r{i + 1}/{len(cases)} cases", end="", flush=True)
    if progress:
        print()
    return pd.DataFrame(rows)


def run_hyperband(cfg: CrossoverConfig) -> pd.DataFrame:
    """A synchronous HyperBand run (max_epochs R, eta 3) on heterogeneous costs with each policy: its |S| shrinks
    from every bracket's first rung to one config."""
    p = cfg.hyperband_workers
    probe = automl.HyperBand({"x": automl.uniform(0, 1)}, max_epochs=cfg.hyperband_epochs, seed=cfg.seed)
    n = sum(b.rungs[0].n for b in probe.brackets)
    w = workload("heterogeneous", n, p, cfg.seed)
    comm_s = cfg.comm * float(w.times.mean())
    rows = []
    for name in POLICIES:
        procedure = automl.HyperBand({"x": automl.uniform(0, 1)}, max_epochs=cfg.hyperband_epochs, seed=cfg.seed)
        r = simulate_selection(procedure, w, lambda config, epoch: {"valid_loss": (config["x"] - 0.3) ** 2 + 1 / (
            epoch + 1)}, scheduler=policy(name, comm_s, cfg.seed, cfg.time_limit_s), seed=cfg.seed,
            cost=CostModel(comm_s=comm_s))
        rows.append({"workers": p, "configs": n, "policy": name, "makespan": r.makespan, "rounds": r.rounds})
    return pd.DataFrame(rows)


def summarize(df: pd.DataFrame) -> pd.DataFrame:
    """One row per (p, kind, |S|): each policy's makespan, and the planner's and Cerebro's ratios to the better of
    MOP and data parallel."""
    wide = df.pivot_table(index=["workers", "kind", "configs"], columns="policy", values="makespan").reset_index()
    best = wide[["mop", "data_parallel"]].min(axis=1)
    wide["planner_vs_best"] = wide["planner"] / best
    wide["cerebro_vs_best"] = wide["cerebro"] / best
    return wide[["workers", "kind", "configs", *POLICIES, "planner_vs_best", "cerebro_vs_best"]]


def plot_crossover(summary: pd.DataFrame, path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    groups = list(summary.groupby(["kind", "workers"]))
    cols = max(1, len({w for (_, w), _ in groups}))
    rows = math.ceil(len(groups) / cols)
    fig, axes = plt.subplots(rows, cols, figsize=(4.2 * cols, 3.2 * rows), squeeze=False)
    for ax, ((kind, p), g) in zip(axes.flat, groups):
        for name, style in zip(POLICIES, ("o-", "s-", "^--", "D-")):
            ax.plot(g["configs"], g[name], style, ms=3, label=name)
        ax.axvline(p / 2, color="grey", lw=0.6, ls=":")
        ax.set_title(f"{kind}, p = {p}", fontsize=9)
        ax.set_xlabel("|S| (configs)")
        ax.set_ylabel("makespan of one epoch (s)")
        ax.set_yscale("log")
    for ax in list(axes.flat)[len(groups):]:
        ax.axis("off")
    axes.flat[0].legend(fontsize=7)
    fig.suptitle("MOP, data parallelism, Cerebro's switch (at p/2, dotted) and the joint planner", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=130)
    plt.close(fig)


def crossover_and_write(cfg: CrossoverConfig, out, progress: bool = True) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Run the crossover (and the HyperBand run), write crossover.csv, crossover_summary.csv, hyperband.csv and
    crossover.png into `out`; return (summary, hyperband)."""
    out = Path(out)
    df = run_crossover(cfg, progress)
    summary = summarize(df)
    hb = run_hyperband(cfg) if cfg.hyperband_workers else pd.DataFrame()
    out.mkdir(parents=True, exist_ok=True)
    df.to_csv(out / "crossover.csv", index=False)
    summary.to_csv(out / "crossover_summary.csv", index=False)
    if not hb.empty:
        hb.to_csv(out / "hyperband.csv", index=False)
    plot_crossover(summary, out / "crossover.png")
    return summary, hb
