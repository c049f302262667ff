"""Steering a running selection from another process: the CLI and `framework.connect` send commands through the
run's inbox; the driver applies them between events and records each in `run.db` (real Ray, real training)."""

from __future__ import annotations

import json
import os
import sqlite3
import subprocess
import sys
import threading
import time

import pytest
import torch

import automl
import framework
from framework.store.inbox import INBOX_FILE
from framework.store.lock import is_being_written
from tests.integration.ft_functions import CloseGateAtRoundEnd, classifier_eval_fn, gated_train_fn, mlp_model_fn

pytestmark = pytest.mark.ray
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _cli(*args: str) -> subprocess.CompletedProcess:
    """`python -m framework ARGS` in a process of its own."""
    return subprocess.run([sys.executable, "-m", "framework", *args], capture_output=True, text=True, timeout=120,
                          cwd=ROOT, env={**os.environ, "PYTHONPATH": ROOT})


def _wait(what, timeout: float = 60.0) -> None:
    # a check may open the run's catalog (`_answer`) or ask the driver: every 0.2 s is soon enough, and costs the
    # CPU the run under test needs less than a tighter loop
    deadline = time.monotonic() + timeout
    while not what():
        if time.monotonic() > deadline:
            raise TimeoutError("waited 60 s")
        time.sleep(0.2)


def _gated_run(digits, tmp_path, gate, epochs: int, **options):
    """A grid of two configs on two workers, running on a thread, whose units wait while `gate` exists: returns
    (the selection, its run directory, the thread, the dict its `Result` goes into)."""
    x, y = digits
    ds = framework.PartitionedDataset.from_arrays(x[:300], y[:300], num_partitions=2, seed=0)
    path = str(tmp_path / "run")
    space = {"hidden": [16], "lr": [0.05, 0.1], "batch_size": [64], "gate": [str(gate)]}
    sel = framework.ModelSelection(mlp_model_fn, gated_train_fn, classifier_eval_fn, ds,
                                   automl.GridSearch(space, epochs=epochs), num_workers=2, storage_path=path,
                                   progress=False, **options)
    done: dict = {}
    runner = threading.Thread(target=lambda: done.setdefault("result", sel.run()), daemon=True)
    runner.start()
    return sel, path, runner, done


def test_commands_from_another_process_reach_the_running_driver_and_stay_in_its_record(ray_cluster, digits,
                                                                                       tmp_path):
    gate = tmp_path / "gate"
    gate.write_text("")  # closed: every unit waits, so the run goes on while the commands arrive
    sel, path, runner, done = _gated_run(digits, tmp_path, gate, 2, metric="valid_accuracy", mode="max")
    try:
        _wait(lambda: os.path.isfile(os.path.join(path, "run.db")) and is_being_written(path)
              and len(sel.live_workers()) == 2)

        added = _cli("workers", path, "--add", "1")
        assert added.returncode == 0, added.stderr
        assert added.stdout.strip() == "add_workers: started workers [2]"
        too_many = _cli("workers", path, "--add", "1000")  # more than the cluster can place: refused, not queued
        assert too_many.returncode == 1 and ("add_workers rejected: `count` is 1000, but the cluster has room for"
                                             in too_many.stdout), (too_many.stdout, too_many.stderr)
        bad = _cli("workers", path, "--drain", "7")
        assert bad.returncode == 1 and "drain_worker rejected: worker 7 does not live" in bad.stdout, bad.stderr
        unknown = _cli("stop", path, "7")
        assert unknown.returncode == 1 and unknown.stdout == (
            "stop_config rejected: `config_id` is 7, but no config has that id (ids 0..1)\n"), unknown.stderr
        # from Python in another process: a command the driver does not know is rejected with the known ones
        # and one a person may not send from outside the run (chaos testing's, for the driver's own process)
        code = (f"import framework, json; h = framework.connect({path!r}); o = h.send('fly', timeout=30); "
                "k = h.send('kill_worker', timeout=30); print(json.dumps([o.applied, o.outcome, k.applied, k.outcome]))")
        out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, cwd=ROOT,
                             env={**os.environ, "PYTHONPATH": ROOT})
        applied, outcome, killed, why = json.loads(out.stdout.strip().splitlines()[-1])
        assert not applied and outcome.startswith("unknown command 'fly'"), out.stderr
        assert not killed and why.startswith("'kill_worker' cannot be sent from outside the run"), why
        # a request planted in the inbox by someone without the key is rejected, and says why
        db = sqlite3.connect(os.path.join(path, INBOX_FILE))
        db.execute("INSERT INTO requests (time, nonce, name, args, source, mac) VALUES (0, 'planted', "
                   "'add_workers', '{\"count\": 8}', 'x', '00')")
        db.commit()
        db.close()
        handle = framework.connect(path)
        _wait(lambda: handle._answer("planted") is not None)
        _wait(lambda: sel.live_workers() == [0, 1, 2])  # the added worker joins once it has loaded its data
        watched = _cli("watch", path, "--once")  # reads the running run: its status, leaderboard, recent events
        assert watched.returncode == 0, watched.stderr
        assert f"{path}: running, 2 configs" in watched.stdout and "  command " in watched.stdout
    finally:
        gate.unlink()
        runner.join(timeout=180)
    result = done["result"]
    cmds = result.commands
    assert cmds[["name", "applied"]].values.tolist() == [
        ["add_workers", True], ["add_workers", False], ["drain_worker", False], ["stop_config", False], ["fly", False],
        ["kill_worker", False], ["add_workers", False]]
    assert cmds.source.tolist() == ["inbox:cli"] * 4 + ["inbox:connect"] * 2 + ["inbox:x"]
    assert "cannot be trusted: its signature does not verify" in cmds.outcome.iloc[6]
    assert (cmds.t.diff().dropna() >= 0).all()
    assert result.status.status.tolist() == ["completed", "completed"]
    assert set(result.schedule.worker) <= {0, 1, 2}
    # the run has ended: a command cannot reach it, in one line
    late = _cli("workers", path, "--add", "1")
    assert late.returncode == 2 and late.stderr.count("\n") == 1 and "is finished, not running" in late.stderr
    bad_json = _cli("add", path, "{lr: 1}")
    assert bad_json.returncode == 2 and bad_json.stderr.count("\n") == 1 and "must be a JSON object" in bad_json.stderr


