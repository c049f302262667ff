"""`modelhopper list|status|compare|export|resume` on real runs: a finished one and one whose driver was killed after
its first commit (`tests.integration.resume_job`). Reading never writes into a run, an unverified run imports
nothing, bad input is one line on stderr and exit code 2. `watch` and `dashboard` wait for a run that is starting;
`status` counts the workers a person added to a running run."""

from __future__ import annotations

import json
import os
import shutil
import socket
import sqlite3
import subprocess
import sys
import threading
import time

import pandas as pd
import pytest

import automl
import framework
from framework.__main__ import main as cli
from framework.examples import classifier_eval_fn, classifier_train_fn, mlp_model_fn
from framework.result import CATALOG_FILE
from framework.runs import list_runs
from framework.steering.status import RECENT_S, DriverInfo, classify, pid_alive, run_status
from framework.store.catalog import SQLiteCatalog
from framework.store.lock import writer_lock

pytestmark = pytest.mark.ray
PLANTED_REF = "tests.integration.planted:model_fn"  # importing it runs code (tests/integration/planted.py)


@pytest.fixture(scope="module")
def runs(ray_cluster, digits, tmp_path_factory):
    """A storage root with a finished run (ranked by valid_accuracy, max) and, newer, a crashed one (valid_loss,
    min), plus a mirrored run's working copy under `.working` that `list` must skip."""
    from tests.integration.ft_helpers import _crash_driver

    root = tmp_path_factory.mktemp("root")
    x, y = digits
    ds = framework.PartitionedDataset.from_arrays(x[:200], y[:200], num_partitions=2, seed=0)
    finished = str(root / "group" / "finished")
    framework.ModelSelection(
        mlp_model_fn, classifier_train_fn, classifier_eval_fn, ds,
        automl.GridSearch({"hidden": [16], "lr": [0.05, 0.1], "batch_size": [64]}, epochs=2), num_workers=2,
        storage_path=finished, progress=False, metric="valid_accuracy", mode="max").run()
    crashed = _crash_driver(root, "commit")  # root/crashed-commit: 4 configs, round 0 committed, then SIGKILL
    shutil.copytree(finished, str(root / ".working" / "copy"))
    return {"root": str(root), "finished": finished, "crashed": crashed}


def _copy(run: str, where) -> str:
    return shutil.copytree(run, str(where / "run"))


def _listing(run: str) -> tuple:
    db = os.path.join(run, CATALOG_FILE)
    return sorted(os.listdir(run)), os.stat(db).st_mtime_ns, os.stat(db).st_size


def _one_error_line(capsys, *words: str) -> str:
    err = capsys.readouterr().err
    lines = [line for line in err.strip().splitlines() if line.strip()]
    assert len(lines) == 1 and "error:" in lines[0] and "Traceback" not in err, err
    for w in words:
        assert w in lines[0], lines[0]
    return lines[0]


# ---- the status rule --------------------------------------------------------------------------------------------
HERE = "this-host"


@pytest.mark.parametrize("finished, driver, end_time, last, want", [
    (True, DriverInfo(7, HERE, 100.0), None, 100.0, "finished"),
    (False, DriverInfo(7, HERE, 100.0), None, 100.0, "running"),  # alive below: pid 7
    (False, DriverInfo(8, HERE, 100.0), None, 100.0, "crashed"),  # gone
    (False, DriverInfo(7, HERE, 100.0), 150.0, 150.0, "crashed"),  # alive, but it recorded its end
    (False, DriverInfo(7, HERE, 200.0), 150.0, 250.0, "running"),  # the end was the session before its resume
    (False, DriverInfo(7, "elsewhere", 100.0), None, 1000.0 - RECENT_S / 2, "running?"),
    (False, DriverInfo(7, "elsewhere", 100.0), None, 1000.0 - 2 * RECENT_S, "unknown"),
    (False, None, None, 1000.0 - RECENT_S / 2, "running?"),  # a run from before drivers were recorded
    (False, None, None, 1000.0 - 2 * RECENT_S, "unknown"),
])
def test_classify_follows_the_status_rule(finished, driver, end_time, last, want):
    assert classify(finished, driver, end_time, last, host=HERE, alive=lambda pid, since: pid == 7,
                    now=1000.0) == want


