"""Command line: `python -m framework COMMAND --help` (the console script `modelhopper`): demo, show, replay, list,
status, watch, compare, export, resume, workers, pause, unpause, stop, resume-config, add, clone, extend, dashboard,
up, down (the warm local service, `framework.cluster.service`).
The commands about runs are thin glue over `framework.runs` (reading them), `framework.steering.connect` (steering a running
one) and `framework.dashboard` (a web page of one)."""

from __future__ import annotations

import argparse
import contextlib
import math
import os
import sys
import time
import warnings

from framework.cli import OneLineParser, printable

#: the longest wait a flag takes (`--interval`, `--timeout`): a day; `inf` would overflow `time.sleep`
MAX_WAIT_S = 86400.0
_ANSWER_WAIT = "seconds to wait for the driver's answer (at most a day)"
#: how long `watch` and `dashboard` wait for a run just launched to appear in the directory they are given
WAIT_FOR_RUN_S = 60.0
_WAIT_HELP = ("seconds to wait for a run that is starting (the folder or its run.db not there yet, as right after "
              "the run was launched; at most a day, 0: do not wait)")


def _say(text: object = "", **kwargs) -> None:
    """`print` with each line `printable`: a run folder's name that is not UTF-8 (or an edited catalog's text) neither
    raises on a terminal that takes UTF-8 only nor sends the terminal control characters."""
    print("\n".join(printable(line) for line in str(text).split("\n")), **kwargs)


def _demo(args: argparse.Namespace) -> int:
    import automl
    import framework
    from framework.examples import classifier_step_fn, digits_arrays, mlp_model_fn

    x, y = digits_arrays()
    ds = framework.PartitionedDataset.from_arrays(x, y, num_partitions=args.workers, seed=args.seed)
    space = {"hidden": [32, 128], "lr": [0.01, 0.05, 0.2], "batch_size": [32], "optimizer": ["sgd"]}
    _say(f"Model selection on scikit-learn digits: {len(x)} images, {args.workers} partitions/workers, "
         f"grid of {2 * 3} MLP configs x {args.epochs} epochs, scheduler={args.scheduler}")
    sel = framework.ModelSelection(
        mlp_model_fn, step_fn=classifier_step_fn, dataset=ds, procedure=automl.GridSearch(space, epochs=args.epochs),
        num_workers=args.workers, scheduler=args.scheduler, seed=args.seed, storage_path=args.storage_path,
        metric="valid_accuracy", mode="max", pack=args.pack,
    )
    result = sel.run()
    board = result.leaderboard()
    board["config"] = board.config_id.map(result.configs)
    _say("\nLeaderboard (latest epoch):")
    _say(board[["config_id", "valid_accuracy", "valid_loss", "train_loss", "config"]].to_string(index=False))
    _say(f"\nBest config {result.best_config_id}: {result.best_config}")
    _say(f"Results written to {result.storage_path} (metrics.csv, schedule.csv, leaderboard.csv, checkpoints/, "
         f"run.db, learning_curves.png)")
    return _ran(result, args)


def _ran(result, args: argparse.Namespace) -> int:
    """The exit code of a command that ran a selection (demo, resume, replay): 0, or 1 when every config of the run
    failed, said at the end on stderr (the tracebacks are in `show RUN`)."""
    if not result.all_failed:
        return 0
    print(printable(f"{args.prog} {args.command}: every config failed ({len(result.configs)} configs): see their "
                    f"errors with `{args.prog} show {result.storage_path}`"), file=sys.stderr, flush=True)
    return 1


def _show(args: argparse.Namespace) -> int:
    from framework.steering.status import open_result
    from framework.store.catalog import CatalogError

    with open_result(args.storage_path) as result:  # a run opened from a URI is a temporary copy: removed after
        try:
            return _print_run(result, args)
        except (KeyError, TypeError, IndexError, AttributeError) as e:
            if result.verified:
                raise
            # rows of an edited catalog need not fit together: say so in one line, as for any unverified run
            raise CatalogError(f"the run in {args.storage_path!r} is not verified and its rows do not fit together "
                               f"({type(e).__name__}: {e})") from e