def test_commands_sent_while_the_run_was_down_are_applied_once_when_it_resumes(ray_cluster, tmp_path,
                                                                               assert_complete):
    from framework.steering.connect import NotRunningError
    from framework.store.catalog import SQLiteCatalog
    from framework.store.inbox import send_request
    from tests.integration.ft_helpers import _crash_driver, _resume

    storage = _crash_driver(tmp_path, "commit")  # 1 worker, round 0 committed, then SIGKILL
    with pytest.raises(NotRunningError, match="is crashed, not running"):
        framework.connect(storage).add_workers(1)
    catalog = SQLiteCatalog(os.path.join(storage, "run.db"), readonly=True)
    run_id = catalog.meta()["run_id"]
    catalog.close()
    send_request(storage, run_id, "add_workers", {"count": 1})  # what a sender whose run stopped leaves behind
    for _ in range(999):  # a long log of commands: each applied (here: rejected) once, in order
        send_request(storage, run_id, "unpause", {})
    result = _resume(storage)
    cmds = result.commands
    assert len(cmds) == 1000 and cmds[["name", "applied", "outcome"]].iloc[0].tolist() == [
        "add_workers", True, "started workers [1]"]
    assert set(cmds.outcome.iloc[1:]) == {"the run is not paused"} and result.verified
    assert set(result.status.status) == {"completed"}
    assert_complete(result)


def test_a_paused_run_starts_nothing_new_until_it_is_unpaused(ray_cluster, digits, tmp_path):
    from tests.integration.ft_functions import slow_train_fn

    x, y = digits
    ds = framework.PartitionedDataset.from_arrays(x[:300], y[:300], num_partitions=2, seed=0)
    path = str(tmp_path / "run")
    space = {"hidden": [16], "lr": [0.05, 0.1], "batch_size": [64], "sleep": [0.3]}
    sel = framework.ModelSelection(mlp_model_fn, slow_train_fn, classifier_eval_fn, ds,
                                   automl.GridSearch(space, epochs=4), num_workers=2, storage_path=path,
                                   progress=False)
    done: dict = {}
    runner = threading.Thread(target=lambda: done.setdefault("result", sel.run()), daemon=True)
    runner.start()
    _wait(lambda: os.path.isfile(os.path.join(path, "run.db")) and is_being_written(path)
          and sel.rounds_completed >= 1)
    handle = framework.connect(path)  # through the inbox, as from another process (the CLI is tested above)
    early = handle.unpause()
    assert (early.applied, early.outcome) == (False, "the run is not paused")
    paused = handle.pause()
    assert paused.applied and paused.outcome.startswith("paused"), paused
    running = int(paused.outcome.split(";")[1].split()[0])  # "...; N running unit(s) finish"
    time.sleep(2.0)  # without the pause, 2 workers would start about a dozen 0.3 s units in this time
    assert handle.unpause().applied
    runner.join(timeout=180)
    result = done["result"]
    cmds = result.commands
    assert cmds[["name", "applied"]].values.tolist() == [["unpause", False], ["pause", True], ["unpause", True]]
    t_pause, t_unpause = cmds.t.iloc[1], cmds.t.iloc[2]
    assert t_unpause - t_pause >= 2.0
    started_while_paused = result.schedule[(result.schedule.start > t_pause) & (result.schedule.start < t_unpause)]
    assert len(started_while_paused) <= running  # only what was already on its way to a worker
    assert (result.schedule.start > t_unpause).any() and set(result.status.status) == {"completed"}


