"""Commands about this machine's Ray: `cleanup` (the Ray processes killed drivers left behind,
`framework.cluster.orphans`) and the warm local service runs attach to, `up` and `down`
(`framework.cluster.service`)."""

from __future__ import annotations

import argparse
import contextlib
import sys
import time

from framework.cli.common import _count, _positive_int, _say, _wait_seconds


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


def add_parsers(sub, fmt) -> None:
    """cleanup, up and down."""
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
