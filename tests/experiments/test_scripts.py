"""Every experiment script imports and answers --help (they are what users submit with `ray job submit`)."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SCRIPTS = sorted(f for f in os.listdir(os.path.join(ROOT, "experiments")) if f.endswith(".py") and not f.startswith("_"))


@pytest.mark.parametrize("script", SCRIPTS)
def test_experiment_script_answers_help(script):
    out = subprocess.run([sys.executable, os.path.join("experiments", script), "--help"], cwd=ROOT,
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert "usage:" in out.stdout
