"""The live dashboard (`framework.dashboard`) of a real running selection: its JSON endpoints, its access rules, the
commands it forwards to the driver, the CLI that serves it, and the page itself in a real headless Chromium.

One gated run serves the whole module: every unit waits while the gate file exists, so the run stays alive while the
tests look at it; `GatedRun.advance` lets it commit a round, then holds it again. The last test lets it finish.
"""

from __future__ import annotations

import json
import os
import secrets
import signal
import socket
import stat
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest

import automl
import framework
from framework.dashboard import SCHEDULE_LIMIT, serve
from framework.store.lock import is_being_written
from tests.integration.ft_functions import (
    CloseGateAtRoundEnd,
    classifier_eval_fn,
    classifier_train_fn,
    gated_train_fn,
    mlp_model_fn,
)

pytestmark = pytest.mark.ray
ROOT = Path(__file__).resolve().parents[2]
EPOCHS = 10  # more than the rounds the tests let through: the run is still running when the last test ends it


def _wait(what, timeout: float = 60.0, why: str = "the condition") -> None:
    deadline = time.monotonic() + timeout
    while not what():
        if time.monotonic() > deadline:
            raise TimeoutError(f"waited {timeout:g} s for {why}")
        time.sleep(0.02)


class GatedRun:
    """A selection running on a thread whose units wait while `gate` exists."""

    def __init__(self, sel: framework.ModelSelection, path: str, gate: Path, closer: CloseGateAtRoundEnd) -> None:
        self.sel, self.path, self.gate, self.closer = sel, path, gate, closer
        self.done: dict = {}
        self.thread = threading.Thread(target=lambda: self.done.setdefault("result", sel.run()), daemon=True)

    def advance(self) -> None:
        """Open the gate until the run commits one more round: the run's callback closes it again as that round
        ends, before the next round's units open."""
        rounds = self.sel.rounds_completed
        self.closer.armed = True
        self.gate.unlink()
        try:
            _wait(lambda: self.sel.rounds_completed > rounds, why=f"round {rounds} to commit")
        finally:
            self.gate.write_text("")  # (closed already, unless the wait failed)


@pytest.fixture(scope="module")
def run(ray_cluster, digits, tmp_path_factory) -> GatedRun:
    tmp = tmp_path_factory.mktemp("dashboard")
    gate = tmp / "gate"
    gate.write_text("")
    x, y = digits
    ds = framework.PartitionedDataset.from_arrays(x[:300], y[:300], num_partitions=2, seed=0)
    path = str(tmp / "run")
    space = {"hidden": [16], "lr": [0.05, 0.1], "batch_size": [64], "gate": [str(gate)]}
    closer = CloseGateAtRoundEnd(gate, armed=False)
    sel = framework.ModelSelection(mlp_model_fn, gated_train_fn, classifier_eval_fn, ds,
                                   automl.GridSearch(space, epochs=EPOCHS), num_workers=2, storage_path=path,
                                   progress=False, metric="valid_accuracy", mode="max", callbacks=[closer])
    gated = GatedRun(sel, path, gate, closer)
    gated.thread.start()
    try:
        _wait(lambda: os.path.isfile(os.path.join(path, "run.db")) and is_being_written(path)
              and len(sel.live_workers()) == 2, why="the run's 2 workers")
        gated.advance()  # one round committed: curves and a schedule to show
        yield gated
    finally:
        gate.unlink(missing_ok=True)
        gated.thread.join(timeout=180)


_TOKENS: dict[str, str] = {}  # a dashboard's base URL -> its token, which `_call` sends unless told otherwise


def _base(board) -> str:
    """The base URL of `board` (no token in it): `_call` on it sends the board's token as a Bearer header."""
    base = f"http://127.0.0.1:{board.port}"
    _TOKENS[base] = board.token
    return base