def _print_run(result, args: argparse.Namespace) -> int:
    import json

    board = result.get_dataframe(args.metric, args.mode, args.scope)
    if args.top is not None:
        board = board.head(args.top)
    if args.json:
        out = {"storage_path": result.storage_path, "metric": args.metric or result.metric,
               "mode": args.mode or result.mode, "configs": len(result.configs),
               "leaderboard": json.loads(board.to_json(orient="records")),
               "failures": json.loads(result.failures.to_json(orient="records"))}
        _say(json.dumps(out, indent=1))
        return 0
    _say(result)
    _say(_board_text(result, board))
    if not result.failures.empty:
        _say("\nFailed configs:")
        for row in result.failures.itertuples():
            _say(f"--- config {row.config_id}\n{row.error}")
    return 0


def _board_text(result, board) -> str:
    """A leaderboard as a table; for a run in which no config has finished an epoch yet (its table would be empty),
    one line that says so, with the units done so far."""
    if not board.empty:
        return board.drop(columns=["round"], errors="ignore").to_string(index=False)
    kinds = result.schedule.kind.value_counts() if not result.schedule.empty else {}
    train, evals = int(kinds.get("train", 0)), int(kinds.get("eval", 0))
    return (f"No epoch has finished yet: {len(result.configs)} configs, {train} training and {evals} evaluation "
            "units done so far")


def _wait_for_run(args: argparse.Namespace) -> None:
    """Before `watch` or `dashboard` reads `args.run`: wait (at most `--wait` seconds, saying so on stderr) while it
    holds no run that has started, as right after the run was launched. No run after the wait is an error; a run
    given by URI is not waited for."""
    from framework.result import CATALOG_FILE
    from framework.steering.status import run_started, wait_for_run
    from framework.store.storage import is_uri

    if args.wait == 0 or is_uri(args.run) or run_started(args.run):
        return
    print(printable(f"{args.prog} {args.command}: waiting up to {args.wait:g} s for a run to start in {args.run} "
                    "(--wait)"), file=sys.stderr, flush=True)
    if not wait_for_run(args.run, args.wait) and not os.path.isfile(os.path.join(args.run, CATALOG_FILE)):
        raise TimeoutError(f"`run` {args.run!r} holds no {CATALOG_FILE}: not a run directory (no run started there "
                           f"within {args.wait:g} s; --wait SECONDS waits longer)")


#: the help of resume's and replay's --accept-changed-data
_ACCEPT_CHANGED = ("go on where the data differs from what the run read (a file's size, columns or bytes; refused "
                   "otherwise, naming the file); the run's events record it")


def _replay(args: argparse.Namespace) -> int:
    import framework
    from framework.store.storage import unusable_dir

    why = unusable_dir(args.out) if args.out is not None else None
    if why is not None:
        raise ValueError(f"`--out` is {args.out!r}, but {why}: it must be a new folder (or one that holds no run)")
    result = framework.replay(args.storage_path, out_path=args.out, device=args.device,
                              trust_unverified=args.trust_unverified, accept_changed_data=args.accept_changed_data)
    _say(f"Replayed into {result.storage_path}")
    _say(result.leaderboard().drop(columns=["round"], errors="ignore").to_string(index=False))
    return _ran(result, args)


def _cleanup(args: argparse.Namespace) -> int:
    import psutil

    from framework.cluster import orphans

    pids = orphans.reap(dry_run=True)
    for pid in pids:
        with contextlib.suppress(psutil.Error):
            _say(f"{pid} {psutil.Process(pid).name()}")
    if not pids:
        _say("No Ray processes left by killed drivers")
    elif args.dry_run:
        _say(f"{len(pids)} Ray processes left by killed drivers (--dry-run: none stopped)")
    else:
        _say(f"stopped {len(orphans.reap())} Ray processes left by killed drivers")
    return 0


def _up(args: argparse.Namespace) -> int:
    import json

    from framework.cluster import service

    if args.status:
        s = service.status()
    else:
        from framework.engine import pool  # (torch: the pool's workers are of the class runs use)

        s = pool.up(num_cpus=args.num_cpus, pool=args.pool,
                       say=(lambda line: _say(line, file=sys.stderr)) if args.json else _say)
    if args.json:
        _say(json.dumps(s, indent=1))
    elif args.status:
        _say(_service_text(s))
    return 0


