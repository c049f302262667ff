"""The programs in examples/: each compiles, is a complete script (a docstring that says how to run it, a
`__main__` guard), is listed in examples/README.md, and runs to exit code 0 from an empty working directory with
the storage root in a temporary folder, writing nothing into the working directory.

Starting Ray costs each fresh process several seconds, so the runs share one process: a subprocess runs every
example in turn as `__main__` (`runpy.run_path`, with its own `sys.argv`), as `python examples/NAME.py` would, and
reports each one's exit; one test per example then reads its part of that output. The GPU example falls back to
CPU workers without CUDA, so it runs here too."""

from __future__ import annotations

import ast
import os
import re
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
EXAMPLES = os.path.join(ROOT, "examples")
NAMES = sorted(f for f in os.listdir(EXAMPLES) if f.endswith(".py"))

#: what each example's output must show, beyond its exit code: a pattern per example
EXPECTED = {
    "first_selection.py": r"\{'hidden': \d+, 'lr': [\d.]+, 'batch_size': 32\} 0\.\d+",
    "custom_procedure.py": r"statuses: \{'pruned': 7, 'completed': 1\}; config-epochs trained: 15",
    "cluster_job.py": r"driver: an embedded local Ray \(no RAY_ADDRESS set\)",
    "gpu_run.py": r"(CUDA is not available: falling back to CPU workers|GPU run: 2 workers)",
    "steering_session.py": r"clone_config inbox:connect +True config 5 cloned from config 0",
}

# runs every example as `__main__`, in order, in this one process; a line `=== NAME exit CODE SECONDS` after each
RUNNER = r"""
import os, runpy, sys, time, traceback
for path in sys.argv[1:]:
    name, code, t0 = os.path.basename(path), 0, time.perf_counter()
    print(f"=== {name} start", flush=True)
    sys.argv = [path]
    try:
        runpy.run_path(path, run_name="__main__")
    except SystemExit as e:
        code = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
    except BaseException:
        traceback.print_exc()
        code = 1
    sys.stdout.flush()
    sys.stderr.flush()
    print(f"=== {name} exit {code} {time.perf_counter() - t0:.1f}", flush=True)
"""


def test_every_example_is_listed():
    assert NAMES == sorted(EXPECTED), f"examples/ holds {NAMES}; EXPECTED here must name each one"
    with open(os.path.join(EXAMPLES, "README.md")) as f:
        readme = f.read()
    for name in NAMES:
        assert f"`{name}`" in readme and f"python examples/{name}" in readme, f"examples/README.md lacks {name}"


@pytest.mark.parametrize("name", NAMES)
def test_example_compiles_and_is_a_script(name):
    with open(os.path.join(EXAMPLES, name)) as f:
        source = f.read()
    tree = ast.parse(compile(source, name, "exec", flags=ast.PyCF_ONLY_AST))
    doc = ast.get_docstring(tree)
    assert doc and f"python examples/{name}" in doc, f"{name}: its docstring must say how to run it"
    assert 'if __name__ == "__main__":' in source, f"{name}: a script needs a __main__ guard"


@pytest.fixture(scope="module")
def example_runs(tmp_path_factory):
    """Every example, run once in one subprocess: {name: (exit code, seconds, its output)}, and the folders."""
    base = tmp_path_factory.mktemp("examples")
    work, runs = base / "work", base / "runs"
    work.mkdir()
    runs.mkdir()
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}  # each example starts its own local Ray
    env.update(MODELHOPPER_STORAGE=str(runs), PYTHONPATH=ROOT)
    done = subprocess.run([sys.executable, "-c", RUNNER, *(os.path.join(EXAMPLES, n) for n in NAMES)], cwd=work,
                          env=env, capture_output=True, text=True, timeout=280)
    out = done.stdout + done.stderr
    parts = {}
    for name in NAMES:
        m = re.search(rf"=== {re.escape(name)} start\n(.*?)=== {re.escape(name)} exit (-?\d+) ([\d.]+)", done.stdout,
                      flags=re.DOTALL)
        parts[name] = (int(m.group(2)), float(m.group(3)), m.group(1)) if m else (None, None, out)
    return parts, work, runs, out


@pytest.mark.slow  # a process of its own that starts its own Ray: make test-slow (make docs runs them too)
@pytest.mark.timeout(300)
@pytest.mark.parametrize("name", NAMES)
def test_example_runs(example_runs, name):
    parts, work, runs, everything = example_runs
    code, seconds, out = parts[name]
    assert code == 0, f"{name} exited with {code}:\n{out[-4000:]}\n--- the process's stderr ---\n{everything[-4000:]}"
    assert re.search(EXPECTED[name], out), f"{name}'s output does not show {EXPECTED[name]!r}:\n{out[-4000:]}"
    where = re.findall(r"^run directory: (.+)$", out, flags=re.MULTILINE)
    assert where and all(p.startswith(str(runs)) and os.path.isfile(os.path.join(p, "run.db")) for p in where), \
        f"{name} put its run in {where}, not under $MODELHOPPER_STORAGE ({runs})"
    assert os.listdir(work) == [], f"an example wrote into the working directory: {os.listdir(work)}"
