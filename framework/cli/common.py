"""What the command groups of `framework.cli` share: the argument types of their flags (counts, seconds, `--wait`,
`--checkpoint`, `--worker-resources`, `--pack`, a registry command's values), the help texts several flags use, and
small helpers: `_say` (print, each line `printable`), the exit code of a command that ran a selection, a leaderboard
as text, the wait for a run that is starting, what a running run's driver did with a command, a config or a setting
read from the command line."""

from __future__ import annotations

import argparse
import math
import os
import sys

from framework.text import printable

#: the longest wait a flag takes (`--interval`, `--timeout`): a day; `inf` would overflow `time.sleep`
MAX_WAIT_S = 86400.0
_ANSWER_WAIT = "seconds to wait for the driver's answer (at most a day)"
#: how long `watch` and `dashboard` wait for a run just launched to appear in the directory they are given
WAIT_FOR_RUN_S = 60.0
_WAIT_HELP = ("seconds to wait for a run that is starting (the folder or its run.db not there yet, as right after "
              "the run was launched; at most a day, 0: do not wait)")

#: the help of resume's and replay's --accept-changed-data
_ACCEPT_CHANGED = ("go on where the data differs from what the run read (a file's size, columns or bytes; refused "
                   "otherwise, naming the file); the run's events record it")


def _say(text: object = "", **kwargs) -> None:
    """`print` with each line `printable`: a run folder's name that is not UTF-8 (or an edited catalog's text) neither
    raises on a terminal that takes UTF-8 only nor sends the terminal control characters."""
    print("\n".join(printable(line) for line in str(text).split("\n")), **kwargs)


def _ran(result, args: argparse.Namespace) -> int:
    """The exit code of a command that ran a selection (demo, resume, replay): 0, or 1 when every config of the run
    failed, said at the end on stderr (the tracebacks are in `show RUN`)."""
    if not result.all_failed:
        return 0
    print(printable(f"{args.prog} {args.command}: every config failed ({len(result.configs)} configs): see their "
                    f"errors with `{args.prog} show {result.storage_path}`"), file=sys.stderr, flush=True)
    return 1


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


def _report(outcomes: list) -> int:
    """What the driver did with each command, one line each; exit code 1 when it rejected one."""
    for o in outcomes:
        _say(f"{o.name}: {o.outcome}" if o.applied else f"{o.name} rejected: {o.outcome}")
    return 0 if all(o.applied for o in outcomes) else 1


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