def _service_text(s: dict) -> str:
    """`up --status`: the service, its pool and the runs attached to it, as lines."""
    if not s["up"]:
        return "service:  not up (`modelhopper up` starts it)" + (f"; {s['note']}" if s.get("note") else "")
    since = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(s["start_time"]))
    lines = [f"service:  up at {s['address']} since {since} ({s['num_cpus']} CPUs; Ray's temp dir {s['temp_dir']})"]
    if "error" in s:
        return "\n".join([*lines, f"pool:     {s['error']}"])
    lines.append(f"pool:     {s['idle']} idle (pids {s['idle_pids']}), {s['leased']} leased, {s['warming']} warming "
                 f"up; size {s['size']}, {s['reclaimed']} reclaimed from crashed runs" + (
                     ", stopping" if s["state"] != "up" else ""))
    runs = ", ".join(f"driver pid {pid} (Ray job {job})" for job, pid in sorted(s["runs"].items()))
    return "\n".join([*lines, f"attached: {runs or 'none'}"])


def _down(args: argparse.Namespace) -> int:
    from framework.cluster import service

    service.down(timeout_s=args.timeout, say=_say)
    return 0


def _list(args: argparse.Namespace) -> int:
    # `list_runs`' rows as dicts, printed as its DataFrame was (`text_table`, `json_records`): no pandas to import
    from framework.cli import json_records, text_table
    from framework.runs.manage import LIST_COLUMNS, age, run_rows
    from framework.store.storage import default_root

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


def _workers(args: argparse.Namespace) -> int:
    from framework.steering.connect import connect

    handle = connect(args.run, source="cli")
    if args.add is None and args.drain is None:
        raise ValueError("give --add N or --drain WORKER")
    outcomes = []
    if args.add is not None:
        outcomes.append(handle.add_workers(args.add, timeout=args.timeout))
    if args.drain is not None:
        outcomes.append(handle.drain(args.drain, timeout=args.timeout))
    return _report(outcomes)


def _report(outcomes: list) -> int:
    """What the driver did with each command, one line each; exit code 1 when it rejected one."""
    for o in outcomes:
        _say(f"{o.name}: {o.outcome}" if o.applied else f"{o.name} rejected: {o.outcome}")
    return 0 if all(o.applied for o in outcomes) else 1


def _pause(args: argparse.Namespace) -> int:
    from framework.steering.connect import connect

    handle = connect(args.run, source="cli")
    return _report([handle.pause(args.timeout) if args.command == "pause" else handle.unpause(args.timeout)])


def _config_command(args: argparse.Namespace) -> int:
    """stop, resume-config, add, clone, extend: one command to the running run's driver."""
    from framework.steering.connect import connect

    handle, t = connect(args.run, source="cli"), args.timeout
    if args.command == "stop":
        return _report([handle.stop(args.config_id, timeout=t)])
    if args.command == "resume-config":
        return _report([handle.resume(args.config_id, epochs=args.epochs, timeout=t)])
    if args.command == "add":
        return _report([handle.add(_json_object(args.config, "config"), epochs=args.epochs, timeout=t)])
    if args.command == "clone":
        overrides = dict(_setting(kv) for kv in args.set)
        return _report([handle.clone(args.config_id, warm=not args.cold, epochs=args.epochs, timeout=t,
                                     **overrides)])
    if args.epochs is None and args.samples is None:
        raise ValueError("give --epochs N or --samples N (or both)")
    return _report([handle.extend(epochs=args.epochs, samples=args.samples, timeout=t)])


def _json_object(text: str, what: str) -> dict:
    import json

    try:
        value = json.loads(text)
    except (json.JSONDecodeError, RecursionError) as e:
        given = repr(text) if len(text) <= 200 else f"{text[:60]!r}... ({len(text)} characters)"
        why = e if isinstance(e, json.JSONDecodeError) else "nested too deeply"
        raise ValueError(f"`{what}` is {given}, but must be a JSON object such as '{{\"lr\": 0.01}}' ({why})") from None
    if not isinstance(value, dict):
        raise ValueError(f"`{what}` is {text!r}, but must be a JSON object such as '{{\"lr\": 0.01}}'")
    _check_text(value, what, text)
    return value


def _check_text(value: object, what: str, text: str) -> None:
    """A ValueError when a str in `value` (a key too) is not UTF-8 text: a lone surrogate, which JSON's `\\udcff`
    escape makes and a run's tables (pandas' Arrow strings) cannot hold."""
    stack = [value]
    while stack:
        v = stack.pop()
        if isinstance(v, dict):
            stack += [*v.keys(), *v.values()]
        elif isinstance(v, list):
            stack += v
        elif isinstance(v, str) and any(0xD800 <= ord(c) <= 0xDFFF for c in v):
            raise ValueError(f"`{what}` is {text!r}, but its text must be UTF-8: {v!r} holds a lone surrogate")


