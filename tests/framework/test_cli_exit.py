"""A run in which every config failed: `Result.all_failed` says so, the run's closing line says "every config failed"
(not "best None"), and the commands that run a selection (demo, resume, replay) exit with 1 and say so at the end.
A run with at least one config that did not fail exits 0 as before."""

from __future__ import annotations

import os

import pytest

import framework
from framework.__main__ import main as cli
from framework.driver.observers import print_summary
from framework.result import CATALOG_FILE, Result
from framework.store.catalog import SQLiteCatalog
from framework.store.storage import RunStorage

ERROR = "Traceback (most recent call last):\nTypeError: '<' not supported between instances of 'Float' and 'float'"


def _run_dir(path, failed: tuple[int, ...]) -> str:
    os.makedirs(path)
    catalog = SQLiteCatalog(str(path / CATALOG_FILE))
    catalog.set_meta(metric="valid_loss", mode="min", start_time=0.0)
    for cid in range(3):
        catalog.add_config(cid, {"lr": 0.1 * (cid + 1)}, "stopped")
        if cid in failed:
            catalog.update_config(cid, status="failed", error=ERROR)
        else:
            catalog.add_epoch(cid, 0, 0, {"valid_loss": 0.5})
            catalog.update_config(cid, epochs=1)
    catalog.close()
    return str(path)


def test_all_failed_only_when_every_config_failed(tmp_path):
    assert Result(_run_dir(tmp_path / "all", (0, 1, 2))).all_failed
    assert not Result(_run_dir(tmp_path / "some", (0, 2))).all_failed
    assert not Result(_run_dir(tmp_path / "none", ())).all_failed


def test_the_closing_line_says_every_config_failed_and_what_the_first_error_was(tmp_path, capsys):
    run = _run_dir(tmp_path / "run", (0, 1, 2))
    print_summary(RunStorage(run, "run"), Result(run), "valid_loss")
    [line] = capsys.readouterr().err.strip().splitlines()
    assert "(3 configs, every config failed; the first: TypeError: '<' not supported" in line
    assert "best None" not in line and "tracebacks: result.failures, or modelhopper show RUN" in line
    ok = _run_dir(tmp_path / "ok", (1,))
    print_summary(RunStorage(ok, "ok"), Result(ok), "valid_loss")
    assert "3 configs, best 0, valid_loss=0.5" in capsys.readouterr().err


@pytest.mark.parametrize("failed, code", [((0, 1, 2), 1), ((0, 2), 0)])
def test_replay_and_resume_exit_1_when_every_config_failed(tmp_path, capsys, monkeypatch, failed, code):
    run = _run_dir(tmp_path / "run", failed)
    monkeypatch.setattr(framework, "replay", lambda storage_path, **kwargs: Result(run))
    assert cli(["replay", run]) == code
    err = capsys.readouterr().err
    assert "error:" not in err and ("every config failed (3 configs)" in err) == (code == 1), err
    if code:
        assert err.strip().splitlines()[-1] == (f"python -m framework replay: every config failed (3 configs): see "
                                                f"their errors with `python -m framework show {run}`")

    import framework.runs.manage as manage
    import framework.steering.status as status

    monkeypatch.setattr(status, "run_status", lambda path: {"status": "crashed"})
    monkeypatch.setattr(manage, "resume_run", lambda path, **kwargs: Result(run))
    assert cli(["resume", run, "--quiet"]) == code
    assert ("resume: every config failed" in capsys.readouterr().err) == (code == 1)
