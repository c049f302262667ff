"""Commands about whole runs on disk: `compare` (the best configs of several runs), `export` (a run's tables as files),
`resume` (a crashed run continued with the functions it recorded) and `dashboard` (a run's live web page)."""

from __future__ import annotations

import argparse
import os

from framework.cli.common import (
    _ACCEPT_CHANGED,
    _WAIT_HELP,
    WAIT_FOR_RUN_S,
    _any_seconds,
    _checkpoint,
    _count,
    _pack,
    _positive_int,
    _ran,
    _resources,
    _say,
    _wait_for_run,
    _wait_seconds,
)


def _compare(args: argparse.Namespace) -> int:
    from framework.runs.manage import compare_runs

    board = compare_runs(args.runs, args.metric, args.mode, args.scope, top=args.top)
    if args.json:
        _say(board.to_json(orient="records", indent=1))
        return 0
    _say(board.to_string(index=False))
    return 0


def _export(args: argparse.Namespace) -> int:
    from framework.runs.manage import export_run

    files = export_run(args.run, args.format, args.out)
    _say(f"Exported {len(files)} tables of {args.run} to {os.path.dirname(next(iter(files.values())))}: "
         f"{', '.join(os.path.basename(f) for f in files.values())}")
    return 0


def _resume(args: argparse.Namespace) -> int:
    from framework.functions import FUNCTIONS
    from framework.runs.manage import resume_run
    from framework.steering.status import run_status

    if run_status(args.run)["status"] == "finished":
        _say(f"The run in {args.run} had finished: nothing to resume")
        return 0
    overrides = {k: v for k, v in (
        ("scheduler", args.scheduler), ("queue_depth", args.queue_depth), ("checkpoint", args.checkpoint),
        ("unit_timeout_s", args.unit_timeout_s), ("max_unit_retries", args.max_unit_retries),
        ("max_worker_restarts", args.max_worker_restarts), ("worker_resources", args.worker_resources),
        ("pack", args.pack), ("time_budget_s", args.time_budget_s),
    ) if v is not None}
    functions = {n: getattr(args, n) for n in FUNCTIONS if getattr(args, n) is not None}
    result = resume_run(args.run, trust_unverified=args.trust_unverified, functions=functions,
                        progress=not args.quiet, accept_changed_data=args.accept_changed_data, **overrides)
    _say(f"Resumed {args.run}: it finished")
    _say(result.leaderboard().drop(columns=["round"], errors="ignore").to_string(index=False))
    return _ran(result, args)


def _dashboard(args: argparse.Namespace) -> int:
    import time

    from framework.dashboard import serve

    _wait_for_run(args)
    with serve(args.run, host=args.host, port=args.port, token=args.token) as board:
        _say(f"Serving the dashboard of {args.run} at {board.url} (Ctrl-C stops it)", flush=True)
        try:
            while True:
                time.sleep(3600)
        except KeyboardInterrupt:
            return 0