def _setting(text: str) -> tuple[str, object]:
    """`--set name=value`: the value read as JSON when it is JSON (0.001, true, "adam"), else as a string."""
    import json

    name, sep, value = text.partition("=")
    if not sep or not name:
        raise ValueError(f"`--set` is {text!r}, but must be NAME=VALUE (e.g. lr=0.001)")
    try:
        setting = name, json.loads(value)
    except (json.JSONDecodeError, RecursionError):
        setting = name, value
    _check_text(list(setting), "--set", text)
    return setting


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


def _int_at_least(low: int):
    """An argparse type: an int >= `low`."""

    def parse(s: str) -> int:
        try:
            v = int(s)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{s!r} is not an int") from None
        if v < low:
            raise argparse.ArgumentTypeError(f"{s!r} must be >= {low}")
        return v

    return parse


_positive_int, _count = _int_at_least(1), _int_at_least(0)


def _seconds_up_to(high: float):
    """An argparse type: a finite number of seconds > 0 and <= `high`."""

    def parse(s: str) -> float:
        try:
            v = float(s)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{s!r} is not a number of seconds") from None
        if not 0 < v < math.inf:
            raise argparse.ArgumentTypeError(f"{s!r} must be a finite number of seconds > 0")
        if v > high:
            raise argparse.ArgumentTypeError(f"{s!r} must be at most {high:g} seconds")
        return v

    return parse


_seconds, _any_seconds = _seconds_up_to(MAX_WAIT_S), _seconds_up_to(math.inf)


def _wait_seconds(s: str) -> float:
    """`--wait`: 0 (do not wait) or a number of seconds > 0, at most a day."""
    try:
        v = float(s)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{s!r} is not a number of seconds") from None
    if v == 0:
        return 0.0
    if not 0 < v <= MAX_WAIT_S:
        raise argparse.ArgumentTypeError(f"{s!r} must be 0 (do not wait) or a number of seconds > 0, at most "
                                         f"{MAX_WAIT_S:g}")
    return v


def _checkpoint(s: str) -> str | float:
    try:
        v = float(s)  # every N seconds
    except ValueError:
        return s  # a policy name: RunOptions checks it
    if not 0 < v < math.inf:
        raise argparse.ArgumentTypeError(f"{s!r} must be epoch, unit, off or a finite number of seconds > 0")
    return v


def _resources(s: str) -> dict:
    import json

    try:
        v = json.loads(s)
    except (ValueError, RecursionError):
        raise argparse.ArgumentTypeError(f"{s!r} is not JSON, e.g. '{{\"CPU\": 1}}'") from None
    if not isinstance(v, dict):
        raise argparse.ArgumentTypeError(f"{s!r} must be a JSON object, e.g. '{{\"CPU\": 1, \"GPU\": 1}}'")
    return v


