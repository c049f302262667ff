"""Every experiment script imports and answers --help (they are what users submit with `ray job submit`), reports a
bad flag in one line, writes under the storage root (never the working directory, which `ray job submit` replaces)
or `--out`, prints its provenance (revision, machine, versions, date, command line) with its table, and runs a
procedure of the user's own with its arguments."""

from __future__ import annotations

import ast
import importlib
import json
import math
import os
import platform
import re
import runpy
import shlex
import subprocess
import sys
import time

import pandas as pd
import pytest

from framework.text import OneLineParser

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SCRIPTS = sorted(f for f in os.listdir(os.path.join(ROOT, "experiments")) if f.endswith(".py") and not f.startswith("_"))
PROCEDURE = "tests.experiments.procedures:LearningRates"


@pytest.fixture(autouse=True)
def storage(tmp_path, monkeypatch):
    """The storage root of every test here: a temporary folder, whatever the machine's $MODELHOPPER_STORAGE."""
    root = tmp_path / "storage"
    monkeypatch.setenv("MODELHOPPER_STORAGE", str(root))
    return root


def _run_script(script: str, argv: list[str], monkeypatch) -> SystemExit:
    """Run `script` as `python experiments/<script> argv...` does, in this process (torch and Ray are imported once
    for all scripts); returns the SystemExit that argparse raises."""
    path = os.path.join(ROOT, "experiments", script)
    monkeypatch.setattr(sys, "argv", [path, *argv])
    monkeypatch.setattr(sys, "path", list(sys.path))
    with pytest.raises(SystemExit) as e:
        runpy.run_path(path, run_name="__main__")
    return e.value


def _script_module(name: str, monkeypatch):
    monkeypatch.setattr(sys, "path", [ROOT, *sys.path])
    return importlib.import_module(f"experiments.{name}")


@pytest.mark.parametrize("script", SCRIPTS)
def test_experiment_script_answers_help_with_defaults(script, monkeypatch, capsys):
    e = _run_script(script, ["--help"], monkeypatch)
    out = capsys.readouterr().out
    assert e.code == 0 and "usage:" in out
    assert "(default:" in out


@pytest.mark.parametrize("script", SCRIPTS)
def test_experiment_script_options_say_more_than_their_names(script, monkeypatch, capsys):
    parsers = []
    original = OneLineParser.print_help

    def keep(self, file=None):
        parsers.append(self)
        original(self, file)

    monkeypatch.setattr(OneLineParser, "print_help", keep)
    _run_script(script, ["--help"], monkeypatch)
    assert len(parsers) == 1, f"{script} does not build its parser with framework.text.OneLineParser"
    for action in parsers[0]._actions:
        for flag in action.option_strings:
            name = flag.lstrip("-").replace("-", " ").replace("_", " ")
            assert action.help and action.help.strip().lower() != name.lower(), f"{script} {flag}: {action.help!r}"


@pytest.mark.parametrize("script", SCRIPTS)
def test_experiment_script_reports_a_bad_flag_in_one_line(script, monkeypatch, capsys, storage):
    e = _run_script(script, ["--no-such-flag"], monkeypatch)
    err = capsys.readouterr().err
    assert e.code == 2
    assert err == f"{script}: error: unrecognized arguments: --no-such-flag (see --help)\n"
    assert not storage.exists()


QUICK_COMPARISON = ["--quick", "--kinds", "homogeneous", "--schedulers", "randomized", "--seeds", "1", "--quiet"]


@pytest.fixture(scope="module")
def quick_comparison(tmp_path_factory):
    """`python experiments/scheduler_comparison.py QUICK_COMPARISON` run as `ray job submit --working-dir .` runs it:
    in a fresh folder (a copy that Ray deletes), its storage root a temporary folder. (storage, cwd, the process.)"""
    base = tmp_path_factory.mktemp("comparison")
    storage, cwd = base / "storage", base / "cwd"
    cwd.mkdir()
    done = subprocess.run([sys.executable, os.path.join(ROOT, "experiments", "scheduler_comparison.py"),
                           *QUICK_COMPARISON], cwd=cwd, capture_output=True, text=True, timeout=300,
                          env={**os.environ, "MODELHOPPER_STORAGE": str(storage)})
    return storage, cwd, done