def _call(url: str, body: bytes | None = None, headers: dict | None = None, token: str | None = "") -> tuple[
        int, object]:
    """(HTTP status, the JSON body, or the text of one that is not JSON) of a GET, or a POST when `body` is given;
    with the token of the dashboard `url` is on (`token=""`, via `_base`), `token`, or none (`token=None`)."""
    headers = dict(headers or {})
    if token == "":
        token = next((t for b, t in _TOKENS.items() if url.startswith(b + "/")), None)
    if token is not None and "token=" not in url and "Authorization" not in headers:
        headers["Authorization"] = f"Bearer {token}"
    req = urllib.request.Request(url, data=body, headers=headers, method="GET" if body is None else "POST")
    try:
        with urllib.request.urlopen(req, timeout=60) as r:
            status, text = r.status, r.read().decode()
    except urllib.error.HTTPError as e:
        status, text = e.code, e.read().decode()
    try:
        return status, json.loads(text)
    except ValueError:
        return status, text


def _command(base: str, name: str, token: str | None = "", **args) -> tuple[int, dict]:
    return _call(base + "/api/command", json.dumps({"name": name, "args": args}).encode(),
                 {"Content-Type": "application/json"}, token=token)


def test_the_endpoints_serve_the_running_run_as_json(run):
    with serve(run.path) as board:
        assert len(board.token) >= 24 and board.url == f"http://127.0.0.1:{board.port}/?token={board.token}"
        base = _base(board)
        # the module's other tests may have run first (in random order): configs added (one may have completed its
        # epoch), config 0 stopped
        status, s = _call(base + "/api/status")
        assert status == 200 and s["status"] == "running" and s["num_configs"] >= 2 and s["rounds"] >= 1, s
        status, b = _call(base + "/api/leaderboard")
        assert status == 200 and (b["metric"], b["mode"]) == ("valid_accuracy", "max")
        rows = b["configs"]
        ids = sorted(r["config_id"] for r in rows)
        assert ids == list(range(s["num_configs"])) and {r["status"] for r in rows} <= {"active", "stopped", "completed"}
        first = [r for r in rows if r["config_id"] in (0, 1)]
        assert all(r["epochs"] >= 1 and 0.0 <= r["value"] <= 1.0 and r["config"]["hidden"] == 16 for r in first)
        values = [r["value"] for r in rows if r["value"] is not None]
        assert values == sorted(values, reverse=True)  # best first
        status, c = _call(base + "/api/curves")
        assert status == 200 and {0, 1} <= {k["config_id"] for k in c["curves"]} <= set(ids)
        assert all(k["epochs"][0] == 0 and len(k["epochs"]) == len(k["values"]) for k in c["curves"])
        status, sch = _call(base + "/api/schedule")
        units = sch["units"]
        assert status == 200 and sch["limit"] == SCHEDULE_LIMIT and sch["total"] == len(units) > 0
        assert {u["kind"] for u in units} == {"train", "eval"} and {u["worker"] for u in units} <= {0, 1}
        assert all(0 <= u["start"] <= u["end"] for u in units) and {u["partition"] for u in units} == {0, 1}
        status, ev = _call(base + "/api/events")
        kinds = [e["kind"] for e in ev["events"]]
        assert status == 200 and "workers_started" in kinds and "round_committed" not in kinds, kinds
        # the page: one self-contained document, nothing fetched from elsewhere
        status, page = _call(base + "/")
        assert status == 200 and 'id="leaderboard"' in page and 'id="gantt"' in page
        assert not any(s in page for s in ('src="', 'href="http', "@import", "url(", "https://")), "fetches"
        assert _call(base + "/api/nothing")[0] == 404


