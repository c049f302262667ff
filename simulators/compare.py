"""Cerebro Figure 6: makespans and scheduler runtimes of every policy on |S| x p x (homo, hetero) x seeds."""

from __future__ import annotations

import itertools
import time
from dataclasses import dataclass, field

import pandas as pd

from framework.scheduling import PlanScheduler, make_scheduler
from simulators.bounds import lower_bound
from simulators.simulator import simulate
from simulators.validate import validate_schedule
from simulators.workload import Workload, heterogeneous, homogeneous


@dataclass(frozen=True)
class CompareConfig:
    """The grid of Cerebro section 5.4 and the policies to run on it (all by registry name)."""

    configs: tuple[int, ...] = (16, 256)
    workers: tuple[int, ...] = (8, 16)
    kinds: tuple[str, ...] = ("homogeneous", "heterogeneous")
    seeds: tuple[int, ...] = (0, 1, 2, 3, 4)
    schedulers: tuple[str, ...] = ("randomized", "mwr", "lpt", "lookahead", "approx", "cpsat", "milp")
    time_limit_s: float = 5.0  # per exact solve, reference seconds of deterministic work (paper: 300 s, Gurobi)
    validate: bool = True
    options: dict[str, dict] = field(default_factory=dict)

    def __post_init__(self) -> None:
        bad = set(self.kinds) - {"homogeneous", "heterogeneous"}
        if bad:
            raise ValueError(f"`kinds` has {sorted(bad)}, but must be 'homogeneous' or 'heterogeneous'")
        if self.time_limit_s <= 0:
            raise ValueError(f"`time_limit_s` is {self.time_limit_s}, but must be > 0")


def make_workload(kind: str, n_configs: int, n_workers: int, seed: int) -> Workload:
    return homogeneous(n_configs, n_workers) if kind == "homogeneous" else heterogeneous(n_configs, n_workers, seed)


def run_comparison(cfg: CompareConfig, progress: bool = True) -> pd.DataFrame:
    """One row per (kind, |S|, p, seed, scheduler): makespan, LB, ratios, runtime, plan status and bound."""
    from tqdm import tqdm

    grid = list(itertools.product(cfg.kinds, cfg.configs, cfg.workers, cfg.seeds, cfg.schedulers))
    rows = []
    for kind, n, p, seed, name in tqdm(grid, disable=not progress, desc="simulating", unit="run"):
        w = make_workload(kind, n, p, seed)
        opts = dict(cfg.options.get(name, {}))
        if name in ("cpsat", "milp"):
            opts.setdefault("time_limit_s", cfg.time_limit_s)
        sched = make_scheduler(name, seed=seed, **opts)
        t0 = time.perf_counter()
        r = simulate(w, sched, seed=seed)
        wall = time.perf_counter() - t0
        if cfg.validate:
            validate_schedule(r.schedule, w.availability, raise_on_error=True)
        plan = sched.plan if isinstance(sched, PlanScheduler) else None
        rows.append(
            {
                "kind": kind,
                "configs": n,
                "workers": p,
                "seed": seed,
                "scheduler": name,
                "makespan": r.makespan,
                "lower_bound": lower_bound(w),
                "runtime_s": r.decision_time_s,
                "ms_per_unit": r.decision_ms_per_unit,
                "wall_s": wall,
                "status": plan.status if plan is not None else "online",
                "proven_bound": plan.bound if plan is not None else float("nan"),
                "note": str(plan.info.get("skipped", "")) if plan is not None else "",
            }
        )
    df = pd.DataFrame(rows)
    df["vs_lb"] = df["makespan"] / df["lower_bound"]
    base = df[df["scheduler"] == "randomized"].set_index(["kind", "configs", "workers", "seed"])["makespan"]
    if len(base):
        key = pd.MultiIndex.from_frame(df[["kind", "configs", "workers", "seed"]])
        df["vs_randomized"] = df["makespan"].to_numpy() / base.reindex(key).to_numpy()
    return df


def summarize(df: pd.DataFrame) -> pd.DataFrame:
    """Mean and max of makespan / LB and mean makespan / randomized and runtime per setting and scheduler."""
    agg = {"vs_lb": ["mean", "max"], "runtime_s": ["mean"], "ms_per_unit": ["mean"]}
    if "vs_randomized" in df:
        agg["vs_randomized"] = ["mean", "min", "max"]
    out = df.groupby(["kind", "configs", "workers", "scheduler"], sort=True).agg(agg)
    out.columns = ["_".join(c) for c in out.columns]
    return out.reset_index()


def plot_comparison(df: pd.DataFrame, path) -> None:
    """Figure 6 style: per setting, makespan / randomized (mean, min-max bars) and runtime (log scale)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    kinds = sorted(df["kind"].unique())
    fig, axes = plt.subplots(2, len(kinds), figsize=(7 * len(kinds), 7), squeeze=False)
    scheds = list(dict.fromkeys(df["scheduler"]))
    settings = sorted({(n, p) for n, p in zip(df["configs"], df["workers"], strict=True)})
    width = 0.8 / max(len(scheds), 1)
    col = "vs_randomized" if "vs_randomized" in df else "vs_lb"
    for k, kind in enumerate(kinds):
        sub = df[df["kind"] == kind]
        for j, name in enumerate(scheds):
            s = sub[sub["scheduler"] == name].groupby(["configs", "workers"])
            mean, lo, hi = s[col].mean(), s[col].min(), s[col].max()
            rt = s["runtime_s"].mean()
            xs = [i + j * width for i in range(len(settings))]
            m = [mean.get(st, float("nan")) for st in settings]
            err = [[m[i] - lo.get(st, m[i]) for i, st in enumerate(settings)],
                   [hi.get(st, m[i]) - m[i] for i, st in enumerate(settings)]]  # fmt: skip
            axes[0][k].bar(xs, m, width, yerr=err, label=name, capsize=2)
            axes[1][k].bar(xs, [max(rt.get(st, 0.0), 1e-6) for st in settings], width, label=name)
        ticks = [i + 0.4 - width / 2 for i in range(len(settings))]
        for ax in (axes[0][k], axes[1][k]):
            ax.set_xticks(ticks, [f"|S|={n}, p={p}" for n, p in settings])
        axes[0][k].set_ylabel(f"makespan / {'randomized' if col == 'vs_randomized' else 'LB'}")
        axes[0][k].set_ylim(0.8, max(1.3, float(sub[col].max()) + 0.05))
        axes[0][k].set_title(kind)
        axes[1][k].set_yscale("log")
        axes[1][k].set_ylabel("scheduler runtime (s)")
    axes[0][0].legend(fontsize=8, ncol=2)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def compare_and_write(cfg: CompareConfig, out, progress: bool = True) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Run the comparison and write comparison.csv, summary.csv and comparison.png into `out`; return both frames."""
    from pathlib import Path

    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    df = run_comparison(cfg, progress=progress)
    df.to_csv(out / "comparison.csv", index=False)
    summ = summarize(df)
    summ.to_csv(out / "summary.csv", index=False)
    plot_comparison(df, out / "comparison.png")
    return df, summ
