"""The real driver loop at scale, simulated: HyperBand over 256 workers and ~1,000 configs, with worker failures.

The run is the engine's own loop (`framework.driver`) on `simulators.SimulatedBackend`: the same dispatch state,
policies, recovery handlers and procedure as a live run; only the clock and the training are simulated. It prints
the makespan against a lower bound and the driver's rate (unit events handled per second of wall time; the target
is >= 30,000 on 2 cores, so that a Figure-6 grid of simulations takes seconds), then the same for
`simulate(heterogeneous(64, 32))` (one epoch of 64 configs on 32 workers; target >= 50,000/s). `--profile N` prints
the N functions with the most time of their own (cProfile) for the HyperBand run.

Setting: 64 training partitions held by 4 workers each (256 workers), 8 validation partitions held by 32 workers
each; unit times from `simulators.heterogeneous` (one row per config); HyperBand(max_epochs=27, eta=3,
iterations=20) = 980 configs; 16 workers fail at given times and come back 30 simulated seconds later. Needs no
Ray: `python experiments/driver_scale.py [--workers 256 --iterations 20 --seed 0]`.

`--depth-cost` instead prints what a completion costs the driver at queue depth 2 against depth 1, measured side
by side in one run: one epoch of 3,000 configs on 1,024 workers (8 training partitions held by 128 workers each,
one validation partition held by all), each depth run `--repeats` times alternately, the least CPU time of each
kept. The target is a ratio <= 1.3: the idle workers at each capacity are indexed incrementally, so no dispatch
walks every worker.

`--deterministic-cost` instead prints what `ModelSelection(deterministic=True)` costs in makespan: the seeded visit
order (`SeededOrderScheduler`) against the default randomized dispatch, side by side on the same simulated
workloads (2 epochs, unit times with lognormal noise sigma 0.2, 5 seeds each).
"""

from __future__ import annotations

import argparse
import math
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import numpy as np  # noqa: E402

import automl  # noqa: E402
from experiments._common import provenance  # noqa: E402
from framework.scheduling import SCHEDULERS, SeededOrderScheduler  # noqa: E402
from framework.text import OneLineParser  # noqa: E402
from simulators import (  # noqa: E402
    FAIL,
    RETURN,
    Noise,
    WorkerEvent,
    Workload,
    heterogeneous,
    homogeneous,
    simulate,
    simulate_selection,
)
from simulators import lower_bound as shop_lower_bound  # noqa: E402

SPACE = {"lr": automl.loguniform(1e-4, 1e-1), "width": [64, 128, 256]}


def objective(config: dict, epoch: int) -> dict[str, float]:
    """A smooth synthetic learning curve: the loss falls with epochs towards a floor set by lr and width."""
    floor = (math.log10(config["lr"]) + 2.5) ** 2 / 4 + 64 / config["width"] / 10
    return {"valid_loss": floor + 1.0 / (1 + epoch), "train_loss": floor + 0.8 / (1 + epoch)}


