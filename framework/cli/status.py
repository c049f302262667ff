"""Commands that read how runs are doing, from their directories only: `list` (the runs under a storage root),
`status` (one run's status, progress and driver) and `watch` (a live leaderboard of a run)."""

from __future__ import annotations

import argparse
import sys

from framework.cli.common import (
    _WAIT_HELP,
    WAIT_FOR_RUN_S,
    _board_text,
    _positive_int,
    _say,
    _seconds,
    _wait_for_run,
    _wait_seconds,
)

#: `framework.runs`' status rule, for `list --help` and `status --help` (10 minutes: `framework.runs.RECENT_S`)
_STATUS_RULE = (
    "A run is finished when it committed its last decision. Otherwise: crashed when its driver (the process whose "
    "pid and host the run records at its start and at each resume) recorded its end, or ran on this host and is "
    "gone; running when it runs on this host; running? when it cannot be checked from here (another host, or a "
    "run from before drivers were recorded) and the run changed in the last 10 minutes, unknown when it did not.")


def _list(args: argparse.Namespace) -> int:
    # `list_runs`' rows as dicts, printed as its DataFrame was (`text_table`, `json_records`): no pandas to import
    from framework.runs.manage import LIST_COLUMNS, age, run_rows
    from framework.store.storage import default_root
    from framework.text import json_records, text_table

    root = args.root if args.root is not None else default_root()
    runs = run_rows(args.root, max_depth=args.depth)
    if args.json:
        _say(json_records(runs, LIST_COLUMNS, int_columns=["pid"]))
        return 0
    if not runs:
        _say(f"No runs under {root}")
        return 0
    modes = [r["mode"] for r in runs]
    if any(isinstance(d, str) for d in modes) and all(d is None or isinstance(d, str) for d in modes):
        modes = ["nan" if d is None else d for d in modes]  # a column of text: its None is NaN, as in a DataFrame
    _say(text_table({
        "path": [r["path"] for r in runs], "status": [r["status"] for r in runs],
        "configs": [r["configs"] for r in runs],
        "best": [("-" if r["best"] != r["best"] else f"{r['best']:.4g}")
                 + (f" {r['metric']} ({d})" if isinstance(r["metric"], str) else "") for r, d in zip(runs, modes)],
        "age": [age(r["age_s"]) for r in runs], "verified": ["yes" if r["verified"] else "no" for r in runs],
    }))
    return 0


def _watch(args: argparse.Namespace) -> int:
    import time
    import warnings

    from framework.runs.manage import age
    from framework.steering.status import open_result, run_status
    from framework.store.catalog import UnverifiedRunWarning, configs_named, describe_problems

    _wait_for_run(args)
    while True:
        s = run_status(args.run)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", UnverifiedRunWarning)  # said in every frame instead, with the rows
            with open_result(args.run) as result:
                board = result.get_dataframe().head(args.top).drop(columns=["round"], errors="ignore")
                table = _board_text(result, board)
                unverified = result.unverified  # the board's own reading: a row edited since run_status is flagged
                recent = result.events[result.events.kind.isin(("command", "worker_failed", "worker_joined",
                                                                "config_failed", "worker_killed", "inbox"))].tail(5)
        units = s["units_done"]
        frame = [f"{s['path']}: {s['status']}, {s['num_configs']} configs {s['configs']}, "
                 f"{units.get('train', 0)} train units, {s['rounds']} rounds, last activity {age(s['age_s'])} ago"]
        if unverified:  # what the board shows may not be what the run computed: say so, and which configs
            suspect = configs_named(unverified)
            board.insert(1, "verified", ["NO" if c in suspect else "" for c in board.config_id])
            frame += [f"NOT VERIFIED ({len(unverified)} problems: records edited, or not written by this run under "
                      f"this machine's key; configs marked NO): {describe_problems(unverified, shown=5)}"]
        frame += [board.to_string(index=False) if not board.empty else table]
        if not recent.empty:
            frame += ["recent events:"] + [f"  {k} {d}" for k, d in zip(recent.kind, recent.detail)]
        if not args.once and sys.stdout.isatty():
            print("\x1b[H\x1b[2J", end="")  # clear the terminal: the table refreshes in place
        _say("\n".join(frame), flush=True)
        if args.once or s["status"] not in ("running", "running?"):
            return 0
        time.sleep(args.interval)