def _version() -> str:
    """The installed package's version (the source tree's, when it is not installed)."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("modelhopper")
    except PackageNotFoundError:
        return "unknown (not installed)"


#: `framework.runs`' status rule, for `list --help` and `status --help` (10 minutes: `framework.runs.RECENT_S`)
_STATUS_RULE = (
    "A run is finished when it committed its last decision. Otherwise: crashed when its driver (the process whose "
    "pid and host the run records at its start and at each resume) recorded its end, or ran on this host and is "
    "gone; running when it runs on this host; running? when it cannot be checked from here (another host, or a "
    "run from before drivers were recorded) and the run changed in the last 10 minutes, unknown when it did not.")


def _config_parsers(sub, fmt) -> None:
    """stop, resume-config, add, clone and extend: commands about the configs of a running run."""
    said = ". Prints what the run's driver did with it (exit code 1 when it rejected it)."
    specs = {
        "stop": "stop a config of a running run now (units running finish; it keeps its weights and metrics)",
        "resume-config": "train a stopped config again, from its latest weights (the person's from then on)",
        "add": "add a config to a running run; it trains from model_fn",
        "clone": "add a copy of a config with changed hyper-parameters, from its weights (or --cold, model_fn)",
        "extend": "grow the procedure's budget: more epochs per config and/or more configs, where it allows it",
    }
    for name, what in specs.items():
        p = sub.add_parser(name, help=what, formatter_class=fmt, description=what + said)
        p.add_argument("run", help="run directory of a running run")
        if name in ("stop", "resume-config", "clone"):
            p.add_argument("config_id", type=_count, metavar="ID", help="the config's id")
        if name == "add":
            p.add_argument("config", metavar="CONFIG", help='the config as a JSON object, e.g. \'{"lr": 0.01}\'')
        if name == "clone":
            p.add_argument("--set", action="append", default=[], metavar="NAME=VALUE",
                           help="a hyper-parameter to change (repeat for several); the value is read as JSON when it "
                                "is JSON (0.001, true), else as a string")
            p.add_argument("--cold", action="store_true", help="start from model_fn instead of the config's weights")
        if name == "extend":
            p.add_argument("--epochs", type=_positive_int, default=None, help="epochs more per config")
            p.add_argument("--samples", type=_positive_int, default=None, help="configs more")
        elif name != "stop":
            p.add_argument("--epochs", type=_positive_int, default=None,
                           help="epochs it trains in all (default: the procedure's per-config budget)")
        p.add_argument("--timeout", type=_seconds, default=60.0, help=_ANSWER_WAIT)
        p.set_defaults(func=_config_command)


def _registry_parsers(sub, fmt) -> None:
    """A subcommand for each command a person may send (`framework.command_specs.COMMAND_ENTRIES`, which the driver's
    `COMMANDS` pairs with handlers) that has no hand-written one above: its required arguments positional, the others
    options (a bool as --NAME / --no-NAME), each read as the registry's type says; the driver checks them by the
    entry's rules. Reads the entries only, so `--help` imports neither the driver nor pandas."""
    from framework.command_specs import COMMAND_ENTRIES

    readers = {"int": int, "ints": _ints_arg, "json": _json_arg}
    for c in COMMAND_ENTRIES.values():
        name = c.subcommand
        if not c.outside or name in sub.choices:
            continue
        p = sub.add_parser(name, help=c.doc, formatter_class=fmt, description=f"{c.doc} (the `{c.name}` command). "
                           "Prints what the run's driver did with it (exit code 1 when it rejected it).")
        p.add_argument("run", help="run directory of a running run")
        for a in c.args:
            option = "--" + a.name.replace("_", "-")
            if a.type == "bool":
                p.add_argument(option, dest=f"arg_{a.name}", action=argparse.BooleanOptionalAction, default=None,
                               help=a.rule)
            elif a.required:
                p.add_argument(f"arg_{a.name}", metavar=a.name.upper(), type=readers[a.type], help=a.rule)
            else:
                p.add_argument(option, dest=f"arg_{a.name}", type=readers[a.type], default=None, help=a.rule)
        p.add_argument("--timeout", type=_seconds, default=60.0, help=_ANSWER_WAIT)
        p.set_defaults(func=_registry_command, registry_command=c.name)


def _registry_command(args: argparse.Namespace) -> int:
    """A command made from the registry (`_registry_parsers`): the arguments given, sent to the running run."""
    from framework.steering.connect import connect

    given = {k[len("arg_"):]: v for k, v in vars(args).items() if k.startswith("arg_") and v is not None}
    return _report([connect(args.run, source="cli").send(args.registry_command, timeout=args.timeout, **given)])


def _ints_arg(text: str) -> list[int]:
    """A list of ints, comma-separated: 0,1,2."""
    try:
        return [int(t) for t in text.split(",")]
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a comma-separated list of ints (e.g. 0,1)") from None


def _json_arg(text: str) -> object:
    """A JSON value (0.01, true, [1, 2], {"lr": 0.01})."""
    import json

    try:
        value = json.loads(text)
    except (json.JSONDecodeError, RecursionError):
        raise argparse.ArgumentTypeError(f"{text!r} is not JSON (e.g. 0.01, true, '{{\"lr\": 0.01}}')") from None
    _check_text(value, "the value", text)
    return value


def _pack(text: str) -> int | str:
    """`--pack`: an int 1..16 or "auto" (`framework.scheduling.packing.check_pack`)."""
    from framework.scheduling.packing import check_pack

    try:
        return check_pack(int(text) if text.lstrip("+-").isdigit() else text)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e).replace("`pack`", "--pack")) from None