def test_every_dashboard_needs_its_token_kept_for_its_owner_only(run):
    from framework.dashboard import tokens_dir

    ended = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    os.makedirs(tokens_dir(), exist_ok=True)
    stale = os.path.join(tokens_dir(), f"dashboard-{int(ended.stdout)}-80.json")  # its process ended unclosed
    with open(stale, "w") as f:
        f.write("{}")
    for host in ("0.0.0.0", "127.0.0.1"):  # noqa: S104 - what the test is about
        with serve(run.path, host=host) as board:
            assert board.token is not None and len(board.token) >= 24 and board.url.endswith(f"?token={board.token}")
            base = f"http://127.0.0.1:{board.port}"
            status, body = _call(base + "/api/status", token=None)
            assert status == 401 and "needs its token" in body["error"]
            assert _call(base + "/", token=None)[0] == 401
            assert _call(base + "/api/status?token=" + board.token[:-1] + "x")[0] == 401
            assert _call(base + "/api/status", headers={"Authorization": "Bearer nope"})[0] == 401
            assert _command(base, "pause", token=None)[0] == 401  # no command without it either
            status, s = _call(base + "/api/status?token=" + board.token)
            assert status == 200 and s["status"] == "running"
            assert _call(base + "/api/leaderboard", headers={"Authorization": f"Bearer {board.token}"})[0] == 200
            kept = board.token_file
            assert stat.S_IMODE(os.stat(kept).st_mode) == 0o600 and json.load(open(kept))["token"] == board.token
        assert not os.path.exists(kept) and not os.path.exists(stale)  # only while it serves
    with serve(run.path, host="127.0.0.1", token="s3cret") as board:  # a token of the caller's
        assert board.url.endswith("/?token=s3cret")
        assert _call(f"http://127.0.0.1:{board.port}/api/status", token=None)[0] == 401
        assert _call(f"http://127.0.0.1:{board.port}/api/status", token="s3cret")[0] == 200


def _commands(path: str) -> list[str]:
    with framework.Result.open(path) as result:
        return result.commands.name.tolist()


def test_a_localhost_dashboard_answers_only_its_own_host_and_origin(run):
    before = _commands(run.path)
    with serve(run.path) as board:
        base = _base(board)
        status, body = _call(base + "/api/status", headers={"Host": f"evil.example:{board.port}"})  # DNS rebinding
        assert status == 403 and "is not this dashboard's" in body["error"]
        assert _call(f"http://localhost:{board.port}/api/status", token=board.token)[0] == 200
        # a form or a foreign page cannot send a command: it must be JSON from the dashboard's own origin
        status, body = _call(base + "/api/command", b'{"name": "pause"}', {"Content-Type": "text/plain"})
        assert status == 415 and "application/json" in body["error"]
        status, body = _call(base + "/api/command", b'{"name": "pause"}',
                             {"Content-Type": "application/json", "Origin": "http://evil.example"})
        assert status == 403 and "refused" in body["error"]
    assert _commands(run.path) == before  # nothing reached the driver


def test_pause_and_unpause_from_the_dashboard_reach_the_driver(run):
    with serve(run.path) as board:
        base = _base(board)
        status, paused = _command(base, "pause")
        assert status == 200 and paused["applied"] and paused["outcome"].startswith("paused"), paused
        status, s = _call(base + "/api/events")
        assert s["events"][-1]["kind"] == "command" and s["events"][-1]["detail"]["name"] == "pause"
        status, unpaused = _command(base, "unpause")
        assert status == 200 and unpaused == {"name": "unpause", "args": {}, "applied": True,
                                              "outcome": unpaused["outcome"]}
        status, again = _command(base, "unpause")
        assert status == 200 and (again["applied"], again["outcome"]) == (False, "the run is not paused")
    with framework.Result.open(run.path) as result:
        cmds = result.commands
    mine = cmds[cmds.name.isin(("pause", "unpause"))]
    assert mine[["name", "applied"]].values.tolist() == [["pause", True], ["unpause", True], ["unpause", False]]
    assert set(mine.source) == {"inbox:dashboard"}