def _status(args: argparse.Namespace) -> int:
    import json

    from framework.runs.manage import age, iso
    from framework.steering.status import run_status

    s = run_status(args.run)
    if args.json:
        _say(json.dumps(s, indent=1, default=str))
        return 0
    d = s["driver"] or {}
    driver = f"pid {d.get('pid')} on {d.get('host')}" if d.get("pid") else "not recorded"
    configs = ", ".join(f"{n} {k}" for k, n in s["configs"].items()) or "none"
    units = s["units_done"]
    w = s["workers"]
    when = "now" if s["status"] in ("running", "running?") else "at the end"  # a stopped run has no live workers
    count = str(w["live"]) if w["live"] == w["num_workers"] else f"{w['live']} {when}, {w['num_workers']} at the start"
    best = s["best"]
    lines = [
        ("run", s["path"]),
        ("status", s["status"] + (f" (driver pid {s['pid']})" if s["pid"] else "")),
        ("verified", "yes" if s["verified"] else f"no ({len(s['problems'])} rows or tables, first: {s['problems'][0]})"
         if s["problems"] else "no"),
        ("metric", f"{s['metric']} ({s['mode']})"),
        ("configs", f"{s['num_configs']}: {configs}"),
        ("trained", f"{s['epochs_trained']} epochs, {units['train']} train + {units['eval']} eval units, "
                    f"rounds committed: {s['rounds']}"),
        ("started", iso(s["start_time"]) or "unknown"),
        ("last activity", f"{iso(s['last_activity'])} ({age(s['age_s'])} ago)"),
        ("best", "none yet" if best is None else
         f"config {best['config_id']}: {s['metric']}="
         f"{'-' if best['value'] is None else format(best['value'], '.4g')} at epoch {best['epoch']} {best['config']}"),
        ("workers", f"{count} ({w['executor']}, scheduler {w['scheduler']}), {w['failed']} failed, "
                    f"{w['restarted']} restarted"),
        ("driver", driver + (f", resumed {s['resumes']}x" if s["resumes"] else "")),
    ]
    width = max(len(k) for k, _ in lines) + 1
    for k, v in lines:
        _say(f"{k + ':':<{width}} {v}")
    return 0


def add_parsers(sub, fmt) -> None:
    """list, status and watch."""
    ls = sub.add_parser("list", help="list the runs under a storage root, newest first (reads only)",
                        formatter_class=fmt, description=_STATUS_RULE)
    ls.add_argument("root", nargs="?", default=None,
                    help="the folder to search for runs (None: $MODELHOPPER_STORAGE, else ~/modelhopper_runs)")
    ls.add_argument("--depth", type=_positive_int, default=4,
                    help="how many folder levels below ROOT to search for run directories (folders with run.db)")
    ls.add_argument("--json", action="store_true", help="print JSON records instead of a table")
    ls.set_defaults(func=_list)
    st = sub.add_parser("status", help="one run's status, configs, progress, best config and driver (reads only)",
                        formatter_class=fmt, description=_STATUS_RULE)
    st.add_argument("run", help="run directory (or the URI it was mirrored to)")
    st.add_argument("--json", action="store_true", help="print JSON instead of text")
    st.set_defaults(func=_status)
    wa = sub.add_parser("watch", help="a live leaderboard of a run, refreshed until it stops running (reads only)",
                        formatter_class=fmt)
    wa.add_argument("run", help="run directory (or the URI it was mirrored to)")
    wa.add_argument("--interval", type=_seconds, default=2.0, help="seconds between refreshes (at most a day)")
    wa.add_argument("--top", type=_positive_int, default=10, help="how many of the best configs to show")
    wa.add_argument("--once", action="store_true", help="print once and exit")
    wa.add_argument("--wait", type=_wait_seconds, default=WAIT_FOR_RUN_S, metavar="SECONDS", help=_WAIT_HELP)
    wa.set_defaults(func=_watch)