def add_parsers(sub, fmt) -> None:
    """compare, export, resume and dashboard."""
    cmp = sub.add_parser("compare", help="the best configs of several runs side by side (reads only)",
                         formatter_class=fmt,
                         description="Each run is ranked by its own metric and mode unless --metric is given.")
    cmp.add_argument("runs", nargs="+", metavar="run", help="run directories (or the URIs they were mirrored to)")
    cmp.add_argument("--top", type=_positive_int, default=1, help="how many of the best configs to show per run")
    cmp.add_argument("--metric", default=None, help="rank every run by this metric (None: each run by its own)")
    cmp.add_argument("--mode", choices=("min", "max"), default=None,
                     help="min or max, needed with a --metric other than a run's (None: each run's own)")
    cmp.add_argument("--scope", default="last",
                     help="rank each config by its last epoch (last), its best (all), or the mean over all or its "
                          "last N epochs (avg, last-N-avg)")
    cmp.add_argument("--json", action="store_true", help="print JSON records instead of a table")
    cmp.set_defaults(func=_compare)
    exp = sub.add_parser("export", help="write a run's tables as CSV or Parquet files into a new folder (reads "
                                        "the run only)", formatter_class=fmt)
    exp.add_argument("run", help="run directory (or the URI it was mirrored to)")
    exp.add_argument("--format", choices=("csv", "parquet"), default="csv",
                     help="file format of the leaderboard, metrics, schedule, configs, failures and events tables")
    exp.add_argument("--out", default=None,
                     help="a new (or empty) folder outside the run (None: <run>-export beside the run)")
    exp.set_defaults(func=_export)
    res = sub.add_parser(
        "resume", help="continue a crashed run with the functions it recorded", formatter_class=fmt,
        description="Continue a crashed run (see `status`): its user functions (model_fn, train_fn or step_fn, "
                    "eval_fn or eval_step, input_fn) are imported by the module:qualname the run recorded, and only "
                    "when the run verifies under this "
                    "machine's key. A run that had finished prints one line and exits with 0; a running run, one "
                    "whose functions cannot be imported (defined in __main__ or inside a function) or that used "
                    "extract= is an error: resume those from Python with ModelSelection.resume(path, model_fn, "
                    "...). A run whose status is unknown (another host's, unchanged for 10 minutes) is resumed: make "
                    "sure its driver is gone. The number of workers is the run's own (its data placement is "
                    "recorded).")
    res.add_argument("run", help="run directory (or the URI it was mirrored to)")
    res.add_argument("--trust-unverified", action="store_true",
                     help="resume a run whose run.db does not verify under this machine's key; the functions it "
                          "names are still never imported, so name each one with --model-fn etc.")
    res.add_argument("--accept-changed-data", action="store_true", help=_ACCEPT_CHANGED)
    from framework.functions import FUNCTIONS

    for name in FUNCTIONS:
        res.add_argument(f"--{name.replace('_', '-')}", dest=name, metavar="MODULE:QUALNAME", default=None,
                         help=f"import {name} from here instead of the name the run recorded (None: the run's)")
    res.add_argument("--scheduler", default=None,
                     help="which waiting unit an idle worker trains next, a name from "
                          "framework.scheduling.SCHEDULERS (None: the run's)")
    res.add_argument("--queue-depth", type=_positive_int, default=None,
                     help="units a worker holds at once (None: the run's)")
    res.add_argument("--checkpoint", type=_checkpoint, default=None,
                     help="when config states reach the disk: epoch, unit, or every N seconds (None: the run's)")
    res.add_argument("--unit-timeout-s", type=_any_seconds, default=None,
                     help="seconds after which a running unit counts as hung (None: the run's)")
    res.add_argument("--max-unit-retries", type=_count, default=None,
                     help="how often a unit whose user code raised is retried (None: the run's)")
    res.add_argument("--max-worker-restarts", type=_count, default=None,
                     help="how often a worker id is restarted after it died (None: the run's)")
    res.add_argument("--worker-resources", type=_resources, default=None,
                     help="Ray resources per worker as JSON, e.g. '{\"CPU\": 1}' to resume a GPU run on CPU "
                          "workers (None: the run's)")
    res.add_argument("--pack", type=_pack, default=None,
                     help="configs a worker trains at once as one fused model: 1..16 or auto (None: the run's)")
    res.add_argument("--time-budget-s", type=_any_seconds, default=None,
                     help="the run's time budget in seconds, summed over its sessions: larger than what it has spent "
                          "to continue a run that spent its budget (None: the run's)")
    res.add_argument("--quiet", action="store_true", help="no progress bar on stderr")
    res.set_defaults(func=_resume)
    da = sub.add_parser("dashboard", help="serve a live web dashboard of a run (framework.dashboard) until Ctrl-C",
                        formatter_class=fmt, description="Serves a page with the run's status, leaderboard, learning "
                        "curves, schedule and events, refreshed every second, with buttons that steer a running run "
                        "(stop, resume or clone a config, add one, pause, add workers, extend). Every request needs "
                        "the dashboard's token, on every host, 127.0.0.1 included (any account on the machine can "
                        "reach a port on localhost): a random one is made when --token is not given, the URL it "
                        "prints carries it, and while it serves it is kept in a file only you can read (dashboards/ "
                        "beside the signing key). Bound to 127.0.0.1, localhost or ::1, it answers only requests "
                        "addressed to that host.")
    da.add_argument("run", help="run directory")
    da.add_argument("--host", default="127.0.0.1", help="address to listen on (0.0.0.0: every interface)")
    da.add_argument("--port", type=int, default=0, help="port to listen on (0: a free one)")
    da.add_argument("--token", default=None, help="the token every request must carry, on every host (None: a new "
                                                  "random one, which the printed URL carries)")
    da.add_argument("--wait", type=_wait_seconds, default=WAIT_FOR_RUN_S, metavar="SECONDS", help=_WAIT_HELP)
    da.set_defaults(func=_dashboard)
