"""Every experiment script imports and answers --help (they are what users submit with `ray job submit`)."""

from __future__ import annotations

import os
import runpy
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SCRIPTS = sorted(f for f in os.listdir(os.path.join(ROOT, "experiments")) if f.endswith(".py") and not f.startswith("_"))


@pytest.mark.parametrize("script", SCRIPTS)
def test_experiment_script_answers_help_with_defaults(script, monkeypatch, capsys):
    # in this process (torch and Ray are imported once for all of them); the next test starts a fresh interpreter
    path = os.path.join(ROOT, "experiments", script)
    monkeypatch.setattr(sys, "argv", [path, "--help"])
    monkeypatch.setattr(sys, "path", list(sys.path))
    with pytest.raises(SystemExit) as e:
        runpy.run_path(path, run_name="__main__")
    out = capsys.readouterr().out
    assert e.value.code == 0 and "usage:" in out
    assert "(default:" in out


def test_a_script_runs_as_users_run_it():
    out = subprocess.run([sys.executable, os.path.join("experiments", "mop_vs_baselines.py"), "--help"], cwd=ROOT,
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert "--queue-depth" in out.stdout and "(default: 2)" in out.stdout