_STEER = """
import json, sys
import framework
h = framework.connect(sys.argv[1], source="steer")
gate = sys.argv[2]
out = [h.stop(0), h.clone(1, lr=0.001), h.clone(1, warm=False, epochs=1),
       h.add({"hidden": 16, "lr": 0.2, "batch_size": 64, "gate": gate}, epochs=1), h.stop(4), h.resume(0, epochs=3),
       h.stop(9), h.resume(1), h.extend(epochs=1), h.stop(1)]
print(json.dumps([[o.name, o.applied, o.outcome] for o in out]))
"""


def test_a_person_steers_the_configs_of_a_running_run_from_another_process(ray_cluster, digits, tmp_path,
                                                                           assert_complete):
    """stop, clone warm and cold, add, resume, extend, from a second process, while the run trains on Ray: each
    command is applied at a unit boundary and kept; the MOP invariants and the completeness check hold."""
    from framework.store.catalog import SQLiteCatalog
    from framework.store.checkpoint import load_verified
    from simulators import validate_schedule

    gate = tmp_path / "gate"
    sel, path, runner, done = _gated_run(digits, tmp_path, gate, 3, checkpoint="unit", callbacks=[CloseGateAtRoundEnd(gate)])
    try:
        _wait(lambda: sel.rounds_completed >= 1)  # every config trained epoch 0; the gate closed before epoch 1 opened
        out = subprocess.run([sys.executable, "-c", _STEER, path, str(gate)], capture_output=True, text=True,
                             timeout=180, cwd=ROOT, env={**os.environ, "PYTHONPATH": ROOT})
        assert out.returncode == 0, out.stderr
        said = json.loads(out.stdout.strip().splitlines()[-1])
        # while the gate holds the run: the warm clone's first state is config 1's weights when it was cloned
        units = int(said[1][2].split("after ")[1].split()[0])
        catalog = SQLiteCatalog(os.path.join(path, "run.db"), readonly=True)
        try:
            start = {u: (p, d) for _, u, p, d in catalog.checkpoints(2)}[0]
            source = {u: (p, d) for _, u, p, d in catalog.checkpoints(1)}[units]
            parents = catalog.configs().set_index("config_id").parent
        finally:
            catalog.close()
        got, want = load_verified(*start)["model"], load_verified(*source)["model"]
        assert got.keys() == want.keys() and all(torch.equal(got[k], want[k]) for k in want)
        assert parents[2] == 1 and parents[3] != parents[3]  # the cold clone (NaN: no parent) starts from model_fn
    finally:
        gate.unlink(missing_ok=True)
        runner.join(timeout=180)
    assert [(n, a) for n, a, _ in said] == [
        ("stop_config", True), ("clone_config", True), ("clone_config", True), ("add_config", True),
        ("stop_config", True), ("resume_config", True), ("stop_config", False), ("resume_config", False),
        ("extend", True), ("stop_config", True)]
    assert said[6][2] == "`config_id` is 9, but no config has that id (ids 0..4)"
    assert said[7][2] == "config 1 is active: only a stopped config can be resumed"
    result = done["result"]
    assert result.commands.source.unique().tolist() == ["inbox:steer"] and len(result.commands) == 10
    status = result.status.set_index("config_id")
    assert status.status.tolist() == ["completed", "stopped", "completed", "completed", "stopped"]
    # the grid's budget grew to 4 epochs, the person's configs have their own; config 1 was stopped after its first
    assert status.epochs.tolist()[:1] + status.epochs.tolist()[2:] == [3, 3, 1, 0] and 1 <= status.epochs[1] < 4
    assert result.configs[2]["lr"] == 0.001 and result.configs[3]["lr"] == 0.1
    cut = [(1, int(status.epochs[1]))]  # config 1's epoch in progress when it was stopped (config 0's was finished)
    assert validate_schedule(result.schedule, cut=cut).ok
    # a replay repeats what the person did where it happened: bit-identical weights for every config that trained
    again = framework.replay(path)
    assert again.status.status.tolist() == status.status.tolist()
    for cid in range(4):  # (config 1 was cut in an epoch after its first, config 0 cut and resumed)
        a, b = result.load_state(cid), again.load_state(cid)
        assert a["visited"] == b["visited"] and all(torch.equal(a["model"][k], b["model"][k]) for k in a["model"])
    assert not result.schedule.duplicated(["config_id", "epoch", "partition", "kind"]).any()
    assert result.verified
    assert_complete(result)  # clones warm and cold, an added config, cut and resumed ones: each state proves its visits
    assert_complete(again)