def build_parser(prog: str = "python -m framework") -> argparse.ArgumentParser:
    fmt = argparse.ArgumentDefaultsHelpFormatter
    parser = OneLineParser(prog=prog, description="Model hopper parallelism on Ray.", formatter_class=fmt)
    parser.add_argument("--version", action="version", version=f"%(prog)s {_version()}")
    sub = parser.add_subparsers(dest="command", required=True)
    demo = sub.add_parser("demo", help="run a small model selection on an embedded local Ray", formatter_class=fmt)
    demo.add_argument("--workers", type=_positive_int, default=2, help="partitions and worker actors")
    demo.add_argument("--epochs", type=_positive_int, default=5, help="epochs per config")
    demo.add_argument("--scheduler", default="randomized", help="a name from framework.scheduling.SCHEDULERS")
    demo.add_argument("--seed", type=_count, default=0, help="run seed")
    demo.add_argument("--pack", type=_pack, default=1,
                      help="configs of one architecture a worker trains at once as one fused model: 1..16 or auto")
    demo.add_argument("--storage-path", default=None,
                      help="run directory or URI (None: a new folder under $MODELHOPPER_STORAGE or ~/modelhopper_runs)")
    demo.set_defaults(func=_demo)
    show = sub.add_parser("show", help="print a run's leaderboard and failures (reads only)", formatter_class=fmt)
    show.add_argument("storage_path", help="run directory (or the URI it was mirrored to)")
    show.add_argument("--top", type=_positive_int, default=None, help="show only the best N configs (None: all)")
    show.add_argument("--metric", default=None, help="rank by this metric (None: the run's)")
    show.add_argument("--mode", choices=("min", "max"), default=None, help="min or max (None: the run's)")
    show.add_argument("--scope", default="last",
                      help="rank each config by its last epoch (last), its best (all), or the mean over all or its "
                           "last N epochs (avg, last-N-avg)")
    show.add_argument("--json", action="store_true", help="print JSON instead of a table")
    show.set_defaults(func=_show)
    rep = sub.add_parser("replay", help="re-run a finished run from its schedule log (bit-identical on CPU)",
                         formatter_class=fmt)
    rep.add_argument("storage_path", help="run directory (or the URI it was mirrored to)")
    rep.add_argument("--out", default=None,
                     help="a new output directory (None: <storage_path>-replay beside the run, or -replay-2, ... if taken)")
    rep.add_argument("--device", default=None, help="where to train: cpu, cuda, cuda:1 (None: the run's device)")
    rep.add_argument("--trust-unverified", action="store_true",
                     help="replay a run whose run.db does not verify under this machine's key (one from someone "
                          "else, or edited); it still imports no function the run names")
    rep.add_argument("--accept-changed-data", action="store_true", help=_ACCEPT_CHANGED)
    rep.set_defaults(func=_replay)

    cl = sub.add_parser("cleanup", help="stop the Ray processes that drivers killed on this machine left behind",
                        formatter_class=fmt, description="A driver killed with SIGKILL leaves Ray's agents running "
                        "for about a minute; the next run stops them, and so does this command. Only processes a "
                        "driver of yours recorded (same pid and start time, this host) are stopped.")
    cl.add_argument("--dry-run", action="store_true", help="list the processes that would be stopped; stop none")
    cl.set_defaults(func=_cleanup)
    up = sub.add_parser("up", help="start the warm local service your runs attach to (a Ray of yours and a pool of "
                        "warm workers), or say it is up", formatter_class=fmt, description="Starts, once per user and "
                        "machine, a local Ray head as a daemon (127.0.0.1, token authentication, no dashboard) and a "
                        "pool of warm worker processes. A run told of no cluster (no address, no $RAY_ADDRESS) "
                        "attaches to it and starts its workers on the pool in seconds; `down` stops it.")
    up.add_argument("--num-cpus", type=_positive_int, default=None, help="the head's CPUs (None: this machine's)")
    up.add_argument("--pool", type=_count, default=None, help="warm workers kept (None: one per CPU)")
    up.add_argument("--status", action="store_true",
                    help="start nothing: say whether the service is up, its address, its pool (idle, leased) and the "
                         "runs attached")
    up.add_argument("--json", action="store_true", help="print the service's status as JSON (what `up` says goes to "
                                                          "stderr then)")
    up.set_defaults(func=_up)
    dn = sub.add_parser("down", help="stop the local service: attached runs end their sessions cleanly (resume "
                        "them later), then its processes stop", formatter_class=fmt)
    dn.add_argument("--timeout", type=_wait_seconds, default=60.0,
                    help="seconds attached runs get to end before the service stops under them (0: none)")
    dn.set_defaults(func=_down)
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
    wk = sub.add_parser("workers", help="add workers to a running run, or drain one (framework.connect)",
                        formatter_class=fmt, description="Sends the command to the running run and prints what its "
                        "driver did with it (exit code 1 when it rejected it).")
    wk.add_argument("run", help="run directory of a running run")
    wk.add_argument("--add", type=_positive_int, default=None, metavar="N", help="start N more workers")
    wk.add_argument("--drain", type=_count, default=None, metavar="WORKER",
                    help="this worker takes no new units, finishes the one it runs, then leaves")
    wk.add_argument("--timeout", type=_seconds, default=60.0, help=_ANSWER_WAIT)
    wk.set_defaults(func=_workers)
    for name, what in (("pause", "pause a running run: units running finish, nothing new starts, workers stay"),
                       ("unpause", "continue a paused run where it paused")):
        pa = sub.add_parser(name, help=what, formatter_class=fmt, description=what + ". Prints what the run's driver "
                            "did (exit code 1 when it rejected the command).")
        pa.add_argument("run", help="run directory of a running run")
        pa.add_argument("--timeout", type=_seconds, default=60.0, help=_ANSWER_WAIT)
        pa.set_defaults(func=_pause)
    _config_parsers(sub, fmt)
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
                    "eval_fn or eval_step, input_fn) are imported by the module:qualname the run recorded, and only when the run verifies under this "
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
    _registry_parsers(sub, fmt)  # last: a hand-written subcommand of the same name wins
    return parser


