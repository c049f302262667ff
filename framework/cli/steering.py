"""Commands that steer a running run through its inbox (`framework.steering.connect`), each printing what the run's
driver did with it: `workers` (add workers, drain one), `pause` and `unpause`, and the commands about its configs,
`stop`, `resume-config`, `add`, `clone` and `extend`. The registry's other commands are `framework.cli.registry`'s."""

from __future__ import annotations

import argparse

from framework.cli.common import _ANSWER_WAIT, _count, _json_object, _positive_int, _report, _seconds, _setting


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


def add_parsers(sub, fmt) -> None:
    """workers, pause, unpause, then the commands about configs (`_config_parsers`)."""
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
