"""`python -m framework`: show reads a run without writing to it, bad input is one line and exit code 2."""

from __future__ import annotations

import json
import os
import sqlite3
import subprocess
import sys

import pytest

from framework.__main__ import main as cli
from framework.result import CATALOG_FILE
from framework.store.catalog import SQLiteCatalog


def _run_dir(path) -> str:
    os.makedirs(path)
    catalog = SQLiteCatalog(str(path / CATALOG_FILE))
    catalog.set_meta(metric="valid_loss", mode="min", start_time=0.0)
    for cid, losses in ((0, [0.5, 0.4]), (1, [0.3, 0.2]), (2, [0.9])):
        catalog.add_config(cid, {"lr": 0.1 * (cid + 1)}, "stopped")
        for e, v in enumerate(losses):
            catalog.add_epoch(cid, e, e, {"valid_loss": v, "valid_accuracy": 1 - v})
        catalog.update_config(cid, epochs=len(losses))
    catalog.update_config(2, status="failed", error="Traceback (most recent call last):\nRuntimeError: boom")
    catalog.close()
    return str(path)


def test_show_prints_the_leaderboard_and_failures_and_writes_nothing(tmp_path, capsys):
    run = _run_dir(tmp_path / "run")
    db = os.path.join(run, CATALOG_FILE)
    before = (os.stat(db).st_mtime_ns, os.stat(db).st_size, sorted(os.listdir(run)))
    assert cli(["show", run, "--top", "1"]) == 0
    out = capsys.readouterr().out
    assert "config/lr" in out and "RuntimeError: boom" in out
    board = out.split("Failed configs:")[0]
    assert board.count("completed") == 1  # --top 1: only the best config's row
    assert cli(["show", run, "--metric", "valid_accuracy", "--mode", "max", "--json"]) == 0
    shown = json.loads(capsys.readouterr().out)
    assert [r["config_id"] for r in shown["leaderboard"]] == [1, 0, 2] and shown["failures"][0]["config_id"] == 2
    assert (os.stat(db).st_mtime_ns, os.stat(db).st_size, sorted(os.listdir(run))) == before


@pytest.mark.parametrize("make, argv, message", [
    (lambda p: None, ["show", "{p}"], "holds no run.db: not a run directory"),
    (lambda p: (os.makedirs(p), open(os.path.join(p, CATALOG_FILE), "w").close()), ["show", "{p}"],
     "is not a run catalog"),
    (lambda p: (os.makedirs(p), open(os.path.join(p, CATALOG_FILE), "w").write("x" * 200)), ["show", "{p}"],
     "is not a readable run catalog"),
    (_run_dir, ["show", "{p}", "--metric", "valid_acc"], "`metric` is 'valid_acc', but the run reported only"),
    (lambda p: None, ["replay", "{p}"], "does not exist: not a run directory's catalog"),
])
def test_bad_input_is_one_line_and_exit_code_2(tmp_path, capsys, make, argv, message):
    path = tmp_path / "run"
    make(path)
    listing = sorted(os.listdir(path)) if os.path.isdir(path) else None
    assert cli([a.format(p=path) for a in argv]) == 2
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err and len(err.strip().splitlines()) == 1
    assert (sorted(os.listdir(path)) if os.path.isdir(path) else None) == listing  # nothing written


@pytest.mark.parametrize("argv", [["demo", "--workers", "0"], ["show", "x", "--top", "-1"], ["show", "x", "--mode", "up"]])
def test_malformed_flags_are_refused_by_the_parser(argv, capsys):
    with pytest.raises(SystemExit) as e:
        cli(argv)
    assert e.value.code == 2 and "error:" in capsys.readouterr().err


def test_every_command_shows_its_defaults_in_help(capsys):
    for command in ("demo", "show", "replay"):
        with pytest.raises(SystemExit):
            cli([command, "--help"])
        out = capsys.readouterr().out
        assert "(default:" in out, command


def _emptied_meta_run(path) -> str:
    run = _run_dir(path)
    conn = sqlite3.connect(os.path.join(run, CATALOG_FILE))
    conn.execute("DELETE FROM meta")
    conn.commit()
    conn.close()
    return run


@pytest.mark.filterwarnings("ignore::framework.store.catalog.UnverifiedRunWarning")  # emptied: it cannot verify
def test_replay_of_a_run_whose_meta_was_emptied_is_one_line_and_exit_code_2(tmp_path, capsys):
    run = _emptied_meta_run(tmp_path / "run")
    assert cli(["replay", run, "--trust-unverified"]) == 2
    err = capsys.readouterr().err
    assert "error: `storage_path`" in err and "meta lacks ['functions'" in err and "Traceback" not in err
    assert len([line for line in err.strip().splitlines() if "error:" in line]) == 1
    assert sorted(os.listdir(run)) == [CATALOG_FILE]  # no replay folder was made