def test_pid_alive_is_false_for_an_exited_and_a_younger_process():
    assert pid_alive(os.getpid(), since=1e12)
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    assert not pid_alive(proc.pid, since=1e12)
    assert not pid_alive(os.getpid(), since=0.0)  # this process started long after: a reused pid


# ---- list and status --------------------------------------------------------------------------------------------
def test_reading_runs_from_the_command_line_imports_no_torch(runs):
    """The commands that read or steer runs start in about a second: neither they nor `--help` import torch (about
    3 s on two cores), which only building a model or a worker needs, nor Ray."""
    code = ("import contextlib, io, sys; from framework.__main__ import main\n"
            "with contextlib.redirect_stdout(io.StringIO()):\n"
            f"    codes = [main(['status', {runs['finished']!r}]), main(['list', {runs['root']!r}]),\n"
            f"             main(['show', {runs['finished']!r}]), main(['watch', {runs['finished']!r}, '--once'])]\n"
            "    try:\n        main(['--help'])\n    except SystemExit as e:\n        codes.append(e.code)\n"
            "print(codes, 'torch' in sys.modules, 'ray' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                         cwd=os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
    assert out.stdout.strip() == "[0, 0, 0, 0, 0] False False", (out.stdout, out.stderr[-2000:])


def test_list_shows_the_finished_and_the_crashed_run_newest_first(runs, capsys):
    board = list_runs(runs["root"])
    assert list(board.path) == ["crashed-commit", os.path.join("group", "finished")]  # not .working/copy
    assert list(board.status) == ["crashed", "finished"] and list(board.configs) == [4, 2]
    assert list(board.metric) == ["valid_loss", "valid_accuracy"] and board.verified.all()
    assert 0 < board.best[1] <= 1 and board.pid.isna().all()

    assert cli(["list", runs["root"]]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0].split() == ["path", "status", "configs", "best", "age", "verified"]
    assert out[1].split()[:3] == ["crashed-commit", "crashed", "4"] and "valid_loss (min)" in out[1]
    assert out[2].split()[:3] == ["group/finished", "finished", "2"] and "valid_accuracy (max)" in out[2]
    assert out[1].split()[-1] == out[2].split()[-1] == "yes"
    assert cli(["list", runs["root"], "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)
    assert [(r["path"], r["status"], r["verified"]) for r in rows] == [
        ("crashed-commit", "crashed", True), ("group/finished", "finished", True)]


def test_list_of_the_default_root_and_of_an_empty_one(runs, tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("MODELHOPPER_STORAGE", runs["root"])
    assert cli(["list", "--json"]) == 0
    assert len(json.loads(capsys.readouterr().out)) == 2
    assert cli(["list", str(tmp_path)]) == 0
    assert capsys.readouterr().out.strip() == f"No runs under {tmp_path}"
    monkeypatch.setenv("MODELHOPPER_STORAGE", str(tmp_path / "not-yet"))  # a fresh machine: no run made the root
    assert cli(["list"]) == 0
    assert capsys.readouterr().out.strip() == f"No runs under {tmp_path / 'not-yet'}"
    assert cli(["list", str(tmp_path / "typo")]) == 2  # a root the user names must exist
    _one_error_line(capsys, "does not exist")


def test_list_finds_the_runs_experiments_write_four_levels_down(runs, tmp_path, capsys):
    shutil.copytree(runs["finished"], str(tmp_path / "experiments" / "script" / "20260101-000000" / "run"))
    assert cli(["list", str(tmp_path), "--json"]) == 0
    assert [r["path"] for r in json.loads(capsys.readouterr().out)] == ["experiments/script/20260101-000000/run"]


def test_status_of_the_finished_and_the_crashed_run(runs, capsys):
    assert cli(["status", runs["crashed"], "--json"]) == 0
    s = json.loads(capsys.readouterr().out)
    assert (s["status"], s["verified"], s["metric"], s["mode"]) == ("crashed", True, "valid_loss", "min")
    assert s["configs"] == {"active": 4} and s["rounds"] == 1 and s["epochs_trained"] == 4
    assert s["units_done"] == {"train": 8, "eval": 8} and s["workers"]["num_workers"] == 1
    assert s["driver"]["host"] == socket.gethostname() and s["driver"]["pid"] > 0 and s["pid"] is None
    assert s["best"]["config_id"] in range(4) and s["start_time"] <= s["last_activity"]

    assert cli(["status", runs["finished"]]) == 0
    out = dict(line.split(":", 1) for line in capsys.readouterr().out.splitlines())
    assert out["status"].strip() == "finished" and out["verified"].strip() == "yes"
    assert out["metric"].strip() == "valid_accuracy (max)" and out["configs"].strip() == "2: 2 completed"
    assert out["best"].strip().startswith("config ") and "ago" in out["last activity"]


def test_a_real_run_is_read_without_pandas_as_a_result_reads_it(runs):
    """`list` and `status` read a run that verifies from its rows (`_plain_reading`, no pandas): the same status, and
    the best value `Result.get_best_result()` gives (each config's last epoch; a failed config is never best)."""
    from framework.steering.status import _plain_reading, _reading_of, _status_dict, opened

    for name in ("finished", "crashed"):
        path = runs[name]
        plain, now = _plain_reading(path), time.time()
        assert plain is not None
        with opened(path) as result:
            want = {**_status_dict(_reading_of(result), now), "path": path}
            best = result.get_best_result()
            metric = result.metric
        got = {**_status_dict(plain, now), "path": path}
        assert json.dumps(got, indent=1, default=str) == json.dumps(want, indent=1, default=str)
        assert (got["best"]["config_id"], got["best"]["value"]) == (best.config_id, best.metrics[metric])
        [row] = [r for r in list_runs(runs["root"]).itertuples() if os.path.join(runs["root"], r.path) == path]
        assert (row.status, row.configs, row.best) == (got["status"], got["num_configs"], best.metrics[metric])


def test_a_run_whose_driver_is_alive_is_running_and_resume_refuses_it(runs, tmp_path, capsys):
    run = _copy(runs["crashed"], tmp_path)
    catalog = SQLiteCatalog(os.path.join(run, CATALOG_FILE))  # signed: the run still verifies
    catalog.set_meta(driver={"pid": os.getpid(), "host": socket.gethostname()})
    catalog.close()
    s = run_status(run)
    assert (s["status"], s["pid"], s["verified"]) == ("running", os.getpid(), True)
    before = _listing(run)
    assert cli(["resume", run]) == 2
    _one_error_line(capsys, "is running", f"pid {os.getpid()}")
    assert _listing(run) == before


def test_a_run_being_resumed_is_running_before_it_records_its_driver_and_a_second_resume_is_refused(
        runs, tmp_path, capsys):
    run = _copy(runs["crashed"], tmp_path)
    assert run_status(run)["status"] == "crashed"
    with writer_lock(run):  # what a resume holds from its first step, before Ray starts and it records its driver
        s = run_status(run)
        assert (s["status"], s["locked"], s["pid"]) == ("running", True, None)
        before = _listing(run)
        assert cli(["resume", run]) == 2
        _one_error_line(capsys, "is running", "holds its writer lock")
        with pytest.raises(ValueError, match=r"is being written by another process on this host"):
            framework.ModelSelection.resume(run, mlp_model_fn, classifier_train_fn, classifier_eval_fn).run()
        assert _listing(run) == before
    assert run_status(run)["status"] == "crashed"


# ---- resume -----------------------------------------------------------------------------------------------------
def test_resume_of_the_crashed_run_from_the_cli_finishes_it(runs, tmp_path, capsys):
    run = _copy(runs["crashed"], tmp_path)
    assert cli(["resume", run, "--quiet", "--max-unit-retries", "1"]) == 0
    assert f"Resumed {run}: it finished" in capsys.readouterr().out
    s = run_status(run)
    assert s["status"] == "finished" and s["configs"] == {"completed": 4} and s["epochs_trained"] == 4 * 3
    assert s["resumes"] == 1 and s["driver"]["pid"] == os.getpid()


def test_resume_of_a_finished_run_says_so_and_exits_0(runs, capsys):
    before = _listing(runs["finished"])
    assert cli(["resume", runs["finished"]]) == 0
    assert capsys.readouterr().out.strip() == f"The run in {runs['finished']} had finished: nothing to resume"
    assert _listing(runs["finished"]) == before


def test_resume_of_functions_defined_in_main_says_to_resume_from_python(runs, tmp_path, capsys):
    run = _copy(runs["crashed"], tmp_path)
    catalog = SQLiteCatalog(os.path.join(run, CATALOG_FILE))
    functions = catalog.meta()["functions"]
    catalog.set_meta(functions={**functions, "model_fn": "__main__:mlp_model_fn"})
    catalog.close()
    assert cli(["resume", run]) == 2
    _one_error_line(capsys, "'__main__:mlp_model_fn'", "ModelSelection.resume(path, model_fn", "--model-fn")
    # the user names an importable one instead
    assert cli(["resume", run, "--quiet", "--model-fn", "framework.examples:mlp_model_fn"]) == 0
    assert run_status(run)["status"] == "finished"


@pytest.mark.filterwarnings("ignore::framework.store.catalog.UnverifiedRunWarning")
def test_an_edited_run_is_listed_unverified_and_resume_imports_nothing(runs, tmp_path, capsys, monkeypatch):
    run = _copy(runs["crashed"], tmp_path)
    conn = sqlite3.connect(os.path.join(run, CATALOG_FILE), isolation_level=None)
    conn.execute("UPDATE meta SET value = json_set(value, '$.model_fn', ?) WHERE key = 'functions'", (PLANTED_REF,))
    conn.close()
    marker = tmp_path / "planted-code-ran"
    monkeypatch.setenv("MODELHOPPER_PLANTED_MARKER", str(marker))
    [row] = list_runs(str(tmp_path)).itertuples()
    assert (row.status, row.verified) == ("crashed", False)
    before = _listing(run)
    assert cli(["resume", run]) == 2
    _one_error_line(capsys, "not verified", "--trust-unverified")
    assert cli(["resume", run, "--trust-unverified"]) == 2
    _one_error_line(capsys, "not verified, so the functions it names are not imported", "--model-fn")
    assert not marker.exists() and "tests.integration.planted" not in sys.modules
    assert _listing(run) == before


# ---- compare and export -----------------------------------------------------------------------------------------
def test_compare_ranks_each_run_by_its_own_metric_unless_one_is_given(runs, capsys):
    finished, crashed = runs["finished"], runs["crashed"]
    assert cli(["compare", finished, crashed, "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)
    assert [(r["run"], r["rank"], r["metric"], r["mode"]) for r in rows] == [
        (finished, 1, "valid_accuracy", "max"), (crashed, 1, "valid_loss", "min")]
    best = framework.Result(finished).get_best_result()
    assert rows[0]["config_id"] == best.config_id and rows[0]["value"] == pytest.approx(best.metrics["valid_accuracy"])

    assert cli(["compare", finished, crashed, "--top", "2", "--metric", "valid_accuracy", "--mode", "max",
                "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)
    assert [(r["rank"], r["metric"]) for r in rows] == [(1, "valid_accuracy"), (2, "valid_accuracy")] * 2
    for run in (finished, crashed):
        values = [r["value"] for r in rows if r["run"] == run]
        assert values == sorted(values, reverse=True)
    assert cli(["compare", finished, crashed]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0].split()[:4] == ["run", "rank", "config_id", "metric"] and len(out) == 3


@pytest.mark.parametrize("fmt", ["csv", "parquet"])
def test_export_writes_readable_tables_beside_the_run_and_nothing_into_it(runs, tmp_path, capsys, fmt):
    run = _copy(runs["finished"], tmp_path)
    before = _listing(run)
    assert cli(["export", run, "--format", fmt]) == 0
    out = run + "-export"
    assert out in capsys.readouterr().out and _listing(run) == before
    read = pd.read_csv if fmt == "csv" else pd.read_parquet
    tables = {name: read(os.path.join(out, f"{name}.{fmt}"))
              for name in ("leaderboard", "metrics", "schedule", "configs", "failures", "events")}
    assert sorted(os.listdir(out)) == sorted(f"{name}.{fmt}" for name in tables)
    assert len(tables["leaderboard"]) == len(tables["configs"]) == 2 and len(tables["metrics"]) == 2 * 2
    assert len(tables["schedule"]) == 2 * 2 * 2 * 2 and tables["failures"].empty  # configs x epochs x parts x kind
    assert json.loads(tables["configs"].config[0])["hidden"] == 16
    # an existing folder that is not empty, and a folder inside the run, are refused
    assert cli(["export", run, "--format", fmt]) == 2
    _one_error_line(capsys, "exists and is not empty")
    assert cli(["export", run, "--out", os.path.join(run, "exported")]) == 2
    _one_error_line(capsys, "inside the run")
    assert _listing(run) == before


def test_export_of_the_current_folder_goes_beside_it(runs, tmp_path, capsys, monkeypatch):
    run = _copy(runs["finished"], tmp_path)
    monkeypatch.chdir(run)
    assert cli(["export", "."]) == 0
    assert os.path.isfile(os.path.join(run + "-export", "leaderboard.csv")), capsys.readouterr()


# ---- bad input ----------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("argv, message", [
    (["status", "{p}/missing"], "holds no run.db: not a run directory"),
    (["status", "{p}"], "holds no run.db: not a run directory"),  # a folder that holds no run
    (["resume", "{p}/missing"], "holds no run.db: not a run directory"),
    (["export", "{p}/missing"], "holds no run.db: not a run directory"),
    (["compare", "{p}/missing", "{p}"], "holds no run.db: not a run directory"),
    (["list", "{p}/missing"], "does not exist"),
    (["workers", "{p}/missing", "--add", "1"], "holds no run.db: not a run directory"),
    (["pause", "{p}/missing"], "holds no run.db: not a run directory"),
    (["watch", "{p}/missing", "--once", "--wait", "0"], "holds no run.db: not a run directory"),
    (["dashboard", "{p}", "--wait", "0"], "holds no run.db: not a run directory"),
    (["unpause", "{p}"], "holds no run.db: not a run directory"),
    (["checkpoint-config", "{p}/missing", "0"], "holds no run.db: not a run directory"),  # made from the registry
])
def test_a_missing_run_is_one_line_and_exit_code_2(tmp_path, capsys, argv, message):
    assert cli([a.format(p=tmp_path) for a in argv]) == 2
    _one_error_line(capsys, message)
    assert os.listdir(tmp_path) == []


@pytest.mark.parametrize("argv", [
    ["list", "--depth", "0"], ["export", "x", "--format", "xls"], ["compare"], ["compare", "x", "--top", "0"],
    ["resume", "x", "--worker-resources", "[1]"], ["resume", "x", "--unit-timeout-s", "-1"], ["status"],
])
def test_a_bad_flag_is_one_line_and_exit_code_2(argv, capsys):
    with pytest.raises(SystemExit) as e:
        cli(argv)
    assert e.value.code == 2
    _one_error_line(capsys, "python -m framework", "(see --help)")


def test_every_command_a_person_may_send_has_a_subcommand_made_from_the_registry_unless_written_by_hand():
    import argparse

    from framework.__main__ import build_parser
    from framework.driver.commands import COMMANDS

    sub = next(a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction))
    wanted = {c.cli or c.name.replace("_", "-") for c in COMMANDS.values() if c.outside}
    assert "checkpoint-config" in wanted and wanted <= set(sub.choices)
    args = build_parser().parse_args(["checkpoint-config", "RUN", "3", "--timeout", "5"])
    assert (args.registry_command, args.run, args.arg_config_id, args.timeout) == ("checkpoint_config", "RUN", 3, 5.0)
    with pytest.raises(SystemExit):
        build_parser().parse_args(["checkpoint-config", "RUN", "three"])


def test_help_lists_the_subcommands_and_says_what_they_do(capsys):
    script = os.path.join(os.path.dirname(sys.executable), "modelhopper")
    out = subprocess.run([script, "--help"], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0
    for command in ("demo", "show", "replay", "list", "status", "watch", "compare", "export", "resume", "workers",
                    "pause", "unpause"):
        assert f"    {command} " in out.stdout, command
    for command in ("list", "status", "compare", "export", "resume"):
        with pytest.raises(SystemExit):
            cli([command, "--help"])
        text = capsys.readouterr().out
        assert "(default:" in text and ("--json" in text) == (command in ("list", "status", "compare")), command
    with pytest.raises(SystemExit):
        cli(["resume", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert "had finished prints one line and exits with 0" in text and "ModelSelection.resume(path" in text


# ---- a run that is starting, and one that is steered -------------------------------------------------------------
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _started(argv: list[str]) -> subprocess.Popen:
    """`python -m framework ARGV` in a process of its own, once it has said on stderr that it waits for the run."""
    env = {**os.environ, "PYTHONPATH": ROOT, "PYTHONFAULTHANDLER": "1"}
    # Ctrl-C's SIGINT handled as in a terminal, also when this test runs with SIGINT ignored (a background job of a
    # non-interactive shell: its children inherit that, and Python then leaves it ignored)
    main = ("import signal, sys; signal.signal(signal.SIGINT, signal.default_int_handler); "
            "from framework.__main__ import main; sys.exit(main(sys.argv[1:]))")
    proc = subprocess.Popen([sys.executable, "-c", main, *argv], cwd=ROOT, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=env)
    line = proc.stderr.readline()  # (blocks until the line comes; the process waits up to --wait after it)
    assert "waiting up to 120 s for a run to start in" in line, (line, proc.stderr.read() if proc.poll() else "")
    return proc


def _until(what, timeout: float = 120.0) -> None:
    deadline = time.monotonic() + timeout
    while not what():
        assert time.monotonic() < deadline, f"waited {timeout:g} s"
        time.sleep(0.2)  # (a run_status reads the run: about 15 ms of CPU)


def test_watch_waits_for_a_run_launched_after_it_and_follows_it_to_its_end(ray_cluster, digits, tmp_path):
    path = str(tmp_path / "run")  # does not exist yet: the run makes it
    watch = _started(["watch", path, "--wait", "120", "--interval", "1"])  # (each frame reads the whole run)
    try:
        x, y = digits
        ds = framework.PartitionedDataset.from_arrays(x[:200], y[:200], num_partitions=2, seed=0)
        framework.ModelSelection(
            mlp_model_fn, classifier_train_fn, classifier_eval_fn, ds,
            automl.GridSearch({"hidden": [16], "lr": [0.05, 0.1], "batch_size": [64]}, epochs=2), num_workers=1,
            storage_path=path, progress=False).run()
        out, err = watch.communicate(timeout=120)
    finally:
        watch.kill()
    assert watch.returncode == 0 and "Traceback" not in err and "warning" not in err, err
    frames = out.split(f"{path}: ")
    assert f"{path}: finished, 2 configs {{'completed': 2}}, 8 train units" in out, out[-3000:]
    assert "config/lr" in frames[-1] and frames[-1].count("completed") >= 2  # the last frame: the whole leaderboard


def test_dashboard_waits_for_a_run_that_appears_and_serves_it(runs, tmp_path):
    import signal
    import urllib.request

    path = str(tmp_path / "run")
    board = _started(["dashboard", path, "--wait", "120"])
    try:
        copy = shutil.copytree(runs["finished"], str(tmp_path / ".copy"))
        os.rename(copy, path)  # the whole run appears at once
        line = board.stdout.readline()
        assert line.startswith(f"Serving the dashboard of {path} at http://127.0.0.1:"), line
        url = line.split(" at ", 1)[1].split()[0]
        with urllib.request.urlopen(url.replace("/?token=", "/api/status?token="), timeout=60) as r:
            status = json.loads(r.read().decode())
        assert (status["status"], status["num_configs"]) == ("finished", 2)
        board.send_signal(signal.SIGINT)  # Ctrl-C
        try:
            out, err = board.communicate(timeout=60)
        except subprocess.TimeoutExpired:  # (PYTHONFAULTHANDLER: SIGABRT prints where each of its threads is)
            board.send_signal(signal.SIGABRT)
            raise AssertionError(f"the dashboard did not stop within 60 s of Ctrl-C:\n{board.communicate()[1]}") from None
    finally:
        board.kill()
    assert board.returncode == 0 and "Traceback" not in err, err


def test_status_counts_the_workers_a_person_added_to_a_running_run(ray_cluster, digits, tmp_path, capsys):
    from tests.integration.ft_functions import gated_train_fn

    gate = tmp_path / "gate"
    gate.write_text("")  # closed: every unit waits, so the run goes on while the worker is added
    x, y = digits
    ds = framework.PartitionedDataset.from_arrays(x[:300], y[:300], num_partitions=2, seed=0)
    path = str(tmp_path / "run")
    space = {"hidden": [16], "lr": [0.05, 0.1], "batch_size": [64], "gate": [str(gate)]}
    sel = framework.ModelSelection(mlp_model_fn, gated_train_fn, classifier_eval_fn, ds,
                                   automl.GridSearch(space, epochs=1), num_workers=2, storage_path=path,
                                   progress=False)
    done: dict = {}
    runner = threading.Thread(target=lambda: done.setdefault("result", sel.run()), daemon=True)
    runner.start()
    try:
        _until(lambda: len(sel.live_workers()) == 2 and run_status(path)["workers"]["started"] == 2)
        s = run_status(path)
        assert (s["status"], s["workers"]["num_workers"], s["workers"]["live"]) == ("running", 2, 2)
        assert cli(["workers", path, "--add", "1"]) == 0
        assert capsys.readouterr().out.strip() == "add_workers: started workers [2]"
        _until(lambda: run_status(path)["workers"]["live"] == 3)  # once the new worker has joined
        assert cli(["status", path]) == 0
        out = capsys.readouterr().out  # (the driver's notices, printed from its thread, may be among its lines)
        [workers] = [line for line in out.splitlines() if line.startswith("workers:")]
        assert workers.split(":", 1)[1].strip().startswith("3 now, 2 at the start ("), out
        assert cli(["status", path, "--json"]) == 0
        w = json.loads(capsys.readouterr().out)["workers"]
        assert (w["num_workers"], w["started"], w["live"]) == (2, 2, 3)
    finally:
        gate.unlink()
        runner.join(timeout=180)
    assert done["result"].status.status.tolist() == ["completed", "completed"]
    assert run_status(path)["workers"]["live"] == 3  # a finished run: the workers it had at its end
    assert cli(["status", path]) == 0  # ... and it says so: none of them runs now
    [workers] = [line for line in capsys.readouterr().out.splitlines() if line.startswith("workers:")]
    assert workers.split(":", 1)[1].strip().startswith("3 at the end, 2 at the start ("), workers