def test_clone_add_and_extend_from_the_dashboard_reach_the_driver(run):
    run.advance()  # every config has trained weights to clone
    with serve(run.path) as board:
        base = _base(board)
        status, cloned = _command(base, "clone_config", config_id=1, overrides={"lr": 0.02}, epochs=1)
        assert status == 200 and cloned["applied"] and "from config 1's weights" in cloned["outcome"], cloned
        new_id = int(cloned["outcome"].split()[1])
        status, added = _command(base, "add_config", config={"hidden": 16, "lr": 0.3, "batch_size": 64,
                                                             "gate": str(run.gate)}, epochs=1)
        assert status == 200 and added["applied"], added
        status, extended = _command(base, "extend", epochs=1)
        assert status == 200 and extended["outcome"] == f"GridSearch: every config now trains {EPOCHS + 1} epochs"
        status, board_now = _call(base + "/api/leaderboard")
        ids = {r["config_id"]: r for r in board_now["configs"]}
        assert ids[new_id]["config"]["lr"] == 0.02 and ids[new_id]["parent"] == 1 and new_id + 1 in ids


def test_the_page_builds_its_commands_from_the_registry_and_a_new_command_reaches_the_driver(run):
    from framework.driver.commands import COMMANDS, OUTSIDE_COMMANDS

    with serve(run.path) as board:
        base = _base(board)
        status, body = _call(base + "/api/commands")
        assert status == 200 and [c["name"] for c in body["commands"]] == [n for n in COMMANDS if n in OUTSIDE_COMMANDS]
        spec = {c["name"]: c for c in body["commands"]}["checkpoint_config"]
        assert spec["target"] == "config" and [a["name"] for a in spec["args"]] == ["config_id"]
        status, page = _call(base + "/")
        assert status == 200 and not [n for n in OUTSIDE_COMMANDS if n in page]  # no form written into the page
        # config 0's latest weights are written (unless the run checkpointed them already, as it does at each epoch's
        # end: the module's other tests may have left it mid-epoch or not), and a second ask says so, writing nothing
        status, out = _command(base, "checkpoint_config", config_id=0)
        assert status == 200 and (out["outcome"].endswith(" written") == out["applied"]), out
        status, out = _command(base, "checkpoint_config", config_id=0)
        assert status == 200 and not out["applied"] and out["outcome"].endswith("on disk already"), out
        status, out = _command(base, "checkpoint_config", config_id=0, when="now")
        assert status == 200 and out["outcome"] == "'checkpoint_config' takes no argument 'when'; it takes ['config_id']"


def test_bad_requests_and_arguments_are_one_line_errors(run):
    with serve(run.path) as board:
        base = _base(board)
        for body, says in ((b"{not json", "must be JSON"), (b'["pause"]', "must be an object"),
                           (b'{"name": 5}', "`name` is 5"), (b'{"name": "pause", "extra": 1}', "must be an object"),
                           (b'{"name": "pause", "args": [1]}', "`args` is [1]"),
                           (b'{"name": "pause", "args": {"timeout": 1}}', "cannot be a command's arguments")):
            status, out = _call(base + "/api/command", body, {"Content-Type": "application/json"})
            assert status == 400 and says in out["error"] and "\n" not in out["error"], (body, out)
        for name in ("fly", "kill_worker", "\x1b[31mred"):  # unknown, or not for a person outside the run
            status, out = _command(base, name)
            assert status == 400 and ("the dashboard sends only" in out["error"] or "`name` is" in out["error"]), out
            assert "\x1b" not in out["error"]
        deep = ('{"name": "stop_config", "args": {"config_id": ' + "[" * 20000 + "]" * 20000 + "}}").encode()
        status, out = _call(base + "/api/command", deep, {"Content-Type": "application/json"})
        assert status == 400 and "nested" in out["error"], out
        status, out = _command(base, "drain_worker", self=1)  # an argument named like the sender's own parameter
        assert status == 200 and not out["applied"] and out["outcome"].startswith("`worker` is None"), out
    for kwargs, error, says in (
            ({"port": -1}, ValueError, "`port` is -1, but must be an int in 0..65535"),
            ({"port": 65536}, ValueError, "`port` is 65536"), ({"port": "80"}, ValueError, "`port` is '80'"),
            ({"port": True}, ValueError, "`port` is True"), ({"host": 5}, ValueError, "`host` is 5"),
            ({"host": "no-such-host.invalid"}, ValueError, "`host` is 'no-such-host.invalid', which does not"),
            ({"token": ""}, ValueError, "`token` is ''"), ({"token": "a b"}, ValueError, "`token` is 'a b'")):
        with pytest.raises(error, match="^" + says.replace("[", r"\[").replace("(", r"\(")):
            serve(run.path, **kwargs)
    with pytest.raises(FileNotFoundError, match="`run` '/nonexistent' holds no run.db: not a run directory"):
        serve("/nonexistent")
    with pytest.raises(ValueError, match=r"`run` is 3, but must be the path"):
        serve(3)
    with socket.create_server(("127.0.0.1", 0)) as taken:
        port = taken.getsockname()[1]
        with pytest.raises(ValueError, match=f"`port` is {port}, but 127.0.0.1:{port} cannot be listened on"):
            serve(run.path, port=port)


