"""CLI: `python -m simulators compare|gantt|comm-cost|crossover ...` (each with --help); results go to --out."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import pandas as pd

from framework.text import OneLineParser


def _ints(s: str) -> tuple[int, ...]:
    try:
        return tuple(int(x) for x in s.split(",") if x)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{s!r} is not a comma-separated list of ints, e.g. 8,16") from None


def _strs(s: str) -> tuple[str, ...]:
    return tuple(x for x in s.split(",") if x)


def cmd_compare(a: argparse.Namespace) -> int:
    from framework.scheduling import SCHEDULERS
    from simulators.compare import CompareConfig, compare_and_write

    unknown = sorted(set(a.schedulers) - set(SCHEDULERS))
    if unknown:  # before the output folder is made
        raise ValueError(f"`--schedulers` has {unknown}, but must be among {list(SCHEDULERS)}")
    cfg = CompareConfig(
        configs=a.configs, workers=a.workers, kinds=a.kinds, seeds=tuple(range(a.seeds)),
        schedulers=a.schedulers, time_limit_s=a.time_limit,
    )  # fmt: skip
    out = Path(a.out)
    _, summ = compare_and_write(cfg, out, progress=not a.quiet)
    with pd.option_context("display.width", 200, "display.max_rows", 500, "display.float_format", "{:.4f}".format):
        print(summ.to_string(index=False))
    print(f"wrote {out / 'comparison.csv'}, {out / 'summary.csv'}, {out / 'comparison.png'}")
    return 0


def cmd_gantt(a: argparse.Namespace) -> int:
    from simulators.gantt import plot_gantt
    from simulators.validate import as_frame, validate_schedule

    # the input is read (or simulated) and checked before the output folder is made: a bad one leaves nothing
    if a.schedule:
        try:
            df, failed, label = as_frame(Path(a.schedule)), None, Path(a.schedule).stem
        except ValueError as e:  # not a CSV, or one without the columns: say which file
            raise ValueError(f"`--schedule` {a.schedule!r} is not a schedule: {e}") from e
        if df.empty:
            raise ValueError(f"`--schedule` {a.schedule!r} holds no units: there is nothing to draw")
    else:
        from simulators.compare import make_workload
        from simulators.simulator import Noise, WorkerEvent, simulate

        w = make_workload(a.kind, a.configs, a.workers, a.seed)
        events = [WorkerEvent(t, wk, "fail") for t, wk in _pairs(a.fail)]
        events += [WorkerEvent(t, wk, "return") for t, wk in _pairs(a.ret)]
        r = simulate(w, a.scheduler, epochs=a.epochs, events=events, noise=Noise(a.noise), seed=a.seed)
        df, failed, label = r.schedule, r.failed, f"{a.scheduler}_{a.kind}_{a.configs}x{a.workers}"
    rep = validate_schedule(df)
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    if not a.schedule:
        df.to_csv(out / f"{label}.csv", index=False)
    path = out / f"{label}.png"
    plot_gantt(df, path, title=f"{label}: makespan {rep.makespan:.4g}, valid={rep.ok}", failed=failed)
    print(f"units {len(df)}  makespan {rep.makespan:.4f}  valid {rep.ok}  -> {path}")
    for v in rep.violations[:10]:
        print("  violation:", v)
    return 0 if rep.ok else 1


def _pair(item: str) -> tuple[float, int]:
    """`TIME:WORKER` -> (time, worker)."""
    try:
        t, w = item.split(":")
        return float(t), int(w)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{item!r} is not TIME:WORKER, e.g. 30:2 (worker 2 at t=30)") from None


def _pairs(items: list[tuple[float, int]] | None) -> list[tuple[float, int]]:
    return list(items or [])


def cmd_comm_cost(a: argparse.Namespace) -> int:
    from simulators.comm_cost import GB, TB, CommCostParams, comm_costs

    p = CommCostParams(a.epochs, a.configs, a.workers, a.model_gb * GB, a.data_tb * TB, a.minibatches)
    df = comm_costs(p)
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    df.to_csv(out / "comm_cost.csv", index=False)
    with pd.option_context("display.width", 200):
        print(df.to_string(index=False))
    print(f"wrote {out / 'comm_cost.csv'}")
    return 0


def cmd_crossover(a: argparse.Namespace) -> int:
    from simulators.crossover import CrossoverConfig, crossover_and_write

    bad = sorted(set(a.kinds) - {"homogeneous", "heterogeneous"})
    if bad:
        raise ValueError(f"`--kinds` has {bad}, but must be among homogeneous, heterogeneous")
    if not a.comm >= 0:
        raise ValueError(f"`--comm` is {a.comm}, but must be >= 0")
    cfg = CrossoverConfig(workers=a.workers, kinds=a.kinds, comm=a.comm, seed=a.seed, time_limit_s=a.time_limit,
                          hyperband_workers=a.hyperband_workers)
    out = Path(a.out)
    summary, hb = crossover_and_write(cfg, out, progress=not a.quiet)
    with pd.option_context("display.width", 200, "display.max_rows", 500, "display.float_format", "{:.3f}".format):
        print(summary.to_string(index=False))
        if not hb.empty:
            print(hb.to_string(index=False))
    print(f"wrote {out / 'crossover_summary.csv'}, {out / 'crossover.png'}")
    return 0


def build_parser() -> argparse.ArgumentParser:
    fmt = argparse.ArgumentDefaultsHelpFormatter
    ap = OneLineParser(prog="python -m simulators", description=__doc__, formatter_class=fmt)
    sub = ap.add_subparsers(dest="command", required=True)

    c = sub.add_parser("compare", help="Cerebro Figure 6: makespans and runtimes of all schedulers on a grid",
                       formatter_class=fmt)
    c.add_argument("--configs", type=_ints, default=(16, 256), help="comma-separated |S| values")
    c.add_argument("--workers", type=_ints, default=(8, 16), help="comma-separated p values")
    c.add_argument("--kinds", type=_strs, default=("homogeneous", "heterogeneous"),
                   help="comma-separated workload kinds: homogeneous, heterogeneous")
    c.add_argument("--seeds", type=int, default=5, help="number of seeds")
    c.add_argument(
        "--schedulers", type=_strs, default=("randomized", "mwr", "lpt", "lookahead", "approx", "cpsat", "milp"),
        help="comma-separated names from framework.scheduling.SCHEDULERS",
    )
    c.add_argument("--time-limit", type=float, default=5.0,
                   help="budget per exact solve, in reference seconds of deterministic work (paper: 300 s)")
    c.add_argument("--out", default="results/scheduler_comparison", help="output folder")
    c.add_argument("--quiet", action="store_true", help="no progress bar")
    c.set_defaults(func=cmd_compare)

    g = sub.add_parser("gantt", help="Gantt chart PNG of a schedule CSV (e.g. a live schedule.csv) or a simulation",
                       formatter_class=fmt)
    g.add_argument("--schedule", help="CSV with config_id,epoch,partition,worker,kind,start,end; None: simulate")
    g.add_argument("--scheduler", default="randomized", help="a name from framework.scheduling.SCHEDULERS")
    g.add_argument("--kind", default="heterogeneous", choices=("homogeneous", "heterogeneous"), help="workload kind")
    g.add_argument("--configs", type=int, default=16, help="|S|, configs simulated")
    g.add_argument("--workers", type=int, default=8, help="p, workers simulated")
    g.add_argument("--epochs", type=int, default=1, help="epochs simulated")
    g.add_argument("--seed", type=int, default=0, help="workload and policy seed")
    g.add_argument("--noise", type=float, default=0.0, help="lognormal sigma of unit times")
    g.add_argument("--fail", nargs="*", type=_pair, help="worker failures as TIME:WORKER")
    g.add_argument("--ret", nargs="*", type=_pair, help="worker returns as TIME:WORKER")
    g.add_argument("--out", default="results/gantt", help="output folder")
    g.set_defaults(func=cmd_gantt)

    m = sub.add_parser("comm-cost", help="Cerebro Table 2: communication cost of MOP vs other approaches",
                       formatter_class=fmt)
    m.add_argument("--epochs", type=int, default=20, help="k, epochs")
    m.add_argument("--configs", type=int, default=20, help="|S|, configs")
    m.add_argument("--workers", type=int, default=10, help="p, workers")
    m.add_argument("--model-gb", type=float, default=1.0, help="m, model size in GB")
    m.add_argument("--data-tb", type=float, default=1.0, help="<D>, data size in TB")
    m.add_argument("--minibatches", type=int, default=100_000, help="|D|/b, minibatches per epoch")
    m.add_argument("--out", default="results/comm_cost", help="output folder")
    m.set_defaults(func=cmd_comm_cost)
    x = sub.add_parser("crossover", help="Cerebro Figure 17: MOP, data parallel, Cerebro's switch and the joint "
                       "planner as |S| goes from 1 to p", formatter_class=fmt)
    x.add_argument("--workers", type=_ints, default=(8, 16, 64), help="comma-separated p values")
    x.add_argument("--kinds", type=_strs, default=("homogeneous", "heterogeneous"),
                   help="comma-separated workload kinds: homogeneous, heterogeneous")
    x.add_argument("--comm", type=float, default=0.05,
                   help="a gang unit's all-reduce as a fraction of a mean unit's compute")
    x.add_argument("--seed", type=int, default=0, help="workload and policy seed")
    x.add_argument("--time-limit", type=float, default=None,
                   help="budget per plan of the planner's CP-SAT, in reference seconds of deterministic work; None: "
                        "2%% of the plan's greedy makespan, within 10 ms and 2 s, as in a live run")
    x.add_argument("--hyperband-workers", type=int, default=8, help="p of the HyperBand run (0: none)")
    x.add_argument("--out", default="results/crossover", help="output folder")
    x.add_argument("--quiet", action="store_true", help="no progress line")
    x.set_defaults(func=cmd_crossover)
    return ap


def main(argv: list[str] | None = None) -> int:
    ap = build_parser()
    a = ap.parse_args(argv)
    try:
        return a.func(a)
    except (OSError, ValueError, TypeError, KeyError) as e:  # bad input: one line, never a traceback
        print(f"{ap.prog} {a.command}: error: {e.args[0] if isinstance(e, KeyError) and e.args else e}",
              file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
