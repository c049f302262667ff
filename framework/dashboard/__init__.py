"""A live web dashboard of one run: `framework.dashboard.serve(run)` (CLI: `modelhopper dashboard RUN`).

    with serve("~/modelhopper_runs/gridsearch-20260101-120000-000000") as board:
        print(board.url)           # open it in a browser: status, leaderboard, curves, schedule, events, commands

The page (`index.html` beside this module: inline CSS and plain JavaScript, nothing fetched from the internet) polls
the JSON endpoints below about once a second; each request reads the run's files afresh (catalogs opened read-only),
so the dashboard serves a running run, a crashed one and a finished one alike, from any process of the machine:

    GET  /                 the page
    GET  /api/status       `framework.steering.status.run_status(run)`
    GET  /api/leaderboard  every config, best first: config_id, status, epochs, value (of the run's metric), config;
                           and what of the run does not verify: `unverified` (lines, the first `TRUST_LIMIT`),
                           `unverified_count`, `suspect_configs` (the configs those lines name): the page shows them
    GET  /api/curves       each config's value of the run's metric per epoch
    GET  /api/schedule     the last `SCHEDULE_LIMIT` units done: config_id, epoch, partition, worker, kind, start, end
    GET  /api/events       the last `EVENTS_LIMIT` events (failures, workers, commands; not each round's commit)
    GET  /api/commands     the commands a person may send (`framework.command_specs.COMMAND_ENTRIES`, the entries
                           the driver's `COMMANDS` pairs with handlers: name, what it does, its arguments with their
                           types and rules), from which the page builds its buttons and forms
    POST /api/command      {"name": ..., "args": {...}}: sent through `framework.connect(run, source="dashboard")`;
                           200 with the driver's outcome (applied true or false), 409 when the run is not running,
                           504 when the driver did not answer in time, 400 for a body of another shape

**What it cannot read** is a one-line answer, never a 500 nor a traceback in the run's console: a token that is not
UTF-8 gets 401 as a wrong one does; a header that is not UTF-8, a body that is not UTF-8 JSON (NaN and infinities
included) or is nested more than `MAX_BODY_DEPTH` levels (refused before it is parsed) get 400. aiohttp's own
messages about a request it cannot parse, and the event loop's, are one line at debug level (`_RequestLog`).

**Access.** Every request needs the dashboard's token, on every address, 127.0.0.1 included (as Jupyter asks for
one: any account on the machine can reach a port on localhost, and a command is signed with the owner's key): as
`?token=...` or `Authorization: Bearer ...`, else 401. One is made with `secrets.token_urlsafe(24)` when none is
given; `Dashboard.url` carries it, `serve` callers print that URL, and it is kept in a file only the owner can read
(0600, `Dashboard.token_file`, under the directory of the signing key) while the dashboard serves. The page keeps
the token of its URL and sends it with each request. Bound to 127.0.0.1, localhost or ::1, it also answers only
requests addressed to that host (a web page from elsewhere cannot reach it by renaming a host of its own: DNS
rebinding). Commands must be sent as `application/json` from the dashboard's own origin (a foreign page cannot send
one), and only those a person may send from outside the run (`OUTSIDE_COMMANDS`: not `kill_worker`, a chaos-testing
command of the driver's own process). The token travels in clear: beyond a trusted network, put the dashboard
behind TLS (an SSH tunnel to a localhost-bound dashboard is the simplest).

The server is aiohttp's (`aiohttp.web`): no new dependency, since `ray[default]` installs it (Ray's own dashboard
runs on it), and it serves on an asyncio loop of its own on a daemon thread. Reads and commands run on small thread
pools, so a command waiting for the driver holds up nothing else.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import ipaddress
import json
import logging
import math
import os
import re
import secrets
import socket
import sys
import threading
import urllib.parse
import warnings
from importlib import resources
from typing import Any

from aiohttp import web

from framework.callbacks import Callback, RunInfo
from framework.command_specs import COMMAND_ENTRIES, OUTSIDE_COMMANDS
from framework.result import CATALOG_FILE, Result
from framework.store.catalog import SQLiteCatalog, UnverifiedRunWarning, configs_named
from framework.store.inbox import InboxError
from framework.store.signing import key_path

__all__ = ["EVENTS_LIMIT", "LOCAL_HOSTS", "MAX_BODY_DEPTH", "OUTSIDE_COMMANDS", "SCHEDULE_LIMIT", "Dashboard",
           "DashboardCallback", "serve"]

#: how many of the lines saying what does not verify `/api/leaderboard` returns (`unverified_count`: all of them)
TRUST_LIMIT = 50
#: hosts reachable from this machine only: a dashboard bound to one answers requests addressed to it only
LOCAL_HOSTS = ("127.0.0.1", "localhost", "::1")
#: how many of the latest units `/api/schedule` returns, and events `/api/events`
SCHEDULE_LIMIT, EVENTS_LIMIT = 2000, 200
#: events `/api/events` leaves out: one per round, routine
QUIET_EVENTS = ("round_committed",)
#: seconds `POST /api/command` waits for the driver's answer
COMMAND_TIMEOUT_S = 30.0
#: how deep a command's JSON body may nest (`{"name": ..., "args": {"config": {...}}}` is 3): deeper is refused unparsed
MAX_BODY_DEPTH = 32
logger = logging.getLogger(__name__)


class Dashboard:
    """A dashboard server that is listening (made by `serve`): `url` to open (it carries `?token=...`), `port`,
    `host`, `token`, `run`, `token_file` (where the token is kept while it serves, 0600; None when it could not be
    written); `close()` stops it (also at the end of a `with` block)."""

    def __init__(self, run: str, host: str, sock: socket.socket, token: str) -> None:
        self.run, self.host, self.token = run, host, token
        self.port: int = sock.getsockname()[1]
        shown = socket.gethostname() if host in ("", "0.0.0.0", "::") else host
        netloc = f"[{shown}]:{self.port}" if ":" in shown else f"{shown}:{self.port}"
        self.url = f"http://{netloc}/?token={urllib.parse.quote(token)}"
        self.token_file = _keep_token(self)
        self._reads = concurrent.futures.ThreadPoolExecutor(4, thread_name_prefix="dashboard-read")
        self._commands = concurrent.futures.ThreadPoolExecutor(4, thread_name_prefix="dashboard-command")
        self._loop = asyncio.new_event_loop()
        self._runner: web.AppRunner | None = None
        self._closed = False
        ready: concurrent.futures.Future = concurrent.futures.Future()
        self._thread = threading.Thread(target=self._serve, args=(sock, ready), name=f"dashboard-{self.port}",
                                        daemon=True)
        self._thread.start()
        try:
            ready.result(timeout=30)
        except BaseException:
            self.close()
            raise

    def _serve(self, sock: socket.socket, ready: concurrent.futures.Future) -> None:
        asyncio.set_event_loop(self._loop)
        self._loop.set_exception_handler(_quiet_loop_error)
        try:
            self._runner = web.AppRunner(_app(self), access_log=None, logger=_RequestLog(logger, {}))
            self._loop.run_until_complete(self._runner.setup())
            self._loop.run_until_complete(web.SockSite(self._runner, sock, shutdown_timeout=1.0).start())
        except BaseException as e:
            sock.close()
            self._loop.close()
            ready.set_exception(e)
            return
        ready.set_result(None)
        self._loop.run_forever()
        self._loop.close()

    def close(self) -> None:
        """Stop serving and free the port (commands already sent stay sent); a no-op when called again."""
        if self._closed:
            return
        self._closed = True
        if self._thread.is_alive() and self._loop.is_running():
            if self._runner is not None:
                try:
                    asyncio.run_coroutine_threadsafe(self._runner.cleanup(), self._loop).result(timeout=10)
                except (concurrent.futures.TimeoutError, RuntimeError) as e:
                    logger.warning("the dashboard on port %s did not shut down cleanly: %s", self.port, e)
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(timeout=10)
        for pool in (self._reads, self._commands):
            pool.shutdown(wait=False, cancel_futures=True)
        if self.token_file is not None:
            with contextlib.suppress(OSError):
                os.remove(self.token_file)

    def __enter__(self) -> Dashboard:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"Dashboard(run={self.run!r}, url={self.url!r}{', closed' if self._closed else ''})"


def serve(run: str, host: str = "127.0.0.1", port: int = 0, token: str | None = None) -> Dashboard:
    """Serve the dashboard of the run in directory `run` on `host`:`port` (0: a free port) and return once it
    listens; it serves from a daemon thread until `close()`. Every request needs `token` (one is made when none is
    given; `Dashboard.url` carries it, and `Dashboard.token_file` keeps it for the owner). Raises `ValueError` for a bad
    argument, or a host and port that cannot be listened on, and `FileNotFoundError` when `run` holds no run."""
    if not isinstance(run, (str, os.PathLike)):
        raise ValueError(f"`run` is {run!r}, but must be the path of a run directory (a str)")
    path = os.path.abspath(os.path.expanduser(os.fspath(run)))
    if not os.path.isfile(os.path.join(path, CATALOG_FILE)):
        raise FileNotFoundError(f"`run` {os.fspath(run)!r} holds no {CATALOG_FILE}: not a run directory")
    if not isinstance(host, str):
        raise ValueError(f"`host` is {host!r}, but must be a host name or address (a str), e.g. '127.0.0.1'")
    _check_port(port)
    if token is not None and (not isinstance(token, str) or not token or any(c.isspace() for c in token)):
        raise ValueError(f"`token` is {token!r}, but must be None or a non-empty str without spaces")
    return Dashboard(path, host, _listen(host, port), token if token is not None else secrets.token_urlsafe(24))


class DashboardCallback(Callback):
    """Serves the dashboard of the run while it runs (`ModelSelection(dashboard=True)` adds one): from the run's
    start to its end, with `serve`'s arguments; prints the URL to stderr and keeps it as `url`."""

    def __init__(self, host: str = "127.0.0.1", port: int = 0, token: str | None = None) -> None:
        _check_port(port)  # before the run starts
        self.host, self.port, self.token = host, port, token
        self.board: Dashboard | None = None
        self.url: str | None = None

    def on_run_start(self, run: RunInfo) -> None:
        if self.board is None:
            self.board = serve(run.storage_path, self.host, self.port, self.token)
            self.url = self.board.url
            print(f"Dashboard: {self.url}", file=sys.stderr, flush=True)

    def on_run_end(self, result: Result) -> None:
        if self.board is not None:
            self.board.close()
            self.board = None