def workload(workers: int, configs: int, replicas: int, seed: int) -> Workload:
    parts = workers // replicas
    times = heterogeneous(configs, workers, seed=seed).times
    availability = {q: tuple(q + k * parts for k in range(replicas)) for q in range(parts)}
    evals = max(1, parts // 8)
    per = workers // evals
    availability.update({parts + e: tuple(range(e * per, (e + 1) * per)) for e in range(evals)})
    return Workload(times, availability, eval_partitions=tuple(range(parts, parts + evals)), name="driver-scale")


def lower_bound(result, wl: Workload) -> float:
    """max(total work / workers, the longest config's chain of units), each unit on its fastest holder."""
    s = result.schedule
    fastest = np.array([min(wl.times[c, w] for w in wl.availability[q]) * (1 if k == "train" else wl.eval_fraction)
                        for c, q, k in zip(s.config_id, s.partition, s.kind)])
    chains = s.assign(t=fastest).groupby("config_id").t.sum()
    return max(fastest.sum() / wl.n_workers, chains.max())


def depth_cost(workers: int = 1024, configs: int = 3000, repeats: int = 3, seed: int = 0) -> float:
    """Prints ms of driver CPU per completion at queue depth 1 and 2 (best of `repeats` each, run alternately, so
    both see the same machine) and their ratio; returns the ratio."""
    wl = workload(workers, configs, replicas=workers // 8, seed=seed)
    best: dict[int, float] = {1: math.inf, 2: math.inf}
    units = 0
    for _ in range(repeats):
        for depth in (1, 2):
            t0 = time.process_time()
            r = simulate(wl, "randomized", seed=seed, queue_depth=depth)
            best[depth] = min(best[depth], (time.process_time() - t0) / len(r.schedule))
            units = len(r.schedule)
    ratio = best[2] / best[1]
    print(f"{configs:,} configs on {workers:,} workers, one epoch ({units:,} units), best of {repeats}: "
          f"{1000 * best[1]:.3f} ms per completion at queue depth 1, {1000 * best[2]:.3f} ms at depth 2, "
          f"ratio {ratio:.2f} (target <= 1.3)")
    return ratio


def deterministic_cost(seeds: int = 5) -> None:
    """Makespan / lower bound of the randomized and the seeded dispatch on the same workloads."""
    print(f"{'workload':14s} {'|S|':>4s} {'p':>3s}  randomized  deterministic  cost")
    for kind in ("homogeneous", "heterogeneous"):
        for n_configs, p in ((16, 8), (32, 8), (16, 16)):
            rand, seeded = [], []
            for seed in range(seeds):
                w = homogeneous(n_configs, p) if kind == "homogeneous" else heterogeneous(n_configs, p, seed=seed)
                lb = shop_lower_bound(w, epochs=2)
                noise = Noise(sigma=0.2)
                rand.append(simulate(w, "randomized", epochs=2, seed=seed, noise=noise).makespan / lb)
                seeded.append(simulate(w, SeededOrderScheduler(seed), epochs=2, seed=seed, noise=noise).makespan / lb)
            r, d = float(np.mean(rand)), float(np.mean(seeded))
            print(f"{kind:14s} {n_configs:4d} {p:3d}  {r:10.3f}  {d:13.3f}  x{d / r:.3f}")


def main(argv: list[str] | None = None) -> int:
    ap = OneLineParser(prog=Path(__file__).name, description=__doc__.splitlines()[0],
                       formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    ap.add_argument("--workers", type=int, default=256, help="simulated workers")
    ap.add_argument("--replicas", type=int, default=4, help="workers holding each training partition")
    ap.add_argument("--iterations", type=int, default=20, help="HyperBand iterations (49 configs each)")
    ap.add_argument("--max-epochs", type=int, default=27, help="HyperBand's R")
    ap.add_argument("--failures", type=int, default=16, help="workers that fail (and return 30 s later)")
    ap.add_argument("--scheduler", default="randomized", choices=list(SCHEDULERS), help="the dispatch policy")
    ap.add_argument("--seed", type=int, default=0, help="seeds the configs, the unit times and the policy")
    ap.add_argument("--profile", type=int, default=0, metavar="N",
                    help="print the N functions with the most own time in the HyperBand run (cProfile; slower)")
    ap.add_argument("--depth-cost", action="store_true",
                    help="print a completion's cost at queue depth 2 against depth 1 instead (module docstring)")
    ap.add_argument("--repeats", type=int, default=3, help="--depth-cost: runs of each depth (the best counts)")
    ap.add_argument("--deterministic-cost", action="store_true",
                    help="print the makespan cost of deterministic=True instead (see the module docstring)")
    a = ap.parse_args(argv)
    if a.depth_cost:
        depth_cost(repeats=a.repeats, seed=a.seed)
    elif a.deterministic_cost:
        deterministic_cost()
    else:
        hyperband_at_scale(a)
    print("\n" + provenance())
    return 0


def hyperband_at_scale(a: argparse.Namespace) -> None:
    """The HyperBand selection of the module docstring, then `simulate(heterogeneous(64, 32))`: makespan against a
    lower bound and the driver's rate."""
    procedure = automl.HyperBand(SPACE, max_epochs=a.max_epochs, eta=3, seed=a.seed, iterations=a.iterations)
    n_configs = sum(b.rungs[0].n for b in procedure.brackets)
    wl = workload(a.workers, n_configs, a.replicas, a.seed)
    rng = np.random.default_rng(a.seed)
    events = []
    for w, t in zip(rng.choice(a.workers, size=a.failures, replace=False), rng.uniform(5, 200, size=a.failures)):
        events += [WorkerEvent(float(t), int(w), FAIL), WorkerEvent(float(t) + 30, int(w), RETURN)]
    run = lambda: simulate_selection(procedure, wl, objective, scheduler=a.scheduler, events=events,  # noqa: E731
                                     seed=a.seed)
    if a.profile:
        import cProfile
        import pstats

        profiler = cProfile.Profile()
        r = profiler.runcall(run)
        pstats.Stats(profiler).sort_stats("tottime").print_stats(a.profile)
    else:
        r = run()
    lb = lower_bound(r, wl)
    units = len(r.schedule) + len(r.failed)
    best = r.configs.sort_values("valid_loss").iloc[0]
    print(f"HyperBand R={a.max_epochs} x{a.iterations}: {len(r.configs)} configs, {r.rounds} rounds, "
          f"{a.workers} workers ({len(wl.train_partitions)} partitions x {a.replicas}), {a.failures} failures")
    print(f"units done {len(r.schedule):,}, interrupted {len(r.failed)}; best config {int(best.config_id)} "
          f"valid_loss={best.valid_loss:.4f} after {int(best.epochs)} epochs")
    print(f"makespan {r.makespan:,.1f} s (simulated), lower bound {lb:,.1f} s, ratio {r.makespan / lb:.3f}")
    print(f"driver: {units:,} unit events in {r.wall_s:.1f} s wall = {units / r.wall_s:,.0f} events/s "
          f"(policy {r.decision_time_s:.1f} s; target >= 30,000/s)")
    het = heterogeneous(64, 32, seed=a.seed)
    rates = [simulate(het, a.scheduler, seed=a.seed).events_per_s for _ in range(3)]
    print(f"simulate(heterogeneous(64, 32)): {64 * 32:,} unit events, best of 3 = {max(rates):,.0f} events/s "
          f"(target >= 50,000/s)")


if __name__ == "__main__":
    raise SystemExit(main())