def test_experiment_script_run_in_a_fresh_folder_writes_only_under_the_storage_root(quick_comparison):
    storage, cwd, done = quick_comparison
    assert done.returncode == 0, done.stderr
    assert list(cwd.iterdir()) == []
    runs = list((storage / "experiments" / "scheduler_comparison").iterdir())
    assert len(runs) == 1 and {"run.json", "comparison.csv", "summary.csv"} <= {p.name for p in runs[0].iterdir()}
    assert all(runs[0] in p.parents or p in runs[0].parents or p == runs[0] for p in storage.rglob("*"))
    lines = done.stdout.strip().splitlines()
    assert lines[0] == lines[-1] == f"Results in {runs[0]}"


def test_output_dir_is_out_else_a_tag_else_a_new_folder_per_run_under_the_storage_root(tmp_path, storage):
    from experiments._common import output_dir

    assert output_dir("x", out=str(tmp_path / "mine")) == str(tmp_path / "mine")
    assert (tmp_path / "mine").is_dir()
    assert output_dir("x", tag="v1") == str(storage / "experiments" / "x" / "v1")
    first, second = output_dir("x"), output_dir("x")  # the same second: two folders all the same
    assert first != second and os.path.dirname(first) == os.path.dirname(second) == str(storage / "experiments" / "x")


@pytest.mark.parametrize("kwargs, message", [
    ({"tag": ".."}, "`--tag` is '..', but must be a folder name"),
    ({"tag": "a/b"}, "`--tag` is 'a/b', but must be a folder name"),
    ({"out": "FILE"}, "but it is a file"),
    ({"out": ""}, "`--out` is '', but it is empty"),
    ({"out": "RUN/results"}, "but it is in the run directory"),
])
def test_output_dir_rejects_a_bad_tag_or_out(kwargs, message, tmp_path):
    from experiments._common import output_dir

    (tmp_path / "FILE").write_text("")
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / "run.db").write_text("")
    kwargs = {k: str(tmp_path / "FILE") if v == "FILE" else v.replace("RUN", str(tmp_path / "run"))
              for k, v in kwargs.items()}
    with pytest.raises(ValueError, match=re.escape(message)):
        output_dir("x", **kwargs)


@pytest.mark.ray
def test_automl_on_mop_runs_a_users_procedure_with_its_arguments(ray_cluster, tmp_path, monkeypatch, capsys):
    script = _script_module("automl_on_mop", monkeypatch)
    out = tmp_path / "out"
    df = script.main(["--procedure", PROCEDURE, "--procedure-args", '{"lrs": [0.05, 0.2], "epochs": 2}',
                      "--executors", "mop", "--rows", "400", "--workers", "1", "--out", str(out)])
    assert df.procedure.tolist() == [PROCEDURE] and df.configs_explored.tolist() == [2]
    assert df.epochs_trained.tolist() == [4]
    assert all(str(out) in p for p in df.storage_path)  # the runs too go where the results go
    assert (out / "summary.csv").exists() and (out / "run.json").exists()


@pytest.mark.parametrize("args, message", [
    (["--procedure-args", '{"lrs": [0.1]}'], f"`procedure` is '{PROCEDURE}' with `procedure_args`: LearningRates "
                                             "needs the option(s) ['epochs']"),
    (["--procedure-args", '{"lrs": [0.1], "epochs": 1, "width": 3}'], "got unknown option(s) ['width']"),
    (["--procedure-args", "[1]"], "`--procedure-args` is '[1]', but must be a JSON object"),
    (["--procedure-args", "{lrs"], "`--procedure-args` is '{lrs', but must be a JSON object"),
])
def test_automl_on_mop_reports_a_bad_procedure_argument_in_one_line(args, message, tmp_path, monkeypatch, capsys):
    script = _script_module("automl_on_mop", monkeypatch)
    out = tmp_path / "out"
    with pytest.raises(SystemExit) as e:
        script.main(["--procedure", PROCEDURE, *args, "--out", str(out)])
    err = capsys.readouterr().err
    assert e.value.code == 2 and err.count("\n") == 1 and err.endswith(" (see --help)\n")
    assert err.startswith("automl_on_mop.py: error: ") and message in err
    assert not out.exists()  # checked before anything is made


