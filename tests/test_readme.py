"""The README's claims, run: every Python block marked `<!-- runnable -->` runs in the suite, in order and in one
namespace (later blocks use what earlier ones defined), from an empty working directory with the storage root in a
temporary folder; every other Python block must at least compile; and the README speaks to users, not to our tracker."""

from __future__ import annotations

import os
import re
import sys
import types

import pytest

README = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "README.md")
MARK = "<!-- runnable -->"


def python_blocks() -> list[tuple[int, bool, str]]:
    """(line, runnable, code) of every ```python block of the README."""
    with open(README) as f:
        lines = f.read().splitlines()
    blocks, i = [], 0
    while i < len(lines):
        if lines[i].strip() == "```python":
            start = i
            runnable = i > 0 and lines[i - 1].strip() == MARK
            i += 1
            body = []
            while lines[i].strip() != "```":
                body.append(lines[i])
                i += 1
            indent = min((len(x) - len(x.lstrip()) for x in body if x.strip()), default=0)
            blocks.append((start + 1, runnable, "\n".join(x[indent:] for x in body)))
        i += 1
    return blocks


def test_every_python_block_compiles():
    blocks = python_blocks()
    assert len(blocks) >= 5, f"the README has {len(blocks)} Python blocks: the reader is meant to find examples"
    for line, _, code in blocks:
        compile(code, f"README.md:{line}", "exec")


def test_the_first_example_is_runnable_and_complete():
    runnable = [(line, code) for line, run, code in python_blocks() if run]
    assert len(runnable) >= 3, "the README must mark its first example (and more) runnable"
    for line, code in runnable:
        assert not re.search(r"^\s*\.\.\.\s*$|\(\.\.\.[,)]", code, flags=re.MULTILINE), \
            f"README.md:{line}: a runnable block has a `...` placeholder"


def test_the_readme_does_not_speak_of_issues_or_notes():
    with open(README) as f:
        text = f.read().lower()
    for phrase in ("the issue", "closing note", "issue that asked"):
        assert phrase not in text, phrase


@pytest.mark.ray
@pytest.mark.slow
def test_runnable_blocks_run(ray_cluster, tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("MODELHOPPER_STORAGE", str(tmp_path / "runs"))
    os.makedirs(tmp_path / "work", exist_ok=True)
    monkeypatch.chdir(tmp_path / "work")
    module = types.ModuleType("readme_example")  # importable while it runs, as a user's script is: what it defines
    monkeypatch.setitem(sys.modules, module.__name__, module)  # pickles (a define-by-run space is saved with the run)
    ray_cluster.cloudpickle.register_pickle_by_value(module)  # and its functions go to the workers by value, as a
    # script's do (`python my_selection.py` defines them in `__main__`)
    for line, run, code in python_blocks():
        if run:
            exec(compile(code, f"README.md:{line}", "exec"), module.__dict__)  # noqa: S102 - our own README
    ray_cluster.cloudpickle.unregister_pickle_by_value(module)
    assert os.listdir(tmp_path / "work") == [], "a README example wrote into the working directory"
    assert os.listdir(tmp_path / "runs"), "the README's runs went nowhere under $MODELHOPPER_STORAGE"