def test_the_cli_serves_until_interrupted(run, tmp_path):
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    bad = subprocess.run([sys.executable, "-m", "framework", "dashboard", run.path, "--port", "70000"],
                         capture_output=True, text=True, timeout=120, cwd=ROOT, env=env)
    assert bad.returncode == 2 and bad.stderr.count("\n") == 1 and "`port` is 70000" in bad.stderr, bad.stderr
    # `python -m framework dashboard ...`, with Ctrl-C's SIGINT handled as in a terminal also when this test runs
    # with SIGINT ignored (a background job of a non-interactive shell: its children inherit that)
    main = ("import signal, sys; signal.signal(signal.SIGINT, signal.default_int_handler); "
            "from framework.__main__ import main; sys.exit(main(sys.argv[1:]))")
    with open(tmp_path / "stderr", "w+") as err:
        proc = subprocess.Popen([sys.executable, "-c", main, "dashboard", run.path, "--token", "t0k"],
                                stdout=subprocess.PIPE, stderr=err, text=True, cwd=ROOT, env=env)
        try:
            line = proc.stdout.readline()
            assert line.startswith(f"Serving the dashboard of {run.path} at http://127.0.0.1:"), (line, err.name)
            url = next(word for word in line.split() if word.startswith("http://"))
            assert url.endswith("/?token=t0k")
            status, s = _call(url.replace("/?", "/api/status?"))
            assert status == 200 and s["path"] == run.path
            # what it cannot read is one line to the client and nothing in its console (each was a 500 and a
            # traceback there: a token that is not UTF-8, an `add_config` nested 900 deep)
            base = url.split("/?")[0]
            status, out = _call(base + "/api/status", headers={"Authorization": b"Bearer \xff\xfe"}, token=None)
            assert status == 401 and out["error"].startswith("the token given is not UTF-8 text"), out
            deep = b'{"name": "add_config", "args": {"config": {"a": ' + b"[" * 900 + b"]" * 900 + b"}}}"
            status, out = _call(base + "/api/command", deep, {"Content-Type": "application/json"}, token="t0k")
            assert status == 400 and out["error"].startswith("the body is nested 903 levels deep"), out
        finally:
            proc.send_signal(signal.SIGINT)
            try:
                proc.communicate(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()
                raise
        err.seek(0)
        assert proc.returncode == 0 and "Traceback" not in err.read(), err.name


def _screenshot(driver) -> Path:
    folder = Path(os.environ.get("MODELHOPPER_SCREENSHOT_DIR") or ROOT / "build")
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "dashboard.png"
    assert driver.save_screenshot(str(path)), f"no screenshot written to {path}"
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n", f"{path} is not a PNG"
    return path


def test_the_page_in_a_real_browser_stops_a_config(run, headless_chrome):
    driver = headless_chrome(1400, 1100)
    from selenium.common.exceptions import StaleElementReferenceException, TimeoutException
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait

    def text(css: str) -> str:
        """The text of the first element `css` selects ("": none, or the page redrew it while it was read)."""
        try:
            found = driver.find_elements(By.CSS_SELECTOR, css)
            return found[0].text if found else ""
        except StaleElementReferenceException:
            return ""

    token = secrets.token_urlsafe(8)  # the page carries the token of its URL into every request it makes
    try:
        with serve(run.path, token=token) as board:
            driver.get(board.url)
            wait = WebDriverWait(driver, 30, poll_frequency=0.1)
            wait.until(lambda d: text("#run-status") == "running"
                       and text('tr[data-config-id="0"] td.status') == "active"
                       and text('tr[data-config-id="1"] td.status') == "active"
                       and d.find_elements(By.CSS_SELECTOR, "#gantt rect.unit")
                       and len(d.find_elements(By.CSS_SELECTOR, "#curves polyline.curve")) >= 2)
            assert "valid_accuracy" in text("#metric-head") and "workers_started" in text("#events")
            _screenshot(driver)  # the dashboard during the run (written again once config 0 stopped)

            driver.find_element(By.CSS_SELECTOR, 'tr[data-config-id="0"] button.stop').click()
            wait.until(lambda d: text("#message").startswith("stop_config") and "sent" not in text("#message"))
            message = text("#message")
            if "stop_config:" not in message:  # "stop_config rejected: ..." or an HTTP error: say which
                pytest.fail(f"the driver did not apply the dashboard's stop_config: {message!r}")
            run.advance()  # the stop commits with the round
            status0 = 'tr[data-config-id="0"] td.status'
            try:
                wait.until(lambda d: text(status0) == "stopped")
            except TimeoutException:
                pytest.fail(f"config 0 is {text(status0)!r} on the page 30 s after its stop was applied "
                            f"({message!r}), not 'stopped'")
            assert text('tr[data-config-id="1"] td.status') == "active" and text("#run-status") == "running"
            assert not driver.find_element(By.CSS_SELECTOR, 'tr[data-config-id="0"] button.resume').get_attribute(
                "disabled")
            _screenshot(driver)
    finally:
        driver.quit()
    with framework.Result.open(run.path) as result:
        stops = result.commands[result.commands.name == "stop_config"]
        assert stops[["args", "applied", "source"]].values.tolist() == [[{"config_id": 0}, True, "inbox:dashboard"]]


def test_model_selection_serves_its_dashboard_while_it_runs_and_stops_at_its_end_and_a_finished_run_gets_409(
        ray_cluster, digits, tmp_path):
    x, y = digits
    ds = framework.PartitionedDataset.from_arrays(x[:200], y[:200], num_partitions=2, seed=0)
    args = (mlp_model_fn, classifier_train_fn, classifier_eval_fn, ds,
            automl.GridSearch({"hidden": [16], "lr": [0.1], "batch_size": [64]}, epochs=2))
    with pytest.raises(ValueError, match=r"`dashboard` is 'yes', but must be True, False or a dict"):
        framework.ModelSelection(*args, dashboard="yes")
    seen: dict = {}

    class Look(framework.Callback):
        def on_epoch_end(self, config_id, epoch, metrics, config):
            if "status" not in seen:
                url = sel.callbacks[-1].url
                seen["url"] = url
                with urllib.request.urlopen(url.replace("/?", "/api/status?"), timeout=10) as r:
                    seen["status"] = json.loads(r.read())["status"]

    sel = framework.ModelSelection(*args, num_workers=2, storage_path=str(tmp_path / "run"), progress=False,
                                   callbacks=[Look()], dashboard=True)
    result = sel.run()
    assert seen["status"] == "running" and seen["url"].startswith("http://127.0.0.1:")
    with pytest.raises(urllib.error.URLError):  # closed with the run
        urllib.request.urlopen(seen["url"], timeout=5)
    # once the run finished, a dashboard still shows it and commands get 409
    with serve(str(tmp_path / "run")) as board:
        base = _base(board)
        status, s = _call(base + "/api/status")
        assert status == 200 and s["status"] == "finished"
        status, b = _call(base + "/api/leaderboard")
        assert [r["config_id"] for r in b["configs"]] == result.leaderboard().config_id.tolist()
        status, out = _command(base, "pause")
        assert status == 409 and "is finished, not running" in out["error"]