@pytest.mark.filterwarnings("ignore::framework.store.catalog.UnverifiedRunWarning")
def test_show_of_a_run_whose_meta_was_emptied_warns_on_stderr(tmp_path, capsys):
    run = _emptied_meta_run(tmp_path / "run")
    assert cli(["show", run]) == 0
    captured = capsys.readouterr()
    warning = [line for line in captured.err.splitlines() if "has no meta" in line]
    assert len(warning) == 1 and warning[0].startswith("python -m framework show: warning: the run in ")
    assert "config/lr" in captured.out


def test_replay_out_that_is_a_file_names_the_flag(tmp_path, capsys):
    run = _run_dir(tmp_path / "run")
    (tmp_path / "a-file").write_text("x")
    assert cli(["replay", run, "--out", str(tmp_path / "a-file")]) == 2
    err = capsys.readouterr().err
    assert f"error: `--out` is '{tmp_path / 'a-file'}', but it is a file" in err and "Traceback" not in err


def test_show_of_another_metric_without_its_mode_is_one_line_and_exit_code_2(tmp_path, capsys):
    run = _run_dir(tmp_path / "run")
    assert cli(["show", run, "--metric", "valid_accuracy"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "`mode` is not given" in err[0] and "pass mode='min' or mode='max'" in err[0]


def test_version_and_the_console_script(capsys):
    from importlib.metadata import version

    with pytest.raises(SystemExit) as e:
        cli(["--version"])
    assert e.value.code == 0 and capsys.readouterr().out.strip() == f"python -m framework {version('modelhopper')}"
    script = os.path.join(os.path.dirname(sys.executable), "modelhopper")
    out = subprocess.run([script, "--version"], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0 and out.stdout.strip() == f"modelhopper {version('modelhopper')}"


def test_show_into_a_closed_pipe_prints_no_traceback(tmp_path):
    # a leaderboard larger than a pipe's buffer, so the reader leaves while `show` still writes
    os.makedirs(tmp_path / "run")
    catalog = SQLiteCatalog(str(tmp_path / "run" / CATALOG_FILE))
    catalog.set_meta(metric="valid_loss", mode="min", start_time=0.0)
    for cid in range(3000):
        catalog.add_config(cid, {"lr": cid, "name": "x" * 40}, "stopped")
        catalog.add_epoch(cid, 0, 0, {"valid_loss": cid / 3000})
        catalog.update_config(cid, epochs=1)
    catalog.close()
    run = str(tmp_path / "run")
    code = f"import sys; from framework.__main__ import main; sys.exit(main(['show', {run!r}]))"
    out = subprocess.run(f"{sys.executable!r} -c {code!r} | head -c 1 > /dev/null", shell=True, capture_output=True,
                         text=True, timeout=120)
    assert "Traceback" not in out.stderr and "BrokenPipeError" not in out.stderr, out.stderr


@pytest.mark.parametrize("argv", [["show"], ["show", "x", "--top", "0"], ["nonsense"], ["demo", "--workers", "two"]])
def test_a_bad_flag_or_argument_is_one_line_and_exit_code_2(argv, capsys):
    with pytest.raises(SystemExit) as e:
        cli(argv)
    err = capsys.readouterr().err.strip().splitlines()
    assert e.value.code == 2 and len(err) == 1 and err[0].startswith("python -m framework") and "error:" in err[0]


# ---- start-up: what a command imports ----------------------------------------------------------------------------
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
HEAVY = ("torch", "ray", "automl", "optuna", "framework.driver")  # the driver imports automl, which imports Optuna


def _imported_by(argv: list[str]) -> tuple[int, set[str]]:
    """(exit code, the modules imported) of `main(argv)` in a fresh interpreter."""
    code = ("import contextlib, io, json, sys; from framework.__main__ import main\n"
            "with contextlib.redirect_stdout(io.StringIO()):\n"
            "    try:\n"
            f"        code = main({argv!r})\n"
            "    except SystemExit as e:\n"
            "        code = e.code\n"
            "print(json.dumps([code, sorted(sys.modules)]))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert out.returncode == 0, out.stderr[-2000:]
    code, modules = json.loads(out.stdout.strip().splitlines()[-1])
    return code, set(modules)


def test_help_imports_neither_the_driver_nor_pandas():
    code, modules = _imported_by(["--help"])
    assert code == 0
    heavy = {*HEAVY, "pandas", "numpy", "framework.store.catalog"}
    assert not heavy & modules, sorted(heavy & modules)


@pytest.mark.parametrize("command", [["list", "{root}"], ["show", "{run}"], ["status", "{run}"],
                                     ["watch", "{run}", "--once"], ["compare", "{run}"]])
def test_commands_that_read_a_run_import_neither_torch_nor_ray_nor_the_driver(tmp_path, command):
    run = _run_dir(tmp_path / "run")
    code, modules = _imported_by([a.format(root=tmp_path, run=run) for a in command])
    assert code == 0 and "framework.steering.status" in modules  # it read the run
    assert not set(HEAVY) & modules, sorted(set(HEAVY) & modules)


@pytest.mark.parametrize("command", [["list", "{root}"], ["list", "{root}", "--json"], ["status", "{run}"],
                                     ["status", "{run}", "--json"]])
def test_list_and_status_of_a_run_that_verifies_import_no_pandas(tmp_path, command):
    """They start in a fraction of a second: a run that verifies is read from its rows (no pandas, no numpy: about
    a second to import on two cores); `show`, `watch`, `compare` and `export` print DataFrames."""
    run = _run_dir(tmp_path / "run")
    code, modules = _imported_by([a.format(root=tmp_path, run=run) for a in command])
    assert code == 0 and "framework.steering.status" in modules  # it read the run
    heavy = {*HEAVY, "pandas", "numpy", "framework.result"}
    assert not heavy & modules, sorted(heavy & modules)


def test_the_command_entries_the_cli_reads_are_the_drivers():
    import automl
    from framework.command_specs import _ACTIVE, _STOPPED, COMMAND_ENTRIES
    from framework.driver.commands import COMMANDS

    assert (_ACTIVE, _STOPPED) == (automl.ACTIVE, automl.STOPPED)
    assert list(COMMANDS) == list(COMMAND_ENTRIES)
    for name, c in COMMANDS.items():
        assert c.describe() == COMMAND_ENTRIES[name].describe() and callable(c.handler)


# ---- a run in which no epoch has finished --------------------------------------------------------------------------
def _run_without_an_epoch(path) -> str:
    from framework.scheduling.units import Unit, UnitReport

    os.makedirs(path)
    catalog = SQLiteCatalog(str(path / CATALOG_FILE))
    catalog.set_meta(metric="valid_loss", mode="min", start_time=0.0)
    for cid in range(2):
        catalog.add_config(cid, {"lr": 0.1 * (cid + 1)}, "active")
    for p in range(3):  # config 0 trained 3 of its first epoch's partitions; nothing was evaluated yet
        catalog.add_unit(0, UnitReport(Unit(0, 0, p), worker=0, start=p, end=p + 1), "done")
    catalog.close()
    return str(path)


def test_show_and_watch_of_a_run_without_a_finished_epoch_say_so(tmp_path, capsys):
    run = _run_without_an_epoch(tmp_path / "run")
    said = "No epoch has finished yet: 2 configs, 3 training and 0 evaluation units done so far"
    assert cli(["show", run]) == 0
    out = capsys.readouterr().out
    assert said in out and "Empty DataFrame" not in out
    assert cli(["watch", run, "--once"]) == 0
    out = capsys.readouterr().out
    assert said in out and "Empty DataFrame" not in out and "3 train units" in out
    assert cli(["show", run, "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["leaderboard"] == []  # JSON: an empty list, as before


# ---- watch and dashboard wait for a run that is starting -------------------------------------------------------
@pytest.mark.parametrize("command", [["watch", "{p}", "--once"], ["dashboard", "{p}"]])
@pytest.mark.parametrize("exists", [False, True])
def test_watch_and_dashboard_wait_for_a_run_then_say_none_started(tmp_path, capsys, command, exists):
    path = tmp_path / "run"
    if exists:
        os.makedirs(path)  # the folder of a run that was launched: its run.db is not there yet
    assert cli([a.format(p=path) for a in command] + ["--wait", "0.3"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 2 and "Traceback" not in "".join(err), err
    assert err[0] == f"python -m framework {command[0]}: waiting up to 0.3 s for a run to start in {path} (--wait)"
    assert err[1] == (f"python -m framework {command[0]}: error: `run` '{path}' holds no run.db: not a run directory "
                      "(no run started there within 0.3 s; --wait SECONDS waits longer)")
    assert os.listdir(tmp_path) == (["run"] if exists else [])  # nothing written
    assert cli([a.format(p=path) for a in command] + ["--wait", "0"]) == 2  # 0: no wait, the error at once
    assert "waiting" not in capsys.readouterr().err


def test_watch_does_not_wait_for_a_run_that_is_there(tmp_path, capsys):
    run = _run_dir(tmp_path / "run")
    assert cli(["watch", run, "--once", "--wait", "60"]) == 0
    captured = capsys.readouterr()
    assert captured.err == "" and "config/lr" in captured.out


@pytest.mark.parametrize("wait", ["-1", "nan", "inf", "86401", "soon"])
def test_a_bad_wait_is_refused_by_the_parser(wait, capsys):
    with pytest.raises(SystemExit) as e:
        cli(["watch", "RUN", "--wait", wait])
    err = capsys.readouterr().err.strip().splitlines()
    assert e.value.code == 2 and len(err) == 1 and "argument --wait:" in err[0]