def test_a_script_runs_as_users_run_it():
    out = subprocess.run([sys.executable, os.path.join("experiments", "mop_vs_baselines.py"), "--help"], cwd=ROOT,
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert "--queue-depth" in out.stdout and "(default: 2)" in out.stdout


def test_step_overhead_times_both_ways_side_by_side_and_they_end_with_the_same_weights(tmp_path, monkeypatch, capsys):
    script = _script_module("step_overhead", monkeypatch)
    out = tmp_path / "out"
    table = script.main(["--quick", "--out", str(out)])
    assert table[["hidden", "batch_size"]].values.tolist() == [[16, 32], [64, 32]]
    assert (table.step_s > 0).all() and (table.hand_s > 0).all()
    assert table.ratio.tolist() == pytest.approx((table.step_s / table.hand_s).tolist())
    assert table.same_weights.all() and (table.max_diff == 0).all()  # on CPU: bit for bit
    assert (table.data == "cpu").all() and table.ok.dtype == bool and "cpu_ratio" in table
    units = pd.read_csv(out / "units.csv")
    assert len(units) == 2 * 2 * 4 and set(units.way) == {"step", "hand"}  # cells x ways x --units (quick)
    assert units.groupby(["hidden", "unit"])["first"].sum().tolist() == [1] * 8  # each pair: one way first
    firsts = units[units["first"]].sort_values(["hidden", "unit"]).way.tolist()
    assert firsts == ["hand", "step", "hand", "step"] * 2  # which way goes first alternates (after 1 warm-up)
    assert (out / "step_overhead.csv").exists() and (out / "run.json").exists()
    printed = capsys.readouterr().out
    assert "| hidden | batch_size |" in printed and "identical states in 2 of 2" in printed


def test_fused_packs_times_a_pack_against_its_members_one_at_a_time(tmp_path, monkeypatch, capsys):
    script = _script_module("fused_packs", monkeypatch)
    out = tmp_path / "out"
    table = script.main(["--quick", "--models", "mlp", "cnn", "--out", str(out)])
    assert table[["model", "pack"]].values.tolist() == [["mlp", 1], ["mlp", 4], ["cnn", 1], ["cnn", 4]]
    assert (table.alone_s > 0).all() and (table.fused_s > 0).all()
    assert table.speedup.tolist() == pytest.approx((table.alone_s / table.fused_s).tolist())
    assert (table.state_mb[table.pack == 4].to_numpy() == 4 * table.state_mb[table.pack == 1].to_numpy()).all()
    assert (out / "fused_packs.csv").exists() and "| model | pack |" in capsys.readouterr().out
    with pytest.raises(SystemExit):
        script.main(["--models", "rnn", "--out", str(tmp_path / "bad")])
    assert "`--models` is ('rnn',), but each must be one of" in capsys.readouterr().err


def test_fused_packs_prints_a_failing_cells_error_in_its_row_and_goes_on(tmp_path, monkeypatch, capsys):
    script = _script_module("fused_packs", monkeypatch)

    class Pack(script.FusedPack):
        """As on CUDA: the default pack of 4 raises in its pass (the generic one does not); a pack of 1 goes
        generic, saying why."""

        def __init__(self, models, optimizers, *, generic=False):
            super().__init__(models, optimizers, generic=generic or len(models) == 1)

        @property
        def why_generic(self):  # (whether or not FusedPack has one)
            return "told to"

        @why_generic.setter
        def why_generic(self, value):
            pass

        def train(self, *args, **kwargs):
            if self.k == 4 and self.fused is not None:
                raise RuntimeError("LSE is not correctly aligned (strideH)\nand a second line")
            return super().train(*args, **kwargs)

    build, out, written_before = script.build, tmp_path / "out", []

    def broken(model, width, lr):
        if model == "cnn":
            written_before.append(len(pd.read_csv(out / "fused_packs.csv")))  # the rows done so far: on disk
            raise ValueError("no cnn today")
        return build(model, width, lr)

    monkeypatch.setattr(script, "FusedPack", Pack)
    monkeypatch.setattr(script, "build", broken)
    table = script.main(["--quick", "--models", "mlp", "cnn", "--out", str(out)])
    assert table[["model", "pack"]].values.tolist() == [["mlp", 1], ["mlp", 4], ["cnn", 1], ["cnn", 4]]
    assert table.error.tolist() == ["", "fused: RuntimeError: LSE is not correctly aligned (strideH)",
                                    "cell: ValueError: no cnn today", "cell: ValueError: no cnn today"]
    assert table.path.tolist() == ["generic", "", "", ""] and table.why_generic.tolist() == ["told to", "", "", ""]
    assert (table.alone_s[:2] > 0).all() and (table.generic_s[:2] > 0).all()  # the other ways of the cell ran
    assert table.fused_s[1:].isna().all() and table.alone_s[2:].isna().all()
    written = pd.read_csv(out / "fused_packs.csv")
    assert list(written.columns) == list(table.columns) and written.error.fillna("").tolist() == table.error.tolist()
    assert written_before == [2, 3]
    printed = capsys.readouterr().out
    rows = [line for line in printed.splitlines() if line.startswith("| ")]
    assert rows[0].startswith("| model | pack |") and len(rows) == 5  # the header, then one line per cell
    assert rows[2].startswith("| mlp | 4 |") and rows[2].endswith("| fused: RuntimeError: LSE is not correctly "
                                                                   "aligned (strideH) |")
    assert rows[4].startswith("| cnn | 4 |") and rows[4].endswith("| cell: ValueError: no cnn today |")


@pytest.mark.parametrize("args, message", [
    (["--data-on-device", "maybe"], "`--data-on-device` is 'maybe', but must be one of ['auto', 'false', 'true']"),
    (["--clock", "gpu"], "`--clock` is 'gpu', but must be wall or cpu"),
    (["--batch-size", "512", "--rows", "256"], "`--batch-size` is (512,), but each must be in 1..--rows (256)"),
])
def test_step_overhead_reports_a_bad_option_in_one_line(args, message, tmp_path, monkeypatch, capsys):
    script = _script_module("step_overhead", monkeypatch)
    with pytest.raises(SystemExit) as e:
        script.main([*args, "--out", str(tmp_path / "out")])
    err = capsys.readouterr().err
    assert e.value.code == 2 and err.count("\n") == 1 and message in err
    assert not (tmp_path / "out").exists()


def test_gpu_first_program_refuses_cuda_on_a_machine_without_one(tmp_path, monkeypatch, capsys):
    import torch

    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU")
    script = _script_module("gpu_first_program", monkeypatch)
    with pytest.raises(SystemExit) as e:
        script.main(["--out", str(tmp_path / "out")])  # --device cuda is the default
    assert e.value.code == 2 and "use --device cpu" in capsys.readouterr().err


@pytest.mark.ray
def test_gpu_first_program_on_cpu_workers_runs_places_times_and_replays(ray_cluster, tmp_path, monkeypatch, capsys):
    script = _script_module("gpu_first_program", monkeypatch)
    out = tmp_path / "out"
    table = script.main(["--device", "cpu", "--quick", "--ways", "step_fn", "readme", "--out", str(out)])
    assert table.way.tolist() == ["step_fn", "readme"] and table.data_on_device.tolist() == ["auto", "auto"]
    assert table.runs.tolist() == ["1 of 1", "1 of 1"] and table.error.tolist() == ["", ""]
    assert table.data.tolist() == ["cpu", "cpu"]  # CPU workers keep their partitions in host memory
    assert (table.train_unit_s > 0).all() and (table.eval_unit_s > 0).all()
    assert table.replay_run.tolist() == ["identical", "identical"]  # on CPU: bit for bit
    assert (out / "gpu_first_program.csv").exists() and (out / "run.json").exists()
    assert sorted(p.name for p in (out / "runs").iterdir()) == ["readme-auto", "readme-auto-replay-run",
                                                                "step_fn-auto", "step_fn-auto-replay-run"]
    assert "| way | data_on_device |" in capsys.readouterr().out


def _git(*args: str, cwd: str = ROOT) -> str:
    return subprocess.run(["git", *args], cwd=cwd, capture_output=True, text=True, check=True).stdout.strip()


def test_provenance_names_the_revision_machine_versions_date_and_command(monkeypatch):
    import ray
    import torch

    from experiments._common import provenance

    monkeypatch.setattr(sys, "argv", ["experiments/x.py", "--quick", "--note", "two words"])
    lines = provenance().splitlines()
    assert [line.split(" ")[1] for line in lines] == ["revision", "machine", "software", "date", "command"]
    dirty = _git("status", "--porcelain", "--untracked-files=no", "--", "framework", "automl", "simulators",
                 "experiments") != ""
    assert lines[0] == f"# revision {_git('rev-parse', '--short', 'HEAD')}" + ("+dirty" if dirty else "")
    machine = lines[1]
    assert machine.startswith("# machine ") and f", {os.cpu_count()} logical cores" in machine
    assert re.search(r", \d+\.\d GiB RAM, ", machine) and platform.system() in machine
    gpu = torch.cuda.get_device_name(0) if torch.cuda.is_available() else "no GPU"
    assert gpu in machine
    assert lines[2] == f"# software Python {platform.python_version()}, torch {torch.__version__}, Ray {ray.__version__}"
    assert abs(time.mktime(time.strptime(lines[3], "# date %Y-%m-%d %H:%M:%S %z")) - time.time()) < 60
    assert lines[4] == "# command python experiments/x.py --quick --note 'two words'"


def test_provenance_revision_is_dirty_only_for_changes_to_tracked_code(tmp_path, monkeypatch):
    from experiments import _common

    repo = tmp_path / "repo"
    (repo / "framework").mkdir(parents=True)
    (repo / "framework" / "a.py").write_text("x = 1\n")
    (repo / "README.md").write_text("words\n")
    _git("init", "-q", cwd=str(repo))
    _git("add", ".", cwd=str(repo))
    _git("-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "c", cwd=str(repo))
    monkeypatch.setattr(_common, "ROOT", str(repo))
    short = _git("rev-parse", "--short", "HEAD", cwd=str(repo))
    (repo / "README.md").write_text("other words\n")  # outside the code folders
    (repo / "framework" / "new.py").write_text("")  # untracked
    assert _common.provenance().splitlines()[0] == f"# revision {short}"
    (repo / "framework" / "a.py").write_text("x = 2\n")
    assert _common.provenance().splitlines()[0] == f"# revision {short}+dirty"


def test_provenance_without_git_reports_the_revision_it_was_given(tmp_path, monkeypatch):
    from experiments import _common

    monkeypatch.setattr(_common, "ROOT", str(tmp_path))  # what `ray job submit --working-dir .` uploads: no .git
    monkeypatch.setenv("GIT_CEILING_DIRECTORIES", str(tmp_path.parent))
    monkeypatch.delenv("MODELHOPPER_GIT_REVISION", raising=False)
    assert _common.provenance().splitlines()[0].startswith("# revision unknown (no git repository")
    monkeypatch.setenv("MODELHOPPER_GIT_REVISION", "0123abc")
    assert _common.provenance().splitlines()[0] == ("# revision 0123abc (from $MODELHOPPER_GIT_REVISION; uncommitted "
                                                    "changes unknown)")


@pytest.mark.parametrize("script", SCRIPTS)
def test_experiment_script_prints_the_provenance_of_its_table(script):
    """Its `main` exists and it calls `provenance()` or `record_run` (which prints it under the table), both taken
    from experiments/_common.py: no script writes its own."""
    with open(os.path.join(ROOT, "experiments", script)) as f:
        tree = ast.parse(f.read())
    functions = {node.name for node in tree.body if isinstance(node, ast.FunctionDef)}
    assert "main" in functions and not functions & {"provenance", "record_run"}
    imported = {alias.name for node in ast.walk(tree) if isinstance(node, ast.ImportFrom)
                and node.module == "experiments._common" for alias in node.names}
    called = {node.func.id for node in ast.walk(tree) if isinstance(node, ast.Call)
              and isinstance(node.func, ast.Name)}
    assert called & imported & {"provenance", "record_run"}, f"{script} prints no provenance with its table"


def test_a_quick_scripts_table_comes_with_its_provenance(quick_comparison):
    storage, _, done = quick_comparison
    assert done.returncode == 0, done.stderr
    lines = done.stdout.strip().splitlines()
    (run,) = (storage / "experiments" / "scheduler_comparison").iterdir()
    assert lines[-1] == f"Results in {run}" and lines[-7] == ""
    shown = lines[-6:-1]  # under the table and its summary line, before where the results are
    assert [line.split(" ")[1] for line in shown] == ["revision", "machine", "software", "date", "command"]
    assert shown[0].startswith(f"# revision {_git('rev-parse', '--short', 'HEAD')}")
    assert shown[4] == "# command python " + shlex.join([os.path.join(ROOT, "experiments", "scheduler_comparison.py"),
                                                        *QUICK_COMPARISON])
    kept = json.loads((run / "run.json").read_text())["provenance"]
    assert [f"# {k} {v}" for k, v in kept.items()] == shown


def test_layer_freezing_refuses_a_table_file_in_a_missing_folder(tmp_path, monkeypatch, capsys):
    script = _script_module("layer_freezing", monkeypatch)
    table = tmp_path / "missing" / "table.txt"
    with pytest.raises(SystemExit) as e:
        script.main(["--table", str(table), "--out", str(tmp_path / "out")])
    err = capsys.readouterr().err
    assert e.value.code == 2 and f"`--table` is '{table}', but must be a file in an existing folder" in err
    assert not (tmp_path / "out").exists()


def test_layer_freezing_counts_compute_and_chooses_w_by_it(tmp_path, monkeypatch, capsys):
    import torch.nn.functional as F
    from torch.utils.flop_counter import FlopCounterMode

    script = _script_module("layer_freezing", monkeypatch)
    out = tmp_path / "out"
    argv = ["--quick", "--epochs", "2", "--lr-milestones", "1", "2", "--width", "8", "--windows", "2", "10"]
    script.main([*argv, "--out", str(out)])
    curves = pd.read_csv(out / "curves.csv")
    figures = json.loads((out / "figures.json").read_text())

    # the baseline's compute, counted independently: one whole training step on one batch, per sample, x 1,438
    # training samples an epoch
    cfg = script.Config(width=8)
    x, y, _, _ = script.load_digits_tensors(cfg, 0)
    model = script.build_model(cfg)
    with FlopCounterMode(display=False) as forward:
        loss = F.cross_entropy(model(x[:64]), y[:64])
    with FlopCounterMode(display=False) as backward:
        loss.backward()
    per_epoch = len(x) * (forward.get_total_flops() + backward.get_total_flops()) / 64 / 1e9
    base = curves[curves.arm == "baseline"]
    assert len(x) == 1438 and len(base) == 4  # 2 seeds x 2 epochs
    assert base.train_gflops.tolist() == pytest.approx([per_epoch, 2 * per_epoch] * 2, rel=1e-9)

    # an arm that never froze computed what the baseline did; one that froze, less
    tuning = pd.read_csv(out / "tuning.csv").set_index("W")
    seed100 = curves[curves.seed == 100].set_index(["arm", "epoch"])
    assert tuning.freezes[2] > 0  # W = 2 freezes within the 46 steps (bootstrapping can end at step 4)
    for w in (2, 10):
        arm, base100 = seed100.loc[f"egeria_w{w}"], seed100.loc["baseline"]
        if tuning.freezes[w] == 0:
            assert arm.train_gflops.tolist() == base100.train_gflops.tolist()
        else:
            assert arm.train_gflops.iloc[-1] < base100.train_gflops.iloc[-1] and arm.reference_gflops.iloc[-1] > 0

    # W is chosen by compute to the middle target, among the W that keep the accuracy (one tuning seed: its values)
    middle = figures["targets"][1]

    def gflops_to(arm: str) -> float:
        reached = seed100.loc[arm][seed100.loc[arm].val_accuracy >= middle]
        return float(reached.train_gflops.iloc[0]) if len(reached) else math.inf

    base_to = gflops_to("baseline")
    assert base_to < math.inf  # the baseline reaches 98% of its own final accuracy
    speedups = {w: 1 - gflops_to(f"egeria_w{w}") / base_to for w in (2, 10)}
    kept = [w for w in (2, 10) if tuning.acc_change_pts[w] >= -0.5]
    by = speedups if kept else dict(tuning.acc_change_pts)  # none kept: the smallest accuracy loss
    chosen = max(kept or [2, 10], key=lambda w: (by[w], w))
    assert figures["window_chosen"] == chosen
    assert figures["choice_key"] == f"compute@{middle:.3f}" and "window_by_wall" in figures
    assert {f"compute@{middle:.3f}", f"wall@{middle:.3f}"} <= set(tuning.columns)
    assert all(a["reading_lag"] == a["eval_interval"] == 1 for s in figures["arms"].values() for a in s.values())
    printed = capsys.readouterr().out
    assert f"W chosen by median compute@{middle:.3f}: {chosen}" in printed
    assert f"median speedup to {middle:.3f}: compute" in printed and ", wall " in printed