#: what bad input (or a missing optional dependency: the demo's scikit-learn) raises: reported as one line and exit code 2, never a traceback (anything else is a bug: traceback)
USER_ERRORS = (FileNotFoundError, FileExistsError, NotADirectoryError, ValueError, ImportError, TimeoutError)
#: the project's own errors that mean the same, as (module, class): looked up among the modules a command imported,
#: so that `--help` and the commands that do not need them import none of those modules (pandas, with the catalog)
USER_ERROR_CLASSES = (("framework.store.catalog", "CatalogError"), ("framework.store.signing", "SignatureError"),
                      ("framework.result", "NoResultError"), ("framework.steering.connect", "NotRunningError"))


def _is_user_error(e: BaseException) -> bool:
    """Whether `e` is bad input (`USER_ERRORS`, `USER_ERROR_CLASSES`): one line and exit code 2. A class whose module
    was never imported cannot have raised `e`, so none is imported here."""
    if isinstance(e, USER_ERRORS):
        return True
    for module, name in USER_ERROR_CLASSES:
        cls = getattr(sys.modules.get(module), name, None)
        if cls is not None and isinstance(e, cls):
            return True
    return False


def _check_paths(args: argparse.Namespace) -> None:
    """A ValueError naming the argument when a run directory (or an output folder) given is not UTF-8 text: SQLite
    cannot open a run there (`framework.store.storage.not_utf8`). `list` takes such a root: it lists what it finds."""
    from framework.store.storage import check_utf8

    for dest in ("storage_path", "run", "runs", "out"):
        given = getattr(args, dest, None)
        for path in given if isinstance(given, list) else [given]:
            if isinstance(path, str):
                check_utf8("run" if dest == "runs" else dest, path)


def main(argv: list[str] | None = None, prog: str = "python -m framework") -> int:
    parser = build_parser(prog)
    args = parser.parse_args(argv)
    args.prog = parser.prog  # (what a command prints on stderr starts with it)

    def warn(message, category, filename, lineno, file=None, line=None) -> None:  # one line, as errors are
        print(printable(f"{parser.prog} {args.command}: warning: {message}"), file=sys.stderr)

    try:
        _check_paths(args)
        with warnings.catch_warnings():
            warnings.showwarning = warn
            return args.func(args)
    except BrokenPipeError:  # `show RUN | head`: the reader left; no traceback, and none at exit either
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0
    except Exception as e:
        if not _is_user_error(e):
            raise
        print(printable(f"{parser.prog} {args.command}: error: {e}"), file=sys.stderr)  # one line, whatever e says
        return 2


def entry() -> None:
    """The `modelhopper` console script."""
    sys.exit(main(prog="modelhopper"))


if __name__ == "__main__":
    sys.exit(main())