def tokens_dir() -> str:
    """Where a serving dashboard keeps its token: `dashboards/` beside the signing key (only the owner can read)."""
    return os.path.join(os.path.dirname(key_path()), "dashboards")


def _keep_token(board: Dashboard) -> str | None:
    """Write `board`'s run, URL and token to a 0600 file of its own (`tokens_dir()`, named by pid and port), so its
    owner can find the token of a dashboard another of their processes serves; None when it cannot be written."""
    path = os.path.join(tokens_dir(), f"dashboard-{os.getpid()}-{board.port}.json")
    try:
        os.makedirs(tokens_dir(), mode=0o700, exist_ok=True)
        for name in os.listdir(tokens_dir()):  # those of processes that ended without closing their dashboard
            pid = name.split("-")[1] if name.startswith("dashboard-") and name.count("-") == 2 else ""
            if pid.isdigit() and not _running(int(pid)):
                with contextlib.suppress(OSError):
                    os.remove(os.path.join(tokens_dir(), name))
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o600)
        with os.fdopen(fd, "w") as f:
            json.dump({"run": board.run, "url": board.url, "token": board.token, "pid": os.getpid()}, f)
        return path
    except OSError as e:
        logger.warning("could not keep the dashboard's token in %s: %s", path, e)
        return None


def _running(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:  # another user's: it runs
        return True
    return True


def _check_port(port: Any) -> None:
    if not isinstance(port, int) or isinstance(port, bool) or not 0 <= port <= 65535:
        raise ValueError(f"`port` is {port!r}, but must be an int in 0..65535 (0: a free port)")


def _listen(host: str, port: int) -> socket.socket:
    """A listening socket on `host`:`port`, or a one-line `ValueError` saying why there is none."""
    try:
        family = socket.getaddrinfo(host or None, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)[0][0]
    except socket.gaierror as e:
        raise ValueError(f"`host` is {host!r}, which does not resolve to an address of this machine: {e}") from None
    try:
        return socket.create_server((host, port), family=family)
    except OSError as e:
        raise ValueError(f"`port` is {port}, but {host}:{port} cannot be listened on: "
                         f"{e.strerror or e} (0 picks a free port)") from None


# ---- the web application ----------------------------------------------------------------------------------------
def _app(board: Dashboard) -> web.Application:
    app = web.Application(middlewares=[_guard(board)], client_max_size=64 * 1024)
    page = resources.files(__package__).joinpath("index.html").read_text(encoding="utf-8")

    async def index(request: web.Request) -> web.Response:
        return web.Response(text=page, content_type="text/html", headers={
            "Cache-Control": "no-store", "Referrer-Policy": "no-referrer", "X-Frame-Options": "DENY",
            "Content-Security-Policy": "default-src 'self'; style-src 'unsafe-inline'; script-src 'unsafe-inline'; "
                                       "img-src 'self' data:; frame-ancestors 'none'"})

    def reader(read):
        async def handler(request: web.Request) -> web.Response:
            loop = asyncio.get_running_loop()
            try:
                return _json(await loop.run_in_executor(board._reads, read, board.run))
            except Exception as e:  # the server's edge: a run that cannot be read (or shown) now is an answer
                logger.debug("dashboard read %s failed: %s", request.path, _one_line(e))
                return _json({"error": _one_line(e)}, status=503)

        return handler

    async def command(request: web.Request) -> web.Response:
        from framework.steering.connect import NotRunningError, connect

        try:
            body = _parse_body(await request.read())
        except ValueError as e:
            return _json({"error": str(e)}, status=400)
        problem = _command_problem(body)
        if problem:
            return _json({"error": problem}, status=400)
        name, args = body["name"], body.get("args") or {}

        def send() -> dict[str, Any]:
            outcome = connect(board.run, source="dashboard").send(name, COMMAND_TIMEOUT_S, **args)
            return {"name": outcome.name, "args": outcome.args, "applied": outcome.applied,
                    "outcome": outcome.outcome}

        try:
            return _json(await asyncio.get_running_loop().run_in_executor(board._commands, send))
        except NotRunningError as e:
            return _json({"error": str(e)}, status=409)
        except TimeoutError as e:
            return _json({"error": str(e)}, status=504)
        except InboxError as e:  # the run's inbox was replaced or damaged (the driver reads it as empty)
            return _json({"error": str(e)}, status=503)
        except ValueError as e:
            return _json({"error": str(e)}, status=400)

    app.router.add_get("/", index)
    for name, read in (("status", _status), ("leaderboard", _leaderboard), ("curves", _curves),
                       ("schedule", _schedule), ("events", _events), ("commands", _commands)):
        app.router.add_get(f"/api/{name}", reader(read))
    app.router.add_post("/api/command", command)
    return app


def _guard(board: Dashboard):
    """The middleware that enforces the access rules of the module docstring."""
    local_names = {"127.0.0.1", "localhost", "::1", "[::1]"}

    @web.middleware
    async def guard(request: web.Request, handler) -> web.StreamResponse:
        given = request.query.get("token")
        auth = request.headers.get("Authorization", "")
        if given is None and auth.startswith("Bearer "):
            given = auth[len("Bearer "):].strip()
        if given is None or not _is_text(given) or not secrets.compare_digest(given.encode(), board.token.encode()):
            why = "" if given is None or _is_text(given) else "the token given is not UTF-8 text: "
            return _json({"error": f"{why}this dashboard needs its token: ?token=... or Authorization: Bearer ... "
                                   "(the URL it printed carries it)"}, status=401)
        unreadable = [name for name, value in request.headers.items() if not _is_text(name + value)]
        if unreadable:  # aiohttp keeps the bytes that are not UTF-8 as lone surrogates: nothing below could use them
            return _json({"error": f"the header {_escape(unreadable[0])} is not UTF-8 text"}, status=400)
        if board.host in LOCAL_HOSTS and _host_name(request.host) not in local_names:
            return _json({"error": f"Host {_escape(request.host)} is not this dashboard's (it serves 127.0.0.1, "
                                   "localhost and ::1 only)"}, status=403)
        if request.method not in ("GET", "HEAD"):
            origin = request.headers.get("Origin")
            if origin is not None and urllib.parse.urlsplit(origin).netloc != request.host:
                return _json({"error": f"a command from origin {_escape(origin)}, not this dashboard's: refused"},
                             status=403)
            if request.content_type != "application/json":
                return _json({"error": f"the body must be application/json, not {_escape(request.content_type)}"},
                             status=415)
        try:
            return await handler(request)
        except web.HTTPException:
            raise
        except Exception as e:  # the last resort (input problems are 400s above): one line, no traceback
            logger.warning("dashboard: %s %s failed: %s", request.method, _escape(request.path), _one_line(e))
            return _json({"error": f"the dashboard failed on this request: {_one_line(e)}"}, status=500)

    return guard


class _RequestLog(logging.LoggerAdapter):
    """The logger aiohttp's server logs to: what it says about a request (one it cannot parse, a client that went
    away) is one line at debug level, never a traceback; a request is the client's problem, not the run's."""

    def log(self, level: int, msg: object, *args: object, exc_info: Any = None, **kwargs: Any) -> None:
        exc = sys.exc_info()[1] if exc_info is True else exc_info[1] if isinstance(exc_info, tuple) else exc_info
        try:
            text = str(msg) % args if args else str(msg)
        except (TypeError, ValueError):
            text = f"{msg} {args}"
        if isinstance(exc, BaseException):
            text += f": {_one_line(exc)}"
        self.logger.log(logging.DEBUG, "dashboard: %s", " ".join(text.split()), **kwargs)


def _quiet_loop_error(loop: asyncio.AbstractEventLoop, context: dict[str, Any]) -> None:
    """The dashboard loop's handler of errors no task retrieved: one line at debug level, as `_RequestLog`."""
    exc = context.get("exception")
    logger.debug("dashboard: %s%s", context.get("message", "event loop error"),
                 f": {_one_line(exc)}" if isinstance(exc, BaseException) else "")


def _one_line(exc: BaseException) -> str:
    """`Type: message` of `exc` on one line, non-ASCII escaped and cut short."""
    text = " ".join(f"{type(exc).__name__}: {exc}".split())  # split: no newline, nor a run of blanks
    text = text.encode("ascii", "backslashreplace").decode()
    return text if len(text) <= 300 else text[:300] + "..."


def _is_text(text: str) -> bool:
    """Whether `text` is UTF-8 text (aiohttp keeps a header's bytes that are not as lone surrogates)."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


_BODY_TOKENS = re.compile(r'"(?:[^"\\]|\\.)*"?|[\[\]{}]')  # a JSON string (to skip; unterminated: to the end) or a bracket


def _json_depth(text: str) -> int:
    """How deep `text` nests its brackets, strings skipped: counted without parsing, so any depth is cheap."""
    depth = deepest = 0
    for token in _BODY_TOKENS.finditer(text):
        c = token.group()
        if c in "[{":
            depth += 1
            deepest = max(deepest, depth)
        elif c in "]}":
            depth -= 1
    return deepest


def _finite(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        raise ValueError(f"{text} is out of a float's range")
    return value


def _refuse_constant(name: str) -> None:
    raise ValueError(f"{name} is not JSON")


def _parse_body(raw: bytes) -> Any:
    """The JSON value of a command's body, or a one-line `ValueError` saying why it has none: not UTF-8, nested more
    than `MAX_BODY_DEPTH` deep (checked before parsing, so no parser recursion can blow up), not standard JSON."""
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as e:
        raise ValueError(f"the body must be JSON, in UTF-8, but byte {e.start} is not UTF-8: "
                         f"{_escape(raw[e.start:e.start + 4])}") from None
    depth = _json_depth(text)
    if depth > MAX_BODY_DEPTH:
        raise ValueError(f"the body is nested {depth} levels deep, but must be JSON nested at most {MAX_BODY_DEPTH} "
                         "levels deep: {\"name\": ..., \"args\": {...}}")
    try:
        return json.loads(text, parse_float=_finite, parse_constant=_refuse_constant)
    except (ValueError, RecursionError) as e:  # ValueError: JSONDecodeError, and ints too long for Python to read
        raise ValueError(f"the body must be JSON: {_one_line(e).split(': ', 1)[1]}") from None


def _host_name(host: str) -> str:
    """`Host` header without its port ("[::1]:80" -> "[::1]", "localhost:80" -> "localhost")."""
    if host.startswith("["):
        return host.split("]")[0] + "]"
    try:
        ipaddress.IPv6Address(host)
        return host  # a bare IPv6 address (no port)
    except ValueError:
        return host.rsplit(":", 1)[0] if ":" in host else host


def _command_problem(body: Any) -> str | None:
    """Why `body` is not a command (`{"name": str, "args": dict}`), or None when it is one."""
    if not isinstance(body, dict) or set(body) - {"name", "args"}:
        return f"the body is {_escape(body)}, but must be an object {{\"name\": ..., \"args\": {{...}}}}"
    name, args = body.get("name"), body.get("args", {})
    if not isinstance(name, str) or not name.isidentifier():
        return f"`name` is {_escape(name)}, but must name a command (e.g. \"pause\")"
    if name not in OUTSIDE_COMMANDS:
        return f"`name` is {_escape(name)}, but the dashboard sends only {sorted(OUTSIDE_COMMANDS)}"
    if args is not None and not isinstance(args, dict):
        return f"`args` is {args!r}, but must be an object of the command's arguments"
    bad = [k for k in args or {} if not k.isidentifier() or k in ("name", "timeout")]
    if bad:
        return f"`args` names {_escape(bad)}, which cannot be a command's arguments"
    return None


def _escape(value: Any, limit: int = 200) -> str:
    """`repr(value)`, non-ASCII escaped and cut to `limit` characters: safe to echo in an error."""
    text = ascii(value)
    return text if len(text) <= limit else text[:limit] + "..."


def _json(body: Any, status: int = 200) -> web.Response:
    return web.Response(text=json.dumps(_plain(body), allow_nan=False, default=str), status=status,
                        content_type="application/json", headers={"Cache-Control": "no-store"})


def _plain(value: Any) -> Any:
    """`value` with NaN and infinities as None and numpy/pandas scalars as Python ones (JSON that browsers parse)."""
    if isinstance(value, dict):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    if hasattr(value, "item") and not isinstance(value, (str, bytes)):  # numpy scalar
        try:
            value = value.item()
        except (TypeError, ValueError):
            return str(value)
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value


# ---- reading the run (each on a thread of the read pool; every catalog read-only) -------------------------------
def _commands(run: str) -> dict[str, Any]:
    """The commands the page offers: every one a person may send from outside the run, as its registry entry says."""
    return {"commands": [c.describe() for c in COMMAND_ENTRIES.values() if c.outside]}


def _status(run: str) -> dict[str, Any]:
    from framework.steering.status import run_status

    return run_status(run)


def _leaderboard(run: str) -> dict[str, Any]:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UnverifiedRunWarning)  # said on the page instead, every poll
        with Result.open(run) as result:
            board = result.get_dataframe()
            status = result.status.set_index("config_id")
            configs, metric, mode, unverified = result.configs, result.metric, result.mode, list(result.unverified)
    value = dict(zip(board.config_id, board[metric])) if metric in board else {}
    ranked = [int(c) for c in board.config_id]
    order = ranked + [int(c) for c in status.index if int(c) not in set(ranked)]  # none with a value yet: by id
    rows = [{"config_id": cid, "status": status.at[cid, "status"], "epochs": status.at[cid, "epochs"],
             "value": value.get(cid), "parent": status.at[cid, "parent"], "config": configs[cid]} for cid in order]
    suspect = configs_named(unverified)
    return {"metric": metric, "mode": mode, "configs": rows, "unverified": unverified[:TRUST_LIMIT],
            "unverified_count": len(unverified), "suspect_configs": suspect}


def _catalog(run: str) -> SQLiteCatalog:
    return SQLiteCatalog(os.path.join(run, CATALOG_FILE), readonly=True)


def _curves(run: str) -> dict[str, Any]:
    catalog = _catalog(run)
    try:
        meta, epochs = catalog.meta(), catalog.epochs()
    finally:
        catalog.close()
    metric = meta.get("metric", "valid_loss")
    curves = []
    if metric in epochs:
        for cid, rows in epochs.groupby("config_id", sort=True):
            curves.append({"config_id": int(cid), "epochs": rows.epoch.tolist(), "values": rows[metric].tolist()})
    return {"metric": metric, "mode": meta.get("mode", "min"), "curves": curves}


def _schedule(run: str) -> dict[str, Any]:
    catalog = _catalog(run)
    try:
        t0 = float(catalog.meta().get("start_time", 0.0) or 0.0)
        # the latest units only: a long run logs hundreds of thousands (`units()` reads them all, metrics included)
        rows = catalog._read("SELECT config_id, epoch, partition, worker, kind, start, end FROM units "
                             "WHERE status = 'done' ORDER BY seq DESC LIMIT ?", (SCHEDULE_LIMIT,))
        (total,) = catalog._read("SELECT COUNT(*) FROM units WHERE status = 'done'")[0]
    finally:
        catalog.close()
    keys = ("config_id", "epoch", "partition", "worker", "kind", "start", "end")
    units = [dict(zip(keys, (*r[:5], r[5] - t0, r[6] - t0))) for r in reversed(rows)]
    return {"units": units, "total": int(total), "limit": SCHEDULE_LIMIT}


def _events(run: str) -> dict[str, Any]:
    catalog = _catalog(run)
    try:
        t0 = float(catalog.meta().get("start_time", 0.0) or 0.0)
        events = catalog.events()
    finally:
        catalog.close()
    events = events[~events.kind.isin(QUIET_EVENTS)].tail(EVENTS_LIMIT)
    out = []
    for t, kind, detail in zip(events.time, events.kind, events.detail):
        try:
            parsed = json.loads(detail)
        except (TypeError, ValueError):
            parsed = detail
        out.append({"t": float(t) - t0, "kind": kind, "detail": parsed})
    return {"events": out}
